// Kafka failures (DESIGN §2.1, §2.4): the broker gone for longer than the
// walsender's timeout, a topic that does not exist on a broker that does not
// create topics, and a producer that fails fatally. In every case nothing is
// lost, the slot is never confirmed past a row Kafka has not acknowledged, and
// the relay either rides it out or stops with an error and resumes from the
// slot when started again.
//
// The broker faults run against a private broker (support/throwaway_kafka.h),
// so stopping it does not disturb tests using the shared one; it has topic
// auto-creation off, as production clusters often do.
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <set>
#include <thread>

#include "fixture.h"
#include "resilience_support.h"
#include "support/throwaway_kafka.h"
#include "support/throwaway_pg.h"

namespace outbox_test {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;
using namespace resilience;

using RelayEnv = std::map<std::string, std::optional<std::string>>;

class ResilienceKafka : public RelayTest {
 protected:
  static void TearDownTestSuite() { broker_.reset(); }

  // The suite's private broker (auto.create.topics.enable=false), started on
  // first use, and started again if a test left it stopped. Reads go to it.
  ThrowawayKafka& Broker() {
    if (!broker_) {
      auto started = std::chrono::steady_clock::now();
      broker_ = std::make_unique<ThrowawayKafka>(
          std::map<std::string, std::string>{{"auto.create.topics.enable", "false"}});
      fmt::print("private broker {} up in {:.1f} s\n", broker_->brokers(), SecondsSince(started));
    } else if (!broker_->Running()) {
      broker_->Start();
    }
    kafka_ = std::make_unique<KafkaReader>(broker_->brokers());
    private_broker_ = true;
    return *broker_;
  }

  void TearDown() override {
    if (private_broker_) kafka_.reset();  // its topics go with the broker
    RelayTest::TearDown();
  }

