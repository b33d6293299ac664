// The relay against a 3-node KRaft cluster of the test's own (replication
// factor 3, min.insync.replicas=2, no unclean elections), each broker's
// client listener advertised as a Toxiproxy proxy on 127.0.0.1. The tests'
// own readers use the brokers' internal listeners, never proxied.
//
// One broker black-holed (not killed: the cluster still sees it, so it stays
// the leader of its partitions) for longer than the relay's delivery
// deadline (--kafka-delivery-timeout-ms): the records that time out are given
// up, never counted as delivered, and sent again from the slot once the
// pipeline restarts; after the heal everything arrives, in order per key.
//
// One broker 200 ms slower: confirmation slows, never stops; nothing is
// given up or sent twice.
//
// The cluster's own faults, with the relay's defaults (no delivery deadline):
// the leader of the busiest partitions killed (-9) three times; a rolling
// restart of all three brokers; two of three down for a minute (below
// min.insync.replicas, and below the controllers' quorum): the relay holds
// back, confirms and marks nothing that Kafka did not acknowledge, and drains
// when they return.
#include <fmt/format.h>
#include <librdkafka/rdkafka.h>
#include <unistd.h>

#include <algorithm>
#include <memory>
#include <random>
#include <thread>

#include "fixture.h"
#include "network_support.h"
#include "support/throwaway_kafka.h"
#include "support/throwaway_pg.h"
#include "support/toxiproxy.h"

namespace outbox_test {
namespace {

using network::Figures;
using network::SysClock;
using std::chrono::milliseconds;
using std::chrono::seconds;

constexpr int kDeliveryTimeoutMs = 8000;
constexpr int kSocketTimeoutMs = 3000;

class NetworkKafka : public RelayTest {
 protected:
  void SetUp() override {
    RelayTest::SetUp();
    proxy_ = std::make_unique<Toxiproxy>();
    KafkaClusterOptions o;
    o.nodes = 3;
    int base = 28700 + static_cast<int>(::getpid() % 40) * 4;
    o.advertise = [this, base](size_t node, int client_port) {
      return proxy_->CreateProxy(fmt::format("kafka{}", node),
                                 FreeLocalPort(base + static_cast<int>(node)),
                                 fmt::format("127.0.0.1:{}", client_port));
    };
    cluster_ = std::make_unique<KafkaCluster>(std::move(o));
    reader_ = std::make_unique<KafkaReader>(cluster_->brokers());
  }

  // The broker leading most of the test's partitions: its node id, how many
  // it leads, and the name of its proxy.
  struct Leader {
    int32_t node = -1;
    int partitions = 0;
    std::string proxy;
  };
  Leader BusiestLeader() {
    Leader l;
    for (const auto& [node, count] : cluster_->LeaderCounts(topic_prefix_ + ".")) {
      if (node > 0 && count > l.partitions) {
        l.node = node;
        l.partitions = count;
      }
    }
    if (l.node > 0) l.proxy = fmt::format("kafka{}", cluster_->IndexOf(l.node));
    return l;
  }

  // After the heal: the load stops, the relay catches up and stops cleanly,
  // the topics are checked against the ledger, and the figures are printed
  // and held to the common rules.
  void Finish(RelayProcess& relay, LoadGenerator& load, const Ledger& ledger,
              std::chrono::steady_clock::time_point healed, Figures* f) {
    std::string load_error = load.Stop();
    ASSERT_EQ(load_error, "") << "writer failed";
    uint64_t wal_after_load = CurrentWalLsn(*db_);
    EXPECT_EQ(WaitAllAcked(seconds(90)), 0) << "rows still unacked\n" << DescribeUnacked();
    EXPECT_EQ(MisackedRows(), 0);
    EXPECT_GE(WaitConfirmedAtLeast(wal_after_load, seconds(30)), wal_after_load);
    ASSERT_TRUE(relay.Running()) << "the relay exited by itself:\n" << relay.LogTail();
    relay.Terminate();
    EXPECT_EQ(relay.Wait(seconds(40)), std::optional<int>(0)) << relay.LogTail();
    std::vector<KafkaRecord> records =
        reader_->Read({}, topic_prefix_ + ".", {.timeout = seconds(60)});
    f->delivery = CheckDelivery(ledger.committed(), ledger.rolled_back(), records);
    f->notes +=
        fmt::format("{}{} transactions; drained {:.1f} s after the heal",
                    f->notes.empty() ? "" : "; ", load.transactions(), SecondsSince(healed));
    network::PrintFigures(*f);
    network::ExpectClean(*f);
  }

