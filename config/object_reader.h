// Typed, error-collecting reads of one JSON object of the config. Every read names its key (so
// that keys nobody asked for can be reported as unknown), checks the JSON type and the rule, and
// either stores the value or records "path: expected ..., got ..." and leaves the default.
// Internal to config/.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "config/problems.h"

namespace gcmoe::config::internal {

// Every key path the schema knows and every key it did not, for "unknown key (did you mean
// ...?)". Suggestions are resolved once the whole document is read, so that a key in the wrong
// section can point to the section that has it.
class KeyIndex {
 public:
  void AddKnown(const std::string& path) { known_.push_back(path); }
  void AddUnknown(const std::string& parent, const std::string& key);
  // One problem per unknown key, with the nearest known key when one is close.
  void ReportUnknown(Problems* problems) const;

 private:
  std::vector<std::string> known_;
  std::vector<std::pair<std::string, std::string>> unknown_;  // (parent path, key)
};

// Integer rule: value in [min, max] and a multiple of multiple_of. `expected` is the whole
// expectation as the message states it: "a positive multiple of 32".
struct IntRule {
  int64_t min = 0;
  int64_t max = INT32_MAX;
  int64_t multiple_of = 1;
  const char* expected = "an integer";
};

class ObjectReader {
 public:
  // `object` may be null: an absent optional section reads as empty (every key keeps its
  // default). `suppress_missing` silences "required key is missing" where the section itself
  // was already reported.
  ObjectReader(const nlohmann::json* object, std::string path, KeyIndex* keys, Problems* problems,
               bool suppress_missing = false);

  // Each returns true when the key was present and valid, and only then writes *out.
  bool Int(const char* key, const IntRule& rule, int* out, bool required = false);
  bool Int64(const char* key, const IntRule& rule, int64_t* out, bool required = false);
  bool Bool(const char* key, bool* out);
  // A finite number greater than zero that a float holds.
  bool PositiveFloat(const char* key, float* out);
  // A string accepted by `valid` (any string when `valid` is empty).
  bool String(const char* key, const std::string& expected,
              const std::function<bool(const std::string&)>& valid, std::string* out,
              bool required = false);
  // One of a fixed set of strings: "expected \"cpu\" or \"cuda\", got \"gpu\"".
  bool OneOf(const char* key, const std::vector<std::string>& choices, std::string* out);

  // For rules the typed reads do not cover: marks the key as known and returns its value, or
  // null when absent (after reporting it when required).
  const nlohmann::json* Raw(const char* key, const std::string& expected, bool required = false);
  // A nested object. When it is absent (required: reported) or not an object (reported), the
  // returned reader reads as empty and reports nothing further.
  ObjectReader Object(const char* key, const std::string& expected, bool required = false);

  // Records the keys of this object that no read asked for. Call after the last read.
  void Finish();

  std::string PathOf(const std::string& key) const { return JoinPath(path_, key); }
  Problems* problems() const { return problems_; }

 private:
  const nlohmann::json* Find(const char* key, const std::string& expected, bool required);
  static std::string Choices(const std::vector<std::string>& choices);

  const nlohmann::json* object_;
  std::string path_;
  KeyIndex* keys_;
  Problems* problems_;
  bool suppress_missing_;
  std::vector<std::string> asked_;
};

}  // namespace gcmoe::config::internal
