// `gcmoe bench layer`: the GPU layer harness of DESIGN.md §7.
#pragma once

namespace gcmoe::tools {

// argv[0] = "layer". Returns the process exit code.
int RunBenchLayer(int argc, char** argv);

}  // namespace gcmoe::tools
