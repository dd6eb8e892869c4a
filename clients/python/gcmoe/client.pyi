from typing import Any, Optional, Sequence, Tuple, Union

import numpy as np
import numpy.typing as npt

from gcmoe.channel import TlsArgument
from gcmoe.cuda_memory import CudaMemory
from gcmoe.stream import ForwardStream
from gcmoe.shm import RegionArray, SharedMemoryRegion
from gcmoe.tensors import Fp8Hidden
from gcmoe.v1 import moe_pb2

Hidden = Union[npt.NDArray[Any], Fp8Hidden, RegionArray]
Routing = Union[npt.ArrayLike, RegionArray]

class Client:
    addr: str
    def __init__(self, addr: str = ..., *, tls: TlsArgument = ...,
                 token: Optional[str] = ..., timeout: Optional[float] = ...,
                 max_message_bytes: int = ...,
                 options: Sequence[Tuple[str, Any]] = ...) -> None: ...
    def info(self, timeout: Optional[float] = ...) -> moe_pb2.ModelInfo: ...
    def stats(self, timeout: Optional[float] = ...) -> moe_pb2.Stats: ...
    def forward_response(self, hidden: Hidden, topk_ids: Routing,
                         topk_weights: Routing, layer: int = ..., output_dtype: str = ...,
                         hidden_dtype: Optional[str] = ..., request_id: str = ...,
                         timeout: Optional[float] = ...,
                         out: Optional[RegionArray] = ...) -> moe_pb2.ForwardResponse: ...
    def forward(self, hidden: Hidden, topk_ids: Routing, topk_weights: Routing,
                layer: int = ..., output_dtype: str = ..., hidden_dtype: Optional[str] = ...,
                request_id: str = ..., timeout: Optional[float] = ...,
                out: Optional[RegionArray] = ...) -> Optional[np.ndarray]: ...
    def register_memory(self, region: Union[SharedMemoryRegion, CudaMemory],
                        name: Optional[str] = ...,
                        timeout: Optional[float] = ...) -> moe_pb2.RegisterMemoryResponse: ...
    def unregister_memory(self, region: Union[SharedMemoryRegion, CudaMemory, str],
                          timeout: Optional[float] = ...) -> moe_pb2.UnregisterMemoryResponse: ...
    def forward_stream(self, timeout: Optional[float] = ...) -> ForwardStream: ...
    def close(self) -> None: ...
    def __enter__(self) -> "Client": ...
    def __exit__(self, *exc: object) -> None: ...
