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
#include <fmt/format.h>
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

  // Two writers of mixed transactions (a tenth rolled back), 5 ms apart.
  std::unique_ptr<LoadGenerator> StartLoad(Ledger* ledger) {
    auto load = std::make_unique<LoadGenerator>(
        Workload(), ledger, 2,
        [](std::mt19937_64& rng) {
          TxSpec tx;
          tx.rows = 1 + static_cast<int>(rng() % 20);
          tx.rollback = rng() % 10 == 0;
          return tx;
        },
        std::chrono::microseconds(5000));
    load->Start();
    return load;
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

  std::unique_ptr<Toxiproxy> proxy_;
  std::unique_ptr<KafkaCluster> cluster_;
  std::unique_ptr<KafkaReader> reader_;
};

TEST_F(NetworkKafka, OneBrokerBlackHoledLongerThanTheDeliveryTimeout) {
  CreateTables();
  RelayProcess& relay = StartRelay(
      {"--kafka-brokers", cluster_->client_brokers(), "--topic-replication-factor", "3",
       "--kafka-socket-timeout-ms", std::to_string(kSocketTimeoutMs), "--kafka-connect-timeout-ms",
       "2000", "--kafka-delivery-timeout-ms", std::to_string(kDeliveryTimeoutMs)},
      {{"KAFKA_BROKERS", cluster_->client_brokers()}});
  ASSERT_TRUE(WaitStreaming(relay, seconds(60))) << relay.LogTail();
  Ledger ledger;
  auto load = StartLoad(&ledger);
  std::this_thread::sleep_for(seconds(4));

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
  size_t restarts = network::CountLogAfter(relay.Log(), "restarting the pipeline", fault);
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
  RelayProcess& relay =
      StartRelay({"--kafka-brokers", cluster_->client_brokers(), "--topic-replication-factor", "3"},
                 {{"KAFKA_BROKERS", cluster_->client_brokers()}});
  ASSERT_TRUE(WaitStreaming(relay, seconds(60))) << relay.LogTail();
  Ledger ledger;
  auto load = StartLoad(&ledger);
  std::this_thread::sleep_for(seconds(4));
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
  size_t given_up = network::CountLogAfter(relay.Log(), "giving them up", fault);
  size_t restarts = network::CountLogAfter(relay.Log(), "restarting the pipeline", fault);
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

}  // namespace
}  // namespace outbox_test
