import os
from typing import Any, List, Optional, Tuple, Union

import grpc

DEFAULT_MAX_MESSAGE_BYTES: int

Pem = Union[str, bytes, os.PathLike[str]]

class TLS:
    ca: Optional[bytes]
    cert: Optional[bytes]
    key: Optional[bytes]
    server_name: Optional[str]
    def __init__(self, ca: Optional[Pem] = ..., cert: Optional[Pem] = ...,
                 key: Optional[Pem] = ..., server_name: Optional[str] = ...) -> None: ...
    def credentials(self) -> grpc.ChannelCredentials: ...
    def channel_options(self) -> List[Tuple[str, Any]]: ...

TlsArgument = Union[None, bool, TLS, grpc.ChannelCredentials]

def channel_options(max_message_bytes: int) -> List[Tuple[str, Any]]: ...
def credentials(tls: TlsArgument
                ) -> Tuple[Optional[grpc.ChannelCredentials], List[Tuple[str, Any]]]: ...
def call_metadata(token: Optional[str], addr: str, tls: TlsArgument
                  ) -> Optional[Tuple[Tuple[str, str], ...]]: ...
def is_loopback(addr: str) -> bool: ...
