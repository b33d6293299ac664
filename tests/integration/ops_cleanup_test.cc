// `outbox-relay cleanup` as the seed's CronJob runs it (env vars only, the
// `outbox-cleanup` argument): it deletes exactly the acked rows older than
// the retention, in batches, never an unacked row, prunes the commit index
// the same way, and refuses a retention below 3 days.
#include <fmt/format.h>

#include <set>

#include "fixture.h"
#include "ops_support.h"
#include "outbox_relay/pg/relay_schema.h"

namespace outbox_test {
namespace {

class OpsCleanup : public RelayTest {
 protected:
  void SetUp() override {
    ASSERT_NO_FATAL_FAILURE(RelayTest::SetUp());
    CreateTables();
    db_->Exec(outbox_relay::pg::RelaySchemaDdl());
  }

  // `n` rows named "<prefix>-<i>", created `age` ago, in one transaction;
  // `acked` is an SQL condition over offset_consumed (e.g. "true", "false",
  // "offset_consumed % 2 = 0") choosing the rows that get offset_acked.
  void Seed(const std::string& prefix, int n, const std::string& age, const std::string& acked) {
    db_->Exec(fmt::format(
        "BEGIN; INSERT INTO {t} (uuid, created_at, payload, metadata) "
        "SELECT '{p}-' || g, now() - interval '{age}', '{{}}', '{{}}' "
        "FROM generate_series(1, {n}) g; "
        "UPDATE {t} SET offset_acked = offset_consumed WHERE uuid LIKE '{p}-%' AND ({acked}); "
        "COMMIT",
        fmt::arg("t", QuoteIdent(name_)), fmt::arg("p", prefix), fmt::arg("age", age),
        fmt::arg("n", n), fmt::arg("acked", acked)));
  }

  std::set<std::string> Uuids(const std::string& where = "true") {
    std::set<std::string> out;
    for (const Row& r :
         db_->Query(fmt::format("SELECT uuid FROM {} WHERE {}", QuoteIdent(name_), where))) {
      out.insert(*r[0]);
    }
    return out;
  }

