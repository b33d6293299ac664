// A stop request is obeyed in every state, within the shutdown timeout, and
// never crashes (DESIGN §2.7, docs/runbook.md): during setup, the backfill,
// streaming, held back by --max-in-flight while Kafka is down, and as a
// standby — with Kafka up and down. With Kafka up it drains and exits 0; with
// Kafka down it gives up what Kafka does not take (nothing of it is
// confirmed) and exits 1 in time.
//
// And the refused-record path: a record the broker refuses while the
// producer's queue is full is dead-lettered by the loop thread, not by the
// thread that frees queue space (which used to wait on itself, then crash on
// SIGTERM).
#include <fmt/format.h>
#include <unistd.h>

#include <thread>

#include "fixture.h"
#include "resilience_support.h"
#include "support/throwaway_kafka.h"

namespace outbox_test {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;
using namespace resilience;

using RelayEnv = std::map<std::string, std::optional<std::string>>;

constexpr int kShutdownMs = 3000;
// What a stop may take past the shutdown timeout: the loop notices it within
// 100 ms, the Kafka client's teardown and the process exit.
constexpr auto kStopSlack = milliseconds(2500);

class Shutdown : public RelayTest {
 protected:
  static void TearDownTestSuite() { broker_.reset(); }

  // The suite's private broker (the tests stop it), running.
  ThrowawayKafka& Broker() {
    if (!broker_) {
      broker_ = std::make_unique<ThrowawayKafka>();
    } else if (!broker_->Running()) {
      broker_->Start();
    }
    kafka_ = std::make_unique<KafkaReader>(broker_->brokers());
    private_broker_ = true;
    return *broker_;
  }
  void TearDown() override {
    if (private_broker_) kafka_.reset();
    RelayTest::TearDown();
  }

  std::vector<std::string> Args(std::vector<std::string> extra = {}) {
    extra.insert(extra.end(),
                 {"--shutdown-timeout-ms", std::to_string(kShutdownMs), "--create-topics", "true"});
    return extra;
  }

  // SIGTERM; returns the exit code and how long the exit took.
  std::pair<std::optional<int>, double> Stop(RelayProcess& relay) {
    auto t0 = std::chrono::steady_clock::now();
    relay.Terminate();
    auto code = relay.Wait(milliseconds(kShutdownMs) + kStopSlack + seconds(20));
    return {code, SecondsSince(t0)};
  }

  void ExpectBounded(const std::string& state, RelayProcess& relay,
                     std::optional<int> want_code = std::nullopt) {
    auto [code, secs] = Stop(relay);
    fmt::print("SIGTERM {}: exit {} after {:.2f} s (shutdown timeout {:.1f} s)\n", state,
               code ? std::to_string(*code) : std::string("none"), secs, kShutdownMs / 1000.0);
    ASSERT_TRUE(code.has_value()) << state << ": still running\n" << relay.LogTail();
    EXPECT_LT(*code, 128) << state << ": killed by a signal\n" << relay.LogTail();
    EXPECT_LE(secs, std::chrono::duration<double>(milliseconds(kShutdownMs) + kStopSlack).count())
        << state << "\n"
        << relay.LogTail();
    if (want_code) {
      EXPECT_EQ(*code, *want_code) << state << "\n" << relay.LogTail();
    }
  }

