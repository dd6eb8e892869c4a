#include "config/problems.h"

namespace gcmoe::config::internal {

std::string Describe(const nlohmann::json& value) {
  // A whole mistyped section would flood the message; the path already says where it is.
  constexpr size_t kMaxChars = 60;
  // Override values are not checked for UTF-8; replace bad bytes rather than throw.
  std::string text = value.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  if (text.size() > kMaxChars) text = text.substr(0, kMaxChars - 3) + "...";
  return text;
}

std::string JoinPath(const std::string& parent, const std::string& key) {
  return parent.empty() ? key : parent + "." + key;
}

void Problems::Add(const std::string& path, const std::string& what) {
  lines_.push_back(path + ": " + what);
  failed_paths_.insert(path);
}

void Problems::Expected(const std::string& path, const std::string& expected,
                        const std::string& got) {
  Add(path, "expected " + expected + ", got " + got);
}

bool Problems::Failed(const std::string& path) const {
  for (const std::string& failed : failed_paths_) {
    if (failed == path) return true;
    const bool is_ancestor = path.size() > failed.size() && path.rfind(failed, 0) == 0 &&
                             (path[failed.size()] == '.' || path[failed.size()] == '[');
    const bool is_descendant = failed.size() > path.size() && failed.rfind(path, 0) == 0 &&
                               (failed[path.size()] == '.' || failed[path.size()] == '[');
    if (is_ancestor || is_descendant) return true;
  }
  return false;
}

Status Problems::ToStatus() const {
  if (lines_.empty()) return Status::Ok();
  std::string message;
  for (const std::string& line : lines_) {
    if (!message.empty()) message += '\n';
    message += line;
  }
  return InvalidArgument(std::move(message));
}

}  // namespace gcmoe::config::internal