  std::map<std::string, std::optional<std::string>> CronEnv(const std::string& days,
                                                            const std::string& batch) {
    return {{"DATABASE_URL", env_.database_url},
            {"OUTBOX_TABLE", "public." + name_},
            {"OUTBOX_RETENTION_DAYS", days},
            {"OUTBOX_BATCH_SIZE", batch},
            {"OUTBOX_BATCH_SLEEP_MS", "20"}};
  }
};

size_t CountOccurrences(const std::string& text, const std::string& needle) {
  size_t n = 0;
  for (size_t pos = text.find(needle); pos != std::string::npos;
       pos = text.find(needle, pos + needle.size())) {
    ++n;
  }
  return n;
}

TEST_F(OpsCleanup, DeletesExactlyTheAckedRowsPastRetentionInBatches) {
  // Past retention (7 days): 23 acked (go), 5 unacked (stay), and one
  // transaction of 12 where only the even offsets are acked (6 go, 6 stay).
  Seed("old-acked", 23, "10 days", "true");
  Seed("old-unacked", 5, "10 days", "false");
  Seed("old-mixed", 12, "10 days", "offset_consumed % 2 = 0");
  // Either side of the cutoff by an hour.
  Seed("edge-old-acked", 1, "7 days 1 hour", "true");
  Seed("edge-young-acked", 1, "6 days 23 hours", "true");
  // Inside retention: nothing goes.
  Seed("young-acked", 6, "1 day", "true");
  Seed("young-unacked", 4, "1 hour", "false");
  const std::set<std::string> all = Uuids();
  const std::set<std::string> victims =
      Uuids("offset_acked IS NOT NULL AND (uuid LIKE 'old-%' OR uuid LIKE 'edge-old-%')");
  ASSERT_EQ(all.size(), 52u);
  ASSERT_EQ(victims.size(), 30u);  // 23 + 6 + 1
  std::set<std::string> survivors;
  for (const std::string& u : all) {
    if (!victims.contains(u)) survivors.insert(u);
  }

  // The commit index: three old transactions of this slot, two recent ones.
  db_->Exec(
      "INSERT INTO outbox_relay.commits (slot_name, commit_lsn, end_lsn, transaction_ids, "
      "commit_time, row_count) SELECT $1, ('0/' || to_hex(g * 16))::pg_lsn, "
      "('0/' || to_hex(g * 16 + 8))::pg_lsn, ARRAY[g::text::xid8], "
      "now() - CASE WHEN g <= 3 THEN interval '10 days' ELSE interval '1 day' END, 1 "
      "FROM generate_series(1, 5) g",
      {name_});
  // Every slot's old index rows go (other tests' are recent; leftovers count too).
  const int64_t old_commits = db_->Int(
      "SELECT count(*) FROM outbox_relay.commits WHERE commit_time < now() - interval '7 days'");
  ASSERT_GE(old_commits, 3);

  // --dry-run counts and deletes nothing.
  CommandResult dry = RunRelayCommand({"cleanup", "--dry-run"}, CronEnv("7", "7"));
  ASSERT_EQ(dry.exit_code, 0) << dry.Describe();
  EXPECT_NE(dry.out.find(fmt::format("would delete 30 rows from public.{}", name_)),
            std::string::npos)
      << dry.Describe();
  EXPECT_NE(
      dry.out.find(fmt::format("would delete {} rows from outbox_relay.commits", old_commits)),
      std::string::npos)
      << dry.Describe();
  EXPECT_NE(dry.out.find("kept 11 unacked rows older than the cutoff"), std::string::npos)
      << dry.Describe();
  EXPECT_EQ(Uuids(), all);
  EXPECT_EQ(db_->Int("SELECT count(*) FROM outbox_relay.commits WHERE slot_name = $1", {name_}), 5);

  // The CronJob: `outbox-cleanup` with the environment only; batches of 7
  // make the loop run 4 full batches and a short one.
  CommandResult run = RunRelayCommand({"outbox-cleanup"}, CronEnv("7", "7"));
  ASSERT_EQ(run.exit_code, 0) << run.Describe();
  EXPECT_EQ(Uuids(), survivors);
  EXPECT_EQ(db_->Int(fmt::format("SELECT count(*) FROM {} WHERE offset_acked IS NULL",
                                 QuoteIdent(name_))),
            15);  // every unacked row survives: 5 + 6 + 4
  EXPECT_NE(
      run.out.find(fmt::format(
          "deleted 30 rows from public.{} (acked, created before the cutoff) in 5 batches", name_)),
      std::string::npos)
      << run.Describe();
  // A progress line per batch.
  EXPECT_EQ(CountOccurrences(run.err, fmt::format("cleanup: public.{}: batch ", name_)), 5u)
      << run.Describe();
  EXPECT_NE(run.err.find("batch 5 deleted 2 rows; 30 rows so far"), std::string::npos)
      << run.Describe();
  EXPECT_NE(run.out.find(fmt::format("deleted {} rows from outbox_relay.commits", old_commits)),
            std::string::npos)
      << run.Describe();
  EXPECT_NE(run.out.find("cleanup: done in"), std::string::npos) << run.Describe();
  EXPECT_EQ(db_->Int("SELECT count(*) FROM outbox_relay.commits WHERE slot_name = $1", {name_}), 2);
  EXPECT_EQ(db_->Int("SELECT count(*) FROM outbox_relay.commits WHERE slot_name = $1 AND "
                     "commit_time < now() - interval '7 days'",
                     {name_}),
            0);

  // Idempotent: a second run finds nothing.
  CommandResult again = RunRelayCommand({"cleanup"}, CronEnv("7", "7"));
  ASSERT_EQ(again.exit_code, 0) << again.Describe();
  EXPECT_NE(again.out.find(fmt::format("deleted 0 rows from public.{}", name_)), std::string::npos)
      << again.Describe();
  EXPECT_EQ(Uuids(), survivors);
}

TEST_F(OpsCleanup, RefusesRetentionBelowThreeDays) {
  Seed("old-acked", 10, "10 days", "true");
  for (const char* days : {"2", "0", "-1", "seven"}) {
    CommandResult r = RunRelayCommand({"cleanup"}, CronEnv(days, "10000"));
    EXPECT_EQ(r.exit_code, 2) << r.Describe();
    EXPECT_NE(r.err.find("OUTBOX_RETENTION_DAYS"), std::string::npos) << r.Describe();
  }
  CommandResult two = RunRelayCommand({"cleanup"}, CronEnv("2", "10000"));
  EXPECT_NE(two.err.find("below the minimum of 3"), std::string::npos) << two.Describe();
  EXPECT_EQ(Uuids().size(), 10u);  // nothing deleted

  // Above 30: allowed, with a warning; these rows are younger than 45 days.
  CommandResult long_retention = RunRelayCommand({"cleanup"}, CronEnv("45", "10000"));
  EXPECT_EQ(long_retention.exit_code, 0) << long_retention.Describe();
  EXPECT_NE(long_retention.err.find("above 30"), std::string::npos) << long_retention.Describe();
  EXPECT_EQ(Uuids().size(), 10u);
}

TEST_F(OpsCleanup, BadSettingsExitTwoAndDatabaseErrorsExitOne) {
  CommandResult batch = RunRelayCommand({"cleanup"}, CronEnv("7", "0"));
  EXPECT_EQ(batch.exit_code, 2) << batch.Describe();
  EXPECT_NE(batch.err.find("OUTBOX_BATCH_SIZE"), std::string::npos) << batch.Describe();

  auto env = CronEnv("7", "100");
  env["OUTBOX_TABLE"] = "public." + name_ + "_missing";
  CommandResult table = RunRelayCommand({"cleanup"}, env);
  EXPECT_EQ(table.exit_code, 2) << table.Describe();
  EXPECT_NE(table.err.find("OUTBOX_TABLE"), std::string::npos) << table.Describe();

  env = CronEnv("7", "100");
  env["OUTBOX_COLUMN_CREATED_AT"] = "inserted_at";
  CommandResult column = RunRelayCommand({"cleanup"}, env);
  EXPECT_EQ(column.exit_code, 2) << column.Describe();
  EXPECT_NE(column.err.find("OUTBOX_COLUMN_CREATED_AT"), std::string::npos) << column.Describe();

  env = CronEnv("7", "100");
  env["DATABASE_URL"] = "postgresql://postgres@127.0.0.1:1/outbox?connect_timeout=2";
  CommandResult down = RunRelayCommand({"cleanup"}, env);
  EXPECT_EQ(down.exit_code, 1) << down.Describe();
  EXPECT_NE(down.err.find("cleanup failed"), std::string::npos) << down.Describe();
}

}  // namespace
}  // namespace outbox_test
