#include "server/command_config.h"

namespace gcmoe::server {

Result<config::Config> LoadCommandConfig(const std::string& path,
                                         const std::vector<std::string>& overrides) {
  if (path.empty()) {
    return config::ParseConfig(config::DefaultConfigText(), "<embedded default>", overrides);
  }
  return config::LoadConfigFile(path, overrides);
}

}  // namespace gcmoe::server
