"""The asyncio gcmoe client, on grpc.aio; the same calls as gcmoe.Client, awaited.

    async with gcmoe.aio.Client("127.0.0.1:50051") as client:
        y = await client.forward(hidden, topk_ids, topk_weights)
        async with client.forward_stream() as stream:
            y = await stream.forward(hidden, topk_ids, topk_weights)
"""
import asyncio

import grpc
import grpc.aio

from gcmoe import channel as _channel
from gcmoe import shm as _shm
from gcmoe import tensors
from gcmoe.errors import GcmoeError, from_rpc_error
from gcmoe.stream import RPC as _STREAM_RPC
from gcmoe.stream import InFlight, unanswered
from gcmoe.v1 import moe_pb2, moe_pb2_grpc


class Client:
    """See gcmoe.Client for the arguments. Create it inside the running event loop."""

    def __init__(self, addr="127.0.0.1:50051", *, tls=False, token=None, timeout=None,
                 max_message_bytes=_channel.DEFAULT_MAX_MESSAGE_BYTES, options=()):
        self._metadata = _channel.call_metadata(token, addr, tls)
        creds, tls_options = _channel.credentials(tls)
        opts = _channel.channel_options(max_message_bytes) + tls_options + list(options)
        self.addr = addr
        self._channel = (grpc.aio.secure_channel(addr, creds, options=opts) if creds is not None
                         else grpc.aio.insecure_channel(addr, options=opts))
        self._stub = moe_pb2_grpc.MoeServiceStub(self._channel)
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
                               timeout=None, out=None):
        request = tensors.forward_request(hidden, topk_ids, topk_weights, layer, output_dtype,
                                          hidden_dtype, request_id, out)
        return await self._call("Forward", request, timeout)

    async def forward(self, hidden, topk_ids, topk_weights, layer=0, output_dtype="bf16",
                      hidden_dtype=None, request_id="", timeout=None, out=None):
        response = await self.forward_response(hidden, topk_ids, topk_weights, layer,
                                               output_dtype, hidden_dtype, request_id, timeout,
                                               out)
        if out is not None:
            return out.array
        return tensors.decode_output(response.output)

    async def register_memory(self, region, name=None, timeout=None):
        """See gcmoe.Client.register_memory."""
        return await self._call("RegisterMemory", _shm.register_request(region, name), timeout)

    async def unregister_memory(self, region, timeout=None):
        """See gcmoe.Client.unregister_memory."""
        name = region if isinstance(region, str) else region.name
        return await self._call("UnregisterMemory", moe_pb2.UnregisterMemoryRequest(name=name),
                                timeout)

    def forward_stream(self, timeout=None):
        """Opens a ForwardStream (see gcmoe.aio.ForwardStream and gcmoe.Client.forward_stream)."""
        return ForwardStream(self._stub, self._metadata, timeout)

    async def close(self):
        await self._channel.close()

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        await self.close()


class ForwardStream:
    """gcmoe.ForwardStream on grpc.aio, opened by gcmoe.aio.Client.forward_stream():

        async with client.forward_stream() as stream:
            y = await stream.forward(hidden, topk_ids, topk_weights, layer=0)
            for layer in range(info.layers):
                stream.send(hidden, topk_ids, topk_weights, layer=layer)   # not awaited
            ys = [await stream.receive() for _ in range(info.layers)]

    The same methods as gcmoe.ForwardStream, awaited, except send(), which queues the request
    and returns at once. Tasks may share a stream, each awaiting its own reply. Cancelling a
    task while it reads the stream cancels the stream (gRPC's asyncio calls work so).
    """

    def __init__(self, stub, metadata, timeout):
        self._requests = asyncio.Queue()
        self._read_lock = asyncio.Lock()  # one reader of the reply stream at a time
        self._in_flight = InFlight()
        self._closed = False
        self._call = stub.ForwardStream(self._request_iterator(), timeout=timeout,
                                        metadata=metadata)

    async def _request_iterator(self):
        # gRPC writes these from a task of its own, so send() never waits for the wire (and a
        # caller that sends many before it reads cannot block on flow control).
        while True:
            request = await self._requests.get()
            if request is None:
                return
            yield request

    def _put(self, request, for_receive):
        if self._closed:
            raise RuntimeError("the ForwardStream is closed")
        future = asyncio.get_running_loop().create_future()
        self._in_flight.add(future, request.request_id, for_receive)
        self._requests.put_nowait(request)
        return future

    async def _read_one(self):
        if self._in_flight.broken is not None:
            self._in_flight.fail(self._in_flight.broken)
            return
        try:
            reply = await self._call.read()
        except grpc.RpcError as error:
            self._in_flight.fail(from_rpc_error(error, _STREAM_RPC))
            return
        except asyncio.CancelledError:
            self._in_flight.fail(
                GcmoeError(grpc.StatusCode.CANCELLED, "the stream was cancelled", _STREAM_RPC))
            if self._closed:
                return  # close() cancelled it; the waiting requests have their error
            raise
        if reply is grpc.aio.EOF:
            self._in_flight.fail(unanswered(len(self._in_flight.waiting)))
            return
        self._in_flight.resolve(reply)

    async def _wait(self, future):
        while not future.done():
            async with self._read_lock:
                if not future.done():
                    await self._read_one()
        return future.result()

    def send(self, hidden, topk_ids, topk_weights, layer=0, output_dtype="bf16",
             hidden_dtype=None, request_id="", out=None):
        request = tensors.forward_request(hidden, topk_ids, topk_weights, layer, output_dtype,
                                          hidden_dtype, request_id, out)
        self._put(request, for_receive=True)

    async def receive_response(self):
        return await self._wait(self._in_flight.next_for_receive())

    async def receive(self):
        return tensors.decode_output((await self.receive_response()).output)

    async def forward_response(self, hidden, topk_ids, topk_weights, layer=0,
                               output_dtype="bf16", hidden_dtype=None, request_id="", out=None):
        request = tensors.forward_request(hidden, topk_ids, topk_weights, layer, output_dtype,
                                          hidden_dtype, request_id, out)
        return await self._wait(self._put(request, for_receive=False))

    async def forward(self, hidden, topk_ids, topk_weights, layer=0, output_dtype="bf16",
                      hidden_dtype=None, request_id="", out=None):
        response = await self.forward_response(hidden, topk_ids, topk_weights, layer,
                                               output_dtype, hidden_dtype, request_id, out)
        if out is not None:
            return out.array
        return tensors.decode_output(response.output)

    @property
    def pending(self):
        return len(self._in_flight.unreceived)

    async def close(self):
        """Ends the stream; requests still in flight are cancelled and fail with CANCELLED."""
        if self._closed:
            return
        self._closed = True
        self._requests.put_nowait(None)
        if self._in_flight.waiting:
            self._call.cancel()
            self._in_flight.fail(GcmoeError(
                grpc.StatusCode.CANCELLED,
                f"the stream was closed with {len(self._in_flight.waiting)} request(s) in flight",
                _STREAM_RPC))
        else:
            try:
                while await self._call.read() is not grpc.aio.EOF:
                    pass
            except grpc.RpcError:
                pass  # the stream's own end carries nothing the caller is waiting for
        # Errors nobody will receive are not "never retrieved".
        for future in self._in_flight.unreceived:
            if future.done() and not future.cancelled():
                future.exception()

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        await self.close()
