// Launchers of the three role kernels of a GC-MoE layer replay (DESIGN.md §6). Raw parameters
// and a stream in, cudaError_t out; layer_graph.cu captures them into one graph.
#pragma once

#include <cstddef>

#include <cuda_runtime.h>

#include "kernels/layer_types.h"

namespace gcmoe::kernels {

// Loads every role kernel (each grouped-GEMM instantiation included) and sets its shared-memory
// limit. A kernel that spins on another kernel deadlocks if that kernel's module is still to be
// loaded lazily, so this runs before the first capture or launch.
cudaError_t LoadLayerKernels(const LayerDims& dims);
// The per-file parts of LoadLayerKernels.
cudaError_t LoadDispatchRole1Kernel(const LayerDims& dims);
cudaError_t LoadGroupedGemmKernels();
cudaError_t LoadFinalizeRole3Kernel();

// Dynamic shared memory of each role.
size_t Role1SmemBytes(const LayerDims& dims);
size_t Role2SmemBytes(int block_rows);

// Resident role2 CTAs per SM for a block size (from the occupancy calculator).
cudaError_t Role2BlocksPerSm(int block_rows, int* blocks_per_sm);

// role1: quantize this rank's tokens, route every assignment into its computing rank's receive
// index, barrier (grid, then cross-rank tag 1), pull ring blocks and release their full counters.
cudaError_t LaunchDispatchRole1(const LayerParams& params, int grid, cudaStream_t stream);
// role2: the grouped GEMM task stream (shared W1, routed W1, shared W2, routed W2).
cudaError_t LaunchGroupedGemmRole2(const LayerParams& params, int grid, cudaStream_t stream);
// role3: combine readiness, slot-order reduction into the output, signal reset, parity flip.
cudaError_t LaunchFinalizeRole3(const LayerParams& params, int grid, cudaStream_t stream);

}  // namespace gcmoe::kernels
