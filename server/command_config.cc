#include "server/command_config.h"

#include <cstdio>

#include "engine/hf_checkpoint.h"

namespace gcmoe::server {

config::CheckpointReader HfCheckpointReader() {
  return [](const std::string& weights) -> Result<config::CheckpointModel> {
    const std::optional<std::string> dir = engine::HfCheckpointDir(weights);
    if (!dir) return InvalidArgument("\"" + weights + "\" is not hf:DIR");
    GCMOE_ASSIGN_OR_RETURN(engine::HfCheckpoint c, engine::ReadHfCheckpoint(*dir));
    config::CheckpointModel m;
    m.source = c.config_path();
    m.hidden = c.hidden;
    m.intermediate = c.intermediate;
    m.experts = c.experts;
    m.top_k = c.top_k;
    m.layers = static_cast<int>(c.moe_layer_ids.size());
    m.shared_intermediate = c.shared_intermediate;
    m.activation_alpha = c.activation_alpha;
    m.activation_clamp = c.activation_clamp;
    m.activation_up_offset = c.activation_up_offset;
    m.moe_layer_ids = c.moe_layer_ids;
    m.source_keys = c.source_keys;
    m.source_keys["layers"] = "the MoE layers of num_hidden_layers";
    return m;
  };
}

Result<config::Config> LoadCommandConfig(const std::string& path,
                                         const std::vector<std::string>& overrides) {
  if (path.empty()) {
    return config::ParseConfig(config::DefaultConfigText(), "<embedded default>", overrides,
                               HfCheckpointReader());
  }
  return config::LoadConfigFile(path, overrides, HfCheckpointReader());
}

std::optional<config::Config> LoadConfigOrReport(const std::string& command,
                                                 const std::string& path,
                                                 const std::vector<std::string>& overrides) {
  auto config = LoadCommandConfig(path, overrides);
  if (config.ok()) return std::move(config).value();
  std::fprintf(stderr, "gcmoe %s: invalid config (%s):\n%s\n", command.c_str(),
               path.empty() ? "embedded default" : path.c_str(), config.status().message().c_str());
  return std::nullopt;
}

}  // namespace gcmoe::server
