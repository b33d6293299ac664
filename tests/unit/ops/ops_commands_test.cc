// The pure parts of the ops commands: settings (flags and their environment
// variables, exit-2 validation naming the setting), the JSON and text output,
// and SQL rows turned into the pgoutput structures RecordMapper reads.
#include <gtest/gtest.h>
#include <libpq-fe.h>
#include <simdjson.h>

#include <CLI/CLI.hpp>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "outbox_relay/app/commands.h"
#include "outbox_relay/ops/check.h"
#include "outbox_relay/ops/cleanup.h"
#include "outbox_relay/ops/replay.h"
#include "outbox_relay/ops/slot_command.h"
#include "outbox_relay/outbox/record.h"
#include "outbox_relay/pg/rows.h"

namespace outbox_relay::ops {
namespace {

// Sets an environment variable for the scope of one test.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    ::setenv(name, value, 1);
  }
  ~ScopedEnv() {
    if (old_) {
      ::setenv(name_, old_->c_str(), 1);
    } else {
      ::unsetenv(name_);
    }
  }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

simdjson::dom::element ParseJson(simdjson::dom::parser& parser, const std::string& json) {
  simdjson::dom::element doc;
  auto error = parser.parse(json).get(doc);
  EXPECT_EQ(error, simdjson::SUCCESS) << json;
  return doc;
}

TEST(OpsHelpers, JsonQuoteEscapesWhatJsonNeeds) {
  EXPECT_EQ(JsonQuote("plain"), "\"plain\"");
  EXPECT_EQ(JsonQuote("a\"b\\c\n\t\x01"), "\"a\\\"b\\\\c\\n\\t\\u0001\"");
  EXPECT_EQ(JsonQuote("ünï"), "\"ünï\"");
  simdjson::dom::parser parser;
  std::string_view back;
  ASSERT_EQ(ParseJson(parser, JsonQuote("q\"\\\r\x1f/x")).get(back), simdjson::SUCCESS);
  EXPECT_EQ(back, "q\"\\\r\x1f/x");
}

TEST(OpsHelpers, PrettyBytes) {
  EXPECT_EQ(PrettyBytes(0), "0 B");
  EXPECT_EQ(PrettyBytes(1023), "1023 B");
  EXPECT_EQ(PrettyBytes(1536), "1.5 KiB");
  EXPECT_EQ(PrettyBytes(71359336), "68.1 MiB");
  EXPECT_EQ(PrettyBytes(int64_t{3} << 40), "3.0 TiB");
  EXPECT_EQ(PrettyBytes(-2048), "-2.0 KiB");
}

TEST(OpsHelpers, ParseIntSettingNamesTheSetting) {
  EXPECT_EQ(app::ParseIntSetting("42", "--n", "N", 0, 100), 42);
  for (const char* bad : {"", "4x", "x", " 4", "1e3"}) {
    auto r = app::ParseIntSetting(bad, "--n", "OUTBOX_N", 0, 100);
    ASSERT_FALSE(r) << bad;
    EXPECT_EQ(r.error().code, ErrorCode::kInvalidArgument);
    EXPECT_NE(r.error().message.find("--n (OUTBOX_N)"), std::string::npos) << r.error().message;
  }
  auto high = app::ParseIntSetting("101", "--n", "OUTBOX_N", 0, 100);
  ASSERT_FALSE(high);
  EXPECT_NE(high.error().message.find("out of range 0..100"), std::string::npos);
  EXPECT_EQ(app::ExitCodeOf(high.error()), app::kExitConfig);
  EXPECT_EQ(app::ExitCodeOf(Error{ErrorCode::kTransient, "x"}), app::kExitFailure);
}

// Parses `args` (an integer option's bad value fails there, as CLI11's
// ValidationError, which main turns into exit 2) and then validates.
Status ParseThenValidate(CLI::App& app, const std::string& args,
                         const std::function<Status()>& validate) {
  try {
    app.parse(args, false);
  } catch (const CLI::ParseError& e) {
    return Fail(ErrorCode::kInvalidArgument, "{}", e.what());
  }
  return validate();
}

TEST(OpsCleanupSettings, SeedDefaultsFromTheEnvironment) {
  ScopedEnv url("DATABASE_URL", "postgresql://x@y/z");
  CLI::App app;
  CleanupConfig c;
  AddCleanupFlags(app, c);
  app.parse("", false);
  ASSERT_TRUE(ValidateCleanup(c));
  EXPECT_EQ(c.retention_days, 7);
  EXPECT_EQ(c.batch_size, 10000);
  EXPECT_EQ(c.batch_sleep_ms, 500);
  EXPECT_EQ(c.table_name.ToString(), "public.outbox");
  EXPECT_EQ(c.acked_column, "offset_acked");
  EXPECT_EQ(c.created_at_column, "created_at");
  EXPECT_FALSE(c.dry_run);
}

TEST(OpsCleanupSettings, RetentionBelowThreeDaysIsRefused) {
  ScopedEnv url("DATABASE_URL", "postgresql://x@y/z");
  for (const char* days : {"0", "1", "2"}) {
    ScopedEnv retention("OUTBOX_RETENTION_DAYS", days);
    CLI::App app;
    CleanupConfig c;
    AddCleanupFlags(app, c);
    app.parse("", false);
    auto st = ValidateCleanup(c);
    ASSERT_FALSE(st) << days;
    EXPECT_NE(st.error().message.find("OUTBOX_RETENTION_DAYS"), std::string::npos);
    EXPECT_NE(st.error().message.find("below the minimum of 3"), std::string::npos);
  }
  for (const char* days : {"3", "30", "31", "365"}) {
    ScopedEnv retention("OUTBOX_RETENTION_DAYS", days);
    CLI::App app;
    CleanupConfig c;
    AddCleanupFlags(app, c);
    app.parse("", false);
    EXPECT_TRUE(ValidateCleanup(c)) << days;
  }
}

TEST(OpsCleanupSettings, FlagsOverrideAndBadValuesNameTheirVariable) {
  ScopedEnv url("DATABASE_URL", "postgresql://x@y/z");
  ScopedEnv batch("OUTBOX_BATCH_SIZE", "100");
  CLI::App app;
  CleanupConfig c;
  AddCleanupFlags(app, c);
  app.parse("--batch-size 7 --batch-sleep-ms 0 --table s.t --dry-run", false);
  ASSERT_TRUE(ValidateCleanup(c));
  EXPECT_EQ(c.batch_size, 7);
  EXPECT_EQ(c.batch_sleep_ms, 0);
  EXPECT_EQ(c.table_name.ToString(), "s.t");
  EXPECT_TRUE(c.dry_run);

  struct Case {
    const char* args;
    const char* names;
  };
  for (const Case& k : {Case{"--batch-size 0", "OUTBOX_BATCH_SIZE"},
                        Case{"--batch-sleep-ms -1", "OUTBOX_BATCH_SLEEP_MS"},
                        Case{"--retention-days x", "OUTBOX_RETENTION_DAYS"},
                        Case{"--table a.b.c", "OUTBOX_TABLE"}}) {
    CLI::App a;
    CleanupConfig cc;
    AddCleanupFlags(a, cc);
    auto st = ParseThenValidate(a, k.args, [&] { return ValidateCleanup(cc); });
    ASSERT_FALSE(st) << k.args;
    EXPECT_NE(st.error().message.find(k.names), std::string::npos) << st.error().message;
  }
  // A bad value from the environment fails the same way, naming the variable.
  {
    ScopedEnv bad_sleep("OUTBOX_BATCH_SLEEP_MS", "soon");
    CLI::App e;
    CleanupConfig ce;
    AddCleanupFlags(e, ce);
    auto from_env = ParseThenValidate(e, "", [&] { return ValidateCleanup(ce); });
    ASSERT_FALSE(from_env);
    EXPECT_NE(
        from_env.error().message.find("--batch-sleep-ms (OUTBOX_BATCH_SLEEP_MS): 'soon' is not"),
        std::string::npos)
        << from_env.error().message;
  }
  ScopedEnv no_url("DATABASE_URL", "");
  CLI::App a;
  CleanupConfig cc;
  AddCleanupFlags(a, cc);
  a.parse("", false);
  auto st = ValidateCleanup(cc);
  ASSERT_FALSE(st);
  EXPECT_NE(st.error().message.find("DATABASE_URL"), std::string::npos);
}

Result<ReplayConfig> ParseReplay(const std::string& args) {
  CLI::App app;
  ReplayConfig c;
  AddReplayFlags(app, c);
  if (auto st =
          ParseThenValidate(app, "--database-url postgresql://x@y/z --kafka-brokers k:9092 " + args,
                            [&] { return ValidateReplay(c); });
      !st) {
    return std::unexpected(st.error());
  }
  return c;
}

TEST(OpsChoiceSettings, OutputAndLogFormatAreEnumsAndBadValuesNameTheirVariable) {
  {
    CLI::App app;
    SlotCommandConfig c;
    AddSlotStatusFlags(app, c);
    app.parse("", false);
    EXPECT_EQ(c.output, OutputFormat::kText);
    EXPECT_EQ(c.log.format, app::LogFormat::kText);
    app.parse("--output json --log-format json", false);
    EXPECT_EQ(c.output, OutputFormat::kJson);
    EXPECT_EQ(c.log.format, app::LogFormat::kJson);
  }
  {
    CLI::App app;
    CheckConfig c;
    AddCheckFlags(app, c);
    auto st = ParseThenValidate(app, "--output yaml", [] { return Ok(); });
    ASSERT_FALSE(st);
    EXPECT_NE(st.error().message.find("invalid setting --output (OUTBOX_OUTPUT): 'yaml': use text "
                                      "or json"),
              std::string::npos)
        << st.error().message;
    EXPECT_EQ(c.output, OutputFormat::kText);
  }
  {
    ScopedEnv bad("OUTBOX_LOG_FORMAT", "xml");
    CLI::App app;
    CleanupConfig c;
    AddCleanupFlags(app, c);
    auto st = ParseThenValidate(app, "", [] { return Ok(); });
    ASSERT_FALSE(st);
    EXPECT_NE(st.error().message.find("--log-format (OUTBOX_LOG_FORMAT): 'xml'"), std::string::npos)
        << st.error().message;
  }
}

TEST(OpsReplaySettings, RangeByLsnOrTime) {
  auto lsn = ParseReplay("--from-lsn 0/16B3748 --to-lsn 1/0");
  ASSERT_TRUE(lsn) << lsn.error().message;
  EXPECT_FALSE(lsn->by_time);
  EXPECT_EQ(lsn->from, Lsn(0x16B3748));
  EXPECT_EQ(lsn->to, Lsn(uint64_t{1} << 32));

  auto open = ParseReplay("--from-lsn 0/10");
  ASSERT_TRUE(open);
  EXPECT_EQ(open->to, Lsn(~uint64_t{0}));

  auto time = ParseReplay("--from-time 2024-05-01T00:00:00Z --to-time '2024-05-02 00:00+02'");
  ASSERT_TRUE(time) << time.error().message;
  EXPECT_TRUE(time->by_time);
  EXPECT_EQ(time->to_time, "2024-05-02 00:00+02");

  struct Case {
    const char* args;
    const char* names;
  };
  for (const Case& k : {
           Case{"", "--from-lsn (OUTBOX_REPLAY_FROM_LSN)"},
           Case{"--from-lsn 16B3748", "--from-lsn"},
           Case{"--from-lsn 0/10 --to-lsn 0/F", "--to-lsn"},
           Case{"--from-lsn 0/10 --from-time now", "--from-time"},
           Case{"--from-time now --to-lsn 0/10", "--to-lsn"},
           Case{"--from-lsn 0/10 --to-time now", "--to-time"},
           Case{"--from-lsn 0/10 --page-rows 0", "--page-rows"},
           Case{"--from-lsn 0/10 --topic-template '{'", "--topic-template"},
       }) {
    auto r = ParseReplay(k.args);
    ASSERT_FALSE(r) << k.args;
    EXPECT_EQ(r.error().code, ErrorCode::kInvalidArgument);
    EXPECT_NE(r.error().message.find(k.names), std::string::npos) << r.error().message;
  }
}

TEST(OpsReplaySettings, DryRunNeedsNoKafka) {
  CLI::App app;
  ReplayConfig c;
  AddReplayFlags(app, c);
  ScopedEnv no_brokers("KAFKA_BROKERS", "");
  app.parse("--database-url postgresql://x@y/z --from-lsn 0/0", false);
  auto st = ValidateReplay(c);
  ASSERT_FALSE(st);
  EXPECT_NE(st.error().message.find("KAFKA_BROKERS"), std::string::npos);
  c.dry_run = true;
  EXPECT_TRUE(ValidateReplay(c));
  EXPECT_EQ(c.relay.sink, app::SinkKind::kKafka);  // untouched by the dry run's validation
}

TEST(OpsCheckOutput, TextShowsFixesAndJsonParses) {
  std::vector<CheckResult> results = {
      {CheckStatus::kOk, "wal_level", "logical", ""},
      {CheckStatus::kFail, "role", "no \"REPLICATION\"", "ALTER ROLE r REPLICATION;"},
      {CheckStatus::kWarn, "unacked index", "missing", "CREATE INDEX ..."},
  };
  std::string text = FormatChecksText(results);
  EXPECT_NE(text.find("OK    wal_level: logical\n"), std::string::npos) << text;
  EXPECT_NE(text.find("FAIL  role: no \"REPLICATION\"\n      fix: ALTER ROLE r REPLICATION;\n"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("check: 1 FAIL, 1 WARN, 1 OK\n"), std::string::npos) << text;

  simdjson::dom::parser parser;
  std::string json = FormatChecksJson(results);
  auto doc = ParseJson(parser, json);
  EXPECT_EQ(doc["ok"].get_bool().value(), false);
  EXPECT_EQ(doc["fail"].get_int64().value(), 1);
  EXPECT_EQ(doc["warn"].get_int64().value(), 1);
  auto checks = doc["checks"].get_array().value();
  ASSERT_EQ(checks.size(), 3u);
  EXPECT_EQ(checks.at(1)["status"].get_string().value(), "FAIL");
  EXPECT_EQ(checks.at(1)["detail"].get_string().value(), "no \"REPLICATION\"");
  EXPECT_EQ(checks.at(1)["fix"].get_string().value(), "ALTER ROLE r REPLICATION;");
  EXPECT_TRUE(checks.at(0)["fix"].error() == simdjson::NO_SUCH_FIELD);

  auto all_ok = ParseJson(parser, FormatChecksJson({results[0]}));
  EXPECT_EQ(all_ok["ok"].get_bool().value(), true);
}

TEST(OpsSlotOutput, JsonOfPresentAndMissingSlotsParses) {
  SlotReport r;
  r.slot = "outbox_relay";
  r.current_wal_lsn = "0/3000000";
  r.exists = true;
  r.plugin = "pgoutput";
  r.slot_type = "logical";
  r.database = "outbox";
  r.active = true;
  r.active_pid = 4242;
  r.holder = "outbox-relay from 10.0.0.1";
  r.restart_lsn = "0/1000000";
  r.confirmed_flush_lsn = "0/2000000";
  r.retained_bytes = 0x2000000;
  r.wal_status = "reserved";
  r.relay_schema = true;
  r.state.push_back({kSlotCreatedStateKey, "0/16B3748", "2024-05-01 00:00:00+00"});
  r.indexed_transactions = 3;
  r.first_commit_lsn = "0/1000100";
  r.last_commit_lsn = "0/1000300";

  simdjson::dom::parser parser;
  std::string json = FormatSlotReportJson(r);
  auto doc = ParseJson(parser, json);
  EXPECT_EQ(doc["exists"].get_bool().value(), true);
  EXPECT_EQ(doc["active_pid"].get_int64().value(), 4242);
  EXPECT_EQ(doc["retained_wal"].get_string().value(), "32.0 MiB");
  EXPECT_TRUE(doc["safe_wal_size"].is_null());
  EXPECT_EQ(doc["state"]["slot_created"]["value"].get_string().value(), "0/16B3748");
  EXPECT_EQ(doc["commit_index"]["transactions"].get_int64().value(), 3);
  EXPECT_TRUE(doc["commit_index"]["first_commit_time"].is_null());

  std::string text = FormatSlotReportText(r);
  EXPECT_NE(text.find("yes (pid 4242, outbox-relay from 10.0.0.1)"), std::string::npos) << text;

  SlotReport missing;
  missing.slot = "gone";
  missing.relay_schema = true;
  missing.state.push_back({kSlotCreatedStateKey, "0/16B3748", "2024-05-01 00:00:00+00"});
  auto doc2 = ParseJson(parser, FormatSlotReportJson(missing));
  EXPECT_EQ(doc2["exists"].get_bool().value(), false);
  EXPECT_TRUE(doc2["plugin"].error() == simdjson::NO_SUCH_FIELD);
  EXPECT_NE(FormatSlotReportText(missing).find("treats it as lost"), std::string::npos);
}

// A query result built in memory, as libpq would return it.
struct ResultDeleter {
  void operator()(PGresult* r) const { PQclear(r); }
};

TEST(OpsReplayRows, SqlRowsMapLikeStreamedInserts) {
  std::unique_ptr<PGresult, ResultDeleter> res(PQmakeEmptyPGresult(nullptr, PGRES_TUPLES_OK));
  char n0[] = "outbox_replay_commit_lsn", n1[] = "uuid", n2[] = "payload", n3[] = "metadata",
       n4[] = "transaction_id", n5[] = "offset_consumed", n6[] = "extra";
  PGresAttDesc attrs[] = {
      {n0, 0, 0, 0, 25, -1, -1},  {n1, 0, 0, 0, 1043, -1, 40}, {n2, 0, 0, 0, 114, -1, -1},
      {n3, 0, 0, 0, 114, -1, -1}, {n4, 0, 0, 0, 5069, 8, -1},  {n5, 0, 0, 0, 20, 8, -1},
      {n6, 0, 0, 0, 25, -1, -1},
  };
  ASSERT_TRUE(PQsetResultAttrs(res.get(), 7, attrs));
  auto set = [&](int col, const char* v) {
    ASSERT_TRUE(PQsetvalue(res.get(), 0, col, const_cast<char*>(v),
                           v == nullptr ? -1 : static_cast<int>(std::strlen(v))));
  };
  set(0, "0/16B3748");
  set(1, "01HX");
  set(2, R"({"a":1})");
  set(3, R"({"Aggregate-Id":"r-1","Event-Type":"review.created","Source-Service":"review"})");
  set(4, "777");
  set(5, "12");
  set(6, nullptr);

  pgoutput::Relation relation = pg::RelationOf(res.get());
  ASSERT_EQ(relation.columns.size(), 7u);
  EXPECT_EQ(relation.columns[1].name, "uuid");
  EXPECT_EQ(relation.columns[1].type_oid, 1043u);
  EXPECT_EQ(relation.columns[1].type_modifier, 40);
  auto columns = outbox::ColumnMap::Resolve(relation, outbox::ColumnNames{});
  ASSERT_TRUE(columns) << columns.error().message;
  EXPECT_EQ(columns->uuid, 1);
  EXPECT_EQ(columns->offset, 5);

  pgoutput::TupleData tuple;
  pg::TupleOf(res.get(), 0, &tuple);
  ASSERT_EQ(tuple.values.size(), 7u);
  EXPECT_EQ(tuple.values[6].kind, pgoutput::TupleValue::Kind::kNull);
  EXPECT_EQ(tuple.values[2].kind, pgoutput::TupleValue::Kind::kText);

  auto mapper = outbox::RecordMapper::Create({});
  ASSERT_TRUE(mapper);
  auto mapped = mapper->Map(*columns, tuple, Lsn(0x16B3748));
  ASSERT_TRUE(mapped) << mapped.error().message;
  ASSERT_NE(mapped->record, nullptr);
  EXPECT_EQ(mapped->identity.transaction_id, 777u);
  EXPECT_EQ(mapped->identity.offset, 12);
  EXPECT_EQ(mapped->record->topic, "kazmaps.review.review");
  EXPECT_EQ(mapped->record->key, "r-1");
  EXPECT_EQ(mapped->record->value, R"({"a":1})");
  ASSERT_FALSE(mapped->record->headers.empty());
  EXPECT_EQ(mapped->record->headers[0].first, outbox::kUuidHeader);
  EXPECT_EQ(mapped->record->headers[0].second, "01HX");
}

}  // namespace
}  // namespace outbox_relay::ops
