// `gcmoe client`: the command-line client of the public API (the `gcmoe` command table calls it;
// argv[0] is "client").
#pragma once

namespace gcmoe::client {

// forward | info | stats | health; returns the process exit code.
int RunClientCommand(int argc, char** argv);

}  // namespace gcmoe::client
