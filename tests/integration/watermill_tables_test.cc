// --table-mode=watermill with tables that change under a running relay
// (issue 37): dropped, renamed, altered, truncated, their offsets table
// dropped. In each, under load on three tables:
//  - the other tables' rows are all in Kafka (lost 0) and their consumer
//    group positions keep moving to their last row;
//  - the rows written to the changed table before the change are in Kafka;
//  - the relay's health tells the truth: /readyz stays 200 when nothing is
//    stuck, says 503 naming the table while its position cannot be written
//    for longer than --readyz-stall-timeout-s, and 200 again after;
//  - a listed table (--watermill-tables) that is dropped stops the relay,
//    naming the table and the setting, after what it read is delivered.
// The tables live in a schema of the test's own, named watermill_<topic> as
// watermill-sql names them, the topics under the test's prefix.
#include <fmt/format.h>

#include <atomic>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include "fixture.h"
#include "support/http_get.h"
#include "support/throwaway_pg.h"

namespace outbox_test {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;
using Clock = std::chrono::steady_clock;

class WatermillTables : public RelayTest {
 protected:
  void SetUp() override {
    RelayTest::SetUp();
    schema_ = name_;
    db_->Exec(fmt::format("DROP SCHEMA IF EXISTS {} CASCADE", QuoteIdent(schema_)));
    db_->Exec(fmt::format("CREATE SCHEMA {}", QuoteIdent(schema_)));
    for (const char* t : {"a", "b", "c"}) {
      // watermill-sql's DDL (DefaultPostgreSQLSchema).
      db_->Exec(fmt::format(
          "CREATE TABLE {} (\"offset\" BIGSERIAL, \"uuid\" VARCHAR(36) NOT NULL, "
          "\"created_at\" TIMESTAMP NOT NULL DEFAULT CURRENT_TIMESTAMP, \"payload\" JSON "
          "DEFAULT NULL, \"metadata\" JSON DEFAULT NULL, \"transaction_id\" xid8 NOT NULL, "
          "PRIMARY KEY (\"transaction_id\", \"offset\"))",
          Table(t)));
    }
  }

  void TearDown() override {
    StopWriters();
    RelayTest::TearDown();
    if (db_) db_->Exec(fmt::format("DROP SCHEMA IF EXISTS {} CASCADE", QuoteIdent(schema_)));
  }

  std::string Topic(const std::string& t) const { return topic_prefix_ + "." + t; }
  std::string TableName(const std::string& t) const { return "watermill_" + Topic(t); }
  std::string Table(const std::string& t) const {
    return QuoteIdent(schema_) + "." + QuoteIdent(TableName(t));
  }
  std::string Offsets(const std::string& t) const {
    return QuoteIdent(schema_) + "." + QuoteIdent("watermill_offsets_" + Topic(t));
  }

  // The pattern (or the list) of this test's tables, discovery every second.
  std::vector<std::string> Args(const std::vector<std::string>& listed = {}) const {
    std::vector<std::string> args = {"--table-mode",
                                     "watermill",
                                     "--watermill-consumer-group",
                                     "g",
                                     "--watermill-discover-interval-s",
                                     "1",
                                     "--create-topics",
                                     "true"};
    if (listed.empty()) {
      args.insert(args.end(), {"--watermill-table-pattern", schema_ + ".watermill_*"});
    } else {
      std::string list;
      for (const std::string& t : listed) {
        list += (list.empty() ? "" : ",") + schema_ + "." + QuoteIdent(TableName(t));
      }
      args.insert(args.end(), {"--watermill-tables", list});
    }
    return args;
  }

