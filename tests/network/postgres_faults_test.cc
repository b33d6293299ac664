// The relay behind a fault proxy on the PostgreSQL side: the replication
// connection and the SQL connections (marker, setup, sampler) each go
// through a Toxiproxy proxy of their own on 127.0.0.1, and the scenarios
// black-hole, reset and slice them under load. Every scenario prints its
// figures (network_support.h) and holds the relay to the same rules as the
// crash tests: nothing lost, no phantoms, per-aggregate order kept. A slow
// or narrow stream (latency, a bandwidth cap) must not be taken for a dead one.
//
// The durations are short (seconds) and so are the relay's timeouts, set by
// its flags; the server's wal_sender_timeout is lowered for the replication
// connection only (a per-connection setting), since the detection bound
// follows it (Liveness::ForServer: 20/2 + 5 = 15 s). It stays above that
// bound: a walsender that gives up first closes its socket, and the proxy
// passes the close on (a real black hole would not), so the relay would hear
// of it instead of finding the silence itself.
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <memory>
#include <random>
#include <regex>
#include <thread>

#include "fixture.h"
#include "network_support.h"
#include "support/throwaway_pg.h"
#include "support/toxiproxy.h"

namespace outbox_test {
namespace {

using network::Figures;
using network::SysClock;
using std::chrono::milliseconds;
using std::chrono::seconds;

// The relay's timeouts in these tests (the defaults fit a cloud network and
// are minutes apart from these).
constexpr int kReceiveTimeoutMs = 8000;
constexpr int kStatementTimeoutMs = 3000;
constexpr int kWalSenderTimeoutS = 20;

class NetworkPg : public RelayTest {
 protected:
  void SetUp() override {
    RelayTest::SetUp();
    proxy_ = std::make_unique<Toxiproxy>();
    int base = 28600 + static_cast<int>(::getpid() % 40) * 2;
    std::string upstream = network::HostPort(env_.database_url);
    repl_addr_ = proxy_->CreateProxy("pg_repl", FreeLocalPort(base), upstream);
    sql_addr_ = proxy_->CreateProxy("pg_sql", FreeLocalPort(base + 100), upstream);
  }

  // URL of the replication connection: through its proxy, with a short
  // wal_sender_timeout (the walsender then asks for replies, and gives up on
  // a silent relay, within seconds).
  std::string ReplicationUrl() const {
    std::string url = network::WithHosts(env_.database_url, repl_addr_);
    return url + (url.find('?') == std::string::npos ? "?" : "&") +
           fmt::format("options=-c%20wal_sender_timeout%3D{}s", kWalSenderTimeoutS);
  }
  std::string SqlUrl() const { return network::WithHosts(env_.database_url, sql_addr_); }

  RelayProcess& StartProxiedRelay(const std::vector<std::string>& extra = {}) {
    std::vector<std::string> args = {
        "--replication-database-url", ReplicationUrl(),
        "--status-interval-ms",       "500",
        "--pg-receive-timeout-ms",    std::to_string(kReceiveTimeoutMs),
        "--pg-statement-timeout-ms",  std::to_string(kStatementTimeoutMs),
        "--pg-connect-timeout-s",     "2",
        "--pg-tcp-user-timeout-ms",   "4000",
        "--pg-keepalives-idle-s",     "2",
        "--pg-keepalives-interval-s", "1",
        "--pg-keepalives-count",      "2"};
    args.insert(args.end(), extra.begin(), extra.end());
    return StartRelay(args, {{"DATABASE_URL", SqlUrl()}});
  }

