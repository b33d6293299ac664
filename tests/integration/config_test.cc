// A bad setting stops the relay at start with exit code 2 and a log line that
// names the setting (flag or environment variable), so an operator can fix it.
#include <fmt/format.h>

#include <cstdio>

#include "fixture.h"

namespace outbox_test {
namespace {

using std::chrono::seconds;

struct BadCase {
  std::string what;
  std::vector<std::string> args;
  std::map<std::string, std::optional<std::string>> env;
  std::string must_name;         // the log must contain this
  std::optional<int> want_code;  // nullopt: any non-zero code
};

class Config : public RelayTest {
 protected:
  // Starts the relay once per case; each must exit (code) and name the setting.
  void RunCases(const std::vector<BadCase>& cases);
};

TEST_F(Config, BadSettingFailsAtStartNamingIt) {
  CreateTables();
  std::vector<BadCase> cases = {
      {"--max-in-flight 0", {"--max-in-flight", "0"}, {}, "--max-in-flight", 2},
      {"OUTBOX_MAX_IN_FLIGHT_BYTES above librdkafka's queue",
       {},
       {{"OUTBOX_MAX_IN_FLIGHT_BYTES", "1073741824"}},
       "--max-in-flight-bytes (OUTBOX_MAX_IN_FLIGHT_BYTES)",
       2},
      {"DATABASE_URL unset", {}, {{"DATABASE_URL", std::nullopt}}, "DATABASE_URL", 2},
      {"KAFKA_BROKERS unset", {}, {{"KAFKA_BROKERS", std::nullopt}}, "KAFKA_BROKERS", 2},
      {"--kafka-property acks=1", {"--kafka-property", "acks=1"}, {}, "acks", std::nullopt},
      {"--kafka-property enable.idempotence=false",
       {"--kafka-property", "enable.idempotence=false"},
       {},
       "enable.idempotence",
       std::nullopt},
      {"--table that does not exist",
       {"--table", "public." + name_ + "_missing"},
       {},
       "--table",
       2},
      {"--slot with upper-case letters", {"--slot", "Bad-Slot"}, {}, "--slot", 2},
      {"--status-interval-ms 0", {"--status-interval-ms", "0"}, {}, "--status-interval-ms", 2},
      {"OUTBOX_MARKER_SPLIT_ROWS -1",
       {},
       {{"OUTBOX_MARKER_SPLIT_ROWS", "-1"}},
       "--marker-split-rows (OUTBOX_MARKER_SPLIT_ROWS)",
       2},
      // The bounds of what callers and rows may hold (issue 37).
      {"--metrics-label-cap 0", {"--metrics-label-cap", "0"}, {}, "--metrics-label-cap", 2},
      {"OUTBOX_METRICS_MAX_CONNECTIONS_PER_CLIENT above the total",
       {"--metrics-max-connections", "16"},
       {{"OUTBOX_METRICS_MAX_CONNECTIONS_PER_CLIENT", "17"}},
       "--metrics-max-connections-per-client (OUTBOX_METRICS_MAX_CONNECTIONS_PER_CLIENT)",
       2},
      {"--metrics-request-timeout-ms 0",
       {"--metrics-request-timeout-ms", "0"},
       {},
       "--metrics-request-timeout-ms",
       2},
      {"--metrics-addr with a host name",
       {"--metrics-addr", "localhost:9464"},
       {},
       "--metrics-addr (OUTBOX_METRICS_ADDR)",
       2},
      {"--max-topics 0", {"--max-topics", "0"}, {}, "--max-topics", 2},
      {"OUTBOX_READYZ_STALL_TIMEOUT_S 0",
       {},
       {{"OUTBOX_READYZ_STALL_TIMEOUT_S", "0"}},
       "--readyz-stall-timeout-s (OUTBOX_READYZ_STALL_TIMEOUT_S)",
       2},
  };
  RunCases(cases);
}

// Values the command-line parser itself refuses (not in the allowed set, not a
// number, an unknown flag) are bad configuration too: exit 2, like the rest.
TEST_F(Config, UnparsableValueExitsTwoNamingIt) {
  RunCases({
      {"--on-poison skip (not dlq|halt)", {"--on-poison", "skip"}, {}, "--on-poison", 2},
      {"--log-format xml (not text|json)", {"--log-format", "xml"}, {}, "--log-format", 2},
      {"--max-in-flight abc (not a number)", {"--max-in-flight", "abc"}, {}, "--max-in-flight", 2},
      {"--no-such-flag", {"--no-such-flag", "1"}, {}, "--no-such-flag", 2},
  });
}

void Config::RunCases(const std::vector<BadCase>& cases) {
  for (const BadCase& c : cases) {
    SCOPED_TRACE(c.what);
    RelayProcess relay(RelayArgs(c.args), c.env);
    relay.Start();
    auto code = relay.Wait(seconds(30));
    ASSERT_TRUE(code.has_value()) << "still running 30 s after start:\n" << relay.LogTail();
    std::string log = relay.Log();
    fmt::print("config: {:<45} -> exit {}\n", c.what, *code);
    if (c.want_code) {
      EXPECT_EQ(*code, *c.want_code) << relay.LogTail(10);
    } else {
      EXPECT_NE(*code, 0) << relay.LogTail(10);
    }
    EXPECT_NE(log.find(c.must_name), std::string::npos)
        << "the log does not name " << c.must_name << ":\n"
        << relay.LogTail(10);
  }
}

// --help and version are not errors.
TEST_F(Config, HelpAndVersionExitZero) {
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"--help"}, {"run", "--help"}, {"version"}}) {
    RelayProcess relay(args);
    relay.Start();
    auto code = relay.Wait(seconds(10));
    std::string log = relay.Log();
    fmt::print("config: {:<45} -> exit {}\n", args.size() == 1 ? args[0] : args[0] + " " + args[1],
               code.value_or(-1));
    EXPECT_EQ(code, std::optional<int>(0)) << relay.LogTail(10);
    if (args[0] == "version") {
      EXPECT_NE(log.find("outbox-relay "), std::string::npos) << log;
      // The commit it was built from: git's HEAD of the checkout the tests were built in
      // ("-dirty" with uncommitted changes), "unknown" for a build outside git.
      auto commit = log.find("\ncommit: ");
      ASSERT_NE(commit, std::string::npos) << log;
      std::string named = log.substr(commit + 9, log.find('\n', commit + 1) - commit - 9);
      EXPECT_TRUE(named == "unknown" ||
                  (named.size() >= 40 && named.find_first_not_of("0123456789abcdef") >= 40 &&
                   (named.size() == 40 || named.substr(40) == "-dirty")))
          << named;
      // The libraries it runs with: the librdkafka scripts/librdkafka builds (2.12 or
      // newer: SCRAM against Kafka 4), libpq.
      const size_t at = log.find("\nlibrdkafka: ");
      ASSERT_NE(at, std::string::npos) << log;
      int major = 0, minor = 0;
      ASSERT_EQ(std::sscanf(log.c_str() + at, "\nlibrdkafka: %d.%d", &major, &minor), 2) << log;
      EXPECT_GE(major * 100 + minor, 212) << log;
      EXPECT_NE(log.find("\nlibpq: "), std::string::npos) << log;
      // The tests' build has the test-only faults and says so (the image's does not:
      // Image.ShipsWithoutTheTestFaults).
      EXPECT_NE(log.find("\nfailpoints: compiled in (OUTBOX_TEST_FAULT): a test build"),
                std::string::npos)
          << log;
    } else {
      EXPECT_NE(log.find("Usage"), std::string::npos) << log;
    }
  }
}

// A setting refused at start must not leave a new replication slot behind:
// nothing reads it, so it would pin WAL until someone drops it by hand.
TEST_F(Config, KafkaSettingErrorLeavesNoSlotBehind) {
  CreateTables();
  RelayProcess relay(RelayArgs({"--kafka-property", "acks=1"}));
  relay.Start();
  auto code = relay.Wait(seconds(30));
  ASSERT_TRUE(code.has_value()) << relay.LogTail();
  EXPECT_NE(*code, 0);
  auto slot = QuerySlot(*db_, name_);
  fmt::print("config: acks=1 -> exit {}, slot {} {}\n", *code, name_,
             slot ? "was created and left behind" : "was not created");
  EXPECT_FALSE(slot.has_value()) << "the relay created slot " << name_
                                 << " before refusing its Kafka settings:\n"
                                 << relay.LogTail(10);
}

}  // namespace
}  // namespace outbox_test
