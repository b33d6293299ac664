#include "outbox_relay/app/logging.h"

#include <spdlog/pattern_formatter.h>
#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>

#include <ctime>

#include "outbox_relay/core/json.h"

namespace outbox_relay::app {

namespace {

// "2026-11-29T19:14:26.123456Z" + `between` + the level name.
void AppendTimeAndLevel(const spdlog::details::log_msg& msg, std::string_view between,
                        spdlog::memory_buf_t& dest) {
  auto since_epoch = msg.time.time_since_epoch();
  auto secs = std::chrono::duration_cast<std::chrono::seconds>(since_epoch);
  auto micros = std::chrono::duration_cast<std::chrono::microseconds>(since_epoch - secs);
  std::time_t t = secs.count();
  std::tm tm{};
  gmtime_r(&t, &tm);
  fmt::format_to(std::back_inserter(dest), "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{:06}Z{}{}",
                 tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
                 micros.count(), between, spdlog::level::to_string_view(msg.level));
}

// {"ts":"2026-11-29T19:14:26.123456Z","level":"info","msg":"..."}; the
// message is escaped as a JSON string, whatever it contains.
class JsonFormatter final : public spdlog::formatter {
 public:
  void format(const spdlog::details::log_msg& msg, spdlog::memory_buf_t& dest) override {
    dest.append(std::string_view("{\"ts\":\""));
    AppendTimeAndLevel(msg, "\",\"level\":\"", dest);
    dest.append(std::string_view("\",\"msg\":\""));
    AppendJsonEscaped(std::string_view(msg.payload.data(), msg.payload.size()), dest);
    dest.append(std::string_view("\"}\n"));
  }
  std::unique_ptr<spdlog::formatter> clone() const override {
    return std::make_unique<JsonFormatter>();
  }
};

// 2026-11-29T19:14:26.123456Z info message. Messages can carry text from
// rows (uuids, metadata in a poison row's reason): a line break there must
// not start a line that reads as a record of its own. Continuation lines are
// indented, other control characters written as \xNN.
class TextFormatter final : public spdlog::formatter {
 public:
  void format(const spdlog::details::log_msg& msg, spdlog::memory_buf_t& dest) override {
    AppendTimeAndLevel(msg, " ", dest);
    dest.push_back(' ');
    for (char c : std::string_view(msg.payload.data(), msg.payload.size())) {
      auto u = static_cast<unsigned char>(c);
      if (c == '\n') {
        dest.append(std::string_view("\n    "));
      } else if ((u < 0x20 && c != '\t') || u == 0x7f) {
        fmt::format_to(std::back_inserter(dest), "\\x{:02x}", static_cast<unsigned>(u));
      } else {
        dest.push_back(c);
      }
    }
    dest.push_back('\n');
  }
  std::unique_ptr<spdlog::formatter> clone() const override {
    return std::make_unique<TextFormatter>();
  }
};

}  // namespace

void SetupLogging(const LogConfig& config) {
  // Logs go to stderr; stdout stays free for command output (check, slot status).
  auto logger = spdlog::stderr_logger_mt("outbox-relay");
  if (config.format == LogFormat::kJson) {
    logger->set_formatter(std::make_unique<JsonFormatter>());
  } else {
    logger->set_formatter(std::make_unique<TextFormatter>());
  }
  logger->set_level(spdlog::level::from_str(config.level));
  logger->flush_on(spdlog::level::info);
  spdlog::set_default_logger(logger);
}

}  // namespace outbox_relay::app