  // What the relay did about a fault since `since`: deliveries it gave up
  // (--kafka-delivery-timeout-ms), pipeline restarts, and of those the ones
  // that replaced a producer failed for good.
  struct Reactions {
    size_t given_up = 0;
    size_t restarts = 0;
    size_t replaced = 0;
  };
  static Reactions ReactionsSince(RelayProcess& relay, SysClock::time_point since) {
    std::string log = relay.Log();
    return {network::CountLogAfter(log, "giving them up", since),
            network::CountLogAfter(log, "restarting the pipeline", since),
            network::CountLogAfter(log, "restarting the pipeline: Kafka producer failed", since)};
  }

  // No pipeline restart, and no producer replaced: librdkafka before 2.3.0
  // failed its idempotent producer fatally after a broker failover that lost
  // nothing ("rewound sequence number", "sequence desynchronization":
  // confluentinc/librdkafka#4438), and these tests allowed that one restart
  // then; the librdkafka the relay links (scripts/librdkafka, 2.14.2) moves to
  // the new leaders by itself.
  static void ExpectNoRestart(const Reactions& r, RelayProcess& relay) {
    EXPECT_EQ(r.restarts, 0u) << "librdkafka " << rd_kafka_version_str() << "\n" << relay.LogTail();
    EXPECT_EQ(r.replaced, 0u) << relay.LogTail();
  }

  // The relay on the cluster's proxied listeners, topics replicated 3 times.
  RelayProcess& StartClusterRelay(std::vector<std::string> extra = {}) {
    std::vector<std::string> args = {"--kafka-brokers", cluster_->client_brokers(),
                                     "--topic-replication-factor", "3"};
    args.insert(args.end(), extra.begin(), extra.end());
    return StartRelay(args, {{"KAFKA_BROKERS", cluster_->client_brokers()}});
  }

  // Seconds until the slot confirms the WAL written now (nullopt: not within `timeout`).
  std::optional<double> ConfirmationLag(std::chrono::seconds timeout = seconds(90)) {
    return network::SecondsUntilConfirmed(*db_, name_, CurrentWalLsn(*db_), timeout);
  }

  // Rows of the outbox table the relay marked as delivered.
  int64_t MarkedRows() {
    return db_->Int(
        fmt::format("SELECT count(*) FROM {} WHERE offset_acked IS NOT NULL", QuoteIdent(name_)));
  }

  // Restarts node `index` and waits until every partition of the test's
  // topics has all its replicas in sync again.
  void Restart(size_t index) {
    cluster_->node(index).Start();
    EXPECT_TRUE(cluster_->WaitFullyReplicated(topic_prefix_ + ".", seconds(90)))
        << "replicas not back in sync 90 s after node " << index + 1 << " restarted";
  }

