// A small command-line flag parser shared by every `gcmoe` subcommand.
//   Flags flags("gcmoe client forward", "Sends Forward requests and prints a summary.");
//   flags.String("addr", &addr, "service address host:port");
//   flags.Int("tokens", &tokens, "tokens per request");
//   if (int rc = flags.ParseOrExit(argc, argv); rc >= 0) return rc;   // --help or a bad flag
// Accepts --name=value and --name value; --flag for booleans (also --flag=false).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "common/status.h"

namespace gcmoe {

class Flags {
 public:
  Flags(std::string command, std::string summary);

  void String(const std::string& name, std::string* value, const std::string& help);
  void Int(const std::string& name, int* value, const std::string& help);
  void Int64(const std::string& name, int64_t* value, const std::string& help);
  void Double(const std::string& name, double* value, const std::string& help);
  void Bool(const std::string& name, bool* value, const std::string& help);
  // Repeatable flag: every occurrence is appended.
  void Repeated(const std::string& name, std::vector<std::string>* values, const std::string& help);
  // Describes positional arguments in --help ("FILE", "[ARGS...]").
  void Positional(const std::string& usage, const std::string& help);

  // Parses argv[first..argc). Positional arguments are collected in positional().
  Status Parse(int argc, char** argv, int first = 1);
  // Parse, printing usage for --help (returns 0) or the error and usage (returns 2) to the
  // terminal; returns -1 when the caller should go on.
  int ParseOrExit(int argc, char** argv, int first = 1);

  bool help_requested() const { return help_requested_; }
  const std::vector<std::string>& positional() const { return positional_; }
  std::string Usage() const;

 private:
  struct Flag {
    std::string name;
    std::string type;  // shown in --help
    std::string help;
    std::string default_text;
    bool is_bool = false;
    std::function<Status(const std::string&)> set;
  };
  const Flag* Find(const std::string& name) const;

  std::string command_;
  std::string summary_;
  std::string positional_usage_;
  std::string positional_help_;
  std::vector<Flag> flags_;
  std::vector<std::string> positional_;
  bool help_requested_ = false;
};

}  // namespace gcmoe
