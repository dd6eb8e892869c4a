from typing import TYPE_CHECKING, Any, Optional, Sequence, Union

import numpy as np
import numpy.typing as npt

from gcmoe.v1 import moe_pb2

if TYPE_CHECKING:
    from gcmoe.cuda_memory import CudaMemory

class RegionArray:
    region: "SharedMemoryRegion"
    offset: int
    nbytes: int
    dtype: np.dtype[Any]
    shape: tuple[int, ...]
    array: npt.NDArray[Any]
    def __init__(self, region: "SharedMemoryRegion", offset: int, shape: Sequence[int],
                 dtype: npt.DTypeLike) -> None: ...
    def reference(self) -> moe_pb2.TensorRegion: ...

class SharedMemoryRegion:
    key: str
    name: str
    byte_size: int
    def __init__(self, byte_size: int, name: Optional[str] = ...) -> None: ...
    @property
    def buffer(self) -> memoryview: ...
    def array(self, shape: Sequence[int], dtype: npt.DTypeLike,
              offset: Optional[int] = ...) -> RegionArray: ...
    def close(self) -> None: ...
    def __enter__(self) -> "SharedMemoryRegion": ...
    def __exit__(self, *exc: object) -> None: ...

def register_request(region: Union[SharedMemoryRegion, "CudaMemory"],
                     name: Optional[str] = ...) -> moe_pb2.RegisterMemoryRequest: ...
