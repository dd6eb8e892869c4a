// Programmatic dependent launch (PDL) of a role kernel behind the kernel before it in its stream:
// the grid may be scheduled once every CTA of the one before has executed
// `griddepcontrol.launch_dependents` (or exited), and waits in `griddepcontrol.wait` for what
// it must not read early. Host side, for the role launchers.
#pragma once

#include <cuda_runtime.h>

namespace gcmoe::kernels {

// `config` launches programmatically when `early` (attribute must outlive the launch call).
inline void AllowProgrammaticLaunch(bool early, cudaLaunchConfig_t* config,
                                    cudaLaunchAttribute* attribute) {
  if (!early) return;
  *attribute = {};
  attribute->id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute->val.programmaticStreamSerializationAllowed = 1;
  config->attrs = attribute;
  config->numAttrs = 1;
}

}  // namespace gcmoe::kernels