  // A writer per table: transactions of 1-3 rows every 10 ms, as
  // watermill-sql inserts them; the UUIDs of what committed.
  void StartWriter(const std::string& t) {
    auto stop = std::make_shared<std::atomic<bool>>(false);
    stops_[t] = stop;
    writers_.emplace_back([this, t, stop] {
      Pg pg(env_.database_url);
      int n = 0;
      while (!stop->load()) {
        std::vector<std::string> uuids;
        try {
          pg.Exec("BEGIN");
          for (int i = 0; i <= n % 3; ++i) {
            uuids.push_back(NewUlid());
            pg.Exec(fmt::format("INSERT INTO {} (uuid, payload, metadata, transaction_id) VALUES "
                                "($1, $2, '{{}}', pg_current_xact_id())",
                                Table(t)),
                    {uuids.back(), fmt::format(R"({{"n":{}}})", n)});
          }
          pg.Exec("COMMIT");
        } catch (const std::exception& e) {
          ADD_FAILURE() << "writer of " << t << ": " << e.what();
          return;
        }
        ++n;
        {
          std::lock_guard lock(mu_);
          for (auto& u : uuids) written_[t].insert(std::move(u));
        }
        std::this_thread::sleep_for(milliseconds(10));
      }
    });
  }
  void StopWriter(const std::string& t) {
    stops_.at(t)->store(true);
    // The writers are joined at StopWriters; give this one time to finish its transaction.
    std::this_thread::sleep_for(milliseconds(100));
  }
  void StopWriters() {
    for (auto& [t, stop] : stops_) stop->store(true);
    for (auto& w : writers_) {
      if (w.joinable()) w.join();
    }
    writers_.clear();
  }
  std::set<std::string> Written(const std::string& t) {
    std::lock_guard lock(mu_);
    return written_[t];
  }

  // The group's position in `t`'s offsets table, and `t`'s last row ("" when none).
  std::string Position(const std::string& t) {
    auto rows = db_->Query(fmt::format(
        "SELECT last_processed_transaction_id::text || '/' || offset_acked FROM {} WHERE "
        "consumer_group = 'g'",
        Offsets(t)));
    return rows.empty() ? std::string() : rows[0][0].value_or("");
  }
  std::string LastRow(const std::string& t) {
    return db_
        ->Scalar(fmt::format("SELECT transaction_id::text || '/' || \"offset\" FROM {} ORDER BY "
                             "transaction_id DESC, \"offset\" DESC LIMIT 1",
                             Table(t)))
        .value_or("");
  }
  ::testing::AssertionResult WaitPositionAtLastRow(const std::string& t, seconds timeout) {
    auto deadline = Clock::now() + timeout;
    std::string position;
    while ((position = Position(t)) != LastRow(t)) {
      if (Clock::now() >= deadline) {
        return ::testing::AssertionFailure()
               << "the position of " << t << " is " << position << ", not at its last row "
               << LastRow(t) << " after " << timeout.count() << " s";
      }
      std::this_thread::sleep_for(milliseconds(200));
    }
    return ::testing::AssertionSuccess();
  }

  // Every UUID of `t`'s topic in Kafka: lost = written - these.
  size_t Lost(const std::string& t, const std::set<std::string>& written) {
    ReadOptions o;
    o.timeout = milliseconds(30000);
    std::set<std::string> in_kafka;
    for (const KafkaRecord& r : kafka_->Read({Topic(t)}, "", o)) {
      if (const KafkaHeader* h = r.FindHeader("_watermill_message_uuid"); h && h->value) {
        in_kafka.insert(*h->value);
      }
    }
    size_t lost = 0;
    for (const std::string& u : written) lost += in_kafka.contains(u) ? 0 : 1;
    fmt::print("table {}: {} rows written, {} in Kafka, {} lost\n", t, written.size(),
               in_kafka.size(), lost);
    return lost;
  }

  // Polls /readyz until its status is `status` (0 on timeout); returns the body seen last.
  std::string WaitReady(int port, int status, seconds timeout) {
    auto deadline = Clock::now() + timeout;
    HttpResponse r;
    while (Clock::now() < deadline) {
      r = HttpGet(port, "/readyz");
      if (r.status == status) return r.body;
      std::this_thread::sleep_for(milliseconds(200));
    }
    return "timed out; last: " + std::to_string(r.status) + " " + r.body;
  }

