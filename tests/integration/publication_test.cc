// Table and publication shapes (DESIGN §5): the relay publishes exactly what
// the table holds, or refuses to start and says how to fix the shape. It
// never streams a shape that hides rows while the slot moves past them.
//
// - A partitioned outbox table (partitions by created_at, attached, detached
//   and dropped while rows stream) is served through a publication with
//   publish_via_partition_root; one without it is refused.
// - A publication row filter, FOR ALL TABLES, a column list without a needed
//   column: refused at start (exit 2, naming --publication and the fix), and
//   `check` fails on them too.
#include <fmt/format.h>

#include <thread>

#include "fixture.h"
#include "ops_support.h"

namespace outbox_test {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

class Publication : public RelayTest {
 protected:
  void TearDown() override {
    for (const std::string& t : extra_tables_) {
      try {
        db_->Exec("DROP TABLE IF EXISTS " + QuoteIdent(t));
      } catch (const std::exception& e) {
        fmt::print("[cleanup] {}: {}\n", t, e.what());
      }
    }
    RelayTest::TearDown();
  }

  // A row with an explicit created_at (routing it to a partition).
  WrittenRow InsertAt(Pg& pg, const std::string& created_at, int64_t seq) {
    return InsertRow(pg, {.service = "part",
                          .event_type = "part.moved",
                          .agg = "part-1",
                          .seq = seq,
                          .created_at = created_at});
  }

  // Starts the relay and expects it to refuse: exit 2, the message naming
  // --publication and `needle`.
  void ExpectRefused(const std::string& needle) {
    RelayProcess& relay = StartRelay();
    auto code = relay.Wait(seconds(30));
    ASSERT_TRUE(code.has_value()) << "the relay streamed a publication it cannot serve\n"
                                  << relay.LogTail();
    EXPECT_EQ(*code, 2) << relay.LogTail();
    std::string log = relay.Log();
    EXPECT_NE(log.find("invalid setting --publication (OUTBOX_PUBLICATION)"), std::string::npos)
        << relay.LogTail();
    EXPECT_NE(log.find(needle), std::string::npos) << relay.LogTail();
    EXPECT_EQ(db_->Int(fmt::format("SELECT count(*) FROM {} WHERE offset_acked IS NOT NULL",
                                   QuoteIdent(name_))),
              0);
  }

  // `outbox-relay check` for this test's settings: its exit code and output.
  std::pair<int, std::string> Check() {
    std::vector<std::string> args = RelayArgs();
    args[0] = "check";
    CommandResult r = RunRelayCommand(args);
    return {r.exit_code, r.out + r.err};
  }

