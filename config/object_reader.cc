#include "config/object_reader.h"

#include <algorithm>
#include <cctype>
#include <cfloat>
#include <cmath>

namespace gcmoe::config::internal {
namespace {

using nlohmann::json;

std::string Lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s;
}

// Levenshtein distance, case-insensitive: "hiden" -> "hidden" is 1.
size_t EditDistance(const std::string& a_in, const std::string& b_in) {
  const std::string a = Lower(a_in);
  const std::string b = Lower(b_in);
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = above;
    }
  }
  return row[b.size()];
}

std::pair<std::string, std::string> SplitLeaf(const std::string& path) {
  const size_t dot = path.rfind('.');
  if (dot == std::string::npos) return {"", path};
  return {path.substr(0, dot), path.substr(dot + 1)};
}

// The JSON number as an int64 when it is an integer that fits; nullopt for anything else.
std::optional<int64_t> AsInt64(const json& value) {
  if (value.is_number_unsigned()) {
    const uint64_t u = value.get<uint64_t>();
    if (u > static_cast<uint64_t>(INT64_MAX)) return std::nullopt;
    return static_cast<int64_t>(u);
  }
  if (value.is_number_integer()) return value.get<int64_t>();
  return std::nullopt;
}

}  // namespace

void KeyIndex::AddUnknown(const std::string& parent, const std::string& key) {
  unknown_.emplace_back(parent, key);
}

void KeyIndex::ReportUnknown(Problems* problems) const {
  for (const auto& [parent, key] : unknown_) {
    // Close enough to be a typo: one edit for short keys, two otherwise.
    const size_t max_distance = key.size() < 4 ? 1 : 2;
    std::string suggestion;
    size_t best = max_distance + 1;
    for (const std::string& known : known_) {
      const auto [known_parent, known_leaf] = SplitLeaf(known);
      if (known_parent != parent) continue;
      const size_t d = EditDistance(key, known_leaf);
      if (d < best) {
        best = d;
        suggestion = known;
      }
    }
    // Not a typo in this section: perhaps the right key in the wrong section.
    if (suggestion.empty()) {
      for (const std::string& known : known_) {
        if (Lower(SplitLeaf(known).second) == Lower(key)) {
          suggestion = known;
          break;
        }
      }
    }
    // A dotted key such as "model.hidden" written flat: the path is right, the nesting is not.
    const std::string full = JoinPath(parent, key);
    const bool flat_path = std::find(known_.begin(), known_.end(), full) != known_.end();
    std::string what = "unknown key";
    if (flat_path) {
      // "model.activation.alpha" -> {"model": {"activation": {"alpha": ...}}}
      std::string nested = "...";
      std::string rest = full;
      while (!rest.empty()) {
        const auto [head, leaf] = SplitLeaf(rest);
        nested = "{\"" + leaf + "\": " + nested + "}";
        rest = head;
      }
      what += " (keys nest as objects: write " + nested + ")";
    } else if (!suggestion.empty()) {
      what += " (did you mean " + suggestion + "?)";
    }
    problems->Add(full, what);
  }
}

ObjectReader::ObjectReader(const json* object, std::string path, KeyIndex* keys, Problems* problems,
                           bool suppress_missing)
    : object_(object),
      path_(std::move(path)),
      keys_(keys),
      problems_(problems),
      suppress_missing_(suppress_missing) {}

const json* ObjectReader::Find(const char* key, const std::string& expected, bool required) {
  asked_.emplace_back(key);
  keys_->AddKnown(PathOf(key));
  if (object_ != nullptr) {
    if (auto it = object_->find(key); it != object_->end()) return &*it;
  }
  if (required && !suppress_missing_) {
    problems_->Add(PathOf(key), "required key is missing (expected " + expected + ")");
  }
  return nullptr;
}

