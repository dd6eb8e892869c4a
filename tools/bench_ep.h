// `gcmoe bench ep`: one MoE layer over the GPUs of this host, fused exchange against the NCCL
// all-to-all baseline (tools/bench_ep.cc).
#pragma once

namespace gcmoe::tools {

// argv[0] = "ep". Returns the process exit code.
int RunBenchEp(int argc, char** argv);

}  // namespace gcmoe::tools
