// The harness can see loss. The kill -9 tests pass when CheckDelivery finds
// nothing lost; that means something only if the same harness, run against a
// relay that breaks the confirmation rule, does find lost rows.
// OUTBOX_TEST_FAULT=confirm-newest makes the relay confirm the newest received
// transaction on any delivery report (docs/architecture.md "Prefix, not
// latest"); linger.ms=200 keeps rows in flight long enough for a kill to land
// while the slot is already confirmed past them. Kill rounds continue until
// loss is seen or a bound of kills is reached.
#include <fmt/format.h>

#include <random>
#include <thread>

#include "fixture.h"

namespace outbox_test {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

class ResilienceCrash : public RelayTest {};

TEST_F(ResilienceCrash, HarnessSeesLossWhenTheRelayConfirmsTheNewestTransaction) {
  constexpr int kKillsPerRound = 4;
  constexpr int kMaxKills = 24;
  CreateTables();
  const std::vector<std::string> args = {"--kafka-property", "linger.ms=200"};
  const std::map<std::string, std::optional<std::string>> env = {
      {"OUTBOX_TEST_FAULT", "confirm-newest"}};
  RelayProcess* relay = &StartRelay(args, env);
  ASSERT_TRUE(WaitStreaming(*relay)) << relay->LogTail();
  ASSERT_NE(relay->Log().find("TEST FAULT confirm-newest"), std::string::npos)
      << "the relay does not run with the fault\n"
      << relay->LogTail();

  Ledger ledger;
  auto next = [](std::mt19937_64& rng) {
    TxSpec tx;
    tx.rows = 1 + static_cast<int>(rng() % 20);
    tx.rollback = rng() % 10 == 0;
    return tx;
  };
  std::mt19937_64 rng(TestSeed());
  int kills = 0, rounds = 0;
  size_t transactions = 0;
  DeliveryReport delivery;
  int64_t unacked = 0;
  auto started = std::chrono::steady_clock::now();
  while (kills < kMaxKills) {
    ++rounds;
    LoadGenerator load(Workload(), &ledger, 2, next, std::chrono::microseconds(2000));
    load.Start();
    for (int k = 0; k < kKillsPerRound; ++k) {
      ASSERT_TRUE(WaitStreaming(*relay, seconds(30))) << relay->LogTail();
      std::this_thread::sleep_for(milliseconds(400 + rng() % 600));
      relay->Kill(SIGKILL);
      ASSERT_EQ(relay->Wait(seconds(10)), std::optional<int>(128 + SIGKILL));
      ++kills;
      relay = &StartRelay(args, env);
    }
    std::string load_error = load.Stop();
    ASSERT_EQ(load_error, "") << "writer failed";
    transactions += load.transactions();
    // Let the last instance publish what it still receives: wait until the
    // unacked count stops moving (lost rows stay unacked for good).
    ASSERT_TRUE(WaitStreaming(*relay, seconds(30))) << relay->LogTail();
    auto deadline = std::chrono::steady_clock::now() + seconds(60);
    int64_t last = -1;
    auto stable_since = std::chrono::steady_clock::now();
    while (std::chrono::steady_clock::now() < deadline) {
      unacked = UnackedRows();
      if (unacked != last) {
        last = unacked;
        stable_since = std::chrono::steady_clock::now();
      } else if (unacked == 0 || SecondsSince(stable_since) >= 3) {
        break;
      }
      std::this_thread::sleep_for(milliseconds(200));
    }
    delivery = CheckDelivery(ledger.committed(), ledger.rolled_back(),
                             ReadTopics({.timeout = seconds(90)}));
    fmt::print("confirm-newest round {}: {} kills so far; {}; {} rows unacked in the table\n",
               rounds, kills, delivery.Summary(), unacked);
    if (delivery.lost > 0) break;
  }
  relay->Terminate();
  EXPECT_TRUE(relay->Wait(seconds(40)).has_value()) << relay->LogTail();
  fmt::print(
      "harness vs confirm-newest: {} kill -9 in {} rounds ({:.1f} s), {} transactions; lost {}, "
      "phantom {}, duplicates {}, order violations {}; {} rows never marked\n",
      kills, rounds, SecondsSince(started), transactions, delivery.lost, delivery.phantom,
      delivery.duplicates, delivery.order_violations, unacked);
  EXPECT_GT(delivery.lost, 0u)
      << "the harness did not see the loss a relay that confirms the newest transaction causes";
  // A lost row was never delivered, so it was never marked either.
  EXPECT_GE(static_cast<size_t>(unacked), delivery.lost);
  EXPECT_EQ(delivery.phantom, 0u) << delivery.Samples();
  fmt::print("total {:.1f} s\n", SecondsSince(started_));
}

}  // namespace
}  // namespace outbox_test
