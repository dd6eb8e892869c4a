from typing import Any, List, Optional, Tuple, Union

import grpc

DEFAULT_MAX_MESSAGE_BYTES: int

def channel_options(max_message_bytes: int) -> List[Tuple[str, Any]]: ...
def credentials(tls: Union[None, bool, grpc.ChannelCredentials]
                ) -> Optional[grpc.ChannelCredentials]: ...
def call_metadata(token: Optional[str]) -> Optional[Tuple[Tuple[str, str], ...]]: ...
