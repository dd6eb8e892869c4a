"""gcmoe: a client of the gcmoe MoE-layer inference service.

    import gcmoe
    with gcmoe.Client("127.0.0.1:50051") as client:     # tls=gcmoe.TLS(ca=...), token=...
        y = client.forward(hidden, topk_ids, topk_weights, layer=0, output_dtype="fp32")
        with client.forward_stream() as stream:      # Forward calls on one long-lived stream
            y = stream.forward(hidden, topk_ids, topk_weights, layer=1)

gcmoe.aio.Client is the asyncio variant; gcmoe.numerics holds the BF16 and FP8 (E4M3 + UE8M0)
encoders; gcmoe.v1.moe_pb2 / moe_pb2_grpc are the generated stubs of the API, and the
`inference` package those of the Open Inference Protocol (KServe v2) front door.
"""
from gcmoe._version import __version__
from gcmoe import aio, numerics
from gcmoe.channel import TLS
from gcmoe.client import Client
from gcmoe.cuda_memory import CudaMemory, DeviceArray
from gcmoe.errors import (DeadlineExceededError, GcmoeError, InvalidArgumentError, NotFoundError,
                          ResourceExhaustedError, UnauthenticatedError, UnavailableError)
from gcmoe.shm import RegionArray, SharedMemoryRegion
from gcmoe.stream import ForwardStream
from gcmoe.tensors import Fp8Hidden

__all__ = [
    "__version__", "aio", "numerics", "Client", "ForwardStream", "Fp8Hidden", "TLS", "GcmoeError",
    "SharedMemoryRegion", "RegionArray", "CudaMemory", "DeviceArray",
    "InvalidArgumentError", "NotFoundError", "ResourceExhaustedError", "UnavailableError",
    "DeadlineExceededError", "UnauthenticatedError",
]
