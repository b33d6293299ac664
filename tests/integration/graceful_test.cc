// SIGTERM under load: the relay finishes the transaction it is in, flushes
// Kafka, marks, confirms and exits 0; the next instance starts where it
// stopped, so a graceful restart sends nothing twice (DESIGN §2.7).
#include <fmt/format.h>

#include <random>
#include <thread>

#include "fixture.h"

namespace outbox_test {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

class Graceful : public RelayTest {};

TEST_F(Graceful, SigtermRestartUnderLoadHasNoDuplicates) {
  constexpr int kRestarts = 3;
  CreateTables();
  RelayProcess* relay = &StartRelay();
  ASSERT_TRUE(WaitStreaming(*relay)) << relay->LogTail();

  Ledger ledger;
  LoadGenerator load(
      Workload(), &ledger, 2,
      [](std::mt19937_64& rng) {
        TxSpec tx;
        tx.rows = 1 + static_cast<int>(rng() % 40);
        tx.rollback = rng() % 10 == 0;
        if (rng() % 10 == 0) tx.savepoint_rolled_back_rows = 1 + static_cast<int>(rng() % 3);
        return tx;
      },
      std::chrono::microseconds(3000));
  load.Start();

  std::mt19937_64 rng(std::random_device{}());
  std::vector<double> stop_seconds;
  for (int i = 0; i < kRestarts; ++i) {
    std::this_thread::sleep_for(milliseconds(1500 + rng() % 1500));
    ASSERT_TRUE(relay->Running()) << "the relay exited by itself:\n" << relay->LogTail();
    auto t0 = std::chrono::steady_clock::now();
    relay->Terminate();
    auto code = relay->Wait(seconds(40));
    stop_seconds.push_back(SecondsSince(t0));
    ASSERT_TRUE(code.has_value()) << "no exit within 40 s of SIGTERM:\n" << relay->LogTail();
    ASSERT_EQ(*code, 0) << relay->LogTail();
    relay = &StartRelay();
    ASSERT_TRUE(WaitStreaming(*relay)) << relay->LogTail();
  }
  std::this_thread::sleep_for(seconds(2));
  std::string load_error = load.Stop();
  ASSERT_EQ(load_error, "") << "writer failed";

  auto catch_up = std::chrono::steady_clock::now();
  EXPECT_EQ(WaitAllAcked(seconds(90)), 0) << "rows still unacked after 90 s\n" << DescribeUnacked();
  double catch_up_s = SecondsSince(catch_up);
  EXPECT_EQ(MisackedRows(), 0);
  CheckCommitIndex(ledger);
  relay->Terminate();
  EXPECT_EQ(relay->Wait(seconds(40)), std::optional<int>(0)) << relay->LogTail();

  std::vector<WrittenRow> committed = ledger.committed();
  std::vector<KafkaRecord> records = ReadTopics({.timeout = seconds(60)});
  DeliveryReport delivery = CheckDelivery(committed, ledger.rolled_back(), records);
  std::string stops;
  for (double s : stop_seconds) stops += fmt::format(" {:.2f}s", s);
  fmt::print(
      "graceful: {} SIGTERM restarts under load (time to exit:{}), {} transactions, "
      "catch-up {:.1f} s\n",
      kRestarts, stops, load.transactions(), catch_up_s);
  fmt::print("{}\n", delivery.Summary());
  EXPECT_EQ(delivery.lost, 0u) << delivery.Samples();
  EXPECT_EQ(delivery.phantom, 0u) << delivery.Samples();
  EXPECT_EQ(delivery.duplicates, 0u) << "a graceful stop must not cause re-sends\n"
                                     << delivery.Samples();
  EXPECT_EQ(delivery.order_violations, 0u) << delivery.Samples();
  EXPECT_EQ(delivery.split_aggregates, 0u) << delivery.Samples();
  fmt::print("total {:.1f} s\n", SecondsSince(started_));
}

}  // namespace
}  // namespace outbox_test