  // After the fault: the load stops, the relay catches up and stops cleanly,
  // and the topics are checked against the ledger.
  void Finish(RelayProcess& relay, LoadGenerator& load, const Ledger& ledger, Figures* f) {
    std::string load_error = load.Stop();
    ASSERT_EQ(load_error, "") << "writer failed";
    uint64_t wal_after_load = CurrentWalLsn(*db_);
    EXPECT_EQ(WaitAllAcked(seconds(90)), 0) << "rows still unacked\n" << DescribeUnacked();
    EXPECT_EQ(MisackedRows(), 0);
    EXPECT_GE(WaitConfirmedAtLeast(wal_after_load, seconds(30)), wal_after_load);
    ASSERT_TRUE(relay.Running()) << "the relay exited by itself:\n" << relay.LogTail();
    relay.Terminate();
    EXPECT_EQ(relay.Wait(seconds(40)), std::optional<int>(0)) << relay.LogTail();
    std::vector<KafkaRecord> records = ReadTopics({.timeout = seconds(60)});
    f->delivery = CheckDelivery(ledger.committed(), ledger.rolled_back(), records);
    f->notes += fmt::format(
        "{}{} transactions, {} reconnects logged", f->notes.empty() ? "" : "; ",
        load.transactions(),
        network::CountLogAfter(relay.Log(), "streaming from slot", SysClock::time_point{}) - 1);
    network::PrintFigures(*f);
    network::ExpectClean(*f);
  }

  // The receive bound the relay logged when it started streaming, plus the
  // loop's look interval (it waits up to 100 ms for data between looks) and
  // scheduling slack: silence is judged from the last byte, which came
  // before the fault.
  static std::optional<double> LoggedReceiveBound(const std::string& log) {
    std::smatch m;
    static const std::regex re("silent after ([0-9]+) ms");
    if (!std::regex_search(log, m, re)) return std::nullopt;
    return std::stod(m[1].str()) / 1000 + 0.5;
  }

  // Watches the slot for `duration` (under load): the longest time its
  // confirmed position stood still.
  double LongestConfirmationPause(std::chrono::seconds duration) {
    auto end = std::chrono::steady_clock::now() + duration;
    uint64_t last = 0;
    auto last_move = std::chrono::steady_clock::now();
    double longest = 0;
    while (std::chrono::steady_clock::now() < end) {
      auto slot = QuerySlot(*db_, name_);
      auto now = std::chrono::steady_clock::now();
      if (slot && slot->confirmed_flush_lsn && *slot->confirmed_flush_lsn != last) {
        last = *slot->confirmed_flush_lsn;
        last_move = now;
      }
      longest = std::max(longest, std::chrono::duration<double>(now - last_move).count());
      std::this_thread::sleep_for(milliseconds(250));
    }
    return longest;
  }

  // Seconds from `since` until the slot confirms the WAL written up to now.
  std::optional<double> RecoveryAfter(milliseconds timeout) {
    uint64_t target = CurrentWalLsn(*db_);
    return network::SecondsUntilConfirmed(*db_, name_, target, timeout);
  }