bool ObjectReader::Int64(const char* key, const IntRule& rule, int64_t* out, bool required) {
  const json* value = Find(key, rule.expected, required);
  if (value == nullptr) return false;
  if (!value->is_number_integer()) {
    problems_->Expected(PathOf(key), "an integer", Describe(*value));
    return false;
  }
  const std::optional<int64_t> v = AsInt64(*value);
  if (!v || *v < rule.min || *v > rule.max || *v % rule.multiple_of != 0) {
    problems_->Expected(PathOf(key), rule.expected, Describe(*value));
    return false;
  }
  *out = *v;
  return true;
}

bool ObjectReader::Int(const char* key, const IntRule& rule, int* out, bool required) {
  IntRule bounded = rule;
  bounded.min = std::max<int64_t>(rule.min, INT32_MIN);
  bounded.max = std::min<int64_t>(rule.max, INT32_MAX);
  int64_t v = 0;
  if (!Int64(key, bounded, &v, required)) return false;
  *out = static_cast<int>(v);
  return true;
}

bool ObjectReader::Bool(const char* key, bool* out) {
  const json* value = Find(key, "true or false", false);
  if (value == nullptr) return false;
  if (!value->is_boolean()) {
    problems_->Expected(PathOf(key), "true or false", Describe(*value));
    return false;
  }
  *out = value->get<bool>();
  return true;
}

bool ObjectReader::PositiveFloat(const char* key, float* out) {
  const json* value = Find(key, "a positive number", false);
  if (value == nullptr) return false;
  if (!value->is_number()) {
    problems_->Expected(PathOf(key), "a number", Describe(*value));
    return false;
  }
  const double d = value->get<double>();
  if (!(d > 0.0) || !std::isfinite(d) || d > FLT_MAX) {
    problems_->Expected(PathOf(key), "a positive number", Describe(*value));
    return false;
  }
  *out = static_cast<float>(d);
  return true;
}

bool ObjectReader::String(const char* key, const std::string& expected,
                          const std::function<bool(const std::string&)>& valid, std::string* out,
                          bool required) {
  const json* value = Find(key, expected, required);
  if (value == nullptr) return false;
  if (!value->is_string() || (valid && !valid(value->get<std::string>()))) {
    problems_->Expected(PathOf(key), expected, Describe(*value));
    return false;
  }
  *out = value->get<std::string>();
  return true;
}

std::string ObjectReader::Choices(const std::vector<std::string>& choices) {
  std::string text;
  for (size_t i = 0; i < choices.size(); ++i) {
    if (i > 0) text += i + 1 == choices.size() ? " or " : ", ";
    text += "\"" + choices[i] + "\"";
  }
  return text;
}

bool ObjectReader::OneOf(const char* key, const std::vector<std::string>& choices,
                         std::string* out) {
  return String(
      key, Choices(choices),
      [&choices](const std::string& s) {
        return std::find(choices.begin(), choices.end(), s) != choices.end();
      },
      out);
}

const json* ObjectReader::Raw(const char* key, const std::string& expected, bool required) {
  return Find(key, expected, required);
}

ObjectReader ObjectReader::Object(const char* key, const std::string& expected, bool required) {
  const bool was_missing_reported = required && !suppress_missing_;
  const json* value = Find(key, expected, false);
  if (value == nullptr) {
    if (was_missing_reported) {
      problems_->Add(PathOf(key), "required section is missing (expected " + expected + ")");
    }
    return ObjectReader(nullptr, PathOf(key), keys_, problems_,
                        suppress_missing_ || was_missing_reported);
  }
  if (!value->is_object()) {
    problems_->Expected(PathOf(key), expected, Describe(*value));
    return ObjectReader(nullptr, PathOf(key), keys_, problems_, true);
  }
  return ObjectReader(value, PathOf(key), keys_, problems_, suppress_missing_);
}

void ObjectReader::Finish() {
  if (object_ == nullptr) return;
  for (const auto& item : object_->items()) {
    if (std::find(asked_.begin(), asked_.end(), item.key()) == asked_.end()) {
      keys_->AddUnknown(path_, item.key());
    }
  }
}

}  // namespace gcmoe::config::internal