  static std::unique_ptr<ThrowawayKafka> broker_;
  bool private_broker_ = false;
};

std::unique_ptr<ThrowawayKafka> ResilienceKafka::broker_;

TxSpec SmallTx(std::mt19937_64& rng) {
  TxSpec tx;
  tx.rows = 1 + static_cast<int>(rng() % 10);
  tx.rollback = rng() % 20 == 0;
  return tx;
}

// Rows are written while the broker is down for 12 s, more than twice the
// cluster's wal_sender_timeout (5 s): the relay must keep the walsender
// content (status updates while it holds back) or reconnect cleanly; confirm
// nothing the broker has not acknowledged; hold its memory (it stops reading
// at --max-in-flight); and deliver everything once the broker is back.
TEST_F(ResilienceKafka, BrokerDownLongerThanWalSenderTimeout) {
  constexpr auto kOutage = seconds(12);
  constexpr long kRssBoundKb = 256 * 1024;
  ThrowawayPostgres cluster(FreeLocalPort(26700 + static_cast<int>(getpid() % 300)),
                            "-c wal_level=logical -c wal_sender_timeout=5s -c max_wal_senders=4 "
                            "-c max_replication_slots=4");
  ThrowawayKafka& broker = Broker();
  db_ = std::make_unique<Pg>(cluster.url());
  CreateTables();
  RelayEnv env = {{"DATABASE_URL", cluster.url()}, {"KAFKA_BROKERS", broker.brokers()}};
  RelayProcess& relay = StartRelay({"--create-topics", "true", "--max-in-flight", "5000"}, env);
  ASSERT_TRUE(WaitStreaming(relay)) << relay.LogTail();
  WorkloadOptions options = Workload();
  options.database_url = cluster.url();

  // Before: the pipeline works.
  Ledger before;
  {
    LoadGenerator load(options, &before, 2, SmallTx, std::chrono::microseconds(5000));
    load.Start();
    std::this_thread::sleep_for(seconds(2));
    ASSERT_EQ(load.Stop(), "");
  }
  ASSERT_EQ(WaitAllAcked(seconds(60)), 0) << DescribeUnacked();
  long rss_before = ProcStatusKb(relay.pid(), "VmRSS");

  // The outage.
  SlotSampler slot(cluster.url(), name_);
  auto stopping = std::chrono::steady_clock::now();
  broker.Stop();
  auto down = std::chrono::steady_clock::now();
  double stop_s = SecondsSince(stopping);
  slot.Reset();  // from here on the broker acknowledges nothing
  RssSampler rss(relay.pid());
  Ledger during;
  LoadGenerator load(options, &during, 2, SmallTx, std::chrono::microseconds(2000));
  load.Start();
  while (std::chrono::steady_clock::now() - down < kOutage && relay.Running()) {
    std::this_thread::sleep_for(milliseconds(200));
  }
  ASSERT_EQ(load.Stop(), "");
  ASSERT_TRUE(relay.Running()) << "the relay exited while Kafka was down:\n" << relay.LogTail();
  std::this_thread::sleep_for(milliseconds(500));  // the last status updates reach the slot
  uint64_t max_confirmed_down = slot.max_confirmed();
  std::set<int> walsenders_down = slot.walsender_pids();
  int64_t unacked_down = UnackedRows();
  auto slot_down = QuerySlot(*db_, name_);
  long rss_peak_down = rss.peak_kb();
  double down_s = SecondsSince(down);

  // The broker returns.
  auto starting = std::chrono::steady_clock::now();
  broker.Start();
  double start_s = SecondsSince(starting);
  auto up = std::chrono::steady_clock::now();
  int64_t unacked = WaitAllAcked(seconds(120));
  double recovery_s = SecondsSince(up);
  rss.Stop();
  EXPECT_EQ(unacked, 0) << "rows still unacked 120 s after the broker returned\n"
                        << DescribeUnacked();
  EXPECT_TRUE(relay.Running()) << relay.LogTail();

  std::vector<WrittenRow> committed = before.committed();
  for (auto& r : during.committed()) committed.push_back(r);
  std::vector<WrittenRow> rolled_back = before.rolled_back();
  for (auto& r : during.rolled_back()) rolled_back.push_back(r);
  auto first_outage_commit = MinCommitLsn(*db_, name_, Xids(during.committed()));
  std::vector<KafkaRecord> records = ReadTopics({.timeout = seconds(60)});
  DeliveryReport delivery = CheckDelivery(committed, rolled_back, records);
  std::string log = relay.Log();
  size_t sessions = 0;
  for (size_t p = 0; (p = log.find("streaming from slot", p)) != std::string::npos; ++p) {
    ++sessions;
  }

  fmt::print(
      "kafka outage: {} rows before, {} rows written while the broker was down ({} "
      "transactions); broker stop {:.1f} s, down {:.1f} s (wal_sender_timeout 5 s), start "
      "{:.1f} s\n",
      before.committed_count(), during.committed_count(), load.transactions(), stop_s, down_s,
      start_s);
  fmt::print(
      "while down: {} rows unacked; slot active={} with {} walsender pid(s) seen; replication "
      "sessions of the relay in total: {}; highest confirmed_flush_lsn {} (first outage commit "
      "{})\n",
      unacked_down, slot_down && slot_down->active, walsenders_down.size(), sessions,
      FormatLsn(max_confirmed_down),
      first_outage_commit ? FormatLsn(*first_outage_commit) : "unknown");
  fmt::print("memory: VmRSS {:.1f} MB before, peak {:.1f} MB while down (bound {} MB)\n",
             Mb(rss_before), Mb(rss_peak_down), kRssBoundKb / 1024);
  fmt::print("recovery: all {} rows acked {:.1f} s after the broker answered again\n",
             committed.size(), recovery_s);
  fmt::print("{}\n", delivery.Summary());

  EXPECT_GT(during.committed_count(), 0u);
  EXPECT_EQ(unacked_down, static_cast<int64_t>(during.committed_count()))
      << "rows were marked while Kafka was down";
  ASSERT_TRUE(first_outage_commit.has_value()) << "no outage transaction in the commit index";
  EXPECT_LE(max_confirmed_down, *first_outage_commit)
      << "the slot was confirmed past a transaction Kafka had not acknowledged";
  EXPECT_GT(rss_peak_down, 0);
  EXPECT_LT(rss_peak_down, kRssBoundKb);
  EXPECT_EQ(delivery.lost, 0u) << delivery.Samples() << "broker: " << broker.dir();
  EXPECT_EQ(delivery.phantom, 0u) << delivery.Samples();
  EXPECT_EQ(delivery.order_violations, 0u) << delivery.Samples();
  EXPECT_EQ(delivery.split_aggregates, 0u) << delivery.Samples();
  EXPECT_EQ(MisackedRows(), 0);

  relay.Terminate();
  EXPECT_EQ(relay.Wait(seconds(40)), std::optional<int>(0)) << relay.LogTail();
  fmt::print("total {:.1f} s\n", SecondsSince(started_));
}

// Rows in flight to a broker that is down, and the slot dropped and set up
// again by a second instance (on another Kafka cluster, which is up), whose
// backfill is held for 12 s (the stall-backfill test fault). The first
// instance, back from its reconnect's bounded drain, finds the slot being set
// up and must not stream it (it would publish newer rows before the
// backfill's older ones): it waits as a standby and then sets the slot up
// itself, with its rows still in flight. It restarts its pipeline for that
// (what it held comes again from the slot or the backfill, here the second
// instance's); without that it exited 1, "internal: slot setup with rows
// still in flight", as a relay once did in the fault campaign.
TEST_F(ResilienceKafka, ASlotSetUpAgainWhileTheBrokerHoldsRowsIsWaitedForWithoutExiting) {
  ThrowawayKafka& broker = Broker();
  CreateTables();
  RelayProcess& first =
      StartRelay({"--create-topics", "true"}, {{"KAFKA_BROKERS", broker.brokers()}});
  ASSERT_TRUE(WaitStreaming(first)) << first.LogTail();
  Ledger ledger;
  Writer writer(Workload(), &ledger, -1, 5);
  ASSERT_TRUE(writer.Transaction({.rows = 3}));
  ASSERT_EQ(WaitAllAcked(seconds(60)), 0) << DescribeUnacked();
  // The second instance waits as a standby; it recreates the slot when it goes.
  RelayProcess& second = StartRelay(
      {"--create-topics", "true"},
      {{"KAFKA_BROKERS", env_.kafka_brokers}, {"OUTBOX_TEST_FAULT", "stall-backfill:12"}});
  ASSERT_TRUE(second.WaitForLog("standby:", seconds(30))) << second.LogTail();

  broker.Stop();
  for (int i = 0; i < 10; ++i) ASSERT_TRUE(writer.Transaction({.rows = 2}));
  std::this_thread::sleep_for(milliseconds(1000));  // read from the slot, held by the broker
  // The slot goes: its walsender ended, then dropped before either relay is back.
  bool dropped = false;
  auto deadline = std::chrono::steady_clock::now() + seconds(30);
  while (!dropped && std::chrono::steady_clock::now() < deadline) {
    auto slot = QuerySlot(*db_, name_);
    ASSERT_TRUE(slot.has_value());
    if (slot->active_pid) {
      db_->Exec(fmt::format("SELECT pg_terminate_backend({})", *slot->active_pid));
    }
    try {
      db_->Exec("SELECT pg_drop_replication_slot($1)", {name_});
      dropped = true;
    } catch (const std::exception&) {
      std::this_thread::sleep_for(milliseconds(20));  // a relay took it again
    }
  }
  ASSERT_TRUE(dropped) << first.LogTail();
  ASSERT_TRUE(second.WaitForLog("TEST FAULT stall-backfill", seconds(30))) << second.LogTail();
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(writer.Transaction({.rows = 2}));
  ASSERT_TRUE(first.WaitForLog("not streaming it, waiting for its setup", seconds(30)))
      << first.LogTail();
  // Its drain (5 s), its wait as a standby (2 s), the second's setup (12 s).
  ASSERT_TRUE(second.WaitForLog("streaming from slot", seconds(60))) << second.LogTail();
  std::this_thread::sleep_for(seconds(3));
  ASSERT_TRUE(first.Running()) << "the relay exited while its broker was down:\n"
                               << first.LogTail();

  broker.Start();
  EXPECT_EQ(WaitAllAcked(seconds(120)), 0) << DescribeUnacked() << first.LogTail();
  EXPECT_TRUE(first.Running()) << first.LogTail();
  EXPECT_TRUE(second.Running()) << second.LogTail();
  // Every row in one of the two clusters (the order is each cluster's own).
  std::vector<KafkaRecord> records = ReadTopics({.timeout = seconds(60)});
  KafkaReader shared(env_.kafka_brokers);
  for (KafkaRecord& r : shared.Read({}, topic_prefix_ + ".", {.timeout = seconds(60)})) {
    records.push_back(std::move(r));
  }
  DeliveryReport delivery = CheckDelivery(ledger.committed(), ledger.rolled_back(), records);
  fmt::print("slot set up again while the first relay's broker was down: {}\n", delivery.Summary());
  EXPECT_EQ(delivery.lost, 0u) << delivery.Samples();
  EXPECT_EQ(delivery.phantom, 0u) << delivery.Samples();
  EXPECT_EQ(MisackedRows(), 0);
  first.Terminate();
  second.Terminate();
  EXPECT_EQ(first.Wait(seconds(40)), std::optional<int>(0)) << first.LogTail();
  EXPECT_EQ(second.Wait(seconds(40)), std::optional<int>(0)) << second.LogTail();
  if (kafka_ != nullptr) {
    try {
      shared.DeleteTopics(shared.TopicsWithPrefix(topic_prefix_ + "."));
    } catch (const std::exception& e) {
      std::fprintf(stderr, "[cleanup] kafka topics: %s\n", e.what());
    }
  }
}

// A topic the broker does not have and will not create: the relay stops with
// an error that names the topic (and counts it in
// outbox_forwarder_errors_total while it runs), marks and confirms nothing of
// it; started again with --create-topics it creates the topics with the
// partitions asked for and delivers every row.
TEST_F(ResilienceKafka, UnknownTopicStopsThenCreateTopicsDelivers) {
  ThrowawayKafka& broker = Broker();
  CreateTables();
  int metrics_port = FreeLocalPort(28100 + static_cast<int>(getpid() % 500));
  RelayEnv env = {{"KAFKA_BROKERS", broker.brokers()}};
  // librdkafka waits topic.metadata.propagation.max.ms (30 s) before it
  // believes a topic is missing (a new topic may still be propagating); 3 s
  // keeps the test short and changes nothing else.
  RelayProcess& relay = StartRelay({"--metrics-addr", fmt::format("127.0.0.1:{}", metrics_port),
                                    "--kafka-property", "topic.metadata.propagation.max.ms=3000"},
                                   env);
  ASSERT_TRUE(WaitStreaming(relay)) << relay.LogTail();

  Ledger ledger;
  Writer writer(Workload(), &ledger, -1, 11);
  for (int i = 0; i < 50; ++i) writer.Transaction({.rows = 1 + i % 5});
  auto written = std::chrono::steady_clock::now();

  // Scrape the error counter while the relay lives.
  std::optional<double> errors_metric;
  while (relay.Running() && SecondsSince(written) < 90) {
    HttpResponse r = HttpGet(metrics_port, "/metrics");
    if (r.status == 200) {
      if (auto v = MetricSum(r.body, "outbox_forwarder_errors_total")) errors_metric = v;
    }
    std::this_thread::sleep_for(milliseconds(100));
  }
  auto code = relay.Wait(seconds(30));
  double fail_s = SecondsSince(written);
  ASSERT_TRUE(code.has_value()) << "the relay did not stop on an unknown topic:\n"
                                << relay.LogTail();
  std::string log = relay.Log();
  uint64_t confirmed_after_stop = QuerySlot(*db_, name_)->confirmed_flush_lsn.value_or(0);
  int64_t unacked_after_stop = UnackedRows();
  std::string topic = ledger.committed().front().expected.topic;
  std::string error_line;
  if (size_t p = log.find("Z error "); p != std::string::npos) {
    error_line = log.substr(p + 2, log.find('\n', p) - p - 2);
  }

  // Again, creating the topics.
  RelayProcess& again = StartRelay({"--create-topics", "true", "--topic-partitions", "3"}, env);
  ASSERT_TRUE(WaitStreaming(again)) << again.LogTail();
  auto restarted = std::chrono::steady_clock::now();
  int64_t unacked = WaitAllAcked(seconds(60));
  double recovery_s = SecondsSince(restarted);
  EXPECT_EQ(unacked, 0) << DescribeUnacked();
  auto first_commit = MinCommitLsn(*db_, name_, Xids(ledger.committed()));
  std::vector<KafkaRecord> records = ReadTopics({.timeout = seconds(30)});
  DeliveryReport delivery = CheckDelivery(ledger.committed(), ledger.rolled_back(), records);
  auto partitions = PartitionCounts(records);

  fmt::print(
      "unknown topic: {} rows; relay exited with {} after {:.1f} s; first error: {}; "
      "outbox_forwarder_errors_total seen {}\n",
      ledger.committed_count(), *code, fail_s, error_line,
      errors_metric ? fmt::format("{}", *errors_metric) : "never (the relay was gone first)");
  fmt::print("after the stop: {} rows unacked, confirmed_flush_lsn {} (first commit {})\n",
             unacked_after_stop, FormatLsn(confirmed_after_stop),
             first_commit ? FormatLsn(*first_commit) : "unknown");
  std::string topics;
  for (const auto& [t, n] : partitions) topics += fmt::format(" {}({} partitions)", t, n);
  fmt::print("--create-topics: all acked {:.1f} s after streaming; topics:{}\n", recovery_s,
             topics);
  fmt::print("{}\n", delivery.Summary());

  EXPECT_NE(*code, 0);
  // Whichever of the test's topics the producer tried first is the one named.
  std::set<std::string> expected_topics;
  for (const auto& row : ledger.committed()) expected_topics.insert(row.expected.topic);
  bool names_a_topic = std::any_of(
      expected_topics.begin(), expected_topics.end(),
      [&](const std::string& t) { return error_line.find("'" + t + "'") != std::string::npos; });
  EXPECT_TRUE(names_a_topic) << "the error does not name a missing topic (such as " << topic
                             << "):\n"
                             << relay.LogTail();
  EXPECT_EQ(unacked_after_stop, static_cast<int64_t>(ledger.committed_count()));
  ASSERT_TRUE(first_commit.has_value());
  EXPECT_LE(confirmed_after_stop, *first_commit);
  EXPECT_FALSE(partitions.empty());
  for (const auto& [t, n] : partitions) EXPECT_EQ(n, 3) << t;
  EXPECT_EQ(delivery.lost, 0u) << delivery.Samples();
  EXPECT_EQ(delivery.phantom, 0u) << delivery.Samples();
  EXPECT_EQ(delivery.order_violations, 0u) << delivery.Samples();
  ContractReport contract = CheckContract(ledger.committed(), records, partitions);
  fmt::print("{}\n", contract.Summary());
  EXPECT_EQ(contract.mismatches, 0u) << contract.Samples();
  EXPECT_EQ(contract.wrong_partition, 0u) << contract.Samples();

  again.Terminate();
  EXPECT_EQ(again.Wait(seconds(30)), std::optional<int>(0)) << again.LogTail();
  fmt::print("total {:.1f} s\n", SecondsSince(started_));
}

class ResilienceProducer : public RelayTest {};

// OUTBOX_TEST_FAULT=fatal-after:N puts the idempotent producer into its fatal
// state after N records, as an out-of-order sequence from the broker does
// (and as librdkafka before 2.3.0 did after broker failovers that lost
// nothing, confluentinc/librdkafka#4438). At-least-once, the relay replaces
// the producer and sends again from the slot: it keeps running, confirms
// nothing Kafka did not acknowledge, and loses nothing.
TEST_F(ResilienceProducer, AFatalIdempotenceErrorReplacesTheProducerAndSendsAgainFromTheSlot) {
  constexpr int kFatalAfter = 1500;
  CreateTables();
  RelayProcess& relay =
      StartRelay({}, {{"OUTBOX_TEST_FAULT", fmt::format("fatal-after:{}", kFatalAfter)}});
  ASSERT_TRUE(WaitStreaming(relay)) << relay.LogTail();

  Ledger ledger;
  LoadGenerator load(Workload(), &ledger, 2, SmallTx, std::chrono::microseconds(2000));
  load.Start();
  auto began = std::chrono::steady_clock::now();
  // Until the fault has fired and the pipeline is back, then a few seconds more.
  bool restarted = false;
  while (!restarted && SecondsSince(began) < 60 && relay.Running()) {
    std::this_thread::sleep_for(milliseconds(200));
    restarted = relay.Log().find("pipeline restarted") != std::string::npos;
  }
  std::this_thread::sleep_for(seconds(3));
  ASSERT_EQ(load.Stop(), "");
  ASSERT_TRUE(relay.Running()) << "the relay exited after the producer's fatal error:\n"
                               << relay.LogTail();
  ASSERT_TRUE(restarted) << "no pipeline restart 60 s into the load:\n" << relay.LogTail();
  auto stopped = std::chrono::steady_clock::now();
  int64_t unacked = WaitAllAcked(seconds(60));
  const double acked_s = SecondsSince(stopped);
  EXPECT_EQ(unacked, 0) << DescribeUnacked();
  std::vector<KafkaRecord> records = ReadTopics({.timeout = seconds(60)});
  DeliveryReport delivery = CheckDelivery(ledger.committed(), ledger.rolled_back(), records);
  const std::string log = relay.Log();
  const size_t restarts = CountOccurrences(log, "restarting the pipeline");
  std::string restart_took = "?";
  if (size_t at = log.find("pipeline restarted in "); at != std::string::npos) {
    restart_took = log.substr(at + 22, log.find(':', at) - at - 22);
  }

  fmt::print(
      "fatal idempotence error after {} records: {} pipeline restart(s) (in {}), the relay "
      "kept running; all acked {:.1f} s after the load stopped\n",
      kFatalAfter, restarts, restart_took, acked_s);
  fmt::print("{}\n", delivery.Summary());

  EXPECT_EQ(restarts, 1u) << relay.LogTail();
  EXPECT_NE(log.find("OUT_OF_ORDER_SEQUENCE_NUMBER"), std::string::npos) << relay.LogTail();
  EXPECT_EQ(delivery.lost, 0u) << delivery.Samples();
  EXPECT_EQ(delivery.phantom, 0u) << delivery.Samples();
  EXPECT_EQ(delivery.order_violations, 0u) << delivery.Samples();
  EXPECT_EQ(MisackedRows(), 0);
  CheckCommitIndex(ledger);

  relay.Terminate();
  EXPECT_EQ(relay.Wait(seconds(30)), std::optional<int>(0)) << relay.LogTail();
  fmt::print("total {:.1f} s\n", SecondsSince(started_));
}

// Exactly-once, the same fatal error ends the producer's transactions: the
// relay must exit non-zero without confirming a row Kafka has not
// acknowledged, and a restart without the fault replays the rest from the
// slot, nothing twice for a read_committed consumer.
TEST_F(ResilienceProducer, ExactlyOnceAFatalErrorStopsThenRestartReplaysFromSlot) {
  constexpr int kFatalAfter = 1500;
  CreateTables();
  RelayProcess& relay =
      StartRelay(Eos(), {{"OUTBOX_TEST_FAULT", fmt::format("fatal-after:{}", kFatalAfter)}});
  ASSERT_TRUE(WaitStreaming(relay)) << relay.LogTail();

  Ledger ledger;
  LoadGenerator load(Workload(), &ledger, 2, SmallTx, std::chrono::microseconds(2000));
  load.Start();
  auto code = relay.Wait(seconds(60));
  auto failed = std::chrono::steady_clock::now();
  // Writes go on for a moment after the failure: rows the restart must pick up too.
  std::this_thread::sleep_for(milliseconds(500));
  ASSERT_EQ(load.Stop(), "");
  ASSERT_TRUE(code.has_value()) << "the relay did not stop after the fatal error:\n"
                                << relay.LogTail();
  uint64_t confirmed_after_fail = QuerySlot(*db_, name_)->confirmed_flush_lsn.value_or(0);
  // The transactions not marked when it stopped: the slot must not be past any.
  std::vector<std::string> unacked_xids;
  for (const Row& r : db_->Query(
           fmt::format("SELECT DISTINCT transaction_id::text FROM {} WHERE offset_acked IS NULL",
                       QuoteIdent(name_)))) {
    unacked_xids.push_back(r[0].value_or(""));
  }
  int64_t unacked_after_fail = UnackedRows();
  std::string log = relay.Log();

  RelayProcess& again = StartRelay(Eos());
  ASSERT_TRUE(WaitStreaming(again)) << again.LogTail();
  auto restarted = std::chrono::steady_clock::now();
  int64_t unacked = WaitAllAcked(seconds(60));
  double recovery_s = SecondsSince(restarted);
  EXPECT_EQ(unacked, 0) << DescribeUnacked();
  auto first_unacked_commit = MinCommitLsn(*db_, name_, unacked_xids);
  std::vector<KafkaRecord> records;
  for (KafkaRecord& r : ReadTopics({.timeout = seconds(60), .read_committed = true})) {
    if (r.topic != topic_prefix_ + ".progress") records.push_back(std::move(r));
  }
  DeliveryReport delivery = CheckDelivery(ledger.committed(), ledger.rolled_back(), records);

  fmt::print(
      "exactly-once, fatal producer error after {} records: relay exited {} ({:.1f} s after "
      "the load began to stop); {} rows in {} transactions unacked then; confirmed_flush_lsn {} "
      "(first of them committed at {})\n",
      kFatalAfter, *code, SecondsSince(failed), unacked_after_fail, unacked_xids.size(),
      FormatLsn(confirmed_after_fail),
      first_unacked_commit ? FormatLsn(*first_unacked_commit) : "unknown");
  fmt::print("restart without the fault: all acked {:.1f} s after streaming\n", recovery_s);
  fmt::print("{}\n", delivery.Summary());

  EXPECT_NE(*code, 0);
  EXPECT_NE(log.find("fatal"), std::string::npos) << relay.LogTail();
  EXPECT_EQ(CountOccurrences(log, "restarting the pipeline"), 0u) << relay.LogTail();
  EXPECT_GT(unacked_after_fail, 0);
  ASSERT_TRUE(first_unacked_commit.has_value());
  EXPECT_LE(confirmed_after_fail, *first_unacked_commit)
      << "the slot was confirmed past a transaction that was not delivered";
  EXPECT_EQ(delivery.lost, 0u) << delivery.Samples();
  EXPECT_EQ(delivery.phantom, 0u) << delivery.Samples();
  EXPECT_EQ(delivery.order_violations, 0u) << delivery.Samples();
  EXPECT_EQ(delivery.duplicates, 0u) << delivery.Samples();
  EXPECT_EQ(MisackedRows(), 0);
  CheckCommitIndex(ledger);

  again.Terminate();
  EXPECT_EQ(again.Wait(seconds(30)), std::optional<int>(0)) << again.LogTail();
  fmt::print("total {:.1f} s\n", SecondsSince(started_));
}

}  // namespace
}  // namespace outbox_test
