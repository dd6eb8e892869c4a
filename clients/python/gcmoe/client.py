"""The blocking gcmoe client."""
import grpc

from gcmoe import channel as _channel
from gcmoe import shm as _shm
from gcmoe import tensors
from gcmoe.stream import ForwardStream
from gcmoe.errors import from_rpc_error
from gcmoe.v1 import moe_pb2, moe_pb2_grpc


class Client:
    """A connection to one gcmoe service.

        with gcmoe.Client("127.0.0.1:50051") as client:
            info = client.info()
            y = client.forward(hidden, topk_ids, topk_weights, layer=0, output_dtype="fp32")
            with client.forward_stream() as stream:     # one long-lived stream, e.g. per layer
                y = stream.forward(hidden, topk_ids, topk_weights, layer=0)

    tls: False (plaintext), True (TLS, the system's roots), gcmoe.TLS(ca=..., cert=..., key=...,
        server_name=...) for a private CA, mTLS or another server name, or grpc.ChannelCredentials.
    token: sent as `authorization: Bearer <token>` with every call (a service with
        server.auth.tokens_file refuses calls without it: gcmoe.UnauthenticatedError).
    timeout: default deadline of each call in seconds (None: none; the server applies its own).
    """

    def __init__(self, addr="127.0.0.1:50051", *, tls=False, token=None, timeout=None,
                 max_message_bytes=_channel.DEFAULT_MAX_MESSAGE_BYTES, options=()):
        self._metadata = _channel.call_metadata(token, addr, tls)
        creds, tls_options = _channel.credentials(tls)
        opts = _channel.channel_options(max_message_bytes) + tls_options + list(options)
        self.addr = addr
        self._channel = (grpc.secure_channel(addr, creds, options=opts) if creds is not None
                         else grpc.insecure_channel(addr, options=opts))
        self._stub = moe_pb2_grpc.MoeServiceStub(self._channel)
        self._timeout = timeout

    def _call(self, rpc, request, timeout):
        try:
            return getattr(self._stub, rpc)(
                request, timeout=self._timeout if timeout is None else timeout,
                metadata=self._metadata)
        except grpc.RpcError as error:
            raise from_rpc_error(error, rpc) from None

    def info(self, timeout=None):
        """The served model: gcmoe.v1.ModelInfo (hidden, experts, top_k, layers, version, ...)."""
        return self._call("GetModelInfo", moe_pb2.GetModelInfoRequest(), timeout)

    def stats(self, timeout=None):
        """Counters, latencies and balance since start-up: gcmoe.v1.Stats."""
        return self._call("GetStats", moe_pb2.GetStatsRequest(), timeout)

    def forward_response(self, hidden, topk_ids, topk_weights, layer=0, output_dtype="bf16",
                         hidden_dtype=None, request_id="", timeout=None, out=None):
        """Forward, returning the whole gcmoe.v1.ForwardResponse (output tensor and stats)."""
        request = tensors.forward_request(hidden, topk_ids, topk_weights, layer, output_dtype,
                                          hidden_dtype, request_id, out)
        return self._call("Forward", request, timeout)

    def register_memory(self, region, name=None, timeout=None):
        """Registers a gcmoe.SharedMemoryRegion or gcmoe.CudaMemory (all of it) under `name`
        (default region.name), so that its arrays can be passed to forward(). The service must
        run with server.allow_registered_memory on, on this host (CudaMemory: with the cuda
        backend)."""
        return self._call("RegisterMemory", _shm.register_request(region, name), timeout)

    def unregister_memory(self, region, timeout=None):
        """Drops a registration (a SharedMemoryRegion or its name); calls already using it
        finish."""
        name = region if isinstance(region, str) else region.name
        return self._call("UnregisterMemory", moe_pb2.UnregisterMemoryRequest(name=name), timeout)

    def forward(self, hidden, topk_ids, topk_weights, layer=0, output_dtype="bf16",
                hidden_dtype=None, request_id="", timeout=None, out=None):
        """One MoE layer over T tokens; returns the [T, H] output as a NumPy array.

        hidden: [T, H] float32 (sent as FP32, or encoded as hidden_dtype "bf16" / "fp8"),
        uint16 BF16 bit patterns or ml_dtypes.bfloat16, or a gcmoe.Fp8Hidden.
        topk_ids: [T, k] integers in [0, E), -1 for an unused slot. topk_weights: [T, k].
        output_dtype "fp32" gives float32; "bf16" gives bfloat16 (ml_dtypes) or uint16 bits.
        Inputs may be gcmoe.RegionArray (registered memory; hidden also a gcmoe.DeviceArray, in
        registered GPU memory); with out= (a RegionArray) the output is written there and its
        NumPy view returned (with a DeviceArray: written on the GPU, and None returned).
        """
        response = self.forward_response(hidden, topk_ids, topk_weights, layer, output_dtype,
                                         hidden_dtype, request_id, timeout, out)
        if out is not None:
            return out.array
        return tensors.decode_output(response.output)

    def forward_stream(self, timeout=None):
        """Opens a ForwardStream: Forward calls on one stream, answered in order, so a frontend
        that calls once per layer does not pay call setup each time (see gcmoe.ForwardStream).

        timeout: deadline of the whole stream in seconds (None: none). The client's per-call
        timeout does not apply, as a stream lives across many calls.
        """
        return ForwardStream(self._stub, self._metadata, timeout)

    def close(self):
        self._channel.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
