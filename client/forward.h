// `gcmoe client forward`: sends Forward requests with C in flight and prints what it measured.
#pragma once

namespace gcmoe::client {

// argv[0] = "client", argv[1] = "forward"; flags from argv[2].
int RunForward(int argc, char** argv);

}  // namespace gcmoe::client
