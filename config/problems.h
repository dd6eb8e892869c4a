// Collects every problem of one config (parse, overrides, per-key and cross-field rules) so that
// they are reported together, one per line: "model.hidden: expected a positive multiple of 32,
// got 100". Internal to config/.
#pragma once

#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"

namespace gcmoe::config::internal {

// How a JSON value appears after "got" in a message: as written (strings quoted), shortened.
std::string Describe(const nlohmann::json& value);

// Joins a parent path and a key: ("model", "hidden") -> "model.hidden"; ("", "model") -> "model".
std::string JoinPath(const std::string& parent, const std::string& key);

class Problems {
 public:
  // "path: what". The path is remembered as failed so that cross-field rules skip it.
  void Add(const std::string& path, const std::string& what);
  // "path: expected EXPECTED, got GOT".
  void Expected(const std::string& path, const std::string& expected, const std::string& got);

  // True when a problem was recorded at this path, at one of its ancestors (a missing or
  // mistyped section) or below it (a bad array element): a cross-field rule reading this path
  // would only repeat that problem.
  bool Failed(const std::string& path) const;

  bool empty() const { return lines_.empty(); }
  const std::vector<std::string>& lines() const { return lines_; }
  // INVALID_ARGUMENT with one line per problem, or OK when there are none.
  Status ToStatus() const;

 private:
  std::vector<std::string> lines_;
  std::set<std::string> failed_paths_;
};

}  // namespace gcmoe::config::internal
