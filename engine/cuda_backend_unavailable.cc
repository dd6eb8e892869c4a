// CreateCudaBackend of a build without the CUDA toolkit.
#include "engine/backend.h"

namespace gcmoe::engine {

Result<std::unique_ptr<Backend>> CreateCudaBackend(const BackendOptions& /*options*/) {
  return Unimplemented(
      "cuda backend: this gcmoe was built without CUDA (configure with nvcc on the PATH and "
      "GCMOE_WITH_CUDA=ON)");
}

}  // namespace gcmoe::engine