  std::unique_ptr<Toxiproxy> proxy_;
  std::unique_ptr<KafkaCluster> cluster_;
  std::unique_ptr<KafkaReader> reader_;
};

TEST_F(NetworkKafka, OneBrokerBlackHoledLongerThanTheDeliveryTimeout) {
  CreateTables();
  RelayProcess& relay = StartClusterRelay(
      {"--kafka-socket-timeout-ms", std::to_string(kSocketTimeoutMs), "--kafka-connect-timeout-ms",
       "2000", "--kafka-delivery-timeout-ms", std::to_string(kDeliveryTimeoutMs)});
  Ledger ledger;
  auto load = network::LoadOnceStreaming(relay, Workload(), &ledger, seconds(4));
  ASSERT_TRUE(load);

  const Leader busiest = BusiestLeader();
  ASSERT_GT(busiest.node, 0) << "no partition of the test's topics has a leader";
  const std::string& proxy = busiest.proxy;

  Figures f;
  f.scenario = fmt::format("kafka broker {} of 3 black-holed 20 s (leads {} partitions)",
                           busiest.node, busiest.partitions);
  // The watchdog looks every second: a transaction is given up at most that
  // late after the deadline; its newest record was handed over before the
  // fault or during it.
  f.bound_s = (kDeliveryTimeoutMs + 1000) / 1000.0 + 1;
  auto fault = SysClock::now();
  proxy_->BlackHole(proxy);
  std::this_thread::sleep_for(seconds(20));
  f.detect_s = network::FirstLogAfter(relay.Log(), "giving them up", fault);
  EXPECT_TRUE(f.detect_s.has_value()) << "no delivery given up in 20 s\n" << relay.LogTail();
  const size_t restarts = ReactionsSince(relay, fault).restarts;
  proxy_->Heal(proxy);
  auto healed = std::chrono::steady_clock::now();
  uint64_t target = CurrentWalLsn(*db_);
  f.recover_s = network::SecondsUntilConfirmed(*db_, name_, target, seconds(90));
  f.recover_what = "heal -> slot confirms the WAL of the heal";
  EXPECT_TRUE(f.recover_s.has_value()) << relay.LogTail();
  std::this_thread::sleep_for(seconds(2));

  f.notes = fmt::format("{} pipeline restarts during the hole", restarts);
  Finish(relay, *load, ledger, healed, &f);
  EXPECT_GE(restarts, 1u) << "the timed-out records were never given up";
}

// One broker of three 200 ms slower (every answer it sends is held 200 ms):
// its partitions' records take longer to be acknowledged, so confirmation
// moves in longer steps, but it keeps moving and nothing is given up; after
// the heal the relay is as quick as before. Figures: the time the slot takes
// to confirm the WAL written at a moment (the confirmation lag), before and
// during the latency.
TEST_F(NetworkKafka, OneBrokerTwoHundredMsSlowerNothingStalls) {
  CreateTables();
  RelayProcess& relay = StartClusterRelay();
  Ledger ledger;
  auto load = network::LoadOnceStreaming(relay, Workload(), &ledger, seconds(4));
  ASSERT_TRUE(load);
  // The confirmation lag, sampled `n` times one after the other: the worst.
  auto worst_lag = [&](int n) {
    double worst = 0;
    for (int i = 0; i < n; ++i) {
      auto lag = network::SecondsUntilConfirmed(*db_, name_, CurrentWalLsn(*db_), seconds(30));
      if (!lag) return std::optional<double>();
      worst = std::max(worst, *lag);
    }
    return std::optional<double>(worst);
  };
  std::optional<double> lag_before = worst_lag(5);
  ASSERT_TRUE(lag_before.has_value()) << "the relay does not confirm under load\n"
                                      << relay.LogTail();

  const Leader busiest = BusiestLeader();
  ASSERT_GT(busiest.node, 0) << "no partition of the test's topics has a leader";
  const std::string& proxy = busiest.proxy;

  Figures f;
  f.scenario = fmt::format("kafka broker {} of 3 (leads {} partitions) 200 ms slower for 15 s",
                           busiest.node, busiest.partitions);
  auto fault = SysClock::now();
  auto fault_steady = std::chrono::steady_clock::now();
  proxy_->AddToxic(proxy, {.name = "slow",
                           .type = "latency",
                           .stream = "downstream",
                           .attributes = {{"latency", 200}, {"jitter", 0}}});
  // Sampled until 15 s have passed: each sample must be confirmed within 30 s.
  std::optional<double> lag_during = 0.0;
  int samples = 0;
  while (std::chrono::steady_clock::now() - fault_steady < seconds(15) && lag_during) {
    auto lag = worst_lag(1);
    lag_during = lag ? std::optional<double>(std::max(*lag_during, *lag)) : std::nullopt;
    ++samples;
  }
  EXPECT_TRUE(lag_during.has_value())
      << "the slot did not confirm within 30 s while one broker was slow\n"
      << relay.LogTail();
  const auto [given_up, restarts, replaced] = ReactionsSince(relay, fault);
  proxy_->RemoveToxic(proxy, "slow");
  auto healed = std::chrono::steady_clock::now();
  uint64_t target = CurrentWalLsn(*db_);
  f.recover_s = network::SecondsUntilConfirmed(*db_, name_, target, seconds(90));
  f.recover_what = "heal -> slot confirms the WAL of the heal";
  EXPECT_TRUE(f.recover_s.has_value()) << relay.LogTail();
  std::optional<double> lag_after = worst_lag(5);

  f.notes = fmt::format(
      "confirmation lag worst {} before, {} during ({} samples), {} after; {} deliveries given "
      "up, {} pipeline restarts",
      network::Seconds(lag_before), network::Seconds(lag_during), samples,
      network::Seconds(lag_after), given_up, restarts);
  Finish(relay, *load, ledger, healed, &f);
  EXPECT_EQ(given_up, 0u) << "a slow broker is not a dead one: nothing is given up";
  EXPECT_EQ(restarts, 0u) << relay.LogTail();
  EXPECT_EQ(f.delivery.duplicates, 0u) << "nothing was sent twice without a fault\n"
                                       << f.delivery.Samples();
}

// The leader of the most partitions killed with SIGKILL under load, three
// times over; after each kill the cluster elects new leaders (the session of
// the dead broker expires in 3 s) and the killed broker is started again and
// caught up before the next kill. The relay keeps going on its own: no
// restart, nothing given up, confirmation moving again within seconds.
TEST_F(NetworkKafka, BusiestLeaderKilledThreeTimes) {
  CreateTables();
  RelayProcess& relay = StartClusterRelay();
  Ledger ledger;
  auto load = network::LoadOnceStreaming(relay, Workload(), &ledger, seconds(4));
  ASSERT_TRUE(load);

  Figures f;
  f.scenario = "kafka: kill -9 of the busiest partition leader, 3 times";
  auto first_fault = SysClock::now();
  std::string killed;
  double worst = 0;
  for (int round = 0; round < 3; ++round) {
    const Leader busiest = BusiestLeader();
    ASSERT_GT(busiest.node, 0) << "no partition of the test's topics has a leader";
    killed += fmt::format("{}{} ({} partitions)", round == 0 ? "" : ", ", busiest.node,
                          busiest.partitions);
    cluster_->node(cluster_->IndexOf(busiest.node)).Stop(/*kill=*/true);
    // The time the slot takes to confirm the WAL written at the kill.
    std::optional<double> lag = ConfirmationLag();
    ASSERT_TRUE(lag.has_value()) << "nothing confirmed 90 s after killing broker " << busiest.node
                                 << "\n"
                                 << relay.LogTail();
    worst = std::max(worst, *lag);
    Restart(cluster_->IndexOf(busiest.node));
    std::this_thread::sleep_for(seconds(2));
  }
  auto healed = std::chrono::steady_clock::now();
  f.recover_s = worst;
  f.recover_what = "kill -> slot confirms the WAL of the kill, worst of 3";
  const Reactions r = ReactionsSince(relay, first_fault);
  f.notes = fmt::format(
      "killed brokers {}; {} deliveries given up, {} pipeline restarts ({} replacing a failed "
      "producer)",
      killed, r.given_up, r.restarts, r.replaced);
  Finish(relay, *load, ledger, healed, &f);
  // librdkafka moves to the new leaders by itself.
  ExpectNoRestart(r, relay);
}

// All three brokers restarted one after the other (SIGTERM: controlled
// shutdown, leadership moved away first), each caught up before the next:
// the relay never stops, nothing is given up, nothing is sent twice.
TEST_F(NetworkKafka, RollingRestartOfAllThreeBrokers) {
  CreateTables();
  RelayProcess& relay = StartClusterRelay();
  Ledger ledger;
  auto load = network::LoadOnceStreaming(relay, Workload(), &ledger, seconds(4));
  ASSERT_TRUE(load);

  Figures f;
  f.scenario = "kafka: rolling restart of all 3 brokers";
  auto first_fault = SysClock::now();
  auto start = std::chrono::steady_clock::now();
  double worst = 0;
  for (size_t i = 0; i < cluster_->size(); ++i) {
    cluster_->node(i).Stop();
    // While it is down: the slot confirms the WAL written now.
    std::optional<double> lag = ConfirmationLag();
    ASSERT_TRUE(lag.has_value()) << "nothing confirmed 90 s after stopping node " << i + 1 << "\n"
                                 << relay.LogTail();
    worst = std::max(worst, *lag);
    Restart(i);
  }
  auto healed = std::chrono::steady_clock::now();
  f.recover_s = worst;
  f.recover_what = "a broker stopped -> slot confirms the WAL of that moment, worst of 3";
  const Reactions r = ReactionsSince(relay, first_fault);
  f.notes = fmt::format(
      "the roll took {:.1f} s; {} deliveries given up, {} pipeline restarts ({} replacing a "
      "failed producer)",
      SecondsSince(start), r.given_up, r.restarts, r.replaced);
  Finish(relay, *load, ledger, healed, &f);
  EXPECT_EQ(r.given_up, 0u);
  ExpectNoRestart(r, relay);
  EXPECT_EQ(f.delivery.duplicates, 0u) << "a controlled restart sends nothing twice\n"
                                       << f.delivery.Samples();
}

// Two brokers of three killed for a minute: every partition is below
// min.insync.replicas=2 (and the controllers below their quorum), so Kafka
// acknowledges nothing. The relay holds back: from 10 s into the outage to
// its end, the slot's confirmed position and the marked rows do not move.
// When the brokers return, it drains on its own.
TEST_F(NetworkKafka, TwoBrokersDownForAMinuteHoldsBackThenDrains) {
  CreateTables();
  RelayProcess& relay = StartClusterRelay();
  Ledger ledger;
  auto load = network::LoadOnceStreaming(relay, Workload(), &ledger, seconds(4));
  ASSERT_TRUE(load);
  // The scenario is an outage of a cluster that took rows: its topics exist and
  // acknowledge. (On a loaded machine the relay's topics were once still being
  // created when the brokers were killed; a topic that cannot be made while the
  // controllers lack their quorum fails its rows as unknown, and the relay exits.)
  ASSERT_TRUE(network::SecondsUntilConfirmed(*db_, name_, CurrentWalLsn(*db_), seconds(90)))
      << "nothing was delivered before the fault\n"
      << relay.LogTail();

  Figures f;
  f.scenario = "kafka: 2 of 3 brokers killed for 60 s (below min.insync.replicas)";
  auto fault = SysClock::now();
  auto fault_steady = std::chrono::steady_clock::now();
  cluster_->node(0).Stop(/*kill=*/true);
  cluster_->node(1).Stop(/*kill=*/true);
  // What was acknowledged before the kill is confirmed and marked within 10 s.
  std::this_thread::sleep_for(seconds(10));
  auto slot_at = [&] {
    auto s = QuerySlot(*db_, name_);
    return s && s->confirmed_flush_lsn ? *s->confirmed_flush_lsn : 0;
  };
  uint64_t confirmed_early = slot_at();
  int64_t marked_early = MarkedRows();
  std::this_thread::sleep_until(fault_steady + seconds(60));
  uint64_t confirmed_late = slot_at();
  int64_t marked_late = MarkedRows();
  EXPECT_EQ(confirmed_late, confirmed_early)
      << "the slot was confirmed further while Kafka could acknowledge nothing";
  EXPECT_EQ(marked_late, marked_early)
      << "rows were marked delivered while Kafka could acknowledge nothing";
  ASSERT_TRUE(relay.Running()) << "the relay gave up during the outage\n" << relay.LogTail();
  cluster_->node(0).Launch();
  cluster_->node(1).Launch();
  cluster_->node(0).WaitAnswering();
  cluster_->node(1).WaitAnswering();
  auto healed = std::chrono::steady_clock::now();
  uint64_t target = CurrentWalLsn(*db_);
  f.recover_s = network::SecondsUntilConfirmed(*db_, name_, target, seconds(120));
  f.recover_what = "brokers answering again -> slot confirms the WAL of that moment";
  EXPECT_TRUE(f.recover_s.has_value()) << relay.LogTail();
  EXPECT_TRUE(cluster_->WaitFullyReplicated(topic_prefix_ + ".", seconds(90)));
  const Reactions r = ReactionsSince(relay, fault);
  f.notes = fmt::format(
      "confirmed and marked still from 10 s into the outage to its end ({} rows marked); {} "
      "deliveries given up, {} failed producers replaced",
      marked_late, r.given_up, r.replaced);
  Finish(relay, *load, ledger, healed, &f);
  ExpectNoRestart(r, relay);
}

}  // namespace
}  // namespace outbox_test
