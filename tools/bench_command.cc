// `gcmoe bench SUBCOMMAND`: benchmarks: `layer` (tools/bench_layer.cc), `ep`
// (tools/bench_ep.cc).
#include <cstdio>
#include <cstring>

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include "tools/bench_ep.h"
#include "tools/bench_layer.h"
#include "tools/bench_serve.h"
#include "tools/commands.h"

namespace gcmoe::tools {

int RunBenchCommand(int argc, char** argv) {
  if (argc < 2 || std::strcmp(argv[1], "--help") == 0 || std::strcmp(argv[1], "-h") == 0) {
    std::fprintf(argc < 2 ? stderr : stdout,
                 "usage: gcmoe bench layer|ep|serve --config FILE [flags]   (gcmoe bench layer --help)\n\n"
                 "  layer   one rank's MoE layer on the GPU: median latency over CUDA graph\n"
                 "          replays, the layer's memory floor and the fraction of it reached\n"
                 "  ep      one layer over P GPUs (a rank process each): the fused GC-MoE\n"
                 "          exchange against the NCCL all-to-all baseline, balancer off and on\n"
                 "  serve   the service from a client: Forward against the gRPC floor (Echo) and\n"
                 "          the engine, with where every call's time went, stage by stage\n");
    return argc < 2 ? 2 : 0;
  }
  // Tables go to stdout; log entries (the engine's, engine.cuda.trace_role2's summaries) to
  // stderr, so that they never end up inside a table that is redirected to a file.
  spdlog::set_default_logger(spdlog::stderr_color_mt("gcmoe-bench"));
  if (std::strcmp(argv[1], "layer") == 0) return RunBenchLayer(argc - 1, argv + 1);
  if (std::strcmp(argv[1], "ep") == 0) return RunBenchEp(argc - 1, argv + 1);
  if (std::strcmp(argv[1], "serve") == 0) return RunBenchServe(argc - 1, argv + 1);
  std::fprintf(stderr, "gcmoe bench: unknown benchmark \"%s\" (expected layer, ep or serve)\n",
               argv[1]);
  return 2;
}

}  // namespace gcmoe::tools
