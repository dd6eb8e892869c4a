// How every service command gets its config: a file (--config) or the embedded default, with
// --set overrides, reported with every problem when invalid.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "common/status.h"
#include "config/config.h"

namespace gcmoe::server {

// Reads an "hf:DIR" checkpoint's config.json for the config loader (engine/hf_checkpoint.h), so
// model keys left out of a config come from the checkpoint and those given are checked.
config::CheckpointReader HfCheckpointReader();

Result<config::Config> LoadCommandConfig(const std::string& path,
                                         const std::vector<std::string>& overrides);

// LoadCommandConfig for a service command: on failure it prints
// "gcmoe COMMAND: invalid config (SOURCE):" and every problem to stderr, and returns nullopt.
std::optional<config::Config> LoadConfigOrReport(const std::string& command,
                                                 const std::string& path,
                                                 const std::vector<std::string>& overrides);

}  // namespace gcmoe::server
