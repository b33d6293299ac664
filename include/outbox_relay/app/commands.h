// The operations subcommands of outbox-relay (DESIGN §6, §7): `cleanup`,
// `replay`, `slot status|drop` and `check`, registered on main's CLI11 app.
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

// Registers cleanup (alias outbox-cleanup, the seed's CronJob argument),
// replay, slot and check on `app`. The flag values live as long as `app`.
void AddOpsCommands(CLI::App& app);

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

// What a command prints its result as (--output, OUTBOX_OUTPUT).
enum class OutputFormat { kText, kJson };
CLI::Option* AddOutputOption(CLI::App& app, OutputFormat* value);

// `text` as a JSON string literal, quotes included (control characters,
// quotes and backslashes escaped; other bytes as they are).
std::string JsonQuote(std::string_view text);

// 1536 -> "1.5 KiB", 0 -> "0 B" (binary units, as pg_size_pretty but with one decimal).
std::string PrettyBytes(int64_t bytes);

// What `outbox-relay version` prints, one "name: value" line each after the
// first: the relay's version, the commit it was built from ("unknown" for a
// build outside git; "-dirty": with changes to tracked files), the versions of
// what it persists and which newer ones it runs against (docs/upgrading.md),
// then the libraries it runs with as they report themselves (librdkafka's
// rd_kafka_version_str() and builtin.features, libpq's PQlibVersion()) and
// whether the test-only faults are compiled in (core/failpoint.h; the shipped
// image has none).
//
//   outbox-relay 0.2.0
//   commit: 18da5fc1c6a0f9e2d4b7a8c3e5f1029384756abc
//   relay schema: 1 (runs against newer schemas that declare themselves readable by 1)
//   exactly-once progress record: format 2 (reads records readable by format 2 or older)
//   librdkafka: 2.14.2 (gzip, snappy, ssl, sasl, ..., oidc)
//   libpq: 15.13
//   failpoints: compiled in (OUTBOX_TEST_FAULT): a test build, not for production
std::string VersionReport(std::string_view relay_version, std::string_view commit);

// The exit code for an error that ends a command (run and every operations
// command): kExitConfig for a setting or a privilege (kInvalidArgument,
// kPermission), kExitOk for a stop request (kCancelled), kExitFailure
// otherwise.
int ExitCodeOf(const Error& error);

}  // namespace outbox_relay::app
