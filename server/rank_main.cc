// PLACEHOLDER during the first build-out: replaced by the real command before it lands.
#include <cstdio>

#include "server/commands.h"

namespace gcmoe::server {

int RunRankCommand(int, char**) {
  std::fprintf(stderr, "gcmoe: this command is not built yet\n");
  return 2;
}

}  // namespace gcmoe::server
