// Poison rows (DESIGN §2.6): rows that cannot become a Kafka record are never
// dropped silently and never stop the stream silently.
//
// --on-poison=dlq (the default): each goes to the dead-letter topic with
// headers saying why and where (commit LSN, xid, offset, table, the original
// bytes or a reference when they do not fit), the row is marked and the rows
// after it are delivered. --on-poison=halt: the relay exits non-zero before
// the row, confirms nothing past it and says what to do; started again in
// dlq mode it delivers the rest.
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

class ResiliencePoison : public RelayTest {
 protected:
  // A well-formed row of aggregate `agg`, written with Go's json.Marshal
  // metadata, and the record the contract says it becomes.
  WrittenRow GoodRow(const std::string& agg, int64_t seq) {
    WrittenRow w;
    w.uuid = NewUlid();
    w.aggregate = agg;
    w.seq = seq;
    std::map<std::string, std::string> metadata = {
        {"Aggregate-Id", agg}, {"Event-Type", "review.updated"}, {"Source-Service", "review"}};
    w.metadata_json = GoJsonObject(metadata);
    w.expected.topic = topic_prefix_ + ".review.review";
    w.expected.key = agg;
    w.expected.value = fmt::format(R"({{"agg":"{}","seq":{}}})", agg, seq);
    w.expected.headers = ExpectedHeaders(w.uuid, metadata);
    return w;
  }

  // INSERT one row; returns its offset_consumed and sets its xid.
  int64_t Insert(Pg& pg, const std::string& uuid, const std::optional<std::string>& payload,
                 const std::optional<std::string>& metadata, std::string* xid) {
    auto rows = pg.Query(fmt::format("INSERT INTO {} (uuid, payload, metadata) VALUES ($1, $2, $3) "
                                     "RETURNING offset_consumed, transaction_id::text",
                                     QuoteIdent(name_)),
                         {uuid, payload, metadata});
    *xid = rows.at(0)[1].value_or("");
    return std::stoll(rows.at(0)[0].value_or("-1"));
  }

  void InsertGood(Pg& pg, WrittenRow& w) {
    Insert(pg, w.uuid, w.expected.value, w.metadata_json, &w.xid);
  }
};

struct Poison {
  std::string what;
  std::string uuid;
  std::optional<std::string> payload;
  std::optional<std::string> metadata;
  std::string reason;  // expected in outbox_dlq_reason
  // The broker, not the producer, refused it: the relay no longer has the row,
  // only the refused record (offset unknown: the dead letter names the uuid).
  bool refused_by_broker = false;
  bool truncated = false;  // the dead letter carries a reference instead of the bytes
  // Filled in when written.
  int64_t offset = -1;
  std::string xid;
};

std::string BigPayload(size_t bytes) {
  std::string p = R"({"pad":")";
  p.append(bytes, 'b');
  return p + "\"}";
}

