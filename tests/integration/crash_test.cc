// kill -9 of the relay, again and again (50 times; OUTBOX_IT_CRASH_KILLS sets
// another count, e.g. the shorter loop of the PostgreSQL matrix in
// scripts/test), under concurrent load,
// mixed with SIGSTOP/SIGCONT freezes: nothing lost, no phantoms, per-aggregate
// order kept; duplicates only from what was in flight; the slot's
// confirmed_flush_lsn never moves backwards.
#include <fmt/format.h>

#include <cstdlib>
#include <random>
#include <thread>

#include "fixture.h"
#include "resilience_support.h"
#include "support/confirmed_sampler.h"

namespace outbox_test {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

class Crash : public RelayTest {};

// The warning and error lines of the relays' shared log (every instance
// appends to it), the first `max` of them: a failed delivery check names what
// the relays saw (a producer replaced, a broker refusing a batch), since CI
// keeps only the failure's message.
std::string RelayWarnings(const std::string& log, size_t max) {
  std::string out;
  size_t count = 0, pos = 0;
  while (pos < log.size()) {
    size_t end = log.find('\n', pos);
    if (end == std::string::npos) end = log.size();
    std::string_view line(log.data() + pos, end - pos);
    if (line.find("Z warning ") != std::string_view::npos ||
        line.find("Z error ") != std::string_view::npos) {
      if (count++ < max) out += fmt::format("\n  relay: {}", line.substr(0, 200));
    }
    pos = end + 1;
  }
  return fmt::format("{} warning/error lines in the relays' log{}", count, out);
}

TEST_F(Crash, KillNineUnderLoad) {
  const char* kills_env = std::getenv("OUTBOX_IT_CRASH_KILLS");
  const int kKills = kills_env != nullptr && std::atoi(kills_env) > 0 ? std::atoi(kills_env) : 50;
  CreateTables();
  RelayProcess* relay = &StartRelay();
  ASSERT_TRUE(WaitStreaming(*relay)) << relay->LogTail();
  ConfirmedSampler sampler(env_.database_url, name_);

  Ledger ledger;
  LoadGenerator load(Workload(), &ledger, 2, resilience::MixedTx, std::chrono::microseconds(3000));
  load.Start();

  std::mt19937_64 rng(TestSeed());
  auto kill_phase = std::chrono::steady_clock::now();
  int kills = 0, not_streaming = 0, killed_streaming = 0;
  int pauses = 0, killed_frozen = 0, killed_just_thawed = 0;
  double frozen_s = 0;
  for (int i = 0; i < kKills; ++i) {
    // Most kills hit a relay that streams; every third one lands early, wherever
    // the new instance is (setup, waiting for the slot, starting to stream).
    bool wait_streaming = i % 3 != 2;
    if (wait_streaming && !WaitStreaming(*relay, seconds(30))) ++not_streaming;
    ASSERT_TRUE(relay->Running()) << "the relay exited by itself:\n" << relay->LogTail();
    // 0.15-1 s into streaming; or 20-300 ms after the start (setup, backfill, first reads).
    std::this_thread::sleep_for(wait_streaming ? milliseconds(150 + rng() % 851)
                                               : milliseconds(20 + rng() % 281));
    bool frozen = false;
    if (i % 4 == 3) {
      // Every fourth cycle freezes the relay for 1-3 s under load (a stalled
      // node, a debugger, a VM pause) and then: kills it frozen, or thaws it and
      // kills it 0-300 ms later, or thaws it and lets it stream again first.
      ++pauses;
      relay->Pause();
      auto pause_ms = milliseconds(1000 + rng() % 2001);
      std::this_thread::sleep_for(pause_ms);
      frozen_s += static_cast<double>(pause_ms.count()) / 1000;
      switch ((i / 4) % 3) {
        case 0:
          frozen = true;
          ++killed_frozen;
          break;
        case 1:
          relay->Resume();
          ++killed_just_thawed;
          std::this_thread::sleep_for(milliseconds(rng() % 301));
          break;
        default:
          relay->Resume();
          std::this_thread::sleep_for(milliseconds(500 + rng() % 1001));
          break;
      }
    }
    if (relay->Log().find("streaming from slot") != std::string::npos) ++killed_streaming;
    sampler.SampleNow();
    relay->Kill(SIGKILL);
    ASSERT_EQ(relay->Wait(seconds(10)), std::optional<int>(128 + SIGKILL))
        << (frozen ? "(killed while frozen)" : "");
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
  fmt::print(
      "freezes: {} SIGSTOP/SIGCONT pauses ({:.1f} s frozen in all): {} killed while frozen, {} "
      "killed 0-300 ms after SIGCONT, {} streamed again before the kill\n",
      pauses, frozen_s, killed_frozen, killed_just_thawed,
      pauses - killed_frozen - killed_just_thawed);
  fmt::print("slot: {} samples of confirmed_flush_lsn, {} steps backwards{}\n", sampler.samples(),
             sampler.backwards(),
             sampler.backwards() > 0 ? " (first " + sampler.first_backwards() + ")" : "");
  fmt::print("{}\n", delivery.Summary());
  EXPECT_EQ(kills, kKills);
  EXPECT_EQ(sampler.backwards(), 0u)
      << "confirmed_flush_lsn went backwards: " << sampler.first_backwards();
  const std::string warnings = RelayWarnings(relay->Log(), 6);
  fmt::print("{}\n", warnings);
  // The first sample, what the relays warned of, then the other samples.
  std::string explained = delivery.samples.empty() ? "" : delivery.samples.front();
  explained += "\n" + warnings + "\n" + delivery.Samples();
  EXPECT_EQ(delivery.lost, 0u) << explained;
  EXPECT_EQ(delivery.phantom, 0u) << delivery.Samples();
  EXPECT_EQ(delivery.order_violations, 0u) << explained;
  EXPECT_EQ(delivery.split_aggregates, 0u) << delivery.Samples();
  ContractReport contract = CheckContract(committed, records, PartitionCounts(records));
  fmt::print("{}\n", contract.Summary());
  EXPECT_EQ(contract.mismatches, 0u) << contract.Samples();
  EXPECT_EQ(contract.wrong_partition, 0u) << contract.Samples();
  fmt::print("total {:.1f} s\n", SecondsSince(started_));
}

}  // namespace
}  // namespace outbox_test
