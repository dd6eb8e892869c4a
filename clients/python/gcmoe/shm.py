"""Registered memory: a POSIX shared-memory object this process creates, NumPy arrays laid out
in it, and the references a Forward call sends instead of their bytes (the service must run
with server.allow_registered_memory on, on the same host).

    with gcmoe.SharedMemoryRegion(1 << 20) as shm, gcmoe.Client(addr) as client:
        client.register_memory(shm)                  # once; the name defaults to the object's
        hidden = shm.array((T, H), np.float32)       # NumPy views of the shared memory
        ...                                          # fill hidden, topk_ids, topk_weights
        out = shm.array((T, H), np.float32)
        client.forward(hidden, topk_ids, topk_weights, output_dtype="fp32", out=out)
        y = out.array                                # the output, written there by the service
        client.unregister_memory(shm)
"""
import mmap
import os
import secrets

import numpy as np

from gcmoe.v1 import moe_pb2

_ALIGNMENT = 64


def _place(next_free, alignment, shape, itemsize, offset, byte_size, what):
    """Where an array of `shape` and `itemsize` goes in a registration of `byte_size` bytes whose
    arrays so far end at `next_free`: (offset, nbytes), at `offset` or else the next `alignment`
    boundary. ValueError, naming `what` holds the bytes, when it does not fit."""
    if offset is None:
        offset = -(-next_free // alignment) * alignment
    nbytes = int(np.prod(shape, dtype=np.int64)) * itemsize
    if offset < 0 or offset + nbytes > byte_size:
        raise ValueError(f"{nbytes} bytes at offset {offset} do not fit in {what}'s "
                         f"{byte_size} bytes")
    return offset, nbytes


class RegionArray:
    """A dense little-endian array inside a SharedMemoryRegion: `array` is its NumPy view,
    `offset` and `nbytes` where it lies. Pass it to forward() in place of a NumPy array."""

    def __init__(self, region, offset, shape, dtype):
        self.region = region
        self.offset = offset
        self.dtype = np.dtype(dtype).newbyteorder("<")
        self.shape = tuple(int(d) for d in shape)
        self.nbytes = int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize
        self.array = np.ndarray(self.shape, dtype=self.dtype, buffer=region.buffer,
                                offset=offset)

    def reference(self):
        """The gcmoe.v1.TensorRegion naming these bytes."""
        return moe_pb2.TensorRegion(region=self.region.name, offset=self.offset,
                                    byte_size=self.nbytes)


class SharedMemoryRegion:
    """A new POSIX shared-memory object of `byte_size` bytes, readable and writable by this user
    only. `key` is what RegisterMemory maps ("/gcmoe_py-..."); `name` the registration's name
    (default: the key without its slash). array() hands out aligned arrays in it, one after the
    other. close() removes the object; this process's mapping goes with the last NumPy view of
    it, and the service keeps its own until the registration is dropped and its last call has
    finished.

    Linux: the object is created where shm_open puts it, /dev/shm (O_EXCL, mode 0600)."""

    def __init__(self, byte_size, name=None):
        if int(byte_size) <= 0:
            raise ValueError(f"byte_size: {byte_size}, expected at least 1")
        base = "gcmoe_py-" + secrets.token_hex(8)  # "gcmoe-" is the service's own prefix
        self.key = "/" + base
        self.name = name or base
        self.byte_size = int(byte_size)
        self._path = "/dev/shm/" + base
        fd = os.open(self._path, os.O_CREAT | os.O_EXCL | os.O_RDWR | os.O_CLOEXEC, 0o600)
        try:
            os.ftruncate(fd, self.byte_size)
            self._map = mmap.mmap(fd, self.byte_size)
        except BaseException:
            os.unlink(self._path)
            raise
        finally:
            os.close(fd)
        self._next = 0

    @property
    def buffer(self):
        return self._map

    def array(self, shape, dtype, offset=None):
        """A RegionArray of `shape` and `dtype` at `offset` (default: the next free 64-byte
        boundary)."""
        dtype = np.dtype(dtype)
        offset, nbytes = _place(self._next, _ALIGNMENT, shape, dtype.itemsize, offset,
                                self.byte_size, "the region")
        self._next = max(self._next, offset + nbytes)
        return RegionArray(self, offset, shape, dtype)

    def close(self):
        """Removes the object (the name goes at once); the mapping goes now, or with the last
        NumPy view of it."""
        try:
            os.unlink(self._path)
        except FileNotFoundError:
            pass
        try:
            self._map.close()
        except BufferError:
            pass  # a view still exists: the mapping goes with the last one

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def register_request(region, name=None):
    """The gcmoe.v1.RegisterMemoryRequest for the whole of `region` (a SharedMemoryRegion, or a
    gcmoe.CudaMemory, which makes its own)."""
    if hasattr(region, "ipc_handle"):
        return region.register_request(name)
    return moe_pb2.RegisterMemoryRequest(
        name=name or region.name,
        posix_shm=moe_pb2.PosixShmMemory(key=region.key, offset=0, byte_size=region.byte_size))