TEST_F(ResiliencePoison, DeadLetterModeSetsRowsAsideAndContinues) {
  // The producer takes records up to 200,000 bytes; one topic takes only
  // 20,000 (topic max.message.bytes), so one row is refused by the broker
  // after the producer accepted it.
  constexpr int kProducerMax = 200000;
  CreateTables();
  CreateTopic(env_.kafka_brokers, topic_prefix_ + ".small.small", 1,
              {{"max.message.bytes", "20000"}});
  RelayProcess& relay =
      StartRelay({"--kafka-property", fmt::format("message.max.bytes={}", kProducerMax)});
  ASSERT_TRUE(WaitStreaming(relay)) << relay.LogTail();

  const std::string base = R"("Aggregate-Id":"poison-1","Source-Service":"poison")";
  std::vector<Poison> poisons = {
      {"metadata is a JSON array", NewUlid(), R"({"n":1})", R"(["Event-Type","poison.x"])",
       "expected a JSON object of strings"},
      {"metadata value is a number", NewUlid(), R"({"n":2})",
       "{" + base + R"(,"Event-Type":"poison.x","Retries":5})", "expected a string"},
      {"metadata without Event-Type", NewUlid(), R"({"n":3})", "{" + base + "}",
       "metadata has no key \"Event-Type\""},
      {"empty uuid", "", R"({"n":4})", "{" + base + R"(,"Event-Type":"poison.x"})",
       "uuid column is empty"},
      {"larger than the producer's message.max.bytes", NewUlid(), BigPayload(300000),
       "{" + base + R"(,"Event-Type":"poison.x"})", "too large", false, true},
      {"larger than the topic's max.message.bytes", NewUlid(), BigPayload(40000),
       R"({"Aggregate-Id":"small-1","Event-Type":"small.refused","Source-Service":"small"})",
       "too large", true, false},
  };

  // Good rows around each poison row, in their own transactions, and one
  // transaction with good rows on both sides of a poison row.
  std::vector<WrittenRow> good;
  Pg writer(env_.database_url);
  int64_t seq = 0;
  auto good_tx = [&](int rows) {
    writer.Exec("BEGIN");
    for (int i = 0; i < rows; ++i) {
      good.push_back(GoodRow("good-1", ++seq));
      InsertGood(writer, good.back());
    }
    writer.Exec("COMMIT");
  };
  good_tx(3);
  for (size_t i = 0; i < poisons.size(); ++i) {
    Poison& p = poisons[i];
    writer.Exec("BEGIN");
    if (i == 0) {
      good.push_back(GoodRow("good-1", ++seq));
      InsertGood(writer, good.back());
    }
    p.offset = Insert(writer, p.uuid, p.payload, p.metadata, &p.xid);
    if (i == 0) {
      good.push_back(GoodRow("good-1", ++seq));
      InsertGood(writer, good.back());
    }
    writer.Exec("COMMIT");
    good_tx(2);
  }
  size_t rows_total = good.size() + poisons.size();

  int64_t unacked = WaitAllAcked(seconds(60));
  EXPECT_EQ(unacked, 0) << DescribeUnacked() << relay.LogTail();
  EXPECT_EQ(MisackedRows(), 0);
  ASSERT_TRUE(relay.Running()) << "the relay stopped on a poison row:\n" << relay.LogTail();

  std::vector<KafkaRecord> records = ReadTopics({.timeout = seconds(30)});
  std::vector<KafkaRecord> dlq, rest;
  for (auto& r : records) (r.topic == topic_prefix_ + ".dlq" ? dlq : rest).push_back(r);
  DeliveryReport delivery = CheckDelivery(good, {}, rest);

  fmt::print("poison (dlq): {} rows ({} good, {} poison); {} dead letters\n", rows_total,
             good.size(), poisons.size(), dlq.size());
  size_t checked = 0;
  for (const Poison& p : poisons) {
    SCOPED_TRACE(p.what);
    // The dead letter of this row: by offset, or by uuid when the broker refused it.
    const KafkaRecord* letter = nullptr;
    size_t copies = 0;
    for (const KafkaRecord& r : dlq) {
      const KafkaHeader* off = r.FindHeader("outbox_dlq_offset");
      const KafkaHeader* uuid = r.FindHeader("_watermill_message_uuid");
      bool match = p.refused_by_broker ? (uuid != nullptr && uuid->value == p.uuid)
                                       : (off != nullptr && off->value == std::to_string(p.offset));
      if (match) {
        ++copies;
        letter = &r;
      }
    }
    if (letter == nullptr) {
      ADD_FAILURE() << "no dead letter for offset " << p.offset << " uuid '" << p.uuid << "'";
      continue;
    }
    auto header = [&](const std::string& name) {
      const KafkaHeader* h = letter->FindHeader(name);
      return h != nullptr && h->value ? *h->value : std::string("<missing>");
    };
    std::string commit = header("outbox_dlq_commit_lsn");
    auto indexed = MinCommitLsn(*db_, name_, {p.xid});
    fmt::print(
        "  {}: reason \"{}\" code {} commit {} xid {} offset {} table {} value {} truncated {} "
        "reference \"{}\"\n",
        p.what, header("outbox_dlq_reason").substr(0, 140), header("outbox_dlq_error_code"), commit,
        header("outbox_dlq_transaction_id"), header("outbox_dlq_offset"),
        header("outbox_dlq_table"),
        letter->value ? fmt::format("{} bytes", letter->value->size()) : "null",
        header("outbox_dlq_truncated"), header("outbox_dlq_reference"));
    EXPECT_EQ(copies, 1u);
    EXPECT_NE(header("outbox_dlq_reason").find(p.reason), std::string::npos)
        << header("outbox_dlq_reason");
    EXPECT_EQ(header("outbox_dlq_error_code"), "poison");
    EXPECT_EQ(header("outbox_dlq_transaction_id"), p.xid);
    EXPECT_EQ(header("outbox_dlq_table"), "public." + name_);
    EXPECT_EQ(header("_watermill_message_uuid"), p.uuid);
    ASSERT_TRUE(indexed.has_value()) << "the commit index lacks transaction " << p.xid;
    EXPECT_EQ(commit, FormatLsn(*indexed));
    if (p.refused_by_broker) {
      EXPECT_EQ(header("outbox_dlq_offset"), "-1");
    } else {
      EXPECT_EQ(header("outbox_dlq_offset"), std::to_string(p.offset));
    }
    if (p.truncated) {
      EXPECT_EQ(header("outbox_dlq_truncated"), "true");
      std::string ref = header("outbox_dlq_reference");
      EXPECT_NE(ref.find("offset_consumed=" + std::to_string(p.offset)), std::string::npos) << ref;
      EXPECT_NE(ref.find("transaction_id=" + p.xid), std::string::npos) << ref;
    } else {
      EXPECT_EQ(letter->value, p.payload) << "the dead letter does not carry the payload";
    }
    if (p.refused_by_broker) {
      // The reason tells how to find the row.
      EXPECT_NE(header("outbox_dlq_reason").find("uuid '" + p.uuid + "'"), std::string::npos);
    } else if (!p.truncated) {
      EXPECT_EQ(header("outbox_dlq_metadata"), p.metadata.value_or("<missing>"));
    }
    ++checked;
  }
  fmt::print("{}\n", delivery.Summary());
  EXPECT_EQ(checked, poisons.size());
  EXPECT_EQ(dlq.size(), poisons.size());
  EXPECT_EQ(delivery.lost, 0u) << delivery.Samples();
  EXPECT_EQ(delivery.phantom, 0u) << delivery.Samples();
  EXPECT_EQ(delivery.duplicates, 0u) << delivery.Samples();
  EXPECT_EQ(delivery.order_violations, 0u) << delivery.Samples();
  ContractReport contract = CheckContract(good, rest, PartitionCounts(rest));
  fmt::print("{}\n", contract.Summary());
  EXPECT_EQ(contract.mismatches, 0u) << contract.Samples();

  relay.Terminate();
  EXPECT_EQ(relay.Wait(seconds(30)), std::optional<int>(0)) << relay.LogTail();
  fmt::print("total {:.1f} s\n", SecondsSince(started_));
}

