"""Forward calls on one long-lived ForwardStream: the blocking stream, and the bookkeeping of which
reply answers which request, which the asyncio stream (gcmoe.aio) shares.

The server answers the messages of a stream in the order they were sent, each reply with its own
status, so the client pairs replies with requests by position: every request in flight holds a
future, and whoever reads the next reply resolves the oldest one. A reply with an error status
fails only its own request; the stream goes on.
"""
import collections
import concurrent.futures
import queue
import threading

import grpc

from gcmoe import tensors
from gcmoe.errors import GcmoeError, from_rpc_error, from_status

RPC = "ForwardStream"


def reply_result(reply, request_id):
    """The ForwardResponse of a ForwardStreamResponse, or the typed error of its status."""
    # A request sent without an id gets one the server generates, so only a request that named
    # its id can be matched by it.
    if request_id and reply.request_id != request_id:
        # Only a server that breaks the in-order contract gets here; no later reply can be
        # trusted to belong to its request either.
        raise GcmoeError(grpc.StatusCode.INTERNAL,
                         f"reply for request_id {reply.request_id!r} where {request_id!r} was "
                         "next: the server answered out of order", RPC)
    if reply.code != 0:
        return from_status(reply.code, reply.message, RPC)
    return reply.response


def unanswered(count):
    return GcmoeError(grpc.StatusCode.INTERNAL,
                      f"the server ended the stream with {count} request(s) unanswered", RPC)


class InFlight:
    """The requests of one stream awaiting their replies, in send order, and those of send()
    whose replies receive() has not yet returned. Futures are concurrent.futures or asyncio
    ones; this class only orders them."""

    def __init__(self):
        self.waiting = collections.deque()  # (future, request_id), oldest first
        self.unreceived = collections.deque()  # futures of send(), oldest first
        self.broken = None  # the error that ended the stream, once it has ended

    def add(self, future, request_id, for_receive):
        if self.broken is not None:
            raise self.broken
        self.waiting.append((future, request_id))
        if for_receive:
            self.unreceived.append(future)

    def next_for_receive(self):
        if not self.unreceived:
            raise RuntimeError("receive(): every request sent with send() has been received")
        return self.unreceived.popleft()

    def resolve(self, reply):
        """Hands the next reply to the oldest request in flight."""
        future, request_id = self.waiting.popleft()
        try:
            result = reply_result(reply, request_id)
        except GcmoeError as error:
            future.set_exception(error)
            self.fail(error)
            return
        if isinstance(result, GcmoeError):
            future.set_exception(result)
        else:
            future.set_result(result)

    def fail(self, error):
        """The stream has ended with `error`: every request still in flight fails with it."""
        self.broken = error
        while self.waiting:
            future, _ = self.waiting.popleft()
            if not future.done():
                future.set_exception(error)


class ForwardStream:
    """Forward calls on one ForwardStream RPC, opened by gcmoe.Client.forward_stream():

        with client.forward_stream() as stream:
            y = stream.forward(hidden, topk_ids, topk_weights, layer=0)   # one call, answered
            for layer in range(info.layers):                              # pipelined:
                stream.send(hidden, topk_ids, topk_weights, layer=layer)  #   sent at once,
            ys = [stream.receive() for _ in range(info.layers)]           #   read in order

    forward() takes the arguments of Client.forward. A request the server refuses raises its
    typed error (gcmoe.NotFoundError, ...) from forward() or from the receive() that reads its
    reply, and the stream goes on; an error of the stream itself (the service went away, the
    stream's deadline passed) fails every request in flight and every later one. Threads may
    share a stream: each gets its own reply.
    """

    def __init__(self, stub, metadata, timeout):
        self._requests = queue.Queue()
        self._send_lock = threading.Lock()  # a request's place in `waiting` is its place on the wire
        self._read_lock = threading.Lock()  # one reader of the reply stream at a time
        self._in_flight = InFlight()
        self._closed = False
        self._replies = stub.ForwardStream(self._request_iterator(), timeout=timeout,
                                           metadata=metadata)

    def _request_iterator(self):
        # gRPC consumes this on a thread of its own, so send() never waits for the wire; None
        # ends the requests (the client half-closes and the server ends the stream).
        while True:
            request = self._requests.get()
            if request is None:
                return
            yield request

    def _put(self, request, for_receive):
        if self._closed:
            raise RuntimeError("the ForwardStream is closed")
        future = concurrent.futures.Future()
        with self._send_lock:
            self._in_flight.add(future, request.request_id, for_receive)
            self._requests.put(request)
        return future

    def _read_one(self):
        if self._in_flight.broken is not None:  # a request added as the stream ended
            self._in_flight.fail(self._in_flight.broken)
            return
        try:
            reply = next(self._replies)
        except StopIteration:
            self._in_flight.fail(unanswered(len(self._in_flight.waiting)))
            return
        except grpc.RpcError as error:
            self._in_flight.fail(from_rpc_error(error, RPC))
            return
        self._in_flight.resolve(reply)

    def _wait(self, future):
        # Whoever holds the read lock reads replies until its own has come, resolving the
        # futures of the requests sent before it on the way.
        while not future.done():
            with self._read_lock:
                if not future.done():
                    self._read_one()
        return future.result()

    def send(self, hidden, topk_ids, topk_weights, layer=0, output_dtype="bf16",
             hidden_dtype=None, request_id="", out=None):
        """Sends one request without waiting; receive() returns its output, in send order (with
        out=, a gcmoe.RegionArray, the output is written there and wait for it with
        receive_response(), not receive())."""
        request = tensors.forward_request(hidden, topk_ids, topk_weights, layer, output_dtype,
                                          hidden_dtype, request_id, out)
        self._put(request, for_receive=True)

    def receive_response(self):
        """The gcmoe.v1.ForwardResponse of the oldest send() not yet received."""
        return self._wait(self._in_flight.next_for_receive())

    def receive(self):
        """The [T, H] output of the oldest send() not yet received (see Client.forward)."""
        return tensors.decode_output(self.receive_response().output)

    def forward_response(self, hidden, topk_ids, topk_weights, layer=0, output_dtype="bf16",
                         hidden_dtype=None, request_id="", out=None):
        """Sends one request and waits for its reply: the whole gcmoe.v1.ForwardResponse."""
        request = tensors.forward_request(hidden, topk_ids, topk_weights, layer, output_dtype,
                                          hidden_dtype, request_id, out)
        return self._wait(self._put(request, for_receive=False))

    def forward(self, hidden, topk_ids, topk_weights, layer=0, output_dtype="bf16",
                hidden_dtype=None, request_id="", out=None):
        """One MoE layer on the stream; returns the [T, H] output (see Client.forward)."""
        response = self.forward_response(hidden, topk_ids, topk_weights, layer, output_dtype,
                                         hidden_dtype, request_id, out)
        if out is not None:
            return out.array
        return tensors.decode_output(response.output)

    @property
    def pending(self):
        """Requests sent with send() whose output receive() has not returned yet."""
        return len(self._in_flight.unreceived)

    def close(self):
        """Ends the stream. With every reply read the server ends it cleanly; requests still in
        flight are cancelled, as nobody would read their replies."""
        if self._closed:
            return
        self._closed = True
        with self._send_lock:
            self._requests.put(None)
        if self._in_flight.waiting:
            self._replies.cancel()
            return
        try:
            for _ in self._replies:
                pass
        except grpc.RpcError:
            pass  # the stream's own end carries nothing the caller is waiting for

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