  std::unique_ptr<Toxiproxy> proxy_;
  std::string repl_addr_;
  std::string sql_addr_;
};

// (a) The replication connection black-holed (no reset, nothing closed) under
// load for longer than the bound, then restored: the relay finds it dead
// within the bound, reconnects once the path is back, and resends from the
// confirmed position.
TEST_F(NetworkPg, ReplicationBlackHoledThenRestored) {
  CreateTables();
  RelayProcess& relay = StartProxiedRelay();
  Ledger ledger;
  auto load = network::LoadOnceStreaming(relay, Workload(), &ledger, seconds(3));
  ASSERT_TRUE(load);

  Figures f;
  f.scenario = "pg replication black-holed 22 s";
  f.bound_s = LoggedReceiveBound(relay.Log());
  ASSERT_TRUE(f.bound_s.has_value()) << relay.LogTail();
  auto fault = SysClock::now();
  proxy_->BlackHole("pg_repl");
  std::this_thread::sleep_for(seconds(22));
  f.detect_s = network::FirstLogAfter(relay.Log(), "replication connection silent", fault);
  EXPECT_TRUE(f.detect_s.has_value()) << "not detected within 22 s\n" << relay.LogTail();
  auto healed = SysClock::now();
  proxy_->Heal("pg_repl");
  f.recover_s = RecoveryAfter(seconds(60));
  f.recover_what = "heal -> slot confirms the WAL of the heal";
  if (auto again = network::FirstLogAfter(relay.Log(), "streaming from slot", healed)) {
    f.notes = fmt::format("streaming again {:.1f} s after the heal", *again);
  }
  EXPECT_TRUE(f.recover_s.has_value()) << relay.LogTail();
  std::this_thread::sleep_for(seconds(2));
  Finish(relay, *load, ledger, &f);
}

// (b) The SQL connections black-holed (the marker's among them) while rows
// stream: marking stops, so confirmation stops; the marker's statement gets
// no answer, the connection is replaced once the path is back, and marking
// catches up. Nothing is lost.
TEST_F(NetworkPg, MarkerBlackHoledThenRestored) {
  CreateTables();
  RelayProcess& relay = StartProxiedRelay();
  Ledger ledger;
  auto load = network::LoadOnceStreaming(relay, Workload(), &ledger, seconds(3));
  ASSERT_TRUE(load);

  Figures f;
  f.scenario = "pg marker (SQL) black-holed 12 s";
  // A statement sent into the hole is given up after the statement timeout
  // plus the client's grace; the marker sends one within a second under load.
  f.bound_s = (kStatementTimeoutMs + 5000 + 1000) / 1000.0;
  auto fault = SysClock::now();
  proxy_->BlackHole("pg_sql");
  std::this_thread::sleep_for(seconds(2));
  auto held = QuerySlot(*db_, name_);
  std::this_thread::sleep_for(seconds(10));
  auto held_later = QuerySlot(*db_, name_);
  f.detect_s = network::FirstLogAfter(relay.Log(), "no answer from PostgreSQL within", fault);
  EXPECT_TRUE(f.detect_s.has_value()) << "not detected within 12 s\n" << relay.LogTail();
  ASSERT_TRUE(held && held_later && held->confirmed_flush_lsn && held_later->confirmed_flush_lsn);
  // Nothing is confirmed that is not marked.
  EXPECT_EQ(*held_later->confirmed_flush_lsn, *held->confirmed_flush_lsn)
      << "confirmation moved while the marker could not mark";
  proxy_->Heal("pg_sql");
  f.recover_s = RecoveryAfter(seconds(60));
  f.recover_what = "heal -> slot confirms the WAL of the heal";
  f.notes = "confirmation held during the hole";
  EXPECT_TRUE(f.recover_s.has_value()) << relay.LogTail();
  std::this_thread::sleep_for(seconds(2));
  Finish(relay, *load, ledger, &f);
}

// (c) The replication stream cut into 1-byte TCP writes (slicer) for a while,
// then reset (RST) 300 ms into every connection, for a few seconds: resets
// land in the middle of CopyData messages. The relay reconnects each time and
// nothing reaches Kafka twice out of order or not at all.
TEST_F(NetworkPg, SlicedThenResetMidStream) {
  CreateTables();
  RelayProcess& relay = StartProxiedRelay();
  Ledger ledger;
  auto load = network::LoadOnceStreaming(relay, Workload(), &ledger, seconds(2));
  ASSERT_TRUE(load);

  Figures f;
  f.scenario = "pg replication sliced (1 B) 8 s, then reset_peer 5 s";
  proxy_->AddToxic("pg_repl", {"slice",
                               "slicer",
                               "downstream",
                               1.0,
                               {{"average_size", 1}, {"size_variation", 0}, {"delay", 0}}});
  std::this_thread::sleep_for(seconds(8));
  proxy_->RemoveToxic("pg_repl", "slice");
  auto reset = SysClock::now();
  proxy_->AddToxic("pg_repl", {"reset", "reset_peer", "downstream", 1.0, {{"timeout", 300}}});
  std::this_thread::sleep_for(seconds(5));
  proxy_->RemoveToxic("pg_repl", "reset");
  // A reset is heard at once: the connection breaks, no bound to wait for.
  f.detect_s = network::FirstLogAfter(relay.Log(), " replication: ", reset);
  EXPECT_TRUE(f.detect_s.has_value()) << "no broken stream logged\n" << relay.LogTail();
  f.recover_s = RecoveryAfter(seconds(60));
  f.recover_what = "toxic removed -> slot confirms the WAL of that moment";
  EXPECT_TRUE(f.recover_s.has_value()) << relay.LogTail();
  std::this_thread::sleep_for(seconds(2));
  Finish(relay, *load, ledger, &f);
}

// (d) A slow stream, not a dead one: 200 ms ± 50 ms latency on everything the
// walsender sends for 20 s, then its bandwidth capped to 100 KB/s for 20 s
// (below what the load writes: the relay falls behind and catches up after).
// Data and keepalive replies still flow, so the relay must not take the
// connection for dead; confirmation keeps moving; nothing is sent twice.
TEST_F(NetworkPg, ReplicationSlowThenNarrowNeverTakenForDead) {
  CreateTables();
  RelayProcess& relay = StartProxiedRelay();
  Ledger ledger;
  auto load = network::LoadOnceStreaming(relay, Workload(), &ledger, seconds(2));
  ASSERT_TRUE(load);

  Figures f;
  f.scenario = "pg replication 200 +- 50 ms latency 20 s, then 100 KB/s 20 s";
  auto fault = SysClock::now();
  proxy_->AddToxic("pg_repl", {.name = "slow",
                               .type = "latency",
                               .stream = "downstream",
                               .attributes = {{"latency", 200}, {"jitter", 50}}});
  double paused_slow = LongestConfirmationPause(seconds(20));
  proxy_->RemoveToxic("pg_repl", "slow");
  proxy_->AddToxic("pg_repl",
                   {.name = "narrow", .type = "bandwidth", .attributes = {{"rate", 100}}});
  double paused_narrow = LongestConfirmationPause(seconds(20));
  proxy_->RemoveToxic("pg_repl", "narrow");
  f.recover_s = RecoveryAfter(seconds(90));
  f.recover_what = "toxics removed -> slot confirms the WAL of that moment";
  EXPECT_TRUE(f.recover_s.has_value()) << relay.LogTail();
  size_t silences = network::CountLogAfter(relay.Log(), "replication connection silent", fault);
  size_t reconnects = network::CountLogAfter(relay.Log(), "streaming from slot", fault);
  f.notes = fmt::format(
      "confirmation stood still at most {:.1f} s under latency, {:.1f} s under the cap; {} "
      "silences detected, {} reconnects",
      paused_slow, paused_narrow, silences, reconnects);
  EXPECT_EQ(silences, 0u) << "a slow connection was taken for dead\n" << relay.LogTail();
  EXPECT_EQ(reconnects, 0u) << relay.LogTail();
  // The receive bound is 8 s (StartProxiedRelay): confirmation pausing that
  // long would be a stall, not a slow stream.
  EXPECT_LT(paused_slow, kReceiveTimeoutMs / 1000.0) << relay.LogTail();
  EXPECT_LT(paused_narrow, kReceiveTimeoutMs / 1000.0) << relay.LogTail();
  std::this_thread::sleep_for(seconds(1));
  Finish(relay, *load, ledger, &f);
  EXPECT_EQ(f.delivery.duplicates, 0u) << "nothing was sent twice without a break\n"
                                       << f.delivery.Samples();
}

// (e) The address black-holed for good, as after a failover that leaves the
// old address answering nothing: DATABASE_URL and the replication URL name
// two addresses (a multi-host URL, as docs/runbook.md "PostgreSQL failover"
// advises), here two proxies to the same server. The first goes silent under
// load and stays so; the relay finds the silence within its bound, gives up
// connecting there after --pg-connect-timeout-s and goes on at the second.
TEST_F(NetworkPg, AddressBlackHoledForGoodTheRelayMovesToTheNextHost) {
  CreateTables();
  int base = 28680 + static_cast<int>(::getpid() % 40) * 2;
  std::string upstream = network::HostPort(env_.database_url);
  std::string repl_b = proxy_->CreateProxy("pg_repl_b", FreeLocalPort(base), upstream);
  std::string sql_b = proxy_->CreateProxy("pg_sql_b", FreeLocalPort(base + 100), upstream);
  std::string repl_url = network::WithHosts(ReplicationUrl(), repl_addr_ + "," + repl_b);
  std::string sql_url = network::WithHosts(SqlUrl(), sql_addr_ + "," + sql_b);
  RelayProcess& relay = StartRelay(
      {"--replication-database-url", repl_url, "--status-interval-ms", "500",
       "--pg-receive-timeout-ms", std::to_string(kReceiveTimeoutMs), "--pg-statement-timeout-ms",
       std::to_string(kStatementTimeoutMs), "--pg-connect-timeout-s", "2",
       "--pg-tcp-user-timeout-ms", "4000", "--pg-keepalives-idle-s", "2",
       "--pg-keepalives-interval-s", "1", "--pg-keepalives-count", "2"},
      {{"DATABASE_URL", sql_url}});
  Ledger ledger;
  auto load = network::LoadOnceStreaming(relay, Workload(), &ledger, seconds(3));
  ASSERT_TRUE(load);

  Figures f;
  f.scenario = "pg first address black-holed for good (multi-host URL)";
  f.bound_s = LoggedReceiveBound(relay.Log());
  ASSERT_TRUE(f.bound_s.has_value()) << relay.LogTail();
  auto fault = SysClock::now();
  auto fault_steady = std::chrono::steady_clock::now();
  proxy_->BlackHole("pg_repl");
  proxy_->BlackHole("pg_sql");
  // Recovered: the slot confirms the WAL written 2 s into the hole.
  std::this_thread::sleep_for(seconds(2));
  uint64_t target = CurrentWalLsn(*db_);
  auto confirmed = network::SecondsUntilConfirmed(*db_, name_, target, seconds(90));
  EXPECT_TRUE(confirmed.has_value()) << "the relay did not go on at the second address\n"
                                     << relay.LogTail();
  if (confirmed) {
    f.recover_s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - fault_steady).count();
  }
  f.recover_what = "fault -> slot confirms the WAL written 2 s into it";
  f.detect_s = network::FirstLogAfter(relay.Log(), "replication connection silent", fault);
  EXPECT_TRUE(f.detect_s.has_value()) << relay.LogTail();
  std::optional<double> again = network::FirstLogAfter(relay.Log(), "streaming from slot", fault);
  f.notes = fmt::format("streaming again {} after the fault, the first address still silent",
                        network::Seconds(again));
  // Still through the second address: the first never came back.
  std::this_thread::sleep_for(seconds(2));
  Finish(relay, *load, ledger, &f);
}

// (f) SIGTERM while the SQL connections (the marker's) are silent: the
// marker's statement would wait for its deadline (statement timeout + 5 s =
// 8 s here); the shutdown timeout (3 s) bounds the stop instead. Nothing
// unmarked is confirmed, and a relay started after the heal publishes the
// rest.
TEST_F(NetworkPg, SigtermWhileTheMarkerIsSilentStopsWithinTheShutdownTimeout) {
  CreateTables();
  constexpr int kShutdownTimeoutMs = 3000;
  RelayProcess& relay =
      StartProxiedRelay({"--shutdown-timeout-ms", std::to_string(kShutdownTimeoutMs)});
  Ledger ledger;
  auto load = network::LoadOnceStreaming(relay, Workload(), &ledger, seconds(2));
  ASSERT_TRUE(load);

  Figures f;
  f.scenario = "SIGTERM 1 s into a black hole of the SQL connections (shutdown timeout 3 s)";
  proxy_->BlackHole("pg_sql");
  std::this_thread::sleep_for(seconds(1));  // the marker's next statement goes into the hole
  auto term = std::chrono::steady_clock::now();
  relay.Terminate();
  std::optional<int> code = relay.Wait(seconds(30));
  double stop_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - term).count();
  ASSERT_TRUE(code.has_value()) << relay.LogTail();
  f.bound_s = kShutdownTimeoutMs / 1000.0 + 1.5;
  f.detect_s = stop_s;  // here: SIGTERM -> exit
  f.notes = fmt::format("exit code {} after {:.1f} s", *code, stop_s);
  EXPECT_LE(stop_s, *f.bound_s) << "the stop waited for the marker's statement deadline\n"
                                << relay.LogTail();
  proxy_->Heal("pg_sql");
  RelayProcess& after = StartProxiedRelay();
  ASSERT_TRUE(WaitStreaming(after)) << after.LogTail();
  f.recover_s = RecoveryAfter(seconds(60));
  f.recover_what = "restart after the heal -> slot confirms the WAL of that moment";
  Finish(after, *load, ledger, &f);
}

}  // namespace
}  // namespace outbox_test
