// The config schema: which keys each section has, their types, defaults and per-key rules
// (schema.cc), the rules that relate keys to each other (cross_field_rules.cc) and the
// command-line overrides applied before both (overrides.cc). Internal to config/; the public
// entry points are in config.h.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "config/config.h"
#include "config/problems.h"

namespace gcmoe::config::internal {

// Reads a parsed document into a Config, recording every per-key problem (types, ranges,
// required keys, unknown keys). Keys with problems keep their defaults.
// `checkpoint` (may be empty) reads what an "hf:DIR" model.weights fixes.
Config ReadConfig(const nlohmann::json& document, Problems* problems,
                  const CheckpointReader& checkpoint);

// The rules between keys (top_k <= experts, cuda alignment, balancer topology vs ranks, ...).
// A rule whose inputs already failed their own checks is skipped: it would only repeat them.
void CheckCrossFieldRules(const Config& config, Problems* problems);

// Applies "key.path=value" overrides to the document (value parsed as JSON, else taken as a
// string). Malformed overrides are recorded; a path the schema does not know is left for
// ReadConfig to report as an unknown key, like any other.
void ApplyOverrides(const std::vector<std::string>& overrides, nlohmann::json* document,
                    Problems* problems);

// "host:port" (host non-empty, "[v6]:port" allowed; port 0..65535, 0 = any free port).
bool IsHostPort(const std::string& text);
// "synthetic:SEED" with a decimal SEED, "hf:DIR", or a non-empty path.
bool IsWeightsSpec(const std::string& text);
// "ring", "cube" or "torus:AxB" (A, B >= 1). For a torus, *a and *b receive A and B.
bool ParseTopology(const std::string& text, int* a = nullptr, int* b = nullptr);

}  // namespace gcmoe::config::internal
