// --table-mode=watermill against the real services: the consumer group's
// position follows watermill-sql's rule (never past a transaction that can
// still commit behind it), and the first start publishes exactly what the
// group has not processed. (tests/compat compares every record with the real
// Watermill code; these pin the progress semantics one case at a time.)
#include <fmt/format.h>

#include <atomic>
#include <chrono>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include "fixture.h"
#include "ops_support.h"
#include "resilience_support.h"

namespace outbox_test {
namespace {

using std::chrono::seconds;

class Watermill : public RelayTest {
 protected:
  void SetUp() override {
    RelayTest::SetUp();
    topic_ = topic_prefix_ + ".orders";
    // watermill-sql's DDL (DefaultPostgreSQLSchema, v3.1+/v4) under the fixture's
    // name; the offsets table under the side table's name (both dropped at TearDown).
    db_->Exec(fmt::format(
        "CREATE TABLE {} (\"offset\" BIGSERIAL, \"uuid\" VARCHAR(36) NOT NULL, "
        "\"created_at\" TIMESTAMP NOT NULL DEFAULT CURRENT_TIMESTAMP, \"payload\" JSON DEFAULT "
        "NULL, \"metadata\" JSON DEFAULT NULL, \"transaction_id\" xid8 NOT NULL, "
        "PRIMARY KEY (\"transaction_id\", \"offset\"))",
        QuoteIdent(name_)));
  }

  std::vector<std::string> WatermillArgs() const {
    return {"--table-mode",
            "watermill",
            "--watermill-tables",
            "public." + name_,
            "--watermill-topic-map",
            fmt::format("public.{}={}", name_, topic_),
            "--watermill-offsets-table-map",
            fmt::format("public.{}=public.{}", name_, other_table_),
            "--watermill-consumer-group",
            "g",
            "--create-topics",
            "true"};
  }

  // One row, as watermill-sql inserts it (in `pg`'s open transaction, if any).
  std::string Insert(Pg& pg, int n) {
    std::string uuid = NewUlid();
    pg.Exec(fmt::format("INSERT INTO {} (uuid, payload, metadata, transaction_id) VALUES ($1, "
                        "$2, $3, pg_current_xact_id())",
                        QuoteIdent(name_)),
            {uuid, fmt::format(R"({{"n":{}}})", n), fmt::format(R"({{"n":"{}"}})", n)});
    return uuid;
  }

  // The group's (last_processed_transaction_id, offset_acked), "" without a row.
  std::string Position() {
    auto rows = db_->Query(
        fmt::format("SELECT last_processed_transaction_id::text || '/' || offset_acked FROM {} "
                    "WHERE consumer_group = 'g'",
                    QuoteIdent(other_table_)));
    return rows.empty() ? std::string() : rows[0][0].value_or("");
  }

  // The table's last row in (transaction_id, "offset") order, as Position() prints it.
  std::string LastRow() {
    return db_
        ->Scalar(fmt::format("SELECT transaction_id::text || '/' || \"offset\" FROM {} ORDER BY "
                             "transaction_id DESC, \"offset\" DESC LIMIT 1",
                             QuoteIdent(name_)))
        .value_or("");
  }

