"""Typed errors of the gcmoe client. Each keeps the server's status code and its message, which
names the field at fault and the value expected."""
import grpc


class GcmoeError(Exception):
    """A failed call: `code` is the grpc.StatusCode, `message` the server's words."""

    def __init__(self, code, message, rpc=""):
        self.code = code
        self.message = message
        self.rpc = rpc
        name = code.name if isinstance(code, grpc.StatusCode) else str(code)
        super().__init__(f"{rpc + ': ' if rpc else ''}{name}: {message}")


class InvalidArgumentError(GcmoeError, ValueError):
    """The request is malformed: wrong dtype, shape, expert id, ... (INVALID_ARGUMENT)."""


class NotFoundError(GcmoeError, LookupError):
    """A layer or model the service does not have (NOT_FOUND)."""


class ResourceExhaustedError(GcmoeError):
    """Over the service's capacity, its queue or its message limit (RESOURCE_EXHAUSTED)."""


class UnavailableError(GcmoeError):
    """Not every rank is ready, or the service cannot be reached (UNAVAILABLE)."""


class DeadlineExceededError(GcmoeError, TimeoutError):
    """The call's deadline passed before it completed (DEADLINE_EXCEEDED)."""


class UnauthenticatedError(GcmoeError):
    """The service checks bearer tokens (server.auth.tokens_file) and the call carried none, or
    one it does not hold (UNAUTHENTICATED). The message says which, never the token."""


_BY_CODE = {
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgumentError,
    grpc.StatusCode.NOT_FOUND: NotFoundError,
    grpc.StatusCode.RESOURCE_EXHAUSTED: ResourceExhaustedError,
    grpc.StatusCode.UNAVAILABLE: UnavailableError,
    grpc.StatusCode.DEADLINE_EXCEEDED: DeadlineExceededError,
    grpc.StatusCode.UNAUTHENTICATED: UnauthenticatedError,
}


def from_rpc_error(error, rpc=""):
    """The typed error for a grpc.RpcError (or grpc.aio.AioRpcError)."""
    code = error.code()
    return _BY_CODE.get(code, GcmoeError)(code, error.details() or "", rpc)


_STATUS_CODES = {code.value[0]: code for code in grpc.StatusCode}


def from_status(code, message, rpc=""):
    """The typed error for a status carried in a message (a ForwardStream reply's `code`, an
    integer gRPC status code, and its `message`)."""
    status = _STATUS_CODES.get(int(code), grpc.StatusCode.UNKNOWN)
    return _BY_CODE.get(status, GcmoeError)(status, message, rpc)
