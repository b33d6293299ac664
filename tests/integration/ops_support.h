// Helpers of the ops command tests (ops_*_test.cc): run one `outbox-relay
// <command>` to completion with its stdout and stderr kept apart (stdout is
// the command's result, stderr its log), and read its JSON output through
// PostgreSQL's own parser.
#pragma once

#include <chrono>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "support/pg.h"

namespace outbox_test {

struct CommandResult {
  int exit_code = -1;  // 128+signal when killed; -1 when it timed out
  std::string out;
  std::string err;

  // The command line, exit code, stdout and stderr, for failure messages.
  std::string Describe() const;
  std::string command;
};

// Runs the relay binary with `args`; `env` entries override the inherited
// environment (nullopt removes a variable). Kills it after `timeout`.
CommandResult RunRelayCommand(const std::vector<std::string>& args,
                              const std::map<std::string, std::optional<std::string>>& env = {},
                              std::chrono::milliseconds timeout = std::chrono::seconds(120));

// The text of `path` (e.g. "{checks,0,status}") in the JSON document `json`,
// parsed by PostgreSQL (jsonb #>> path); nullopt for JSON null or a missing
// path. Throws when `json` is not valid JSON.
std::optional<std::string> JsonPath(Pg& db, const std::string& json, const std::string& path);

}  // namespace outbox_test