  std::vector<std::string> extra_tables_;
};

TEST_F(Publication, PartitionedTableStreamsWhilePartitionsAreAttachedDetachedAndDropped) {
  // The seed's table, partitioned by created_at; the primary key must hold
  // the partition key.
  db_->Exec(fmt::format(
      "CREATE TABLE {0} (offset_acked BIGINT, offset_consumed BIGSERIAL NOT NULL, "
      "uuid VARCHAR(36) NOT NULL, created_at TIMESTAMPTZ NOT NULL DEFAULT NOW(), payload JSON, "
      "metadata JSON, transaction_id xid8 NOT NULL DEFAULT pg_current_xact_id(), "
      "PRIMARY KEY (transaction_id, offset_consumed, created_at)) PARTITION BY RANGE (created_at);"
      "CREATE INDEX ON {0} (offset_acked) WHERE offset_acked IS NULL;"
      "CREATE TABLE {1} PARTITION OF {0} FOR VALUES FROM ('2000-01-01') TO ('2001-01-01');"
      "CREATE TABLE {2} PARTITION OF {0} FOR VALUES FROM ('2001-01-01') TO ('2100-01-01');"
      "CREATE TABLE {3} (id BIGSERIAL PRIMARY KEY, note TEXT)",
      QuoteIdent(name_), QuoteIdent(name_ + "_p2000"), QuoteIdent(name_ + "_pnow"),
      QuoteIdent(other_table_)));
  extra_tables_ = {name_ + "_p2000", name_ + "_p2100"};
  Ledger ledger;
  Pg writer(env_.database_url);
  // Old rows, published long ago by the forwarder: the partition a cleanup drops.
  std::vector<WrittenRow> old_rows;
  for (int i = 1; i <= 20; ++i) old_rows.push_back(InsertAt(writer, "2000-06-01", i));
  db_->Exec(fmt::format("UPDATE {} SET offset_acked = offset_consumed", QuoteIdent(name_)));

  RelayProcess& relay = StartRelay();
  ASSERT_TRUE(WaitStreaming(relay)) << relay.LogTail();
  auto pub = db_->Scalar("SELECT pubviaroot::text FROM pg_publication WHERE pubname = $1", {name_});
  EXPECT_EQ(pub, "true");

  LoadGenerator load(Workload(), &ledger, 2, [](std::mt19937_64& rng) {
    return TxSpec{.rows = 1 + static_cast<int>(rng() % 10)};
  });
  load.Start();
  std::this_thread::sleep_for(milliseconds(500));
  // A new partition for the future, attached under load, and rows into it.
  db_->Exec(
      fmt::format("CREATE TABLE {1} (LIKE {0} INCLUDING DEFAULTS INCLUDING CONSTRAINTS);"
                  "ALTER TABLE {0} ATTACH PARTITION {1} FOR VALUES FROM ('2100-01-01') TO "
                  "('2101-01-01')",
                  QuoteIdent(name_), QuoteIdent(name_ + "_p2100")));
  std::vector<WrittenRow> future;
  for (int i = 1; i <= 30; ++i) {
    writer.Exec("BEGIN");
    future.push_back(InsertAt(writer, "2100-03-01", i));
    writer.Exec("COMMIT");
  }
  std::this_thread::sleep_for(milliseconds(300));
  // The cleanup of the old way: detach the old partition and drop it.
  db_->Exec(fmt::format("ALTER TABLE {} DETACH PARTITION {}", QuoteIdent(name_),
                        QuoteIdent(name_ + "_p2000")));
  db_->Exec("DROP TABLE " + QuoteIdent(name_ + "_p2000"));
  std::this_thread::sleep_for(milliseconds(500));
  load.Stop();

  EXPECT_EQ(WaitAllAcked(seconds(60)), 0) << DescribeUnacked();
  std::vector<WrittenRow> committed = ledger.committed();
  committed.insert(committed.end(), future.begin(), future.end());
  DeliveryReport report = CheckDelivery(committed, ledger.rolled_back(), ReadTopics());
  fmt::print("{} (partitioned table)\n", report.Summary());
  EXPECT_GT(report.committed, 100u);
  EXPECT_EQ(report.lost, 0u) << report.Samples();
  EXPECT_EQ(report.phantom, 0u) << report.Samples();
  EXPECT_EQ(report.duplicates, 0u) << report.Samples();
  EXPECT_EQ(report.order_violations, 0u) << report.Samples();
  EXPECT_EQ(MisackedRows(), 0);
  ContractReport contract = CheckContract(committed, ReadTopics(), PartitionCounts(ReadTopics()));
  EXPECT_EQ(contract.mismatches, 0u) << contract.Samples();
  EXPECT_TRUE(relay.Running()) << relay.LogTail();
}

TEST_F(Publication, PartitionedTableWithoutRootPublishingIsRefused) {
  db_->Exec(fmt::format(
      "CREATE TABLE {0} (offset_acked BIGINT, offset_consumed BIGSERIAL NOT NULL, "
      "uuid VARCHAR(36) NOT NULL, created_at TIMESTAMPTZ NOT NULL DEFAULT NOW(), payload JSON, "
      "metadata JSON, transaction_id xid8 NOT NULL DEFAULT pg_current_xact_id(), "
      "PRIMARY KEY (transaction_id, offset_consumed, created_at)) PARTITION BY RANGE (created_at);"
      "CREATE TABLE {1} PARTITION OF {0} FOR VALUES FROM ('2001-01-01') TO ('2100-01-01');"
      "CREATE PUBLICATION {2} FOR TABLE {0} WITH (publish = 'insert')",
      QuoteIdent(name_), QuoteIdent(name_ + "_pnow"), QuoteIdent(name_)));
  Pg writer(env_.database_url);
  InsertAt(writer, "2026-01-01", 1);
  ExpectRefused("publish_via_partition_root");
  auto [code, out] = Check();
  EXPECT_EQ(code, 1) << out;
  EXPECT_NE(out.find("publish_via_partition_root = true"), std::string::npos) << out;
}

TEST_F(Publication, RowFilterIsRefusedAndNoRowIsMarked) {
  CreateTables();
  // A kept and a filtered row in one transaction: with a row filter only the
  // first would reach the relay, and marking by transaction marked both.
  db_->Exec(
      fmt::format("CREATE PUBLICATION {} FOR TABLE {} WHERE (uuid <> 'filtered') "
                  "WITH (publish = 'insert')",
                  QuoteIdent(name_), QuoteIdent(name_)));
  Pg writer(env_.database_url);
  writer.Exec("BEGIN");
  InsertAt(writer, "2026-01-01", 1);
  writer.Exec(
      fmt::format("INSERT INTO {} (uuid, payload, metadata) VALUES ('filtered', '{{}}', "
                  "'{{\"Event-Type\":\"part.moved\",\"Source-Service\":\"part\"}}')",
                  QuoteIdent(name_)));
  writer.Exec("COMMIT");
  ExpectRefused("row filter");
  auto [code, out] = Check();
  EXPECT_EQ(code, 1) << out;
  EXPECT_NE(out.find("row filter"), std::string::npos) << out;
  EXPECT_EQ(out.find("stay unacked"), std::string::npos) << out;
}

TEST_F(Publication, ForAllTablesIsRefused) {
  CreateTables();
  // It would stream the relay's own commit index back to it: a write loop.
  db_->Exec(fmt::format("CREATE PUBLICATION {} FOR ALL TABLES WITH (publish = 'insert')",
                        QuoteIdent(name_)));
  Pg writer(env_.database_url);
  InsertAt(writer, "2026-01-01", 1);
  ExpectRefused("FOR ALL TABLES");
}

TEST_F(Publication, ColumnListWithoutANeededColumnIsRefused) {
  CreateTables();
  db_->Exec(
      fmt::format("CREATE PUBLICATION {} FOR TABLE {} (offset_consumed, uuid, payload, "
                  "transaction_id) WITH (publish = 'insert')",
                  QuoteIdent(name_), QuoteIdent(name_)));
  ExpectRefused("leaves out \"metadata\"");
}

TEST_F(Publication, PublicationWithoutTheTableOrWithoutInsertsIsRefused) {
  CreateTables();
  db_->Exec(fmt::format("CREATE PUBLICATION {} FOR TABLE {} WITH (publish = 'update')",
                        QuoteIdent(name_), QuoteIdent(other_table_)));
  ExpectRefused("exists but does not include");
}

}  // namespace
}  // namespace outbox_test
