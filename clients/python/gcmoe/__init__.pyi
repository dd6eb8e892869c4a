from gcmoe import aio as aio
from gcmoe import numerics as numerics
from gcmoe.channel import TLS as TLS
from gcmoe.client import Client as Client
from gcmoe.cuda_memory import CudaMemory as CudaMemory
from gcmoe.cuda_memory import DeviceArray as DeviceArray
from gcmoe.errors import DeadlineExceededError as DeadlineExceededError
from gcmoe.errors import GcmoeError as GcmoeError
from gcmoe.errors import InvalidArgumentError as InvalidArgumentError
from gcmoe.errors import NotFoundError as NotFoundError
from gcmoe.errors import ResourceExhaustedError as ResourceExhaustedError
from gcmoe.errors import UnauthenticatedError as UnauthenticatedError
from gcmoe.errors import UnavailableError as UnavailableError
from gcmoe.shm import RegionArray as RegionArray
from gcmoe.shm import SharedMemoryRegion as SharedMemoryRegion
from gcmoe.stream import ForwardStream as ForwardStream
from gcmoe.tensors import Fp8Hidden as Fp8Hidden

__version__: str
