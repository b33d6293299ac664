#include "outbox_relay/app/commands.h"

#include <libpq-fe.h>
#include <librdkafka/rdkafka.h>
#include <spdlog/spdlog.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <array>
#include <charconv>
#include <exception>
#include <iterator>
#include <limits>
#include <memory>

#include "outbox_relay/core/failpoint.h"
#include "outbox_relay/core/json.h"
#include "outbox_relay/pg/relay_schema.h"
#include "outbox_relay/pipeline/kafka_progress.h"

namespace outbox_relay::app {

std::unexpected<Error> BadSetting(std::string_view flag, std::string_view env,
                                  std::string_view why) {
  return Fail(ErrorCode::kInvalidArgument, "invalid setting {} ({}): {}", flag, env, why);
}

Result<int64_t> ParseIntSetting(std::string_view text, std::string_view flag, std::string_view env,
                                int64_t min, int64_t max) {
  int64_t value = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || ec != std::errc() || end != text.data() + text.size()) {
    return BadSetting(flag, env, fmt::format("'{}' is not an integer", text));
  }
  if (value < min || value > max) {
    return BadSetting(flag, env, fmt::format("{} is out of range {}..{}", value, min, max));
  }
  return value;
}

CLI::Option* AddIntOption(CLI::App& app, const std::string& flag, const std::string& env,
                          int64_t* value, int64_t min, int64_t max, const std::string& help) {
  auto parse = [=](const std::string& text) {
    auto v = ParseIntSetting(text, flag, env, min, max);
    if (!v) throw CLI::ValidationError(v.error().message);
    *value = *v;
  };
  return app.add_option_function<std::string>(flag, parse, help)
      ->envname(env)
      ->type_name("INT")
      ->default_str(std::to_string(*value));
}

CLI::Option* AddChoiceOption(CLI::App& app, const std::string& flag, const std::string& env,
                             std::vector<std::string> names, size_t current,
                             std::function<void(size_t)> set, const std::string& help) {
  std::string listed;  // "a, b or c"
  std::string set_of;  // "{a,b,c}", as CLI11 shows its IsMember check
  for (size_t i = 0; i < names.size(); ++i) {
    if (i > 0) listed += i + 1 == names.size() ? " or " : ", ";
    listed += names[i];
    set_of += (i > 0 ? "," : "") + names[i];
  }
  std::string default_name = current < names.size() ? names[current] : "";
  auto parse = [=, set = std::move(set)](const std::string& text) {
    auto it = std::find(names.begin(), names.end(), text);
    if (it == names.end()) {
      throw CLI::ValidationError(
          BadSetting(flag, env, fmt::format("'{}': use {}", text, listed)).error().message);
    }
    set(static_cast<size_t>(it - names.begin()));
  };
  return app.add_option_function<std::string>(flag, parse, help)
      ->envname(env)
      ->type_name("TEXT:{" + set_of + "}")
      ->default_str(default_name);
}

int ExitCodeOf(const Error& error) {
  switch (error.code) {
    case ErrorCode::kInvalidArgument:
    case ErrorCode::kPermission:
      return kExitConfig;  // a setting or a privilege to fix, not a retry
    case ErrorCode::kCancelled:
      return kExitOk;
    default:
      return kExitFailure;
  }
}

}  // namespace outbox_relay::app
