// `outbox-relay replay`: the relay publishes transactions; replay of the LSN
// range of a middle subset (from outbox_relay.commits) re-publishes exactly
// those transactions' rows still in the table, in commit order, with their
// original UUIDs, the record contract, and the replay headers; and reports
// what cleanup already removed.
#include <fmt/format.h>

#include <algorithm>
#include <set>
#include <thread>

#include "fixture.h"
#include "ops_support.h"
#include "outbox_relay/pg/relay_schema.h"

namespace outbox_test {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

struct IndexedTx {
  std::string commit_lsn;
  std::string xid;
  int row_count = 0;
  std::string commit_time;
};

class OpsReplay : public RelayTest {
 protected:
  std::string ReplayPrefix() const { return topic_prefix_ + ".replay"; }

  std::vector<std::string> ReplayArgs(const std::vector<std::string>& extra,
                                      const std::string& prefix = "") const {
    std::vector<std::string> args = {
        "replay",
        "--table",
        "public." + name_,
        "--slot",
        name_,
        "--topic-template",
        (prefix.empty() ? ReplayPrefix() : prefix) + ".{Source-Service}.{Event-Type:aggregate}",
        "--dlq-topic",
        topic_prefix_ + ".dlq",
        "--metrics-addr",
        ""};
    args.insert(args.end(), extra.begin(), extra.end());
    return args;
  }

  std::map<std::string, std::optional<std::string>> Env() const {
    return {{"DATABASE_URL", env_.database_url}, {"KAFKA_BROKERS", env_.kafka_brokers}};
  }