  static std::unique_ptr<ThrowawayKafka> broker_;
  bool private_broker_ = false;
};

std::unique_ptr<ThrowawayKafka> Shutdown::broker_;

TEST_F(Shutdown, DuringSetupWhileTheDatabaseIsUnreachable) {
  int port = FreeLocalPort(28700 + static_cast<int>(getpid() % 200));
  RelayEnv env = {{"DATABASE_URL", fmt::format("postgresql://postgres@127.0.0.1:{}/x", port)}};
  RelayProcess& relay = StartRelay(Args(), env);
  ASSERT_TRUE(relay.WaitForLog("setup:", seconds(20))) << relay.LogTail();
  ExpectBounded("in setup (database unreachable)", relay, 0);
}

TEST_F(Shutdown, DuringTheBackfillWithKafkaUpAndDown) {
  ThrowawayKafka& broker = Broker();
  CreateTables();
  Ledger ledger;
  {
    Writer writer(Workload(), &ledger, -1, 301);
    for (int i = 0; i < 300; ++i) ASSERT_TRUE(writer.Transaction({.rows = 100}));
  }
  RelayEnv env = {{"KAFKA_BROKERS", broker.brokers()}};
  // Kafka up: a stop in the middle of the backfill exits 0; nothing is lost.
  {
    RelayProcess& relay = StartRelay(Args({"--max-in-flight", "200"}), env);
    ASSERT_TRUE(relay.WaitForLog("backfill: publishing", seconds(30))) << relay.LogTail();
    std::this_thread::sleep_for(milliseconds(500));
    ExpectBounded("in the backfill (Kafka up)", relay, 0);
  }
  // Kafka down: held back by --max-in-flight in the middle of the backfill.
  {
    RelayProcess& relay = StartRelay(Args({"--max-in-flight", "200"}), env);
    ASSERT_TRUE(relay.WaitForLog("backfill: publishing", seconds(30))) << relay.LogTail();
    broker.Stop(/*kill=*/true);
    std::this_thread::sleep_for(seconds(2));
    ExpectBounded("in the backfill (Kafka down)", relay);
  }
  broker.Start();
  RelayProcess& relay = StartRelay(Args(), env);
  ASSERT_TRUE(WaitStreaming(relay, seconds(120))) << relay.LogTail();
  EXPECT_EQ(WaitAllAcked(seconds(120)), 0) << DescribeUnacked();
  DeliveryReport report = CheckDelivery(ledger.committed(), ledger.rolled_back(), ReadTopics());
  fmt::print("{}\n", report.Summary());
  EXPECT_EQ(report.lost, 0u) << report.Samples();
  EXPECT_EQ(report.order_violations, 0u) << report.Samples();
  ExpectBounded("streaming, idle (Kafka up)", relay, 0);
}

TEST_F(Shutdown, HeldBackInsideATransactionWithKafkaDown) {
  ThrowawayKafka& broker = Broker();
  CreateTables();
  RelayEnv env = {{"KAFKA_BROKERS", broker.brokers()}};
  RelayProcess& relay = StartRelay(Args({"--max-in-flight", "10"}), env);
  ASSERT_TRUE(WaitStreaming(relay)) << relay.LogTail();
  Ledger ledger;
  Writer writer(Workload(), &ledger, -1, 302);
  ASSERT_TRUE(writer.Transaction({.rows = 5}));
  ASSERT_EQ(WaitAllAcked(seconds(60)), 0) << DescribeUnacked();  // its topics are known now
  broker.Stop(/*kill=*/true);
  // A transaction much larger than --max-in-flight: the loop stops reading
  // inside it, waiting for Kafka, and its Commit never comes.
  ASSERT_TRUE(writer.Transaction({.rows = 500}));
  std::this_thread::sleep_for(seconds(2));
  uint64_t before = QuerySlot(*db_, name_)->confirmed_flush_lsn.value_or(0);
  // Exit 1: the open transaction was given up (it is sent again after the
  // restart); a stop that drained everything exits 0.
  ExpectBounded("held back inside a transaction (Kafka down)", relay, 1);
  EXPECT_NE(relay.Log().find("it is given up and sent again after the restart"), std::string::npos)
      << relay.LogTail();
  EXPECT_EQ(QuerySlot(*db_, name_)->confirmed_flush_lsn.value_or(0), before);
  EXPECT_EQ(UnackedRows(), 500);
  broker.Start();
  RelayProcess& again = StartRelay(Args(), env);
  EXPECT_EQ(WaitAllAcked(seconds(120)), 0) << DescribeUnacked() << again.LogTail();
  DeliveryReport report = CheckDelivery(ledger.committed(), ledger.rolled_back(), ReadTopics());
  fmt::print("{}\n", report.Summary());
  EXPECT_EQ(report.lost, 0u) << report.Samples();
  ExpectBounded("streaming after the outage (Kafka up)", again, 0);
}

TEST_F(Shutdown, AsAStandby) {
  CreateTables();
  RelayProcess& active = StartRelay(Args());
  ASSERT_TRUE(WaitStreaming(active)) << active.LogTail();
  RelayProcess& standby = StartRelay(Args());
  ASSERT_TRUE(standby.WaitForLog("info standby:", seconds(30))) << standby.LogTail();
  ExpectBounded("as a standby", standby, 0);
  ExpectBounded("streaming, idle (Kafka up)", active, 0);
}

// A step of the stop that hangs (here: a failpoint before the Kafka producer
// is closed; in the field, a client waiting on a silent peer) is cut short:
// the process exits with 1 at most 1.5 s after the shutdown timeout, naming
// the step, and a restart publishes everything.
TEST_F(Shutdown, AStepThatHangsIsCutShortAfterTheTimeout) {
  CreateTables();
  RelayProcess& relay = StartRelay(Args(), {{"OUTBOX_TEST_FAULT", "stall-stop:60"}});
  ASSERT_TRUE(WaitStreaming(relay)) << relay.LogTail();
  Ledger ledger;
  Writer writer(Workload(), &ledger, -1, 303);
  ASSERT_TRUE(writer.Transaction({.rows = 20}));
  ASSERT_EQ(WaitAllAcked(seconds(60)), 0) << DescribeUnacked();
  ExpectBounded("a stop step that hangs for 60 s", relay, 1);
  EXPECT_NE(relay.Log().find("still closing the Kafka producer"), std::string::npos)
      << relay.LogTail();
  ASSERT_TRUE(writer.Transaction({.rows = 20}));
  RelayProcess& again = StartRelay(Args());
  EXPECT_EQ(WaitAllAcked(seconds(60)), 0) << DescribeUnacked() << again.LogTail();
  DeliveryReport report = CheckDelivery(ledger.committed(), ledger.rolled_back(), ReadTopics());
  fmt::print("{}\n", report.Summary());
  EXPECT_EQ(report.lost, 0u) << report.Samples();
  EXPECT_EQ(report.phantom, 0u) << report.Samples();
  EXPECT_EQ(report.order_violations, 0u) << report.Samples();
  ExpectBounded("after the restart", again, 0);
}

TEST_F(Shutdown, RefusedRecordWhileTheProducerQueueIsFullIsDeadLetteredThenStopsCleanly) {
  CreateTables();
  const std::string topic = topic_prefix_ + ".small.small";
  CreateTopic(env_.kafka_brokers, topic, 1, {{"max.message.bytes", "20000"}});
  // A one-message producer queue: the poller thread is the only one that
  // frees it, so it must never wait for room itself.
  RelayProcess& relay = StartRelay(Args({"--kafka-property", "queue.buffering.max.messages=1"}));
  ASSERT_TRUE(WaitStreaming(relay)) << relay.LogTail();
  Pg writer(env_.database_url);
  std::vector<WrittenRow> good;
  writer.Exec("BEGIN");
  for (int i = 1; i <= 40; ++i) {
    // The 20th is too large for the topic even alone: the broker refuses it.
    WrittenRow w = InsertRow(writer, {.seq = i, .pad = i == 20 ? 30000u : 0u});
    if (i != 20) good.push_back(std::move(w));
  }
  writer.Exec("COMMIT");
  EXPECT_EQ(WaitAllAcked(seconds(60)), 0) << DescribeUnacked() << relay.LogTail();
  std::vector<KafkaRecord> records = ReadTopics();
  std::vector<KafkaRecord> published;
  size_t dead = 0;
  for (const KafkaRecord& rec : records) {
    if (rec.topic == topic_prefix_ + ".dlq") {
      ++dead;
    } else {
      published.push_back(rec);
    }
  }
  DeliveryReport report = CheckDelivery(good, {}, published);
  fmt::print("{}; dead-lettered {}\n", report.Summary(), dead);
  EXPECT_EQ(report.lost, 0u) << report.Samples();
  EXPECT_EQ(dead, 1u);
  ExpectBounded("streaming after a refused record (Kafka up)", relay, 0);
}

}  // namespace
}  // namespace outbox_test
