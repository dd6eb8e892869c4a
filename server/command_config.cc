#include "server/command_config.h"

#include <cstdio>

namespace gcmoe::server {

Result<config::Config> LoadCommandConfig(const std::string& path,
                                         const std::vector<std::string>& overrides) {
  if (path.empty()) {
    return config::ParseConfig(config::DefaultConfigText(), "<embedded default>", overrides);
  }
  return config::LoadConfigFile(path, overrides);
}

std::optional<config::Config> LoadConfigOrReport(const std::string& command,
                                                 const std::string& path,
                                                 const std::vector<std::string>& overrides) {
  auto config = LoadCommandConfig(path, overrides);
  if (config.ok()) return std::move(config).value();
  std::fprintf(stderr, "gcmoe %s: invalid config (%s):\n%s\n", command.c_str(),
               path.empty() ? "embedded default" : path.c_str(),
               config.status().message().c_str());
  return std::nullopt;
}

}  // namespace gcmoe::server
