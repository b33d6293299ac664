// Hot standby (DESIGN §7, docs/architecture.md "Hot standby"): the slot is the
// lock. A second relay on the same slot gets SQLSTATE 55006, says it is
// standby, reports not ready on /readyz and retries; when the active one is
// killed (-9) under load it takes over within seconds. Three takeovers in a
// row: nothing lost, no phantoms, per-aggregate order kept, and the slot's
// confirmed_flush_lsn never moves backwards (a standby that read the slot
// long ago must not move it back when it takes over).
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <random>
#include <thread>

#include "fixture.h"
#include "support/confirmed_sampler.h"
#include "support/http_get.h"
#include "support/throwaway_pg.h"

namespace outbox_test {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

class ResilienceStandby : public RelayTest {};

std::string Addr(int port) { return fmt::format("127.0.0.1:{}", port); }

// Polls `path` on `port` until `pred(response)` holds; returns the last response.
template <typename Pred>
HttpResponse PollHttp(int port, const std::string& path, Pred pred, milliseconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (true) {
    HttpResponse r = HttpGet(port, path);
    if (pred(r) || std::chrono::steady_clock::now() >= deadline) return r;
    std::this_thread::sleep_for(milliseconds(100));
  }
}

TEST_F(ResilienceStandby, KillNineActiveStandbyTakesOver) {
  constexpr int kTakeovers = 3;
  CreateTables();
  int port = FreeLocalPort(17000 + static_cast<int>(getpid() % 1000) * 4);
  RelayProcess* active = &StartRelay({"--metrics-addr", Addr(port)});
  int active_port = port;
  ASSERT_TRUE(WaitStreaming(*active)) << active->LogTail();
  ConfirmedSampler sampler(env_.database_url, name_);

  Ledger ledger;
  LoadGenerator load(
      Workload(), &ledger, 2,
      [](std::mt19937_64& rng) {
        TxSpec tx;
        tx.rows = 1 + static_cast<int>(rng() % 20);
        tx.rollback = rng() % 10 == 0;
        if (rng() % 10 == 0) tx.savepoint_rolled_back_rows = 1 + static_cast<int>(rng() % 3);
        return tx;
      },
      std::chrono::microseconds(3000));
  load.Start();

  std::mt19937_64 rng(TestSeed());
  std::vector<double> takeovers;
  double max_takeover = 0;
  int standby_retries_seen = 0;
  for (int round = 0; round < kTakeovers; ++round) {
    int standby_port = FreeLocalPort(active_port + 1);
    RelayProcess* standby = &StartRelay({"--metrics-addr", Addr(standby_port)});
    ASSERT_TRUE(standby->WaitForLog("standby:", seconds(30)))
        << "the second instance did not say it is standby\n"
        << standby->LogTail();
    EXPECT_EQ(standby->Log().find("streaming from slot"), std::string::npos);
    // It keeps retrying (every 2 s) while the slot is held: the reconnect
    // counter grows and the standby gauge is 1.
    HttpResponse metrics = PollHttp(
        standby_port, "/metrics",
        [](const HttpResponse& r) {
          return MetricValue(r.body, "outbox_relay_reconnects_total").value_or(0) >= 2;
        },
        seconds(20));
    ASSERT_EQ(metrics.status, 200) << "no /metrics on " << Addr(standby_port);
    double retries = MetricValue(metrics.body, "outbox_relay_reconnects_total").value_or(0);
    EXPECT_GE(retries, 2) << "the standby did not retry";
    EXPECT_EQ(MetricValue(metrics.body, "outbox_relay_standby"), std::optional<double>(1));
    standby_retries_seen += static_cast<int>(retries);
    HttpResponse standby_ready = HttpGet(standby_port, "/readyz");
    EXPECT_EQ(standby_ready.status, 503) << standby_ready.body;
    EXPECT_NE(standby_ready.body.find("standby"), std::string::npos) << standby_ready.body;
    HttpResponse active_ready = PollHttp(
        active_port, "/readyz", [](const HttpResponse& r) { return r.status == 200; }, seconds(10));
    EXPECT_EQ(active_ready.status, 200) << active_ready.body;
    ASSERT_TRUE(active->Running()) << active->LogTail();

    std::this_thread::sleep_for(milliseconds(300 + rng() % 700));  // under load
    sampler.SampleNow();
    active->Kill(SIGKILL);
    auto killed = std::chrono::steady_clock::now();
    ASSERT_EQ(active->Wait(seconds(10)), std::optional<int>(128 + SIGKILL));
    bool took_over = WaitStreaming(*standby, seconds(30));
    double takeover_s = SecondsSince(killed);
    sampler.SampleNow();
    ASSERT_TRUE(took_over) << "the standby did not take over within 30 s\n" << standby->LogTail();
    EXPECT_NE(standby->Log().find("is free: taking over"), std::string::npos) << standby->LogTail();
    takeovers.push_back(takeover_s);
    max_takeover = std::max(max_takeover, takeover_s);
    EXPECT_LT(takeover_s, 15.0) << "takeover " << round;
    HttpResponse now_ready = PollHttp(
        standby_port, "/readyz", [](const HttpResponse& r) { return r.status == 200; },
        seconds(15));
    EXPECT_EQ(now_ready.status, 200) << "the new active instance is not ready: " << now_ready.body;
    active = standby;
    active_port = standby_port;
  }
  std::this_thread::sleep_for(milliseconds(500));
  std::string load_error = load.Stop();
  ASSERT_EQ(load_error, "") << "writer failed";
  uint64_t wal_after_load = CurrentWalLsn(*db_);

  EXPECT_EQ(WaitAllAcked(seconds(90)), 0) << "rows still unacked after 90 s\n" << DescribeUnacked();
  EXPECT_EQ(MisackedRows(), 0);
  CheckCommitIndex(ledger);
  EXPECT_GE(WaitConfirmedAtLeast(wal_after_load, seconds(10)), wal_after_load);
  active->Terminate();
  EXPECT_EQ(active->Wait(seconds(40)), std::optional<int>(0)) << active->LogTail();
  sampler.SampleNow();
  sampler.Stop();

  std::vector<WrittenRow> committed = ledger.committed();
  std::vector<KafkaRecord> records = ReadTopics({.timeout = seconds(90)});
  DeliveryReport delivery = CheckDelivery(committed, ledger.rolled_back(), records);
  std::string times;
  for (double t : takeovers) times += fmt::format("{}{:.2f}", times.empty() ? "" : ", ", t);
  fmt::print(
      "standby: {} kill -9 of the active instance, {} transactions ({} rolled back); takeover "
      "times [{}] s (max {:.2f} s); standby retries seen before the kills: {}\n",
      takeovers.size(), load.transactions(), ledger.aborted_transactions(), times, max_takeover,
      standby_retries_seen);
  fmt::print("slot: {} samples of confirmed_flush_lsn, {} steps backwards{}\n", sampler.samples(),
             sampler.backwards(),
             sampler.backwards() > 0 ? " (first " + sampler.first_backwards() + ")" : "");
  fmt::print("{}\n", delivery.Summary());
  EXPECT_EQ(sampler.backwards(), 0u)
      << "confirmed_flush_lsn went backwards: " << sampler.first_backwards();
  EXPECT_EQ(delivery.lost, 0u) << delivery.Samples();
  EXPECT_EQ(delivery.phantom, 0u) << delivery.Samples();
  EXPECT_EQ(delivery.order_violations, 0u) << delivery.Samples();
  EXPECT_EQ(delivery.split_aggregates, 0u) << delivery.Samples();
  fmt::print("total {:.1f} s\n", SecondsSince(started_));
}

}  // namespace
}  // namespace outbox_test