TEST_F(ResiliencePoison, HaltModeStopsBeforeTheRowThenDeadLetterModeDeliversTheRest) {
  CreateTables();
  RelayProcess& relay = StartRelay({}, {{"OUTBOX_ON_POISON", "halt"}});
  ASSERT_TRUE(WaitStreaming(relay)) << relay.LogTail();

  Ledger ledger;
  Writer writer(Workload(), &ledger, -1, 5);
  for (int i = 0; i < 20; ++i) writer.Transaction({.rows = 1 + i % 3});
  ASSERT_EQ(WaitAllAcked(seconds(30)), 0) << DescribeUnacked();
  size_t before = ledger.committed_count();
  std::string poison_uuid = NewUlid();
  std::string poison_xid;
  int64_t poison_offset =
      Insert(writer.pg(), poison_uuid, R"({"n":1})",
             R"({"Event-Type":"review.created","Source-Service":7})", &poison_xid);
  for (int i = 0; i < 20; ++i) writer.Transaction({.rows = 1 + i % 3});

  auto code = relay.Wait(seconds(60));
  ASSERT_TRUE(code.has_value()) << "the relay did not halt on the poison row:\n" << relay.LogTail();
  std::string log = relay.Log();
  std::string error_line;
  if (size_t p = log.find("poison row"); p != std::string::npos) {
    size_t start = log.rfind('\n', p);
    start = start == std::string::npos ? 0 : start + 1;
    error_line = log.substr(start, log.find('\n', p) - start);
  }
  uint64_t confirmed_at_halt = QuerySlot(*db_, name_)->confirmed_flush_lsn.value_or(0);
  int64_t unacked_at_halt = UnackedRows();
  auto poison_acked =
      db_->Scalar(fmt::format("SELECT offset_acked::text FROM {} WHERE offset_consumed = $1",
                              QuoteIdent(name_)),
                  {std::to_string(poison_offset)});

  // The operator deletes the row, and runs the relay with dead-lettering.
  db_->Exec(fmt::format("DELETE FROM {} WHERE offset_consumed = $1", QuoteIdent(name_)),
            {std::to_string(poison_offset)});
  RelayProcess& again = StartRelay();
  ASSERT_TRUE(WaitStreaming(again)) << again.LogTail();
  auto restarted = std::chrono::steady_clock::now();
  int64_t unacked = WaitAllAcked(seconds(60));
  double recovery_s = SecondsSince(restarted);
  EXPECT_EQ(unacked, 0) << DescribeUnacked();
  EXPECT_TRUE(again.Running()) << again.LogTail();
  std::vector<KafkaRecord> records = ReadTopics({.timeout = seconds(30)});
  std::vector<KafkaRecord> dlq, rest;
  for (auto& r : records) (r.topic == topic_prefix_ + ".dlq" ? dlq : rest).push_back(r);
  // The poison transaction's commit LSN, as its dead letter gives it (the
  // commit index has no entry: the row was deleted before it was published).
  std::optional<uint64_t> poison_commit;
  if (!dlq.empty()) {
    const KafkaHeader* h = dlq[0].FindHeader("outbox_dlq_commit_lsn");
    if (h != nullptr && h->value) poison_commit = ParseLsn(*h->value);
  }
  DeliveryReport delivery = CheckDelivery(ledger.committed(), ledger.rolled_back(), rest);

  fmt::print(
      "poison (halt): {} good rows before and {} after the poison row; relay exited {}; "
      "log: {}\n",
      before, ledger.committed_count() - before, *code, error_line);
  fmt::print(
      "at the halt: {} rows unacked (poison row offset_acked {}), confirmed_flush_lsn {} (poison "
      "transaction commits at {})\n",
      unacked_at_halt, poison_acked.value_or("NULL"), FormatLsn(confirmed_at_halt),
      poison_commit ? FormatLsn(*poison_commit) : "unknown");
  fmt::print("dlq restart (row deleted): all acked {:.1f} s after streaming, {} dead letters\n",
             recovery_s, dlq.size());
  fmt::print("{}\n", delivery.Summary());

  EXPECT_NE(*code, 0);
  EXPECT_NE(error_line.find("OUTBOX_ON_POISON=dlq"), std::string::npos)
      << "the log does not say what to do:\n"
      << relay.LogTail();
  EXPECT_NE(error_line.find(std::to_string(poison_offset)), std::string::npos) << error_line;
  EXPECT_FALSE(poison_acked.has_value()) << "the poison row was marked";
  EXPECT_EQ(unacked_at_halt, static_cast<int64_t>(ledger.committed_count() - before + 1));
  ASSERT_TRUE(poison_commit.has_value());
  EXPECT_NE(error_line.find("commit " + FormatLsn(*poison_commit)), std::string::npos)
      << "the halt message names another commit LSN than the dead letter";
  EXPECT_LE(confirmed_at_halt, *poison_commit)
      << "the slot was confirmed past the poison transaction";
  EXPECT_EQ(dlq.size(), 1u);
  if (!dlq.empty()) {
    const KafkaHeader* off = dlq[0].FindHeader("outbox_dlq_offset");
    EXPECT_TRUE(off != nullptr && off->value == std::to_string(poison_offset));
  }
  EXPECT_EQ(delivery.lost, 0u) << delivery.Samples();
  EXPECT_EQ(delivery.phantom, 0u) << delivery.Samples();
  EXPECT_EQ(delivery.order_violations, 0u) << delivery.Samples();

  again.Terminate();
  EXPECT_EQ(again.Wait(seconds(30)), std::optional<int>(0)) << again.LogTail();
  fmt::print("total {:.1f} s\n", SecondsSince(started_));
}

}  // namespace
}  // namespace outbox_test