  std::vector<IndexedTx> Index() {
    std::vector<IndexedTx> out;
    for (const Row& r : db_->Query(
             "SELECT commit_lsn::text, transaction_ids::text, row_count, commit_time::text FROM "
             "outbox_relay.commits WHERE slot_name = $1 ORDER BY commit_lsn",
             {name_})) {
      std::string xids = *r[1];  // "{123}"
      out.push_back({*r[0], xids.substr(1, xids.size() - 2), std::stoi(*r[2]), *r[3]});
    }
    return out;
  }
};

TEST_F(OpsReplay, ReplaysAnLsnRangeInCommitOrderWithReplayHeaders) {
  CreateTables();
  RelayProcess& relay = StartRelay();
  ASSERT_TRUE(WaitStreaming(relay)) << relay.LogTail();

  // Twelve transactions, one after the other: commit order = ledger order.
  const std::vector<int> sizes = {1, 2, 3, 4, 2, 3, 2, 1, 3, 2, 4, 1};
  Ledger ledger;
  {
    Writer writer(Workload(), &ledger, -1, 77);
    for (int n : sizes) ASSERT_TRUE(writer.Transaction({.rows = n}));
  }
  ASSERT_EQ(WaitAllAcked(seconds(60)), 0) << relay.LogTail();
  std::vector<IndexedTx> index;
  for (auto deadline = std::chrono::steady_clock::now() + seconds(30);
       std::chrono::steady_clock::now() < deadline;
       std::this_thread::sleep_for(milliseconds(100))) {
    index = Index();
    if (index.size() == sizes.size()) break;
  }
  ASSERT_EQ(index.size(), sizes.size());
  relay.Terminate();
  ASSERT_EQ(relay.Wait(seconds(30)), 0) << relay.LogTail();

  // The ledger's transactions are the index's, in the same order.
  std::vector<CommittedTransaction> txs = ledger.transactions();
  ASSERT_EQ(txs.size(), index.size());
  for (size_t i = 0; i < txs.size(); ++i) {
    ASSERT_EQ(txs[i].xid, index[i].xid) << i;
    ASSERT_EQ(txs[i].rows, index[i].row_count) << i;
  }

  // The range: transactions 3..8. "Cleanup" removed one row of transaction 5
  // and all rows of transaction 6.
  const size_t first = 3, last = 8;
  std::map<std::string, size_t> tx_of_xid;
  for (size_t i = 0; i < index.size(); ++i) tx_of_xid[index[i].xid] = i;
  std::vector<WrittenRow> committed = ledger.committed();
  std::set<std::string> deleted;
  bool took_from_5 = false;
  for (const WrittenRow& row : committed) {
    size_t tx = tx_of_xid.at(row.xid);
    if ((tx == 5 && !took_from_5) || tx == 6) deleted.insert(row.uuid);
    if (tx == 5) took_from_5 = true;
  }
  ASSERT_EQ(deleted.size(), 3u);
  for (const std::string& uuid : deleted) {
    db_->Exec(fmt::format("DELETE FROM {} WHERE uuid = $1", QuoteIdent(name_)), {uuid});
  }
  // What replay must produce, in order.
  std::vector<WrittenRow> expected;
  for (const WrittenRow& row : committed) {
    size_t tx = tx_of_xid.at(row.xid);
    if (tx >= first && tx <= last && !deleted.contains(row.uuid)) expected.push_back(row);
  }
  ASSERT_EQ(expected.size(), 3u + 4 + 2 + 3 + 2 + 1 - 3);

  const std::vector<std::string> range = {"--from-lsn", index[first].commit_lsn, "--to-lsn",
                                          index[last].commit_lsn};
  const std::string cleanup_line =
      "2 of 6 transactions in range have rows deleted by cleanup (3 rows missing)";

  // Dry run: counts per topic and event type, produces nothing.
  std::vector<std::string> dry_args = range;
  dry_args.push_back("--dry-run");
  CommandResult dry = RunRelayCommand(ReplayArgs(dry_args), Env());
  ASSERT_EQ(dry.exit_code, 0) << dry.Describe();
  EXPECT_NE(dry.out.find(cleanup_line), std::string::npos) << dry.Describe();
  EXPECT_NE(dry.out.find(fmt::format("would publish {} rows", expected.size())), std::string::npos)
      << dry.Describe();
  std::map<std::string, size_t> per_topic;
  for (const WrittenRow& row : expected) {
    ++per_topic[ReplayPrefix() + row.expected.topic.substr(topic_prefix_.size())];
  }
  for (const auto& [topic, n] : per_topic) {
    EXPECT_NE(dry.out.find(fmt::format("topic {}: {} rows (", topic, n)), std::string::npos)
        << topic << "\n"
        << dry.Describe();
  }
  EXPECT_TRUE(kafka_->TopicsWithPrefix(ReplayPrefix() + ".").empty());

  // The same range by commit time.
  CommandResult by_time =
      RunRelayCommand(ReplayArgs({"--from-time", index[first].commit_time, "--to-time",
                                  index[last].commit_time, "--dry-run"}),
                      Env());
  ASSERT_EQ(by_time.exit_code, 0) << by_time.Describe();
  EXPECT_NE(by_time.out.find(cleanup_line), std::string::npos) << by_time.Describe();
  EXPECT_NE(by_time.out.find(fmt::format("would publish {} rows", expected.size())),
            std::string::npos)
      << by_time.Describe();

  // The replay.
  CommandResult replay = RunRelayCommand(ReplayArgs(range), Env());
  ASSERT_EQ(replay.exit_code, 0) << replay.Describe();
  EXPECT_NE(replay.out.find(cleanup_line), std::string::npos) << replay.Describe();
  EXPECT_NE(
      replay.out.find(fmt::format("produced {0} rows: {0} delivered, 0 failed", expected.size())),
      std::string::npos)
      << replay.Describe();

  std::vector<KafkaRecord> records = kafka_->Read({}, ReplayPrefix() + ".");
  ASSERT_EQ(records.size(), expected.size());
  std::map<std::string, size_t> position;  // uuid -> index in `expected`
  for (size_t i = 0; i < expected.size(); ++i) position[expected[i].uuid] = i;
  std::map<std::pair<std::string, int32_t>, size_t> last_position;
  std::set<std::string> seen;
  for (const KafkaRecord& rec : records) {
    const KafkaHeader* uuid = rec.FindHeader("_watermill_message_uuid");
    ASSERT_NE(uuid, nullptr);
    ASSERT_TRUE(uuid->value.has_value());
    auto it = position.find(*uuid->value);
    ASSERT_NE(it, position.end()) << "replayed a row outside the range: " << *uuid->value;
    EXPECT_TRUE(seen.insert(*uuid->value).second) << "twice: " << *uuid->value;
    const WrittenRow& row = expected[it->second];
    // The contract, byte for byte, then the two replay headers.
    EXPECT_EQ(rec.topic, ReplayPrefix() + row.expected.topic.substr(topic_prefix_.size()));
    EXPECT_EQ(rec.key, row.expected.key);
    EXPECT_EQ(rec.value, row.expected.value);
    std::vector<KafkaHeader> want = row.expected.headers;
    want.push_back({"outbox_replay", "true"});
    want.push_back({"outbox_replay_commit_lsn", index[tx_of_xid.at(row.xid)].commit_lsn});
    EXPECT_EQ(rec.headers, want) << *uuid->value;
    // Commit order (and insert order inside a transaction) per partition.
    auto key = std::make_pair(rec.topic, rec.partition);
    if (auto prev = last_position.find(key); prev != last_position.end()) {
      EXPECT_LT(prev->second, it->second)
          << "out of order in " << rec.topic << "/" << rec.partition;
    }
    last_position[key] = it->second;
  }
  EXPECT_EQ(seen.size(), expected.size());
  // Replay never marks or unmarks anything.
  EXPECT_EQ(UnackedRows(), 0);
  EXPECT_EQ(MisackedRows(), 0);

  // Delivery failures: topics that do not exist and may not be created.
  std::vector<std::string> failing_args = range;
  failing_args.insert(failing_args.end(),
                      {"--kafka-property", "allow.auto.create.topics=false", "--kafka-property",
                       "topic.metadata.propagation.max.ms=1000"});
  CommandResult failing =
      RunRelayCommand(ReplayArgs(failing_args, topic_prefix_ + ".missing"), Env());
  EXPECT_EQ(failing.exit_code, 1) << failing.Describe();
  EXPECT_NE(failing.out.find("0 delivered"), std::string::npos) << failing.Describe();
  EXPECT_NE(failing.err.find("were not delivered"), std::string::npos) << failing.Describe();
  EXPECT_NE(failing.err.find("rerun with --from-lsn " + index[first].commit_lsn), std::string::npos)
      << failing.Describe();
}

TEST_F(OpsReplay, EmptyRangeAndBadSettings) {
  CreateTables();
  db_->Exec(outbox_relay::pg::RelaySchemaDdl());

  CommandResult empty = RunRelayCommand(ReplayArgs({"--from-lsn", "FFFFFFFF/0"}), Env());
  EXPECT_EQ(empty.exit_code, 0) << empty.Describe();
  EXPECT_NE(empty.out.find("0 of 0 transactions in range have rows deleted by cleanup"),
            std::string::npos)
      << empty.Describe();

  struct Bad {
    std::vector<std::string> args;
    std::string names;
  };
  for (const Bad& bad : {
           Bad{{}, "--from-lsn"},
           Bad{{"--from-lsn", "zzz"}, "--from-lsn"},
           Bad{{"--from-lsn", "0/10", "--to-lsn", "0/5"}, "--to-lsn"},
           Bad{{"--from-lsn", "0/10", "--from-time", "2024-01-01"}, "--from-time"},
           Bad{{"--from-lsn", "0/10", "--to-time", "2024-01-01"}, "--to-time"},
           Bad{{"--from-time", "not a time", "--dry-run"}, "--from-time"},
           Bad{{"--from-lsn", "0/0", "--page-rows", "0"}, "--page-rows"},
       }) {
    CommandResult r = RunRelayCommand(ReplayArgs(bad.args), Env());
    EXPECT_EQ(r.exit_code, 2) << r.Describe();
    EXPECT_NE(r.err.find(bad.names), std::string::npos) << r.Describe();
  }
  // Kafka is needed unless it is a dry run.
  auto no_kafka = Env();
  no_kafka["KAFKA_BROKERS"] = std::nullopt;
  CommandResult r = RunRelayCommand(ReplayArgs({"--from-lsn", "0/0"}), no_kafka);
  EXPECT_EQ(r.exit_code, 2) << r.Describe();
  EXPECT_NE(r.err.find("KAFKA_BROKERS"), std::string::npos) << r.Describe();
  r = RunRelayCommand(ReplayArgs({"--from-lsn", "0/0", "--dry-run"}), no_kafka);
  EXPECT_EQ(r.exit_code, 0) << r.Describe();
}

}  // namespace
}  // namespace outbox_test