  // Waits up to `timeout` for the group's position to reach the table's last
  // row (progress is written after Kafka's acks: then everything is in Kafka).
  ::testing::AssertionResult WaitPositionAtLastRow(std::chrono::seconds timeout) {
    auto deadline = std::chrono::steady_clock::now() + timeout;
    while (Position() != LastRow()) {
      if (std::chrono::steady_clock::now() >= deadline) {
        return ::testing::AssertionFailure()
               << "the group's position " << Position() << " is not at the last row " << LastRow()
               << " after " << timeout.count() << " s";
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
    return ::testing::AssertionSuccess();
  }

  std::set<std::string> UuidsInKafka(size_t at_least) {
    ReadOptions o;
    o.max_records = at_least;
    o.timeout = std::chrono::milliseconds(30000);
    std::set<std::string> out;
    for (const KafkaRecord& r : kafka_->Read({topic_}, "", o)) {
      if (const KafkaHeader* h = r.FindHeader("_watermill_message_uuid")) out.insert(*h->value);
    }
    return out;
  }

  std::string topic_;
};

TEST_F(Watermill, PositionNeverPassesATransactionThatCanStillCommitBehindIt) {
  RelayProcess& relay = StartRelay(WatermillArgs());
  ASSERT_TRUE(WaitStreaming(relay)) << relay.LogTail();
  // A takes the smaller xid and stays open; B commits after it.
  Pg a(env_.database_url);
  Pg b(env_.database_url);
  a.Exec("BEGIN");
  std::string ua = Insert(a, 1);
  b.Exec("BEGIN");
  std::string ub = Insert(b, 2);
  b.Exec("COMMIT");
  auto seen = UuidsInKafka(1);
  ASSERT_TRUE(seen.contains(ub)) << "B is published while A is open";
  // Marking rounds and idle rounds go by: the position must not cover B,
  // since A (smaller xid) can still commit; a polling subscriber starting
  // there would skip A's row for ever.
  std::this_thread::sleep_for(seconds(3));
  EXPECT_EQ(Position(), "") << "no row lies below A's xid, so no position yet";
  a.Exec("COMMIT");
  seen = UuidsInKafka(2);
  EXPECT_TRUE(seen.contains(ua));
  // Now nothing is in flight and nothing can commit behind B: the position
  // reaches the last row.
  EXPECT_TRUE(WaitPositionAtLastRow(seconds(30))) << relay.LogTail();
  relay.Terminate();
  EXPECT_EQ(relay.Wait(seconds(30)), std::optional<int>(0)) << relay.LogTail();
}

TEST_F(Watermill, FirstStartPublishesWhatTheGroupHasNotProcessedAndNothingElse) {
  std::vector<std::string> uuids;
  for (int i = 0; i < 10; ++i) uuids.push_back(Insert(*db_, i));  // ten transactions
  // The polling forwarder's position: the fourth row processed.
  db_->Exec(
      fmt::format("CREATE TABLE {} (consumer_group VARCHAR(255) NOT NULL, offset_acked BIGINT, "
                  "last_processed_transaction_id xid8 NOT NULL, PRIMARY KEY(consumer_group))",
                  QuoteIdent(other_table_)));
  db_->Exec(
      fmt::format("INSERT INTO {o} SELECT 'g', \"offset\", transaction_id FROM {t} "
                  "ORDER BY transaction_id, \"offset\" OFFSET 3 LIMIT 1",
                  fmt::arg("o", QuoteIdent(other_table_)), fmt::arg("t", QuoteIdent(name_))));
  RelayProcess& relay = StartRelay(WatermillArgs());
  ASSERT_TRUE(WaitStreaming(relay)) << relay.LogTail();
  std::string late = Insert(*db_, 10);
  auto seen = UuidsInKafka(7);
  std::set<std::string> want(uuids.begin() + 4, uuids.end());
  want.insert(late);
  EXPECT_EQ(seen, want) << relay.LogTail();
  EXPECT_TRUE(WaitPositionAtLastRow(seconds(30)));
  relay.Terminate();
  EXPECT_EQ(relay.Wait(seconds(30)), std::optional<int>(0)) << relay.LogTail();
}

// Concurrent writers (some transactions roll back) while the relay runs, is
// stopped and starts again on its slot: every committed row arrives, nothing
// else does, each key's rows in commit order in one partition; the copies a
// restart may publish twice are counted. Keys from the metadata field
// aggregate_id (--watermill-key-field).
TEST_F(Watermill, LoadAcrossARestartLosesNothingAndKeepsEachKeysOrder) {
  std::vector<std::string> args = WatermillArgs();
  args.insert(args.end(), {"--watermill-key-field", "aggregate_id"});
  RelayProcess* relay = &StartRelay(args);
  ASSERT_TRUE(WaitStreaming(*relay)) << relay->LogTail();
  Ledger ledger;
  std::atomic<bool> stop{false};
  std::mutex error_mu;
  std::string error;
  std::vector<std::thread> writers;
  for (int w = 0; w < 3; ++w) {
    writers.emplace_back([&, w] {
      try {
        Pg pg(env_.database_url);
        std::map<std::string, int64_t> seq;  // per aggregate: the last committed
        for (int i = 0; !stop.load(); ++i) {
          std::string agg = fmt::format("w{}-a{}", w, i % 5);
          pg.Exec("BEGIN");
          std::string xid = pg.Scalar("SELECT pg_current_xact_id()::text").value_or("");
          std::vector<WrittenRow> rows;
          int64_t next = seq[agg];
          for (int k = 0; k < 1 + i % 3; ++k) {
            WrittenRow r;
            r.uuid = NewUlid();
            r.aggregate = agg;
            r.seq = ++next;
            pg.Exec(fmt::format("INSERT INTO {} (uuid, payload, metadata, transaction_id) VALUES "
                                "($1, $2, $3, pg_current_xact_id())",
                                QuoteIdent(name_)),
                    {r.uuid, fmt::format(R"({{"agg":"{}","seq":{}}})", agg, r.seq),
                     fmt::format(R"({{"aggregate_id":"{}"}})", agg)});
            rows.push_back(std::move(r));
          }
          if (i % 7 == 3) {
            pg.Exec("ROLLBACK");
            ledger.AddRolledBack(std::move(rows));
          } else {
            pg.Exec("COMMIT");
            seq[agg] = next;
            ledger.AddCommitted(xid, std::move(rows));
          }
        }
      } catch (const std::exception& e) {
        std::lock_guard<std::mutex> lock(error_mu);
        error = e.what();
        stop.store(true);
      }
    });
  }
  std::this_thread::sleep_for(seconds(2));
  relay->Terminate();
  EXPECT_EQ(relay->Wait(seconds(30)), std::optional<int>(0)) << relay->LogTail();
  std::this_thread::sleep_for(seconds(1));  // rows committed while no relay runs
  relay = &StartRelay(args);
  ASSERT_TRUE(WaitStreaming(*relay)) << relay->LogTail();
  std::this_thread::sleep_for(seconds(2));
  stop.store(true);
  for (auto& t : writers) t.join();
  ASSERT_EQ(error, "");
  ASSERT_GT(ledger.committed_count(), 0u);
  // Progress is written after Kafka's acks: at the last row, everything is in Kafka.
  EXPECT_TRUE(WaitPositionAtLastRow(seconds(60))) << relay->LogTail();
  DeliveryReport report = CheckDelivery(ledger.committed(), ledger.rolled_back(), ReadTopics());
  std::printf("%s\n", report.Summary().c_str());
  EXPECT_EQ(report.lost, 0u) << report.Samples();
  EXPECT_EQ(report.phantom, 0u) << report.Samples();
  EXPECT_EQ(report.order_violations, 0u) << report.Samples();
  EXPECT_EQ(report.split_aggregates, 0u) << report.Samples();
  EXPECT_GE(report.consumed, report.committed);
  relay->Terminate();
  EXPECT_EQ(relay->Wait(seconds(30)), std::optional<int>(0)) << relay->LogTail();
}

// A table that joins the publication while the relay is stopped is caught up
// from a snapshot before streaming. The idempotent producer failing for good
// in the middle (OUTBOX_TEST_FAULT=fatal-after:N, as an out-of-order sequence
// from the broker does) restarts the pipeline as under the backfill: the relay
// keeps running, and the catch-up resumes from the group's position (which
// moves only past delivered pages). Every row arrives, nothing else, each
// partition's first copies in table order; the copies sent again are counted.
TEST_F(Watermill, AFatalProducerErrorUnderATablesCatchUpRestartsThePipeline) {
  constexpr int kFatalAfter = 1000;
  RelayProcess& first = StartRelay(WatermillArgs());
  ASSERT_TRUE(WaitStreaming(first)) << first.LogTail();
  Insert(*db_, 0);
  ASSERT_TRUE(WaitPositionAtLastRow(seconds(30))) << first.LogTail();
  first.Terminate();
  ASSERT_EQ(first.Wait(seconds(30)), std::optional<int>(0)) << first.LogTail();
  // Out of the publication while rows are written: the stream will not have them.
  db_->Exec(fmt::format("ALTER PUBLICATION {0} DROP TABLE {0}", QuoteIdent(name_)));
  for (int tx = 0; tx < 30; ++tx) {
    db_->Exec(
        fmt::format("INSERT INTO {} (uuid, payload, metadata, transaction_id) SELECT "
                    "substr(md5(random()::text || g), 1, 26), json_build_object('n', g), '{{}}', "
                    "pg_current_xact_id() FROM generate_series(1, 100) g",
                    QuoteIdent(name_)));
  }
  // Every row of the table, in the order watermill-sql processes them.
  std::map<std::string, size_t> rank;
  for (const Row& r : db_->Query(fmt::format(
           "SELECT uuid FROM {} ORDER BY transaction_id, \"offset\"", QuoteIdent(name_)))) {
    rank.emplace(*r[0], rank.size());
  }
  ASSERT_EQ(rank.size(), 3001u);

  // Pages of 400: two are delivered (the group's position at row 800) when
  // the fault fires in the third.
  std::vector<std::string> args = WatermillArgs();
  args.insert(args.end(), {"--backfill-batch", "400"});
  RelayProcess& relay =
      StartRelay(args, {{"OUTBOX_TEST_FAULT", fmt::format("fatal-after:{}", kFatalAfter)}});
  ASSERT_TRUE(relay.WaitForLog("joined the publication", seconds(30))) << relay.LogTail();
  ASSERT_TRUE(WaitStreaming(relay, seconds(90))) << relay.LogTail();
  EXPECT_TRUE(WaitPositionAtLastRow(seconds(60))) << relay.LogTail();
  ASSERT_TRUE(relay.Running()) << "the relay exited after the producer's fatal error:\n"
                               << relay.LogTail();

  std::set<std::string> seen;
  std::map<std::pair<std::string, int32_t>, size_t> last_first_copy;
  size_t phantom = 0, duplicates = 0, order_violations = 0, consumed = 0;
  for (const KafkaRecord& rec : kafka_->Read({topic_}, "", ReadOptions{})) {
    ++consumed;
    const KafkaHeader* h = rec.FindHeader("_watermill_message_uuid");
    auto it = h != nullptr && h->value ? rank.find(*h->value) : rank.end();
    if (it == rank.end()) {
      ++phantom;
      continue;
    }
    if (!seen.insert(it->first).second) {
      ++duplicates;
      continue;
    }
    auto [at, fresh] = last_first_copy.try_emplace({rec.topic, rec.partition}, it->second);
    if (!fresh && it->second < at->second) ++order_violations;
    at->second = std::max(at->second, it->second);
  }
  const size_t lost = rank.size() - seen.size();
  const std::string log = relay.Log();
  fmt::print(
      "catch-up of {} rows, fatal producer error after {}: {} pipeline restart(s); consumed {}, "
      "lost {}, phantom {}, order violations {}, duplicates {}\n",
      rank.size() - 1, kFatalAfter, resilience::CountOccurrences(log, "pipeline restarted"),
      consumed, lost, phantom, order_violations, duplicates);
  EXPECT_EQ(resilience::CountOccurrences(log, "pipeline restarted"), 1u) << relay.LogTail();
  EXPECT_NE(log.find("OUT_OF_ORDER_SEQUENCE_NUMBER"), std::string::npos) << relay.LogTail();
  EXPECT_EQ(lost, 0u);
  EXPECT_EQ(phantom, 0u);
  EXPECT_EQ(order_violations, 0u);
  // Sent again: at most the failed page, not the two delivered before it.
  EXPECT_LE(duplicates, 400u);
  relay.Terminate();
  EXPECT_EQ(relay.Wait(seconds(30)), std::optional<int>(0)) << relay.LogTail();
}

// `cleanup --table-mode=watermill`: a row goes once it is past retention and
// every consumer group in the offsets table has processed it (the smallest
// position of all groups); younger rows and rows a group has not processed
// stay.
TEST_F(Watermill, CleanupDeletesOnlyOldRowsEveryConsumerGroupProcessed) {
  std::vector<std::string> old_uuids;
  for (int i = 0; i < 10; ++i) {  // ten transactions, ten days old
    old_uuids.push_back(NewUlid());
    db_->Exec(fmt::format("INSERT INTO {} (uuid, created_at, payload, metadata, transaction_id) "
                          "VALUES ($1, now()::timestamp - interval '10 days', '{{}}', '{{}}', "
                          "pg_current_xact_id())",
                          QuoteIdent(name_)),
              {old_uuids.back()});
  }
  std::string young = Insert(*db_, 99);
  db_->Exec(
      fmt::format("CREATE TABLE {} (consumer_group VARCHAR(255) NOT NULL, offset_acked BIGINT, "
                  "last_processed_transaction_id xid8 NOT NULL, PRIMARY KEY(consumer_group))",
                  QuoteIdent(other_table_)));
  // Group g has processed seven rows, group slow four; the young row is
  // processed by both (still inside retention).
  for (auto [group, n] : {std::pair<const char*, int>{"g", 6}, {"slow", 3}}) {
    db_->Exec(
        fmt::format("INSERT INTO {o} SELECT '{g}', \"offset\", transaction_id FROM {t} "
                    "ORDER BY transaction_id, \"offset\" OFFSET {n} LIMIT 1",
                    fmt::arg("o", QuoteIdent(other_table_)), fmt::arg("g", group),
                    fmt::arg("t", QuoteIdent(name_)), fmt::arg("n", n)));
  }
  CommandResult run = RunRelayCommand(
      {"cleanup", "--table-mode", "watermill", "--watermill-tables", "public." + name_,
       "--watermill-topic-map", fmt::format("public.{}={}", name_, topic_),
       "--watermill-offsets-table-map", fmt::format("public.{}=public.{}", name_, other_table_),
       "--retention-days", "7", "--batch-size", "3", "--batch-sleep-ms", "0"},
      {{"DATABASE_URL", env_.database_url}});
  ASSERT_EQ(run.exit_code, 0) << run.Describe();
  std::set<std::string> left;
  for (const Row& r : db_->Query(fmt::format("SELECT uuid FROM {}", QuoteIdent(name_)))) {
    left.insert(*r[0]);
  }
  std::set<std::string> want(old_uuids.begin() + 4, old_uuids.end());
  want.insert(young);
  EXPECT_EQ(left, want) << run.Describe();
}

}  // namespace
}  // namespace outbox_test
