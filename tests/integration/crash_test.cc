// kill -9 of the relay, again and again, under concurrent load: nothing lost,
// no phantoms, per-aggregate order kept; duplicates only from what was in
// flight; the slot's confirmed_flush_lsn never moves backwards.
#include <fmt/format.h>

#include <atomic>
#include <mutex>
#include <random>
#include <thread>

#include "fixture.h"

namespace outbox_test {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

class Crash : public RelayTest {};

// Samples the slot's confirmed_flush_lsn on its own connection and counts
// every step backwards.
class ConfirmedSampler {
 public:
  ConfirmedSampler(const std::string& url, std::string slot) : slot_(std::move(slot)), pg_(url) {
    thread_ = std::thread([this] { Loop(); });
  }
  ~ConfirmedSampler() { Stop(); }
  void Stop() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
  }
  // Takes one sample now (from the caller's thread, e.g. right after a kill).
  void SampleNow() {
    std::lock_guard lock(mu_);
    Sample();
  }
  size_t samples() const { return samples_; }
  size_t backwards() const { return backwards_; }
  std::string first_backwards() const {
    std::lock_guard lock(mu_);
    return first_backwards_;
  }
  uint64_t last() const { return last_; }

 private:
  void Loop() {
    while (!stop_) {
      {
        std::lock_guard lock(mu_);
        Sample();
      }
      std::this_thread::sleep_for(milliseconds(50));
    }
  }
  void Sample() {
    try {
      auto s = QuerySlot(pg_, slot_);
      if (!s || !s->confirmed_flush_lsn) return;
      ++samples_;
      uint64_t v = *s->confirmed_flush_lsn;
      if (v < last_) {
        ++backwards_;
        if (first_backwards_.empty()) {
          first_backwards_ = fmt::format("{} -> {}", FormatLsn(last_), FormatLsn(v));
        }
      }
      if (v > last_) last_ = v;
    } catch (const std::exception& e) {
      std::fprintf(stderr, "[sampler] %s\n", e.what());
    }
  }

  std::string slot_;
  Pg pg_;
  mutable std::mutex mu_;
  std::atomic<bool> stop_{false};
  std::atomic<size_t> samples_{0};
  std::atomic<size_t> backwards_{0};
  std::atomic<uint64_t> last_{0};
  std::string first_backwards_;
  std::thread thread_;
};

TEST_F(Crash, KillNineUnderLoad) {
  constexpr int kKills = 24;
  CreateTables();
  RelayProcess* relay = &StartRelay();
  ASSERT_TRUE(WaitStreaming(*relay)) << relay->LogTail();
  ConfirmedSampler sampler(env_.database_url, name_);

  Ledger ledger;
  LoadGenerator load(
      Workload(), &ledger, 2,
      [](std::mt19937_64& rng) {
        TxSpec tx;
        tx.rows = 1 + static_cast<int>(rng() % 50);
        tx.rollback = rng() % 10 == 0;
        if (rng() % 10 == 0) tx.savepoint_rolled_back_rows = 1 + static_cast<int>(rng() % 3);
        if (rng() % 10 == 0) tx.other_table_rows = 5;
        return tx;
      },
      std::chrono::microseconds(3000));
  load.Start();

  std::mt19937_64 rng(std::random_device{}());
  auto kill_phase = std::chrono::steady_clock::now();
  int kills = 0, not_streaming = 0, killed_streaming = 0;
  for (int i = 0; i < kKills; ++i) {
    // Most kills hit a relay that streams; every third one lands early, wherever
    // the new instance is (setup, waiting for the slot, starting to stream).
    bool wait_streaming = i % 3 != 2;
    if (wait_streaming && !WaitStreaming(*relay, seconds(30))) ++not_streaming;
    ASSERT_TRUE(relay->Running()) << "the relay exited by itself:\n" << relay->LogTail();
    // 0.2-1.5 s into streaming; or 20-300 ms after the start (setup, backfill, first reads).
    std::this_thread::sleep_for(wait_streaming ? milliseconds(200 + rng() % 1301)
                                               : milliseconds(20 + rng() % 281));
    if (relay->Log().find("streaming from slot") != std::string::npos) ++killed_streaming;
    sampler.SampleNow();
    relay->Kill(SIGKILL);
    ASSERT_EQ(relay->Wait(seconds(10)), std::optional<int>(128 + SIGKILL));
    ++kills;
    sampler.SampleNow();
    relay = &StartRelay();
  }
  double kill_phase_s = SecondsSince(kill_phase);
  std::string load_error = load.Stop();
  ASSERT_EQ(load_error, "") << "writer failed";
  uint64_t wal_after_load = CurrentWalLsn(*db_);

  // The last instance catches up, then stops cleanly.
  ASSERT_TRUE(WaitStreaming(*relay)) << relay->LogTail();
  auto catch_up = std::chrono::steady_clock::now();
  EXPECT_EQ(WaitAllAcked(seconds(120)), 0) << "rows still unacked after 120 s\n"
                                           << DescribeUnacked();
  double catch_up_s = SecondsSince(catch_up);
  EXPECT_EQ(MisackedRows(), 0);
  CheckCommitIndex(ledger);
  uint64_t confirmed = WaitConfirmedAtLeast(wal_after_load, seconds(10));
  EXPECT_GE(confirmed, wal_after_load);
  relay->Terminate();
  EXPECT_EQ(relay->Wait(seconds(40)), std::optional<int>(0)) << relay->LogTail();
  sampler.SampleNow();
  sampler.Stop();

  std::vector<WrittenRow> committed = ledger.committed();
  std::vector<KafkaRecord> records = ReadTopics({.timeout = seconds(90)});
  DeliveryReport delivery = CheckDelivery(committed, ledger.rolled_back(), records);
  fmt::print(
      "crash: {} kills ({} of a streaming relay; kill phase {:.1f} s; {} instances not "
      "streaming within 30 s), {} transactions ({} rolled back), catch-up {:.1f} s\n",
      kills, killed_streaming, kill_phase_s, not_streaming, load.transactions(),
      ledger.aborted_transactions(), catch_up_s);
  fmt::print("slot: {} samples of confirmed_flush_lsn, {} steps backwards{}\n", sampler.samples(),
             sampler.backwards(),
             sampler.backwards() > 0 ? " (first " + sampler.first_backwards() + ")" : "");
  fmt::print("{}\n", delivery.Summary());
  EXPECT_EQ(kills, kKills);
  EXPECT_EQ(sampler.backwards(), 0u)
      << "confirmed_flush_lsn went backwards: " << sampler.first_backwards();
  EXPECT_EQ(delivery.lost, 0u) << delivery.Samples();
  EXPECT_EQ(delivery.phantom, 0u) << delivery.Samples();
  EXPECT_EQ(delivery.order_violations, 0u) << delivery.Samples();
  EXPECT_EQ(delivery.split_aggregates, 0u) << delivery.Samples();
  ContractReport contract = CheckContract(committed, records, PartitionCounts(records));
  fmt::print("{}\n", contract.Summary());
  EXPECT_EQ(contract.mismatches, 0u) << contract.Samples();
  EXPECT_EQ(contract.wrong_partition, 0u) << contract.Samples();
  fmt::print("total {:.1f} s\n", SecondsSince(started_));
}

}  // namespace
}  // namespace outbox_test
