// GCMOE_HOST_DEVICE marks the small functions that host C++ and CUDA device code both call.
#pragma once

#if defined(__CUDACC__)
#define GCMOE_HOST_DEVICE __host__ __device__
#else
#define GCMOE_HOST_DEVICE
#endif
