"""The asyncio gcmoe client, on grpc.aio; the same calls as gcmoe.Client, awaited.

    async with gcmoe.aio.Client("127.0.0.1:50051") as client:
        y = await client.forward(hidden, topk_ids, topk_weights)
"""
import grpc
import grpc.aio

from gcmoe import channel as _channel
from gcmoe import tensors
from gcmoe.errors import from_rpc_error
from gcmoe.v1 import moe_pb2, moe_pb2_grpc


class Client:
    """See gcmoe.Client for the arguments. Create it inside the running event loop."""

    def __init__(self, addr="127.0.0.1:50051", *, tls=False, token=None, timeout=None,
                 max_message_bytes=_channel.DEFAULT_MAX_MESSAGE_BYTES, options=()):
        opts = _channel.channel_options(max_message_bytes) + list(options)
        creds = _channel.credentials(tls)
        self.addr = addr
        self._channel = (grpc.aio.secure_channel(addr, creds, options=opts) if creds is not None
                         else grpc.aio.insecure_channel(addr, options=opts))
        self._stub = moe_pb2_grpc.MoeServiceStub(self._channel)
        self._metadata = _channel.call_metadata(token)
        self._timeout = timeout

    async def _call(self, rpc, request, timeout):
        try:
            return await getattr(self._stub, rpc)(
                request, timeout=self._timeout if timeout is None else timeout,
                metadata=self._metadata)
        except grpc.RpcError as error:
            raise from_rpc_error(error, rpc) from None

    async def info(self, timeout=None):
        return await self._call("GetModelInfo", moe_pb2.GetModelInfoRequest(), timeout)

    async def stats(self, timeout=None):
        return await self._call("GetStats", moe_pb2.GetStatsRequest(), timeout)

    async def forward_response(self, hidden, topk_ids, topk_weights, layer=0,
                               output_dtype="bf16", hidden_dtype=None, request_id="",
                               timeout=None):
        request = tensors.forward_request(hidden, topk_ids, topk_weights, layer, output_dtype,
                                          hidden_dtype, request_id)
        return await self._call("Forward", request, timeout)

    async def forward(self, hidden, topk_ids, topk_weights, layer=0, output_dtype="bf16",
                      hidden_dtype=None, request_id="", timeout=None):
        response = await self.forward_response(hidden, topk_ids, topk_weights, layer,
                                               output_dtype, hidden_dtype, request_id, timeout)
        return tensors.decode_output(response.output)

    async def close(self):
        await self._channel.close()

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        await self.close()
