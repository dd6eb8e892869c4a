// The tool commands of `gcmoe`, one function each (the command table is tools/main.cc); argv[0]
// is the subcommand's own name so that Flags::Parse(argc, argv, 1) reads its flags. Each returns
// the process exit code.
#pragma once

namespace gcmoe::tools {

int RunConfigCommand(int argc, char** argv);   // config_command.cc: validate|show|default
int RunBalanceCommand(int argc, char** argv);  // balance_command.cc: eplb|replay
int RunBenchCommand(int argc, char** argv);    // bench_command.cc: layer|ep
int RunWeightsCommand(int argc, char** argv);  // weights_command.cc: export|check|inspect|convert

}  // namespace gcmoe::tools
