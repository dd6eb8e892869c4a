// CreateCudaBackend and NCCL of a build without the CUDA toolkit.
#include "engine/backend.h"
#include "engine/nccl_comm.h"

namespace gcmoe::engine {

Result<std::unique_ptr<Backend>> CreateCudaBackend(const BackendOptions& /*options*/) {
  return Unimplemented(
      "cuda backend: this gcmoe was built without CUDA (configure with nvcc on the PATH and "
      "GCMOE_WITH_CUDA=ON)");
}

Result<std::string> NewNcclUniqueId() {
  return Unimplemented("nccl: this gcmoe was built without CUDA");
}

std::string NcclVersionText() { return "NCCL: this gcmoe was built without CUDA"; }

}  // namespace gcmoe::engine
