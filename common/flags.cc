#include "common/flags.h"

#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <sstream>

namespace gcmoe {
namespace {

Status ParseInteger(const std::string& name, const std::string& text, int64_t lo, int64_t hi,
                    int64_t* out) {
  char* end = nullptr;
  errno = 0;
  const long long v = std::strtoll(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || errno != 0 || v < lo || v > hi) {
    return InvalidArgument("--" + name + ": expected an integer, got \"" + text + "\"");
  }
  *out = v;
  return Status::Ok();
}

}  // namespace

Flags::Flags(std::string command, std::string summary)
    : command_(std::move(command)), summary_(std::move(summary)) {}

void Flags::String(const std::string& name, std::string* value, const std::string& help) {
  flags_.push_back({name, "STRING", help, value->empty() ? "" : "\"" + *value + "\"", false,
                    [value](const std::string& v) {
                      *value = v;
                      return Status::Ok();
                    }});
}

void Flags::Int(const std::string& name, int* value, const std::string& help) {
  flags_.push_back({name, "INT", help, std::to_string(*value), false,
                    [name, value](const std::string& v) {
                      int64_t parsed = 0;
                      GCMOE_RETURN_IF_ERROR(ParseInteger(name, v, INT32_MIN, INT32_MAX, &parsed));
                      *value = static_cast<int>(parsed);
                      return Status::Ok();
                    }});
}

void Flags::Int64(const std::string& name, int64_t* value, const std::string& help) {
  flags_.push_back({name, "INT", help, std::to_string(*value), false,
                    [name, value](const std::string& v) {
                      return ParseInteger(name, v, INT64_MIN, INT64_MAX, value);
                    }});
}

void Flags::Double(const std::string& name, double* value, const std::string& help) {
  std::ostringstream def;
  def << *value;
  flags_.push_back({name, "NUM", help, def.str(), false, [name, value](const std::string& v) {
                      char* end = nullptr;
                      const double d = std::strtod(v.c_str(), &end);
                      if (v.empty() || *end != '\0') {
                        return InvalidArgument("--" + name + ": expected a number, got \"" + v +
                                               "\"");
                      }
                      *value = d;
                      return Status::Ok();
                    }});
}

void Flags::Bool(const std::string& name, bool* value, const std::string& help) {
  flags_.push_back({name, "", help, *value ? "true" : "false", true,
                    [name, value](const std::string& v) {
                      if (v == "true" || v == "1" || v == "yes") {
                        *value = true;
                      } else if (v == "false" || v == "0" || v == "no") {
                        *value = false;
                      } else {
                        return InvalidArgument("--" + name + ": expected true or false, got \"" +
                                               v + "\"");
                      }
                      return Status::Ok();
                    }});
}

void Flags::Repeated(const std::string& name, std::vector<std::string>* values,
                     const std::string& help) {
  flags_.push_back({name, "STRING", help + " (repeatable)", "", false,
                    [values](const std::string& v) {
                      values->push_back(v);
                      return Status::Ok();
                    }});
}

void Flags::Positional(const std::string& usage, const std::string& help) {
  positional_usage_ = usage;
  positional_help_ = help;
}

const Flags::Flag* Flags::Find(const std::string& name) const {
  for (const Flag& f : flags_) {
    if (f.name == name) return &f;
  }
  return nullptr;
}

Status Flags::Parse(int argc, char** argv, int first) {
  for (int i = first; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      help_requested_ = true;
      return Status::Ok();
    }
    if (arg == "--") {
      for (++i; i < argc; ++i) positional_.push_back(argv[i]);
      break;
    }
    if (arg.rfind("--", 0) != 0 || arg.size() == 2) {
      positional_.push_back(arg);
      continue;
    }
    std::string name = arg.substr(2);
    std::string value;
    bool has_value = false;
    if (const size_t eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
      has_value = true;
    }
    const Flag* flag = Find(name);
    if (flag == nullptr) return InvalidArgument("unknown flag --" + name);
    if (!has_value) {
      if (flag->is_bool) {
        value = "true";
      } else if (i + 1 < argc) {
        value = argv[++i];
      } else {
        return InvalidArgument("--" + name + " needs a value");
      }
    }
    GCMOE_RETURN_IF_ERROR(flag->set(value));
  }
  return Status::Ok();
}

int Flags::ParseOrExit(int argc, char** argv, int first) {
  const Status status = Parse(argc, argv, first);
  if (!status.ok()) {
    std::fprintf(stderr, "%s: %s\n\n%s", command_.c_str(), status.message().c_str(),
                 Usage().c_str());
    return 2;
  }
  if (help_requested_) {
    std::fputs(Usage().c_str(), stdout);
    return 0;
  }
  return -1;
}

std::string Flags::Usage() const {
  std::ostringstream out;
  out << "usage: " << command_ << " [flags]";
  if (!positional_usage_.empty()) out << " " << positional_usage_;
  out << "\n\n" << summary_ << "\n";
  if (!positional_help_.empty()) out << "\n  " << positional_usage_ << "  " << positional_help_ << "\n";
  if (!flags_.empty()) out << "\nflags:\n";
  for (const Flag& f : flags_) {
    std::string left = "  --" + f.name + (f.type.empty() ? "" : " " + f.type);
    out << left;
    if (left.size() < 28) {
      out << std::string(28 - left.size(), ' ');
    } else {
      out << "\n" << std::string(28, ' ');
    }
    out << f.help;
    if (!f.default_text.empty()) out << " (default " << f.default_text << ")";
    out << "\n";
  }
  out << "  --help                    show this help\n";
  return out.str();
}

}  // namespace gcmoe
