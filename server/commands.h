// The service's `gcmoe` subcommands, one function each (the command table is tools/main.cc);
// argv[0] is the subcommand's own name so that Flags::Parse(argc, argv, 1) reads its flags. Each
// returns the process exit code.
#pragma once

namespace gcmoe::server {

int RunServeCommand(int argc, char** argv);        // serve.cc: coordinator + local ranks
int RunCoordinatorCommand(int argc, char** argv);  // coordinator_main.cc
int RunRankCommand(int argc, char** argv);         // rank_main.cc

}  // namespace gcmoe::server
