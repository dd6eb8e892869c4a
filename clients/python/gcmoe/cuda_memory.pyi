from typing import Any, Optional, Sequence

from gcmoe.shm import RegionArray
from gcmoe.v1 import moe_pb2

class DeviceArray(RegionArray):
    region: "CudaMemory"  # type: ignore[assignment]
    array: None  # type: ignore[assignment]
    def __init__(self, region: "CudaMemory", offset: int, shape: Sequence[int],
                 dtype: Any) -> None: ...

class CudaMemory:
    ipc_handle: bytes
    device: int
    byte_size: int
    offset: int
    name: str
    def __init__(self, ipc_handle: bytes, device: int, byte_size: int, offset: int = ...,
                 name: Optional[str] = ...) -> None: ...
    @classmethod
    def from_pointer(cls, pointer: int, byte_size: int, device: int,
                     name: Optional[str] = ...) -> "CudaMemory": ...
    @classmethod
    def from_torch(cls, tensor: Any, name: Optional[str] = ...) -> "CudaMemory": ...
    def array(self, shape: Sequence[int], dtype: str,
              offset: Optional[int] = ...) -> DeviceArray: ...
    @staticmethod
    def torch_view(storage_tensor: Any, array: DeviceArray) -> Any: ...
    def register_request(self, name: Optional[str] = ...) -> moe_pb2.RegisterMemoryRequest: ...
