// --table-mode=watermill against the real services: the consumer group's
// position follows watermill-sql's rule (never past a transaction that can
// still commit behind it), and the first start publishes exactly what the
// group has not processed. (tests/compat compares every record with the real
// Watermill code; these pin the progress semantics one case at a time.)
#include <fmt/format.h>

#include <chrono>
#include <set>
#include <thread>

#include "fixture.h"

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
  auto deadline = std::chrono::steady_clock::now() + seconds(30);
  while (Position() != LastRow() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  EXPECT_EQ(Position(), LastRow()) << relay.LogTail();
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
  auto deadline = std::chrono::steady_clock::now() + seconds(30);
  while (Position() != LastRow() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  EXPECT_EQ(Position(), LastRow());
  relay.Terminate();
  EXPECT_EQ(relay.Wait(seconds(30)), std::optional<int>(0)) << relay.LogTail();
}

}  // namespace
}  // namespace outbox_test
