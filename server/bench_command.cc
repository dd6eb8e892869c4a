// `gcmoe bench SUBCOMMAND`: benchmarks. Today one: `layer` (server/bench_layer.cc).
#include <cstdio>
#include <cstring>

#include "server/bench_layer.h"
#include "server/commands.h"

namespace gcmoe::server {

int RunBenchCommand(int argc, char** argv) {
  if (argc < 2 || std::strcmp(argv[1], "--help") == 0 || std::strcmp(argv[1], "-h") == 0) {
    std::fprintf(argc < 2 ? stderr : stdout,
                 "usage: gcmoe bench layer --config FILE [flags]   (gcmoe bench layer --help)\n\n"
                 "  layer   one rank's MoE layer on the GPU: median latency over CUDA graph\n"
                 "          replays, the layer's memory floor and the fraction of it reached\n");
    return argc < 2 ? 2 : 0;
  }
  if (std::strcmp(argv[1], "layer") == 0) return RunBenchLayer(argc - 1, argv + 1);
  std::fprintf(stderr, "gcmoe bench: unknown benchmark \"%s\" (expected layer)\n", argv[1]);
  return 2;
}

}  // namespace gcmoe::server
