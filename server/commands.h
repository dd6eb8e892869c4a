// Every `gcmoe` subcommand, one function each; argv[0] is the subcommand's own name so that
// Flags::Parse(argc, argv, 1) reads its flags. Each returns the process exit code.
#pragma once

namespace gcmoe::server {

int RunServeCommand(int argc, char** argv);        // serve.cc: coordinator + local ranks
int RunCoordinatorCommand(int argc, char** argv);  // coordinator_main.cc
int RunRankCommand(int argc, char** argv);         // rank_main.cc
int RunClientCommand(int argc, char** argv);       // client_command.cc: forward|info|stats|health
int RunConfigCommand(int argc, char** argv);       // config_command.cc: validate|show|default
int RunBalanceCommand(int argc, char** argv);      // balance_command.cc: eplb|replay
int RunBenchCommand(int argc, char** argv);        // bench_command.cc: layer
int RunWeightsCommand(int argc, char** argv);      // weights_command.cc: export|check

}  // namespace gcmoe::server
