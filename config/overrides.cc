// "key.path=value" overrides, applied to the parsed document before it is read, so that an
// override is checked by exactly the rules a file is.
#include <string>

#include "config/schema.h"

namespace gcmoe::config::internal {
namespace {

using nlohmann::json;

std::vector<std::string> SplitPath(const std::string& path) {
  std::vector<std::string> parts;
  size_t start = 0;
  while (true) {
    const size_t dot = path.find('.', start);
    parts.push_back(path.substr(start, dot - start));
    if (dot == std::string::npos) break;
    start = dot + 1;
  }
  return parts;
}

// The value as JSON when it parses ("4", "true", "null", "[0, 1]", "\"x\""), else the text
// itself as a string ("0.0.0.0:5000", "auto", "synthetic:3").
json ParseValue(const std::string& text) {
  json value = json::parse(text, /*cb=*/nullptr, /*allow_exceptions=*/false);
  if (value.is_discarded()) return json(text);
  return value;
}

}  // namespace

void ApplyOverrides(const std::vector<std::string>& overrides, json* document, Problems* problems) {
  for (const std::string& override_text : overrides) {
    const size_t eq = override_text.find('=');
    const std::string where = "override \"" + override_text + "\"";
    if (eq == std::string::npos || eq == 0) {
      problems->Add(where, "expected key.path=value (e.g. parallel.ranks=4)");
      continue;
    }
    const std::string path = override_text.substr(0, eq);
    const std::vector<std::string> parts = SplitPath(path);
    bool empty_part = false;
    for (const std::string& part : parts) empty_part = empty_part || part.empty();
    if (empty_part) {
      problems->Add(where, "expected key.path=value with non-empty keys between the dots");
      continue;
    }
    if (!document->is_object()) continue;  // ReadConfig reports the document itself.

    json* node = document;
    std::string walked;
    bool blocked = false;
    for (size_t i = 0; i + 1 < parts.size(); ++i) {
      walked = JoinPath(walked, parts[i]);
      if (!node->contains(parts[i])) (*node)[parts[i]] = json::object();
      json& child = (*node)[parts[i]];
      if (!child.is_object()) {
        problems->Add(path, "cannot be set: " + walked + " is " + Describe(child) +
                                ", not an object (" + where + ")");
        blocked = true;
        break;
      }
      node = &child;
    }
    if (!blocked) (*node)[parts.back()] = ParseValue(override_text.substr(eq + 1));
  }
}

}  // namespace gcmoe::config::internal
