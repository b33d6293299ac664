// The shape of the table and of the transactions changing under the relay:
// columns added and dropped while writers write (pgoutput re-sends the
// Relation; columns are found by name, DESIGN §3), and one transaction of
// 200,000 rows (produced as it streams, never held whole: memory stays
// bounded by --max-in-flight, DESIGN §5 "Backpressure, not buffering").
#include <fmt/format.h>
#include <unistd.h>

#include <thread>

#include "fixture.h"
#include "resilience_support.h"

namespace outbox_test {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;
using namespace resilience;

class ResilienceSchema : public RelayTest {};

size_t Count(const std::string& text, const std::string& needle) {
  size_t n = 0;
  for (size_t p = 0; (p = text.find(needle, p)) != std::string::npos; p += needle.size()) ++n;
  return n;
}

TEST_F(ResilienceSchema, AddAndDropColumnsUnderLoad) {
  CreateTables();
  RelayProcess& relay = StartRelay();
  ASSERT_TRUE(WaitStreaming(relay)) << relay.LogTail();

  Ledger ledger;
  LoadGenerator load(
      Workload(), &ledger, 2,
      [](std::mt19937_64& rng) {
        TxSpec tx;
        tx.rows = 1 + static_cast<int>(rng() % 10);
        tx.rollback = rng() % 20 == 0;
        return tx;
      },
      std::chrono::microseconds(3000));
  load.Start();
  const std::string t = QuoteIdent(name_);
  // Each change lands between writers' transactions (ALTER TABLE waits for
  // its lock); created_at is not a column the relay uses, and dropping it
  // moves every contract column after it one position to the left.
  std::vector<std::string> changes = {
      fmt::format("ALTER TABLE {} ADD COLUMN extra_note TEXT DEFAULT 'added'", t),
      fmt::format("ALTER TABLE {} DROP COLUMN created_at", t),
      fmt::format("ALTER TABLE {} ADD COLUMN extra_num BIGINT NOT NULL DEFAULT 7", t),
      fmt::format("ALTER TABLE {} DROP COLUMN extra_note", t),
      fmt::format("ALTER TABLE {} ADD COLUMN created_at TIMESTAMPTZ NOT NULL DEFAULT NOW()", t),
  };
  std::vector<double> alter_s;
  for (const std::string& sql : changes) {
    std::this_thread::sleep_for(milliseconds(1500));
    auto t0 = std::chrono::steady_clock::now();
    db_->Exec(sql);
    alter_s.push_back(SecondsSince(t0));
  }
  std::this_thread::sleep_for(milliseconds(1500));
  ASSERT_EQ(load.Stop(), "");

  auto catch_up = std::chrono::steady_clock::now();
  int64_t unacked = WaitAllAcked(seconds(60));
  double catch_up_s = SecondsSince(catch_up);
  EXPECT_EQ(unacked, 0) << DescribeUnacked();
  EXPECT_EQ(MisackedRows(), 0);
  EXPECT_TRUE(relay.Running()) << relay.LogTail();
  std::vector<WrittenRow> committed = ledger.committed();
  std::vector<KafkaRecord> records = ReadTopics({.timeout = seconds(60)});
  DeliveryReport delivery = CheckDelivery(committed, ledger.rolled_back(), records);
  std::string columns = *db_->Scalar(
      "SELECT string_agg(attname, ', ' ORDER BY attnum) FROM pg_attribute "
      "WHERE attrelid = $1::regclass AND attnum > 0 AND NOT attisdropped",
      {name_});

  std::string alters;
  for (double s : alter_s) alters += fmt::format(" {:.2f}", s);
  fmt::print(
      "schema changes under load: {} ALTER TABLEs (seconds each:{}), {} transactions, {} rows; "
      "relay logged {} table changes; columns now: {}; catch-up {:.1f} s\n",
      changes.size(), alters, load.transactions(), committed.size(), Count(relay.Log(), "changed:"),
      columns, catch_up_s);
  fmt::print("{}\n", delivery.Summary());
  EXPECT_EQ(delivery.lost, 0u) << delivery.Samples();
  EXPECT_EQ(delivery.phantom, 0u) << delivery.Samples();
  EXPECT_EQ(delivery.duplicates, 0u) << delivery.Samples();
  EXPECT_EQ(delivery.order_violations, 0u) << delivery.Samples();
  ContractReport contract = CheckContract(committed, records, PartitionCounts(records));
  fmt::print("{}\n", contract.Summary());
  EXPECT_EQ(contract.mismatches, 0u) << contract.Samples();
  EXPECT_EQ(contract.wrong_partition, 0u) << contract.Samples();
  CheckCommitIndex(ledger);

  relay.Terminate();
  EXPECT_EQ(relay.Wait(seconds(30)), std::optional<int>(0)) << relay.LogTail();
  fmt::print("total {:.1f} s\n", SecondsSince(started_));
}

TEST_F(ResilienceSchema, TwoHundredThousandRowTransaction) {
  constexpr int kRows = 200000;
  constexpr int kAggregates = 64;
  constexpr int kPad = 200;
  constexpr int64_t kMaxInFlight = 20000;  // the relay's default, spelled out
  constexpr long kBoundKb = 256 * 1024;
  CreateTables();
  RelayProcess& relay = StartRelay({"--max-in-flight", std::to_string(kMaxInFlight)});
  ASSERT_TRUE(WaitStreaming(relay)) << relay.LogTail();
  long rss_idle = ProcStatusKb(relay.pid(), "VmRSS");
  RssSampler rss(relay.pid());

  // One statement, one transaction; row i belongs to aggregate i % 64 and is
  // its (i / 64 + 1)-th event, so each aggregate's seq rises in insert order.
  std::string pad(kPad, 'x');
  auto insert = std::chrono::steady_clock::now();
  db_->Exec(
      fmt::format("INSERT INTO {} (uuid, payload, metadata) "
                  "SELECT 'big-' || lpad(i::text, 8, '0'), "
                  " ('{{\"agg\":\"big-' || (i % {}) || '\",\"seq\":' || (i / {} + 1) || "
                  "  ',\"pad\":\"{}\"}}')::json, "
                  " ('{{\"Aggregate-Id\":\"big-' || (i % {}) || "
                  "  '\",\"Event-Type\":\"big.created\",\"Source-Service\":\"big\"}}')::json "
                  "FROM generate_series(0, {}) AS i",
                  QuoteIdent(name_), kAggregates, kAggregates, pad, kAggregates, kRows - 1));
  double insert_s = SecondsSince(insert);
  auto committed_at = std::chrono::steady_clock::now();
  std::string xid =
      *db_->Scalar(fmt::format("SELECT DISTINCT transaction_id::text FROM {}", QuoteIdent(name_)));

  std::vector<WrittenRow> rows;
  rows.reserve(kRows);
  for (int i = 0; i < kRows; ++i) {
    WrittenRow w;
    w.uuid = fmt::format("big-{:08}", i);
    w.aggregate = fmt::format("big-{}", i % kAggregates);
    w.seq = i / kAggregates + 1;
    w.xid = xid;
    std::map<std::string, std::string> metadata = {
        {"Aggregate-Id", w.aggregate}, {"Event-Type", "big.created"}, {"Source-Service", "big"}};
    w.expected.topic = topic_prefix_ + ".big.big";
    w.expected.key = w.aggregate;
    w.expected.value =
        fmt::format(R"({{"agg":"{}","seq":{},"pad":"{}"}})", w.aggregate, w.seq, pad);
    w.expected.headers = ExpectedHeaders(w.uuid, metadata);
    rows.push_back(std::move(w));
  }
  Ledger ledger;
  ledger.AddCommitted(xid, rows);

  int64_t unacked = WaitAllAcked(seconds(180));
  double delivered_s = SecondsSince(committed_at);
  EXPECT_EQ(unacked, 0) << DescribeUnacked();
  EXPECT_EQ(MisackedRows(), 0);
  ASSERT_TRUE(relay.Running()) << relay.LogTail();
  long hwm = ProcStatusKb(relay.pid(), "VmHWM");
  rss.Stop();

  std::vector<KafkaRecord> records = ReadTopics({.timeout = seconds(120)});
  DeliveryReport delivery = CheckDelivery(rows, {}, records);
  ContractReport contract = CheckContract(rows, records, PartitionCounts(records));
  // What --max-in-flight implies: the idle process, plus each unacknowledged
  // record held about four times over (librdkafka's copy of key, value and
  // headers, its message and batch buffers, the relay's own bookkeeping),
  // plus 64 MB for librdkafka's and libpq's buffers.
  size_t record_bytes = rows[0].expected.value->size() + rows[0].expected.key->size();
  for (const KafkaHeader& h : rows[0].expected.headers) {
    record_bytes += h.name.size() + h.value.value_or("").size();
  }
  long implied_kb = rss_idle + static_cast<long>(kMaxInFlight * 4 * record_bytes / 1024) + 65536;

  fmt::print(
      "large transaction: {} rows ({} bytes a record) inserted in {:.1f} s, all delivered and "
      "marked {:.1f} s after the commit\n",
      kRows, record_bytes, insert_s, delivered_s);
  fmt::print(
      "memory: VmRSS {:.1f} MB idle, peak sampled {:.1f} MB, VmHWM {:.1f} MB (bounds: {} MB, "
      "and {:.1f} MB implied by --max-in-flight {})\n",
      Mb(rss_idle), Mb(rss.peak_kb()), Mb(hwm), kBoundKb / 1024, Mb(implied_kb), kMaxInFlight);
  fmt::print("{}\n{}\n", delivery.Summary(), contract.Summary());
  EXPECT_GT(hwm, 0);
  EXPECT_LT(hwm, kBoundKb);
  EXPECT_LT(hwm, implied_kb);
  EXPECT_EQ(delivery.committed, static_cast<size_t>(kRows));
  EXPECT_EQ(delivery.lost, 0u) << delivery.Samples();
  EXPECT_EQ(delivery.phantom, 0u) << delivery.Samples();
  EXPECT_EQ(delivery.duplicates, 0u) << delivery.Samples();
  EXPECT_EQ(delivery.order_violations, 0u) << delivery.Samples();
  EXPECT_EQ(contract.mismatches, 0u) << contract.Samples();
  EXPECT_EQ(contract.wrong_partition, 0u) << contract.Samples();
  CheckCommitIndex(ledger);

  relay.Terminate();
  EXPECT_EQ(relay.Wait(seconds(30)), std::optional<int>(0)) << relay.LogTail();
  fmt::print("total {:.1f} s\n", SecondsSince(started_));
}

}  // namespace
}  // namespace outbox_test