  std::string schema_;
  std::mutex mu_;
  std::map<std::string, std::set<std::string>> written_;
  std::map<std::string, std::shared_ptr<std::atomic<bool>>> stops_;
  std::vector<std::thread> writers_;
};

TEST_F(WatermillTables, DroppedTableOfThePatternIsUnfollowedAndTheOthersMoveOn) {
  const int port = FreeLocalPort(17500);
  std::vector<std::string> args = Args();
  args.insert(args.end(), {"--metrics-addr", fmt::format("127.0.0.1:{}", port)});
  RelayProcess& relay = StartRelay(args);
  ASSERT_TRUE(WaitStreaming(relay)) << relay.LogTail();
  auto t0 = Clock::now();
  for (const char* t : {"a", "b", "c"}) StartWriter(t);
  std::this_thread::sleep_for(seconds(3));
  StopWriter("a");
  const std::set<std::string> written_a = Written("a");
  db_->Exec(fmt::format("DROP TABLE {}", Table("a")));
  std::this_thread::sleep_for(seconds(6));
  StopWriters();
  // The others' positions reach their last rows, and every row is in Kafka,
  // the dropped table's included.
  EXPECT_TRUE(WaitPositionAtLastRow("b", seconds(30))) << relay.LogTail();
  EXPECT_TRUE(WaitPositionAtLastRow("c", seconds(30))) << relay.LogTail();
  EXPECT_EQ(Lost("a", written_a), 0u);
  EXPECT_EQ(Lost("b", Written("b")), 0u);
  EXPECT_EQ(Lost("c", Written("c")), 0u);
  EXPECT_TRUE(relay.Running()) << relay.LogTail();
  EXPECT_NE(relay.Log().find("is no longer followed"), std::string::npos) << relay.LogTail();
  EXPECT_EQ(WaitReady(port, 200, seconds(10)).substr(0, 2), "ok");
  // Still moving after: new rows of b go out and its position follows.
  Pg pg(env_.database_url);
  pg.Exec(
      fmt::format("INSERT INTO {} (uuid, payload, metadata, transaction_id) VALUES ('late', "
                  "'{{}}', '{{}}', pg_current_xact_id())",
                  Table("b")));
  EXPECT_TRUE(WaitPositionAtLastRow("b", seconds(30))) << relay.LogTail();
  // And it stops cleanly: nothing is left unmarked behind the dropped table.
  relay.Terminate();
  EXPECT_EQ(relay.Wait(seconds(30)), std::optional<int>(0)) << relay.LogTail();
  fmt::print("test body {:.1f} s\n", SecondsSince(t0));
}

TEST_F(WatermillTables, RenamedTableOfThePatternIsUnfollowedAndTheOthersMoveOn) {
  const int port = FreeLocalPort(17520);
  std::vector<std::string> args = Args();
  args.insert(args.end(), {"--metrics-addr", fmt::format("127.0.0.1:{}", port)});
  RelayProcess& relay = StartRelay(args);
  ASSERT_TRUE(WaitStreaming(relay)) << relay.LogTail();
  for (const char* t : {"a", "b", "c"}) StartWriter(t);
  std::this_thread::sleep_for(seconds(3));
  StopWriter("a");
  const std::set<std::string> written_a = Written("a");
  // Out of the pattern: no longer a Watermill table of this relay.
  db_->Exec(fmt::format("ALTER TABLE {} RENAME TO {}", Table("a"),
                        QuoteIdent("archived_" + TableName("a"))));
  // A row written to it under its new name: not followed, and no stall.
  db_->Exec(fmt::format(
      "INSERT INTO {}.{} (uuid, payload, metadata, transaction_id) VALUES ('after-rename', '{{}}', "
      "'{{}}', pg_current_xact_id())",
      QuoteIdent(schema_), QuoteIdent("archived_" + TableName("a"))));
  std::this_thread::sleep_for(seconds(6));
  StopWriters();
  EXPECT_TRUE(WaitPositionAtLastRow("b", seconds(30))) << relay.LogTail();
  EXPECT_TRUE(WaitPositionAtLastRow("c", seconds(30))) << relay.LogTail();
  EXPECT_EQ(Lost("a", written_a), 0u);
  EXPECT_EQ(Lost("b", Written("b")), 0u);
  EXPECT_EQ(Lost("c", Written("c")), 0u);
  EXPECT_TRUE(relay.Running()) << relay.LogTail();
  EXPECT_NE(relay.Log().find("is no longer followed"), std::string::npos) << relay.LogTail();
  EXPECT_EQ(WaitReady(port, 200, seconds(10)).substr(0, 2), "ok");
}

// Altered so that it no longer has watermill-sql's columns (a column
// dropped): rows written before still go out, rows after are not Watermill
// rows any more, and nothing stops or stalls.
TEST_F(WatermillTables, AlteredTableOfThePatternIsUnfollowedAndTheOthersMoveOn) {
  const int port = FreeLocalPort(17540);
  std::vector<std::string> args = Args();
  args.insert(args.end(), {"--metrics-addr", fmt::format("127.0.0.1:{}", port)});
  RelayProcess& relay = StartRelay(args);
  ASSERT_TRUE(WaitStreaming(relay)) << relay.LogTail();
  for (const char* t : {"a", "b", "c"}) StartWriter(t);
  std::this_thread::sleep_for(seconds(3));
  StopWriter("a");
  const std::set<std::string> written_a = Written("a");
  db_->Exec(fmt::format("ALTER TABLE {} DROP COLUMN metadata", Table("a")));
  db_->Exec(
      fmt::format("INSERT INTO {} (uuid, payload, transaction_id) VALUES ('after-alter', '{{}}', "
                  "pg_current_xact_id())",
                  Table("a")));
  std::this_thread::sleep_for(seconds(6));
  StopWriters();
  EXPECT_TRUE(WaitPositionAtLastRow("b", seconds(30))) << relay.LogTail();
  EXPECT_TRUE(WaitPositionAtLastRow("c", seconds(30))) << relay.LogTail();
  EXPECT_EQ(Lost("a", written_a), 0u);
  EXPECT_EQ(Lost("b", Written("b")), 0u);
  EXPECT_EQ(Lost("c", Written("c")), 0u);
  EXPECT_TRUE(relay.Running()) << relay.LogTail();
  EXPECT_NE(relay.Log().find("is no longer followed"), std::string::npos) << relay.LogTail();
  EXPECT_EQ(WaitReady(port, 200, seconds(10)).substr(0, 2), "ok");
}

TEST_F(WatermillTables, TruncatedTableAndADroppedOffsetsTableHoldNobodyBack) {
  const int port = FreeLocalPort(17550);
  std::vector<std::string> args = Args();
  args.insert(args.end(), {"--metrics-addr", fmt::format("127.0.0.1:{}", port)});
  RelayProcess& relay = StartRelay(args, {{"OUTBOX_READYZ_STALL_TIMEOUT_S", "3"}});
  ASSERT_TRUE(WaitStreaming(relay)) << relay.LogTail();
  for (const char* t : {"a", "b", "c"}) StartWriter(t);
  std::this_thread::sleep_for(seconds(2));
  StopWriter("a");
  const std::set<std::string> written_a = Written("a");
  ASSERT_TRUE(WaitPositionAtLastRow("a", seconds(30))) << relay.LogTail();
  // A migration truncates a and holds its ACCESS EXCLUSIVE lock for 10 s.
  // (Its open transaction also holds every table's position back, by
  // watermill-sql's own rule: nothing with a larger xid is processed while
  // it may commit. The slot must not be held: the rows go on.)
  auto confirmed = [&] {
    return db_->Int(
        fmt::format("SELECT (confirmed_flush_lsn - '0/0')::bigint FROM "
                    "pg_replication_slots WHERE slot_name = '{}'",
                    name_));
  };
  Pg migration(env_.database_url);
  migration.Exec("BEGIN");
  migration.Exec(fmt::format("TRUNCATE {}", Table("a")));
  auto locked_at = Clock::now();
  // Meanwhile the offsets table of c goes.
  db_->Exec(fmt::format("DROP TABLE {}", Offsets("c")));
  std::this_thread::sleep_for(seconds(1));
  const int64_t confirmed_before = confirmed();
  // /readyz names the table once its position has failed for 3 s.
  const std::string unready = WaitReady(port, 503, seconds(8));
  fmt::print("/readyz during the lock: {}", unready);
  EXPECT_NE(unready.find(TableName("a")), std::string::npos) << unready;
  std::this_thread::sleep_for(seconds(10) - (Clock::now() - locked_at));
  // The slot moved meanwhile: b's and c's rows were marked and confirmed.
  const int64_t confirmed_during = confirmed();
  fmt::print("confirmed during the lock: {} -> {} ({} bytes)\n", confirmed_before, confirmed_during,
             confirmed_during - confirmed_before);
  EXPECT_GT(confirmed_during, confirmed_before) << "the slot did not move while a was locked";
  migration.Exec("COMMIT");
  EXPECT_EQ(WaitReady(port, 200, seconds(15)).substr(0, 2), "ok");
  StopWriters();
  EXPECT_TRUE(WaitPositionAtLastRow("b", seconds(30))) << relay.LogTail();
  // c's offsets table is back, with the group's position at its last row.
  EXPECT_TRUE(WaitPositionAtLastRow("c", seconds(30))) << relay.LogTail();
  EXPECT_EQ(Lost("a", written_a), 0u);
  EXPECT_EQ(Lost("b", Written("b")), 0u);
  EXPECT_EQ(Lost("c", Written("c")), 0u);
  std::string metrics = HttpGet(port, "/metrics").body;
  EXPECT_GT(MetricSum(metrics, "outbox_relay_marker_failed_rounds_total").value_or(0), 0);
  EXPECT_NE(relay.Log().find("was dropped while the relay ran: created it again"),
            std::string::npos)
      << relay.LogTail();
  EXPECT_TRUE(relay.Running());
}

TEST_F(WatermillTables, DroppedListedTableStopsTheRelayNamingItAndTheSetting) {
  RelayProcess& relay = StartRelay(Args({"a", "b"}));
  ASSERT_TRUE(WaitStreaming(relay)) << relay.LogTail();
  for (const char* t : {"a", "b"}) StartWriter(t);
  std::this_thread::sleep_for(seconds(3));
  StopWriter("a");
  const std::set<std::string> written_a = Written("a");
  const std::set<std::string> written_b = Written("b");
  db_->Exec(fmt::format("DROP TABLE {}", Table("a")));
  std::this_thread::sleep_for(seconds(1));
  StopWriters();
  auto code = relay.Wait(seconds(30));
  ASSERT_TRUE(code.has_value()) << "the relay did not stop: " << relay.LogTail();
  EXPECT_EQ(*code, 2) << relay.LogTail();  // kExitConfig: a setting to fix
  std::string log = relay.Log();
  EXPECT_NE(log.find("--watermill-tables"), std::string::npos) << relay.LogTail();
  EXPECT_NE(log.find(TableName("a")), std::string::npos) << relay.LogTail();
  // What was written before the drop went out first (b's later rows wait
  // for the restart that fixes the setting).
  EXPECT_EQ(Lost("a", written_a), 0u);
  EXPECT_EQ(Lost("b", written_b), 0u);
}

}  // namespace
}  // namespace outbox_test
