from typing import Any, Optional, Sequence, Tuple, Union

import grpc
import numpy as np
import numpy.typing as npt

from gcmoe.client import Hidden
from gcmoe.v1 import moe_pb2

class Client:
    addr: str
    def __init__(self, addr: str = ..., *, tls: Union[bool, grpc.ChannelCredentials] = ...,
                 token: Optional[str] = ..., timeout: Optional[float] = ...,
                 max_message_bytes: int = ...,
                 options: Sequence[Tuple[str, Any]] = ...) -> None: ...
    async def info(self, timeout: Optional[float] = ...) -> moe_pb2.ModelInfo: ...
    async def stats(self, timeout: Optional[float] = ...) -> moe_pb2.Stats: ...
    async def forward_response(self, hidden: Hidden, topk_ids: npt.ArrayLike,
                               topk_weights: npt.ArrayLike, layer: int = ...,
                               output_dtype: str = ..., hidden_dtype: Optional[str] = ...,
                               request_id: str = ...,
                               timeout: Optional[float] = ...) -> moe_pb2.ForwardResponse: ...
    async def forward(self, hidden: Hidden, topk_ids: npt.ArrayLike,
                      topk_weights: npt.ArrayLike, layer: int = ..., output_dtype: str = ...,
                      hidden_dtype: Optional[str] = ..., request_id: str = ...,
                      timeout: Optional[float] = ...) -> np.ndarray: ...
    async def close(self) -> None: ...
    async def __aenter__(self) -> "Client": ...
    async def __aexit__(self, *exc: object) -> None: ...
