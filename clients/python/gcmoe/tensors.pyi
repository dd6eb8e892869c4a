from typing import Any, Optional, Tuple, Union

import numpy as np
import numpy.typing as npt

from gcmoe.v1 import moe_pb2

class Fp8Hidden:
    codes: npt.NDArray[np.uint8]
    scales: npt.NDArray[np.uint8]
    def __init__(self, codes: npt.ArrayLike, scales: npt.ArrayLike) -> None: ...
    @classmethod
    def quantize(cls, hidden: npt.ArrayLike) -> "Fp8Hidden": ...

def encode_hidden(hidden: Union[npt.NDArray[Any], Fp8Hidden], hidden_dtype: Optional[str] = ...
                  ) -> Tuple[moe_pb2.Tensor, Optional[moe_pb2.Tensor]]: ...
def forward_request(hidden: Union[npt.NDArray[Any], Fp8Hidden], topk_ids: npt.ArrayLike,
                    topk_weights: npt.ArrayLike, layer: int = ..., output_dtype: str = ...,
                    hidden_dtype: Optional[str] = ...,
                    request_id: str = ...) -> moe_pb2.ForwardRequest: ...
def decode_output(tensor: moe_pb2.Tensor) -> np.ndarray: ...
