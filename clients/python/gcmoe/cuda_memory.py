"""Registered GPU memory: an allocation of this process on a GPU of the service's host, exported
with CUDA IPC, whose arrays a Forward call names instead of sending their bytes. The service
must run the cuda backend with server.allow_registered_memory on; each of its ranks opens the
allocation and copies the activations from it and the output into it on the GPU, so they never
pass through host memory. Only hidden (BF16 or FP32) and the output may live there: the routing
is read on the host and goes inline (or in a SharedMemoryRegion).

With PyTorch (the allocation of a tensor's storage; any CUDA tensor works):

    buffer = torch.empty(64 << 20, dtype=torch.uint8, device="cuda:0")
    gpu = gcmoe.CudaMemory.from_torch(buffer)
    client.register_memory(gpu)                      # once
    hidden = gpu.array((T, H), "bf16")               # DeviceArray: offset, shape, dtype
    out = gpu.array((T, H), "bf16")
    gpu.torch_view(buffer, hidden).copy_(x)          # x: a [T, H] torch.bfloat16 CUDA tensor
    torch.cuda.synchronize()                         # the service reads what the GPU holds
    client.forward(hidden, topk_ids, topk_weights, out=out)
    y = gpu.torch_view(buffer, out)                  # the output, written there by the service
    client.unregister_memory(gpu)

Without PyTorch, CudaMemory.from_pointer(address, byte_size, device) exports any device memory
of this process through the CUDA driver, and CudaMemory(ipc_handle, device, byte_size, offset)
takes the 64 bytes of a cudaIpcMemHandle_t made elsewhere (offset: where the registered bytes
start in the allocation the handle names).
"""
import ctypes

import numpy as np

from gcmoe.shm import RegionArray, _place
from gcmoe.v1 import moe_pb2

_ALIGNMENT = 256
_DTYPES = {"bf16": np.dtype(np.uint16), "fp32": np.dtype(np.float32)}


class DeviceArray(RegionArray):
    """A dense [shape] array of "bf16" or "fp32" at `offset` of a CudaMemory: pass it to forward()
    as hidden, or as out=. It has no host view (`array` is None)."""

    def __init__(self, region, offset, shape, dtype):  # pylint: disable=super-init-not-called
        self.region = region
        self.offset = int(offset)
        self.dtype = np.dtype(dtype).newbyteorder("<")
        self.shape = tuple(int(d) for d in shape)
        self.nbytes = int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize
        self.array = None


class CudaMemory:
    """Bytes [offset, offset + byte_size) of the CUDA allocation `ipc_handle` (64 bytes, from
    cudaIpcGetMemHandle) names, on GPU `device` (numbered as the service's processes number
    them). `name` is the registration's name (default: one of its own). array() hands out
    DeviceArrays in it, one after the other."""

    def __init__(self, ipc_handle, device, byte_size, offset=0, name=None):
        ipc_handle = bytes(ipc_handle)
        if len(ipc_handle) != 64:
            raise ValueError(f"ipc_handle: {len(ipc_handle)} bytes, expected the 64 bytes of a "
                             "cudaIpcMemHandle_t")
        if int(byte_size) <= 0:
            raise ValueError(f"byte_size: {byte_size}, expected at least 1")
        self.ipc_handle = ipc_handle
        self.device = int(device)
        self.byte_size = int(byte_size)
        self.offset = int(offset)
        self.name = name or "gcmoe_py-cuda-" + ipc_handle[:8].hex() + f"-{self.offset}"
        self._next = 0

    @classmethod
    def from_pointer(cls, pointer, byte_size, device, name=None):
        """`byte_size` bytes at device address `pointer` of this process (from any CUDA library;
        the calling thread's current context must own it), exported through the CUDA driver:
        the handle names the allocation holding `pointer`, and the registration starts where
        `pointer` does in it."""
        cuda = ctypes.CDLL("libcuda.so.1")
        base = ctypes.c_uint64()
        size = ctypes.c_size_t()
        status = cuda.cuMemGetAddressRange_v2(ctypes.byref(base), ctypes.byref(size),
                                              ctypes.c_uint64(pointer))
        if status != 0:
            raise ValueError(f"pointer: {pointer:#x} is not device memory of this process's "
                             f"current CUDA context (cuMemGetAddressRange: CUDA error {status})")
        if pointer + int(byte_size) > base.value + size.value:
            raise ValueError(f"byte_size: {byte_size} bytes from {pointer:#x} run past the end "
                             f"of its allocation ({size.value} bytes from {base.value:#x})")
        handle = (ctypes.c_char * 64)()
        status = cuda.cuIpcGetMemHandle(handle, ctypes.c_uint64(base.value))
        if status != 0:
            raise ValueError(f"pointer: its allocation cannot be exported (cuIpcGetMemHandle: "
                             f"CUDA error {status}); memory of a virtual-memory allocator, such "
                             "as PyTorch's expandable segments, cannot")
        return cls(bytes(handle), device, byte_size, pointer - base.value, name)

    @classmethod
    def from_torch(cls, tensor, name=None):
        """The whole storage of a CUDA torch.Tensor (PyTorch's allocator hands out pieces of
        larger allocations: the registration starts where the storage does)."""
        if not tensor.is_cuda:
            raise ValueError("tensor: on the CPU, expected a CUDA tensor")
        storage = tensor.untyped_storage()
        return cls.from_pointer(storage.data_ptr(), storage.nbytes(), tensor.device.index, name)

    def array(self, shape, dtype, offset=None):
        """A DeviceArray of `shape` and "bf16" or "fp32" at `offset` from the registration's start
        (default: the next free 256-byte boundary)."""
        if dtype not in _DTYPES:
            raise ValueError(f"dtype: {dtype!r}, expected 'bf16' or 'fp32'")
        dtype = _DTYPES[dtype]
        offset, nbytes = _place(self._next, _ALIGNMENT, shape, dtype.itemsize, offset,
                                self.byte_size, "the registration")
        self._next = max(self._next, offset + nbytes)
        return DeviceArray(self, offset, shape, dtype)

    @staticmethod
    def torch_view(storage_tensor, array):
        """`array` as a torch.Tensor over the storage of `storage_tensor` (the tensor this
        CudaMemory was made from)."""
        import torch  # pylint: disable=import-outside-toplevel
        dtype = torch.bfloat16 if array.dtype.itemsize == 2 else torch.float32
        flat = storage_tensor.new_empty(0, dtype=torch.uint8).set_(
            storage_tensor.untyped_storage())
        return flat[array.offset:array.offset + array.nbytes].view(dtype).view(array.shape)

    def register_request(self, name=None):
        """The gcmoe.v1.RegisterMemoryRequest for the whole registration."""
        return moe_pb2.RegisterMemoryRequest(
            name=name or self.name,
            cuda_ipc=moe_pb2.CudaIpcMemory(ipc_handle=self.ipc_handle, device_id=self.device,
                                           byte_size=self.byte_size, offset=self.offset))
