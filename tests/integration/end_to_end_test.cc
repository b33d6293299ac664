// End to end: rows written to the outbox table arrive in Kafka exactly as the
// record contract says (DESIGN §4), once, in order; the table is marked, the
// slot is confirmed, and the commit-LSN index has one row per transaction.
#include <fmt/format.h>

#include <algorithm>
#include <random>
#include <set>
#include <thread>

#include "fixture.h"

namespace outbox_test {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

class EndToEnd : public RelayTest {};

TEST_F(EndToEnd, TenThousandEventsMixedTransactions) {
  CreateTables();
  RelayProcess& relay = StartRelay();
  ASSERT_TRUE(WaitStreaming(relay)) << relay.LogTail();

  // The plan: 10,000 committed rows in transactions of 1, 10 and 500 rows,
  // between rolled-back transactions, rolled-back savepoints (inside committed
  // transactions) and writes to the unpublished side table, in random order,
  // from two writers at once.
  std::mt19937_64 rng(20240501);
  std::vector<TxSpec> plan;
  for (int i = 0; i < 2000; ++i) plan.push_back({.rows = 1});
  for (int i = 0; i < 300; ++i) plan.push_back({.rows = 10});
  for (int i = 0; i < 10; ++i) plan.push_back({.rows = 500});
  for (TxSpec& tx : plan) {
    if (rng() % 10 == 0) tx.savepoint_rolled_back_rows = 1 + static_cast<int>(rng() % 5);
    if (rng() % 5 == 0) tx.other_table_rows = 1 + static_cast<int>(rng() % 20);
  }
  for (int size : {1, 1, 1, 10, 10, 500}) {
    for (int i = 0; i < 5; ++i) {
      plan.push_back({.rows = size, .rollback = true, .other_table_rows = i % 2});
    }
  }
  for (int i = 0; i < 50; ++i) plan.push_back({.rows = 0, .other_table_rows = 10});
  std::shuffle(plan.begin(), plan.end(), rng);

  Ledger ledger;
  auto load_start = std::chrono::steady_clock::now();
  std::vector<std::string> errors(2);
  std::vector<std::thread> writers;
  for (int w = 0; w < 2; ++w) {
    writers.emplace_back([&, w] {
      try {
        Writer writer(Workload(), &ledger, -1, 1000 + static_cast<uint64_t>(w));
        for (size_t i = static_cast<size_t>(w); i < plan.size(); i += 2) {
          if (plan[i].rows == 0) {
            writer.OtherTableOnly(plan[i].other_table_rows);
          } else {
            writer.Transaction(plan[i]);
          }
        }
      } catch (const std::exception& e) {
        errors[static_cast<size_t>(w)] = e.what();
      }
    });
  }
  for (auto& t : writers) t.join();
  uint64_t wal_after_last_commit = CurrentWalLsn(*db_);
  double load_s = SecondsSince(load_start);
  ASSERT_EQ(errors, std::vector<std::string>(2)) << "writer failed";
  std::vector<WrittenRow> committed = ledger.committed();
  std::vector<WrittenRow> rolled_back = ledger.rolled_back();
  ASSERT_EQ(committed.size(), 10000u);
  fmt::print(
      "load: {} committed rows in {} transactions, {} rolled-back transactions, {} rows "
      "rolled back (transactions and savepoints), {} side-table rows, {:.1f} s\n",
      committed.size(), ledger.transactions().size(), ledger.aborted_transactions(),
      rolled_back.size(), ledger.other_table_rows(), load_s);

  // The table: every row marked with its own offset.
  auto catch_up_start = std::chrono::steady_clock::now();
  int64_t unacked = WaitAllAcked(seconds(30));
  fmt::print("catch-up: {} rows unacked {:.2f} s after the last commit\n", unacked,
             SecondsSince(catch_up_start));
  EXPECT_EQ(unacked, 0) << "rows still offset_acked IS NULL after 30 s (see "
                           "Marking.RowDecodedBeforeItIsVisibleIsStillMarked)\n"
                        << DescribeUnacked();
  EXPECT_EQ(MisackedRows(), 0) << "rows with offset_acked <> offset_consumed";
  EXPECT_EQ(db_->Int(fmt::format("SELECT count(*) FROM {}", QuoteIdent(name_))), 10000);

  // The slot: confirmed at least to the end of the last commit; the idle rule
  // then carries it on to the WAL end.
  uint64_t confirmed = WaitConfirmedAtLeast(wal_after_last_commit, seconds(10));
  uint64_t wal_now = CurrentWalLsn(*db_);
  fmt::print(
      "slot: confirmed_flush_lsn {} (WAL after the last commit {}, WAL now {}, {} bytes "
      "behind now)\n",
      FormatLsn(confirmed), FormatLsn(wal_after_last_commit), FormatLsn(wal_now),
      wal_now > confirmed ? wal_now - confirmed : 0);
  EXPECT_GE(confirmed, wal_after_last_commit)
      << "confirmed_flush_lsn did not reach the WAL position after the last commit";
  // Idle rule: with nothing in flight it follows the WAL end, past the WAL the
  // marking itself wrote.
  uint64_t wal_after_marking = CurrentWalLsn(*db_);
  auto idle_start = std::chrono::steady_clock::now();
  uint64_t idle_confirmed = WaitConfirmedAtLeast(wal_after_marking, seconds(10));
  fmt::print("slot: idle, confirmed {} reached the WAL end seen after marking ({}) in {:.2f} s\n",
             FormatLsn(idle_confirmed), FormatLsn(wal_after_marking), SecondsSince(idle_start));
  EXPECT_GE(idle_confirmed, wal_after_marking)
      << "an idle relay did not carry confirmed_flush_lsn to the WAL end within 10 s";

  // The commit-LSN index: one row per committed transaction with outbox rows.
  CheckCommitIndex(ledger);

  // Kafka: the set, the order, the bytes, the partitions.
  auto read_start = std::chrono::steady_clock::now();
  std::vector<KafkaRecord> records = ReadTopics({.timeout = seconds(60)});
  fmt::print("kafka: read {} records in {:.1f} s\n", records.size(), SecondsSince(read_start));
  DeliveryReport delivery = CheckDelivery(committed, rolled_back, records);
  fmt::print("{}\n", delivery.Summary());
  EXPECT_EQ(delivery.lost, 0u) << delivery.Samples();
  EXPECT_EQ(delivery.phantom, 0u) << delivery.Samples();
  EXPECT_EQ(delivery.duplicates, 0u) << "nothing crashed, so nothing may be sent twice\n"
                                     << delivery.Samples();
  EXPECT_EQ(delivery.order_violations, 0u) << delivery.Samples();
  EXPECT_EQ(delivery.split_aggregates, 0u) << delivery.Samples();

  auto partitions = PartitionCounts(records);
  ContractReport contract = CheckContract(committed, records, partitions);
  std::string topics;
  for (const auto& [t, n] : partitions) topics += fmt::format(" {}({} partitions)", t, n);
  fmt::print("{}; topics:{}\n", contract.Summary(), topics);
  EXPECT_EQ(contract.checked, records.size());
  EXPECT_EQ(contract.mismatches, 0u) << contract.Samples();
  EXPECT_EQ(contract.wrong_partition, 0u) << contract.Samples();
  std::set<std::string> want_topics;
  for (const WrittenRow& r : committed) want_topics.insert(r.expected.topic);
  EXPECT_EQ(partitions.size(), want_topics.size());

  relay.Terminate();
  auto code = relay.Wait(seconds(30));
  ASSERT_TRUE(code.has_value()) << "relay did not exit within 30 s of SIGTERM";
  EXPECT_EQ(*code, 0) << relay.LogTail();
  fmt::print("total {:.1f} s\n", SecondsSince(started_));
}

// One hand-made row and the record the contract says it becomes.
struct EdgeRow {
  std::string what;
  std::optional<std::string> payload;          // SQL text of the payload column
  std::string metadata;                        // SQL text of the metadata column
  std::map<std::string, std::string> decoded;  // the metadata as the relay must decode it
  std::string topic_suffix = "edge.edge";
};

TEST_F(EndToEnd, NullPayloadAndMetadataEdgeCases) {
  CreateTables();
  RelayProcess& relay = StartRelay();
  ASSERT_TRUE(WaitStreaming(relay)) << relay.LogTail();

  const std::string base = R"("Event-Type":"edge.case","Source-Service":"edge")";
  std::vector<EdgeRow> rows = {
      {"payload SQL NULL -> null value",
       std::nullopt,
       R"({"Aggregate-Id":"edge-1",)" + base + "}",
       {{"Aggregate-Id", "edge-1"}, {"Event-Type", "edge.case"}, {"Source-Service", "edge"}}},
      {"empty string -> 0-length header",
       R"({"n":2})",
       R"({"Aggregate-Id":"edge-2","Correlation-Id":"",)" + base + "}",
       {{"Aggregate-Id", "edge-2"},
        {"Correlation-Id", ""},
        {"Event-Type", "edge.case"},
        {"Source-Service", "edge"}}},
      {"no Aggregate-Id -> the empty key (Sarama hashes it), no partition_key",
       R"({"n":3})",
       "{" + base + "}",
       {{"Event-Type", "edge.case"}, {"Source-Service", "edge"}}},
      {"Go escapes and a surrogate pair",
       R"({"n":4})",
       R"({"Aggregate-Id":"edge-4",)" + base +
           R"(,"Title":"\u003cb\u003e \u0026 \ud83d\ude00 \u2028 \"q\" \\ \/ \n\t\u0041"})",
       {{"Aggregate-Id", "edge-4"},
        {"Event-Type", "edge.case"},
        {"Source-Service", "edge"},
        {"Title", "<b> & \xF0\x9F\x98\x80 \xE2\x80\xA8 \"q\" \\ / \n\tA"}}},
      {"raw UTF-8 in key, headers and payload",
       R"({"text":"Привет, мир 😀","n":5})",
       R"({"Aggregate-Id":"agg-ü-日本",)" + base + R"(,"Title":"Привет, мир 😀"})",
       {{"Aggregate-Id", "agg-ü-日本"},
        {"Event-Type", "edge.case"},
        {"Source-Service", "edge"},
        {"Title", "Привет, мир 😀"}}},
      {"payload text kept verbatim (spacing, key order)",
       R"({ "b" : [1, 2.50 ,3],  "a":"x" })",
       R"({"Aggregate-Id":"edge-6",)" + base + "}",
       {{"Aggregate-Id", "edge-6"}, {"Event-Type", "edge.case"}, {"Source-Service", "edge"}}},
      {"JSON null value -> empty header",
       R"({"n":7})",
       R"({"Aggregate-Id":"edge-7",)" + base + R"(,"Gone":null})",
       {{"Aggregate-Id", "edge-7"},
        {"Event-Type", "edge.case"},
        {"Gone", ""},
        {"Source-Service", "edge"}}},
      {"unsorted keys, as a non-Go writer may store them",
       R"({"n":8})",
       R"({"traceparent":"00-ab-cd-01","Source-Service":"edge","Event-Type":"edge.case","Aggregate-Id":"edge-8","Correlation-Id":"c-8"})",
       {{"Aggregate-Id", "edge-8"},
        {"Correlation-Id", "c-8"},
        {"Event-Type", "edge.case"},
        {"Source-Service", "edge"},
        {"traceparent", "00-ab-cd-01"}}},
  };

  Ledger ledger;
  std::vector<WrittenRow> written;
  for (const EdgeRow& e : rows) {
    WrittenRow w;
    w.uuid = NewUlid();
    auto agg = e.decoded.find("Aggregate-Id");
    w.aggregate = agg == e.decoded.end() ? "" : agg->second;
    w.seq = 1;
    w.expected.topic = topic_prefix_ + "." + e.topic_suffix;
    // As the Go pipeline's partitioning marshaler: partition_key = Aggregate-Id
    // when present, else the empty key; never a null key.
    w.expected.key = agg != e.decoded.end() ? agg->second : "";
    w.expected.value = e.payload;
    w.expected.headers = ExpectedHeaders(w.uuid, e.decoded);
    w.xid = *db_->Scalar(fmt::format("INSERT INTO {} (uuid, payload, metadata) VALUES ($1, $2, $3) "
                                     "RETURNING transaction_id",
                                     QuoteIdent(name_)),
                         {w.uuid, e.payload, e.metadata});
    written.push_back(w);
  }

  EXPECT_EQ(WaitAllAcked(seconds(30)), 0);
  std::vector<KafkaRecord> records =
      ReadTopics({.max_records = rows.size(), .timeout = seconds(30)});
  DeliveryReport delivery = CheckDelivery(written, {}, records);
  fmt::print("{}\n", delivery.Summary());
  EXPECT_EQ(delivery.lost, 0u) << delivery.Samples();
  EXPECT_EQ(delivery.phantom, 0u) << delivery.Samples();
  EXPECT_EQ(delivery.duplicates, 0u) << delivery.Samples();

  ContractReport contract = CheckContract(written, records, PartitionCounts(records));
  fmt::print("{}\n", contract.Summary());
  EXPECT_EQ(contract.mismatches, 0u) << contract.Samples();
  EXPECT_EQ(contract.wrong_partition, 0u) << contract.Samples();

  // The same facts, spelled out per case (a clearer message when one breaks).
  for (size_t i = 0; i < written.size(); ++i) {
    const WrittenRow& w = written[i];
    auto it = std::find_if(records.begin(), records.end(), [&](const KafkaRecord& r) {
      const KafkaHeader* h = r.FindHeader("_watermill_message_uuid");
      return h != nullptr && h->value == w.uuid;
    });
    if (it == records.end()) {
      ADD_FAILURE() << rows[i].what << ": no record";
      continue;
    }
    SCOPED_TRACE(rows[i].what);
    EXPECT_EQ(it->value.has_value(), rows[i].payload.has_value());
    EXPECT_EQ(it->key, std::optional<std::string>(w.aggregate));
    EXPECT_EQ(it->FindHeader("partition_key") != nullptr, !w.aggregate.empty());
    for (const auto& [k, v] : rows[i].decoded) {
      const KafkaHeader* h = it->FindHeader(k);
      ASSERT_NE(h, nullptr) << "header " << k;
      ASSERT_TRUE(h->value.has_value()) << "header " << k << " is null, not 0-length";
      EXPECT_EQ(*h->value, v) << "header " << k;
    }
  }

  relay.Terminate();
  EXPECT_EQ(relay.Wait(seconds(30)), std::optional<int>(0)) << relay.LogTail();
}

}  // namespace
}  // namespace outbox_test
