from typing import Any, Optional, Tuple, Union

import numpy as np
import numpy.typing as npt

from gcmoe.shm import RegionArray
from gcmoe.v1 import moe_pb2

class Fp8Hidden:
    codes: npt.NDArray[np.uint8]
    scales: npt.NDArray[np.uint8]
    def __init__(self, codes: npt.ArrayLike, scales: npt.ArrayLike) -> None: ...
    @classmethod
    def quantize(cls, hidden: npt.ArrayLike) -> "Fp8Hidden": ...

def encode_hidden(hidden: Union[npt.NDArray[Any], Fp8Hidden, RegionArray], hidden_dtype: Optional[str] = ...
                  ) -> Tuple[moe_pb2.Tensor, Optional[moe_pb2.Tensor]]: ...
def forward_request(hidden: Union[npt.NDArray[Any], Fp8Hidden, RegionArray],
                    topk_ids: Union[npt.ArrayLike, RegionArray],
                    topk_weights: Union[npt.ArrayLike, RegionArray], layer: int = ...,
                    output_dtype: str = ..., hidden_dtype: Optional[str] = ...,
                    request_id: str = ...,
                    out: Optional[RegionArray] = ...) -> moe_pb2.ForwardRequest: ...
def decode_output(tensor: moe_pb2.Tensor) -> np.ndarray: ...
