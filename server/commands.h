// The service's `gcmoe` subcommands, one function each (the command table is tools/main.cc);
// argv[0] is the subcommand's own name so that Flags::Parse(argc, argv, 1) reads its flags. Each
// returns the process exit code.
#pragma once

#include <cstdio>

namespace gcmoe::server {

int RunServeCommand(int argc, char** argv);        // serve.cc: coordinator + local ranks
int RunCoordinatorCommand(int argc, char** argv);  // coordinator_main.cc
int RunRankCommand(int argc, char** argv);         // rank_main.cc

// A role2 timing probe build (CMake GCMOE_ROLE2_PROBE, kernels/role2_probe.h) computes wrong
// outputs, so the processes that compute served results (`rank`, and `serve`, which starts them)
// refuse it: true, after saying so, in such a build.
inline bool RefuseProbeBuild(const char* command) {
#ifdef GCMOE_ROLE2_PROBE_NAME
  std::fprintf(stderr,
               "gcmoe %s: this binary is a role2 timing probe build (GCMOE_ROLE2_PROBE=%s) whose "
               "outputs are wrong; it does not serve\n",
               command, GCMOE_ROLE2_PROBE_NAME);
  return true;
#else
  (void)command;
  return false;
#endif
}

}  // namespace gcmoe::server
