// What every subcommand of outbox-relay shares: `run` (app) and the
// operations commands `cleanup`, `replay`, `slot status|drop` and `check`
// (ops/commands.h, DESIGN §6, §7), registered on main's CLI11 app.
//
// Exit codes, the same for every command (and for `run`):
//   0  done (for `check`: no FAIL)
//   1  a runtime failure (database or Kafka error, a refused action, a FAIL in `check`)
//   2  a bad setting; the message names the flag and its environment variable
//
// Each command runs inside its CLI11 callback. A non-zero exit code leaves
// the callback as CLI::RuntimeError(code), which main's
// `catch (const CLI::ParseError&) { return app.exit(e); }` returns silently
// (CLI11 prints nothing for a RuntimeError), so main stays wiring only.
// Command results go to stdout; logs (spdlog) to stderr.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "outbox_relay/core/result.h"

namespace CLI {
class App;
class Option;
}  // namespace CLI

namespace outbox_relay::app {

inline constexpr int kExitOk = 0;
inline constexpr int kExitFailure = 1;
inline constexpr int kExitConfig = 2;

// --- shared by the ops commands ---------------------------------------------

// "invalid setting --flag (ENV): why" as kInvalidArgument, like run's Validate.
std::unexpected<Error> BadSetting(std::string_view flag, std::string_view env,
                                  std::string_view why);

// A decimal integer in [min, max]; otherwise a BadSetting naming flag and env.
Result<int64_t> ParseIntSetting(std::string_view text, std::string_view flag, std::string_view env,
                                int64_t min, int64_t max);

// Integer option `flag` with environment variable `env`, stored in `*value`,
// whose value at the call is the default. A value that is not an integer in
// [min, max] fails the parse (exit 2) with ParseIntSetting's message, which
// names the variable too (CLI11's own conversion error names only the flag).
CLI::Option* AddIntOption(CLI::App& app, const std::string& flag, const std::string& env,
                          int64_t* value, int64_t min, int64_t max, const std::string& help);

// An option that takes one of `names`: the i-th name calls set(i); `current`
// is the default's index. Any other value fails the parse (exit 2) with
// "invalid setting --flag (ENV): 'value': use a or b". `help` is used as is;
// --help shows the names as the option's type ({a,b}).
CLI::Option* AddChoiceOption(CLI::App& app, const std::string& flag, const std::string& env,
                             std::vector<std::string> names, size_t current,
                             std::function<void(size_t)> set, const std::string& help);

// AddChoiceOption into an enum: each name with its value; *value at the call
// is the default.
template <class Enum>
CLI::Option* AddEnumOption(CLI::App& app, const std::string& flag, const std::string& env,
                           Enum* value, std::vector<std::pair<std::string, Enum>> choices,
                           const std::string& help) {
  std::vector<std::string> names;
  size_t current = 0;
  for (size_t i = 0; i < choices.size(); ++i) {
    names.push_back(choices[i].first);
    if (choices[i].second == *value) current = i;
  }
  return AddChoiceOption(
      app, flag, env, std::move(names), current,
      [value, choices = std::move(choices)](size_t i) { *value = choices[i].second; }, help);
}

// The exit code for an error that ends a command (run and every operations
// command): kExitConfig for a setting or a privilege (kInvalidArgument,
// kPermission), kExitOk for a stop request (kCancelled), kExitFailure
// otherwise.
int ExitCodeOf(const Error& error);

}  // namespace outbox_relay::app
