// The fault campaign (issue 36, item 5): a seeded random mix of faults under a
// mixed load, in both delivery modes, with delivery checked as sets once
// everything has healed.
//
// The stage, all on 127.0.0.1 and all the test's own:
// - PostgreSQL 15 (Debian's, for pg_basebackup): a primary and an
//   ASYNCHRONOUS physical standby made with pg_basebackup, wal_sender_timeout
//   5 s. The relays and the writers are given both servers in one URL with
//   target_session_attrs=read-write (as tests/integration/failover_test.cc).
// - Kafka: a three-node KRaft cluster, topics with replication factor 3,
//   min.insync.replicas=2, no unclean elections.
// - Two relay instances on the same slot (one active, one hot standby), in
//   --delivery=at-least-once (FaultCampaign.AtLeastOnce) or exactly-once
//   (FaultCampaign.ExactlyOnce, read back with isolation.level=read_committed).
// - A foreign relay: another database (the services' PostgreSQL), its own
//   slot, table, topics and (exactly-once) transactional id, the same default
//   progress topic, under a load of its own, on the same Kafka cluster.
// - Writers: MixedTx transactions (1-50 rows, a tenth rolled back, a tenth
//   with a rolled-back savepoint, a tenth also writing another table) on two
//   connections that reconnect after every fault.
//
// The faults, each kind once in a shuffled first pass and then drawn at
// random, 0.5-3 s apart, for OUTBOX_CAMPAIGN_MINUTES (default 1.5):
// - relay kill -9 (restarted at once); SIGSTOP for 0.3-7 s, then SIGCONT
//   (past wal_sender_timeout the standby takes over: a thawed zombie);
//   SIGTERM and restart;
// - hot-standby takeover: the active instance killed -9 or stopped, the
//   standby takes over, the dead one comes back as the new standby;
// - PostgreSQL restart -m immediate;
// - promotion of the asynchronous standby while a relay streams: the
//   primary's walsender to it frozen for 0-3 s (the lag an async standby has
//   under load), the primary killed (-m immediate), the standby promoted; a
//   new standby is made of the new primary with pg_basebackup for the next
//   promotion;
// - a Kafka broker killed -9, restarted 2-12 s later (the next broker kill
//   waits until every partition is back in sync);
// - the foreign relay frozen (SIGSTOP) for 2-20 s, and this relay's active
//   instance killed -9 and restarted 0.2-2 s into the freeze: in exactly-once
//   mode, it reads its progress behind the foreign relay's open Kafka
//   transaction on the shared progress topic.
//
// Truth: the final primary's table. Rows the writers saw committed on an old
// primary that never reached the standby are gone from the database: counted
// as "gone with the failover", neither lost nor phantom (nor are rows whose
// COMMIT got no answer and that the final table does not have). Lost = rows
// in the final table missing from Kafka; phantom = records no committed row
// explains; order violations per aggregate; duplicates of the final table's
// rows (exactly-once: must be 0; at-least-once: reported), and extra copies
// of gone rows (reported only: those rows are outside every guarantee). Every row of the final
// table must end marked (offset_acked), and every relay exits 0 on the final SIGTERM. The foreign
// relay's delivery is checked the same way.
//
// Each mode prints its seed, faults by kind, rows, lost, phantom, gone with
// the failover, order violations, duplicates and the time to heal, and
// appends them to <build>/tests/integration/logs/campaign_figures.tsv.
//
// Replay a run (the same schedule of faults and load mix; the moments the
// relays and servers react at still differ):
//   OUTBOX_CAMPAIGN_SEED=<seed> ctest --test-dir build -R FaultCampaign.ExactlyOnce
// The long run, an hour per mode (the binary itself: ctest stops a test after
// 900 s; it runs both modes, --gtest_filter=FaultCampaign.ExactlyOnce one):
//   eval "$(scripts/services env)"
//   export OUTBOX_CAMPAIGN_MINUTES=60
//   build/tests/integration/campaign_tests
// (one mode measured on 2 cores: 415 faults, 3.6 M rows, 64 min; the test
// program peaks at 2.4 GB; the servers' directories under /tmp grow to about
// 25 GB). The short run takes 2.5-3 minutes a mode.
// Each relay instance logs to
// <build>/tests/integration/logs/FaultCampaign.<mode>.<a|b|foreign>.log.
#include <fmt/chrono.h>
#include <fmt/format.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "fixture.h"
#include "resilience_support.h"
#include "support/throwaway_kafka.h"
#include "support/throwaway_pg.h"

namespace outbox_test {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;
using std::chrono::seconds;
using namespace resilience;

enum class Fault {
  kRelayKill,
  kRelayFreeze,
  kRelayTerm,
  kTakeover,
  kPgRestart,
  kPromotion,
  kBrokerKill,
  kForeignFreeze,
};
constexpr std::array kFaults = {Fault::kRelayKill,  Fault::kRelayFreeze,  Fault::kRelayTerm,
                                Fault::kTakeover,   Fault::kPgRestart,    Fault::kPromotion,
                                Fault::kBrokerKill, Fault::kForeignFreeze};
// After the first pass: how often each kind is drawn (the relay's own faults
// most, a PostgreSQL restart and a broker kill least).
constexpr std::array kWeights = {3, 2, 2, 2, 1, 2, 1, 2};

const char* Name(Fault f) {
  switch (f) {
    case Fault::kRelayKill:
      return "relay kill -9";
    case Fault::kRelayFreeze:
      return "relay SIGSTOP/SIGCONT";
    case Fault::kRelayTerm:
      return "relay SIGTERM + restart";
    case Fault::kTakeover:
      return "hot-standby takeover";
    case Fault::kPgRestart:
      return "PostgreSQL restart -m immediate";
    case Fault::kPromotion:
      return "async standby promotion";
    case Fault::kBrokerKill:
      return "Kafka broker kill -9";
    case Fault::kForeignFreeze:
      return "foreign relay frozen";
  }
  return "?";
}

// Every server takes the same settings (a promoted standby is the next primary).
// wal_sender_timeout 5 s: a frozen relay's walsender lets the slot go in
// seconds, so that the standby instance can take over.
constexpr const char* kPgSettings =
    "-c wal_level=logical -c max_wal_senders=16 -c max_replication_slots=16 -c hot_standby=on "
    "-c wal_keep_size=512MB -c wal_sender_timeout=5s -c checkpoint_timeout=60s "
    "-c max_connections=80";

// Relays stop within this on SIGTERM.
constexpr const char* kShutdownMs = "10000";
// How long the other instance of the pair may take to stream after a
// takeover fault (see the takeover fault for why not less).
constexpr std::chrono::seconds kTakeoverBound{120};

// "1" on, "0" off, unset or anything else: `otherwise`.
bool EnvFlag(const char* name, bool otherwise = false) {
  const char* v = std::getenv(name);
  if (v == nullptr) return otherwise;
  std::string_view s(v);
  return s == "1" ? true : s == "0" ? false : otherwise;
}

uint64_t CampaignSeed() {
  if (const char* s = std::getenv("OUTBOX_CAMPAIGN_SEED"); s != nullptr && *s != '\0') {
    return std::stoull(s);
  }
  return (static_cast<uint64_t>(std::random_device{}()) << 32) ^ std::random_device{}();
}

double CampaignMinutes() {
  if (const char* s = std::getenv("OUTBOX_CAMPAIGN_MINUTES"); s != nullptr && *s != '\0') {
    return std::stod(s);
  }
  return 1.5;
}

// The walsender pid of the last "streaming from slot ... (walsender pid N;"
// line of a relay's log (0: none).
int LastWalsenderPid(const std::string& log) {
  const std::string needle = "(walsender pid ";
  size_t at = log.rfind(needle);
  if (at == std::string::npos) return 0;
  return std::atoi(log.c_str() + at + needle.size());
}

// The error a relay stopped on: the last error line of its log but the
// generic "stopped without confirming" that follows every one.
std::string LastErrorLine(const std::string& log) {
  for (size_t end = log.size(); end > 0;) {
    size_t start = log.rfind('\n', end - 1);
    start = start == std::string::npos ? 0 : start + 1;
    std::string_view line(log.data() + start, end - start);
    if (line.find(" error ") != std::string_view::npos &&
        line.find("stopped without confirming") == std::string_view::npos) {
      return std::string(line);
    }
    end = start == 0 ? 0 : start - 1;
  }
  return "";
}

// When the rows `uuids` of `table` were written, in seconds since `since`
// (the start of the faults), grouped where they lie within 2 s of each other.
// Set beside the faults' timeline, it says which fault a row was lost or
// repeated at (FaultCampaign::Describe).
struct WrittenCluster {
  double from = 0;
  double to = 0;
  size_t rows = 0;
};
std::vector<WrittenCluster> WhenWritten(Pg& db, const std::string& table,
                                        const std::vector<std::string>& uuids,
                                        std::chrono::system_clock::time_point since) {
  std::vector<WrittenCluster> out;
  if (uuids.empty()) return out;
  std::string array = "{";
  for (size_t i = 0; i < uuids.size() && i < 200000; ++i) array += (i > 0 ? "," : "") + uuids[i];
  array += "}";
  const double t0 = std::chrono::duration<double>(since.time_since_epoch()).count();
  std::vector<double> at;
  for (const Row& r : db.Query(fmt::format("SELECT extract(epoch FROM created_at)::float8 FROM {} "
                                           "WHERE uuid = ANY ($1::varchar[]) ORDER BY 1",
                                           QuoteIdent(table)),
                               {array})) {
    if (r[0]) at.push_back(std::stod(*r[0]) - t0);
  }
  for (size_t i = 0; i < at.size();) {
    size_t j = i;
    while (j + 1 < at.size() && at[j + 1] - at[j] <= 2.0) ++j;
    out.push_back({at[i], at[j], j - i + 1});
    i = j + 1;
  }
  return out;
}

class FaultCampaign : public RelayTest {
 protected:
  void TearDown() override {
    // Relays first (the fixture's TearDown drops the objects they hold), then
    // the load, then the foreign relay's objects on the services' database.
    for (auto& r : pair_) {
      if (r && r->Running()) {
        r->Kill(SIGCONT);
        r->Kill(SIGKILL);
        r->Wait(seconds(10));
      }
    }
    if (foreign_ && foreign_->Running()) {
      foreign_->Kill(SIGCONT);
      foreign_->Kill(SIGKILL);
      foreign_->Wait(seconds(10));
    }
    load_.reset();
    foreign_load_.reset();
    if (!foreign_name_.empty() && std::getenv("OUTBOX_IT_KEEP") == nullptr) {
      DropRelayObjects(env_.database_url, foreign_name_, foreign_name_,
                       {foreign_name_, foreign_name_ + "_side"});
    }
    RelayTest::TearDown();
  }

  void Run(bool exactly_once);

  // ---- the stage ----------------------------------------------------------------------------

  std::string BothHosts() const {
    return fmt::format(
        "postgresql://postgres@127.0.0.1:{},127.0.0.1:{}/postgres?target_session_attrs=read-write",
        port_a_, port_b_);
  }

  // A connection to the current primary, opened again after a fault took it.
  Pg& Primary() {
    if (!probe_) probe_.emplace(primary_->url(), "outbox-it-campaign");
    return *probe_;
  }

  // Makes a new standby of the primary with pg_basebackup on `port` and waits
  // until it streams.
  void MakeStandby(int port) {
    standby_ = ThrowawayPostgres::BaseBackupOf(*primary_, port, kPgSettings, "standby");
    standby_->Start();
    auto until = Clock::now() + seconds(90);
    while (true) {
      try {
        Pg p(primary_->url());
        if (p.Int("SELECT count(*) FROM pg_stat_replication WHERE application_name = 'standby' "
                  "AND state = 'streaming'") == 1) {
          return;
        }
      } catch (const std::exception&) {
      }
      if (Clock::now() > until) {
        throw std::runtime_error("the new standby does not stream after 90 s; see " +
                                 standby_->dir() + "/postgres.log");
      }
      Idle(milliseconds(200));
    }
  }

  std::string InstanceLogPath(const std::string& which) const {
    std::string base = TestLogPath();
    return base.substr(0, base.size() - 4) + "." + which + ".log";
  }

  // ---- the relays ---------------------------------------------------------------------------

  // Which instance of the pair streams from the slot now: the one whose last
  // "streaming from slot" line names the slot's walsender pid.
  std::optional<size_t> Active() {
    std::optional<int> pid;
    try {
      auto slot = QuerySlot(Primary(), name_);
      if (slot && slot->active_pid) pid = slot->active_pid;
    } catch (const std::exception&) {
      probe_.reset();
    }
    if (!pid) return std::nullopt;
    for (size_t i = 0; i < pair_.size(); ++i) {
      if (pair_[i]->Running() && LastWalsenderPid(pair_[i]->Log()) == *pid) return i;
    }
    return std::nullopt;
  }
  // The active instance once there is one (up to `timeout`), else a running
  // one: a fault is never skipped because the relays are still recovering.
  size_t Target(milliseconds timeout, bool* was_active = nullptr) {
    auto until = Clock::now() + timeout;
    while (Clock::now() < until) {
      if (auto a = Active()) {
        if (was_active != nullptr) *was_active = true;
        return *a;
      }
      Idle(milliseconds(200));
    }
    if (was_active != nullptr) *was_active = false;
    return pair_[0]->Running() ? 0 : 1;
  }

  // Instances that exited on their own are noted and started again (a thawed
  // exactly-once zombie exits once it finds itself fenced), at every tick of
  // Idle, but for those a fault holds (killed until it restarts them).
  void Supervise() {
    auto check = [&](RelayProcess& r, const std::string& which) {
      if (r.Running()) return;
      std::string log = r.Log();
      bool replaced = log.find("this relay was replaced") != std::string::npos;
      ++self_exits_;
      if (replaced) ++replaced_exits_;
      AddEvent(which + " exited", SecondsSince(phase_start_));
      Note(fmt::format("{} exited by itself ({}{}): restarted", which,
                       r.exit_code() ? fmt::format("code {}", *r.exit_code()) : "?",
                       replaced ? ", replaced: fenced" : "; " + LastErrorLine(log)));
      r.Start();
    };
    for (size_t i = 0; i < pair_.size(); ++i) {
      if (!held_[i]) check(*pair_[i], fmt::format("relay {}", "ab"[i]));
    }
    if (!foreign_frozen_) check(*foreign_, "the foreign relay");
  }
  // Marks instance `i` as the fault's own while it lives.
  class Hold {
   public:
    Hold(FaultCampaign* campaign, size_t i) : campaign_(campaign), i_(i) {
      campaign_->held_[i_] = true;
    }
    ~Hold() { campaign_->held_[i_] = false; }
    Hold(const Hold&) = delete;
    Hold& operator=(const Hold&) = delete;

   private:
    FaultCampaign* campaign_;
    size_t i_;
  };

  // ---- time ---------------------------------------------------------------------------------

  // Waits `d` while the background faults go on: a frozen foreign relay is
  // thawed when its time comes, a killed broker is started again, and a
  // restarted one is followed until its partitions are back in sync.
  void Idle(milliseconds d) {
    auto until = Clock::now() + d;
    while (true) {
      Background();
      auto now = Clock::now();
      if (now >= until) return;
      std::this_thread::sleep_for(std::min<Clock::duration>(until - now, milliseconds(100)));
    }
  }

  void Background() {
    if (pair_[0] && foreign_) Supervise();
    auto now = Clock::now();
    if (foreign_frozen_ && now >= foreign_thaw_at_) {
      foreign_->Resume();
      foreign_frozen_ = false;
      events_[foreign_event_].end = SecondsSince(phase_start_);
      Note("foreign relay thawed");
    }
    if (broker_state_ == BrokerState::kDown && now >= broker_restart_at_) {
      cluster_->node(broker_down_).Launch();
      broker_state_ = BrokerState::kRecovering;
      next_replica_check_ = now + seconds(1);
      Note(fmt::format("broker {} started again", broker_down_ + 1));
    }
    if (broker_state_ == BrokerState::kRecovering && now >= next_replica_check_) {
      next_replica_check_ = now + seconds(1);
      if (!cluster_->node(broker_down_).Running()) {
        ADD_FAILURE() << "broker " << broker_down_ + 1 << " exited after its restart:\n"
                      << cluster_->node(broker_down_).LogTail(30);
        cluster_->node(broker_down_).Launch();
        return;
      }
      int under = -1;
      try {
        under = cluster_->UnderReplicated("");
      } catch (const std::exception&) {
      }
      if (under == 0) {
        broker_state_ = BrokerState::kUp;
        broker_recoveries_.push_back(SecondsSince(broker_killed_at_));
        events_[broker_event_].end = SecondsSince(phase_start_);
        Note(fmt::format("broker {}: every partition in sync again, {:.1f} s after the kill",
                         broker_down_ + 1, broker_recoveries_.back()));
      } else if (now - broker_killed_at_ > seconds(240) && !broker_stuck_reported_) {
        broker_stuck_reported_ = true;
        ADD_FAILURE() << "partitions not back in sync 240 s after broker " << broker_down_ + 1
                      << " was killed\n"
                      << cluster_->node(broker_down_).LogTail(30);
      }
    }
  }

  // A line of the faults' timeline: seconds into the faults, and the UTC
  // time the relays' logs use.
  void Note(const std::string& what) {
    auto now = std::chrono::system_clock::now();
    auto ms = std::chrono::duration_cast<milliseconds>(now.time_since_epoch()).count() % 1000;
    fmt::print("[{:7.1f} s {:%H:%M:%S}.{:03}Z] {}\n", SecondsSince(phase_start_),
               std::chrono::time_point_cast<std::chrono::seconds>(now), ms, what);
    std::fflush(stdout);
  }

  // ---- the faults ---------------------------------------------------------------------------

  bool Available(Fault f) const {
    if (f == Fault::kBrokerKill) return broker_state_ == BrokerState::kUp;
    if (f == Fault::kForeignFreeze) return !foreign_frozen_;
    return true;
  }

  void Apply(Fault f, std::mt19937_64& rng) {
    switch (f) {
      case Fault::kRelayKill: {
        bool active = false;
        size_t i = Target(seconds(20), &active);
        Hold hold(this, i);
        pair_[i]->Kill(SIGKILL);
        pair_[i]->Wait(seconds(10));
        pair_[i]->Start();
        Note(fmt::format("relay {} ({}) kill -9, restarted", "ab"[i],
                         active ? "active" : "no instance active"));
        break;
      }
      case Fault::kRelayFreeze: {
        bool active = false;
        size_t i = Target(seconds(20), &active);
        Hold hold(this, i);
        milliseconds frozen(300 + rng() % 6700);
        pair_[i]->Pause();
        Idle(frozen);
        pair_[i]->Resume();
        Note(fmt::format("relay {} ({}) frozen {} ms", "ab"[i],
                         active ? "active" : "no instance active", frozen.count()));
        break;
      }
      case Fault::kRelayTerm: {
        bool active = false;
        size_t i = Target(seconds(20), &active);
        Hold hold(this, i);
        auto t0 = Clock::now();
        pair_[i]->Terminate();
        std::optional<int> code = pair_[i]->Wait(seconds(40));
        if (code != std::optional<int>(0)) {
          ++term_failures_;
          if (!code) {
            pair_[i]->Kill(SIGKILL);
            pair_[i]->Wait(seconds(10));
          }
        }
        pair_[i]->Start();
        Note(fmt::format("relay {} ({}) SIGTERM: exit {} after {:.1f} s, restarted", "ab"[i],
                         active ? "active" : "no instance active",
                         code ? std::to_string(*code) : "none (killed)", SecondsSince(t0)));
        break;
      }
      case Fault::kTakeover: {
        bool active = false;
        size_t i = Target(seconds(30), &active);
        Hold hold(this, i);
        size_t other = 1 - i;
        bool kill = rng() % 2 == 0;
        auto t0 = Clock::now();
        if (kill) {
          pair_[i]->Kill(SIGKILL);
          pair_[i]->Wait(seconds(10));
        } else {
          pair_[i]->Pause();
        }
        // Taken over: the slot's walsender is the other instance's (it may
        // have restarted meanwhile, e.g. a fenced zombie of an earlier fault).
        // The bound: a killed instance's open Kafka transaction is aborted
        // when the other one initializes, but the progress is read only
        // once its abort marker is replicated; with a broker just back (not
        // yet out of the ISR, replica.lag.time.max.ms 30 s) that took 45 s.
        bool took_over = false;
        while (Clock::now() - t0 < kTakeoverBound) {
          if (Active() == std::optional<size_t>(other)) {
            took_over = true;
            break;
          }
          Idle(milliseconds(100));
        }
        double s = SecondsSince(t0);
        if (kill) {
          pair_[i]->Start();
        } else {
          pair_[i]->Resume();
        }
        if (took_over) takeovers_.push_back(s);
        // Only a takeover from an instance that streamed is owed: without one
        // active (the relays still recovering from the fault before), the
        // slot may be taken by either.
        if (active) {
          EXPECT_TRUE(took_over) << "relay "
                                 << "ab"[other] << " did not take over within "
                                 << kTakeoverBound.count() << " s of "
                                 << (kill ? "the kill" : "the freeze") << " of relay "
                                 << "ab"[i] << "\n"
                                 << pair_[other]->LogTail(30);
        }
        Note(fmt::format(
            "takeover: relay {} ({}) {}; relay {} {}", "ab"[i],
            active ? "active" : "no instance active", kill ? "killed -9" : "frozen", "ab"[other],
            took_over ? fmt::format("took over in {:.1f} s", s)
                      : fmt::format("did not take over within {} s", kTakeoverBound.count())));
        break;
      }
      case Fault::kPgRestart: {
        auto t0 = Clock::now();
        probe_.reset();
        PgCtl(*primary_, "restart -m immediate");
        Note(fmt::format("PostgreSQL primary (port {}) restart -m immediate: {:.1f} s",
                         primary_->port(), SecondsSince(t0)));
        break;
      }
      case Fault::kPromotion:
        Promote(rng);
        break;
      case Fault::kBrokerKill: {
        broker_down_ = rng() % cluster_->size();
        milliseconds down(2000 + rng() % 10000);
        cluster_->node(broker_down_).Stop(/*kill=*/true);
        broker_killed_at_ = Clock::now();
        broker_restart_at_ = broker_killed_at_ + down;
        broker_state_ = BrokerState::kDown;
        broker_stuck_reported_ = false;
        Note(fmt::format("Kafka broker {} kill -9 (down {} ms)", broker_down_ + 1, down.count()));
        break;
      }
      case Fault::kForeignFreeze: {
        // The foreign relay is frozen whatever it was doing (inside a Kafka
        // transaction, most of the time); what that can hide from this
        // relay's progress, it hides when this relay reads it: at a start.
        // So the active instance is restarted (kill -9) during the freeze.
        milliseconds frozen(2000 + rng() % 18000);
        milliseconds restart_after(200 + rng() % 1800);
        foreign_->Pause();
        foreign_frozen_ = true;
        foreign_thaw_at_ = Clock::now() + frozen;
        Idle(restart_after);
        bool active = false;
        size_t i = Target(seconds(10), &active);
        Hold hold(this, i);
        pair_[i]->Kill(SIGKILL);
        pair_[i]->Wait(seconds(10));
        pair_[i]->Start();
        Note(fmt::format(
            "foreign relay frozen for {} ms; {} ms into it relay {} ({}) kill -9, restarted",
            frozen.count(), restart_after.count(), "ab"[i],
            active ? "active" : "no instance active"));
        break;
      }
    }
  }

  // The asynchronous standby becomes the primary: the primary's walsender
  // for it frozen for a while first (the lag of an async standby under load:
  // what commits meanwhile never reaches it), the primary killed, the standby
  // promoted; then a new standby of it, on the old primary's port (the URL
  // the relays and writers have names both ports).
  void Promote(std::mt19937_64& rng) {
    // While a relay streams: a promotion no relay sees happen tests less.
    (void)Target(seconds(20));
    auto t0 = Clock::now();
    milliseconds lag(rng() % 4 == 0 ? 0 : 200 + rng() % 2800);
    std::optional<int> sender;
    if (lag.count() > 0) {
      try {
        Pg p(primary_->url());
        if (auto pid = p.Scalar(
                "SELECT pid FROM pg_stat_replication WHERE application_name = 'standby'")) {
          sender = std::stoi(*pid);
        }
      } catch (const std::exception& e) {
        Note(std::string("promotion: no walsender to freeze: ") + e.what());
      }
      // Stopped, it sends nothing more; the WAL it sent before is in the
      // standby's socket buffer and gets there (freezing the receiver would
      // not make a lag for that reason).
      if (sender) ::kill(*sender, SIGSTOP);
      Idle(lag);
      // Killed before the primary: a stopped process would hold up the
      // immediate shutdown, and on SIGCONT it might send what it holds.
      if (sender) ::kill(*sender, SIGKILL);
    }
    probe_.reset();
    primary_->Stop("immediate");
    standby_->Promote();
    const double promoted_s = SecondsSince(t0);
    const int old_port = primary_->port();
    primary_ = std::move(standby_);  // the old primary's directory goes with it
    ++promotions_;
    auto made = Clock::now();
    MakeStandby(old_port);
    Note(fmt::format(
        "promotion: walsender to the standby frozen {} ms, primary (port {}) killed, standby "
        "(port {}) promoted in {:.1f} s; new standby on port {} streaming {:.1f} s later",
        sender ? lag.count() : 0, old_port, primary_->port(), promoted_s, old_port,
        SecondsSince(made)));
  }

  // ---- the timeline ---------------------------------------------------------------------------

  // A fault from its start to its end (a frozen process thawed, a killed
  // broker's partitions in sync again), in seconds into the faults.
  struct Event {
    double start = 0;
    double end = 0;
    std::string what;
  };
  size_t AddEvent(std::string what, double start) {
    events_.push_back({start, SecondsSince(phase_start_), std::move(what)});
    return events_.size() - 1;
  }
  // Clusters of rows by when they were written, each with the faults around
  // it (begun at most 10 s after its last row, ended at most 1 s before its
  // first): "74.3-76.0 s: 942 rows (near: async standby promotion 73.1-74.2)".
  std::string Describe(const std::vector<WrittenCluster>& clusters) const {
    if (clusters.empty()) return "-";
    std::string out;
    for (const WrittenCluster& c : clusters) {
      std::string near;
      for (const Event& e : events_) {
        if (e.start <= c.to + 10 && e.end >= c.from - 1) {
          near +=
              fmt::format("{}{} {:.1f}-{:.1f}", near.empty() ? "" : ", ", e.what, e.start, e.end);
        }
      }
      out += fmt::format("\n    {:.1f}-{:.1f} s: {} rows{}", c.from, c.to, c.rows,
                         near.empty() ? "" : " (near: " + near + ")");
    }
    return out;
  }

  // ---- state ----------------------------------------------------------------------------------

  enum class BrokerState { kUp, kDown, kRecovering };

  int port_a_ = 0;
  int port_b_ = 0;
  std::unique_ptr<KafkaCluster> cluster_;
  std::unique_ptr<ThrowawayPostgres> primary_;
  std::unique_ptr<ThrowawayPostgres> standby_;
  std::optional<Pg> probe_;
  std::unique_ptr<LoadGenerator> load_;
  std::unique_ptr<LoadGenerator> foreign_load_;
  // Declared after the servers: destroyed (killed) before them.
  std::array<std::unique_ptr<RelayProcess>, 2> pair_;
  std::array<bool, 2> held_{};
  std::unique_ptr<RelayProcess> foreign_;
  std::string foreign_name_;

  Clock::time_point phase_start_ = Clock::now();
  bool foreign_frozen_ = false;
  Clock::time_point foreign_thaw_at_;
  BrokerState broker_state_ = BrokerState::kUp;
  size_t broker_down_ = 0;
  Clock::time_point broker_killed_at_;
  Clock::time_point broker_restart_at_;
  Clock::time_point next_replica_check_;
  bool broker_stuck_reported_ = false;

  int promotions_ = 0;
  int self_exits_ = 0;
  int replaced_exits_ = 0;
  int term_failures_ = 0;
  std::vector<double> takeovers_;
  std::vector<double> broker_recoveries_;
  std::vector<Event> events_;
  size_t foreign_event_ = 0;
  size_t broker_event_ = 0;
};

// A ULID (26 Crockford base32 characters, what the writers use as uuid) as
// 128 bits, so that sets of millions of rows fit in memory. (26 digits are
// 130 bits: the first digit is at most 7 until the year 10889.)
struct Id {
  uint64_t hi = 0;
  uint64_t lo = 0;
  bool operator==(const Id&) const = default;
};
struct IdHash {
  size_t operator()(const Id& id) const {
    return std::hash<uint64_t>{}(id.hi * 0x9E3779B97F4A7C15ull ^ id.lo);
  }
};
constexpr std::string_view kCrockford = "0123456789ABCDEFGHJKMNPQRSTVWXYZ";
std::optional<Id> ParseUlid(std::string_view s) {
  if (s.size() != 26) return std::nullopt;
  Id id;
  for (char c : s) {
    size_t v = kCrockford.find(c);
    if (v == std::string_view::npos) return std::nullopt;
    id.hi = (id.hi << 5) | (id.lo >> 59);
    id.lo = (id.lo << 5) | v;
  }
  return id;
}
std::string FormatUlid(Id id) {
  std::string out(26, '0');
  for (size_t i = 26; i-- > 0;) {
    out[i] = kCrockford[id.lo & 31];
    id.lo = (id.lo >> 5) | (id.hi << 59);
    id.hi >>= 5;
  }
  return out;
}

// Delivery of one relay's rows, as sets: the final table is the truth; rows
// the writers saw committed (or sent a COMMIT for) that the table lacks are
// gone with a failover, and their records excused. The rules are
// CheckDelivery's (tests/support/delivery.h): lost, phantom, duplicates,
// order of first copies per aggregate, aggregates split over partitions;
// the rows and records are held as ids and counters, for the hour's run.
struct CampaignDelivery {
  DeliveryReport report;  // over the final table's rows
  size_t table_rows = 0;
  size_t ledger_committed = 0;
  size_t gone = 0;            // the writers saw them committed; the final table lacks them
  size_t in_doubt_gone = 0;   // COMMIT without an answer, not in the final table
  size_t gone_published = 0;  // of both: in Kafka (published before the failover)
  size_t duplicates = 0;      // report.duplicates plus extra copies of gone rows
  size_t gone_copies = 0;     // of those, the extra copies of gone rows
  size_t dlq = 0;             // dead letters (none expected)
  std::vector<std::string> lost_uuids;
  // Lost rows whose transaction id a row gone with the failover had too: a
  // promoted standby hands out again the xids (and sequence values) the old
  // primary used after the last WAL it sent, so a (transaction_id,
  // offset_consumed) key of the old history can name another row on the new.
  size_t lost_reused_xid = 0;
  std::vector<std::string> lost_samples;        // the first few, with their xids
  std::vector<std::string> duplicate_samples;   // the first few, with both copies' offsets
  std::vector<std::string> duplicated_uuids;    // rows of the table in Kafka more than once
  std::vector<std::string> out_of_order_uuids;  // first copies after a higher seq
};

class DeliverySets {
 public:
  // The truth: every row of the final table (through a cursor: millions).
  void LoadTable(Pg& db, const std::string& table) {
    db.Exec("BEGIN ISOLATION LEVEL REPEATABLE READ");
    db.Exec(fmt::format(
        "DECLARE campaign_rows NO SCROLL CURSOR FOR SELECT uuid, metadata->>'Aggregate-Id', "
        "(payload->>'seq')::bigint, transaction_id::text FROM {}",
        QuoteIdent(table)));
    while (true) {
      std::vector<Row> page = db.Query("FETCH 50000 FROM campaign_rows");
      for (const Row& r : page) {
        std::optional<Id> id = ParseUlid(r[0].value_or(""));
        if (!id)
          throw std::runtime_error("a row of " + table + " has no ULID: " + r[0].value_or(""));
        index_.emplace(*id, static_cast<uint32_t>(rows_.size()));
        rows_.push_back({Aggregate(r[1].value_or("")), r[2] ? std::stoll(*r[2]) : 0,
                         std::stoull(r[3].value_or("0"))});
      }
      if (page.empty()) break;
    }
    db.Exec("COMMIT");
    out_.table_rows = rows_.size();
    out_.report.committed = rows_.size();
  }

  // What the writers did: the committed rows the table lacks are excused,
  // rolled-back rows are the known phantoms.
  void Ledger(const outbox_test::Ledger& ledger) {
    auto gone = [&](const WrittenRow& w, size_t* counter) {
      std::optional<Id> id = ParseUlid(w.uuid);
      if (!id || index_.contains(*id)) return;
      ++*counter;
      excused_.emplace(*id, 0);
      gone_xids_.insert(std::stoull(w.xid.empty() ? "0" : w.xid));
    };
    ledger.VisitCommitted([&](const WrittenRow& w) {
      ++out_.ledger_committed;
      gone(w, &out_.gone);
    });
    for (const WrittenRow& w : ledger.in_doubt()) gone(w, &out_.in_doubt_gone);
    for (const WrittenRow& w : ledger.rolled_back()) {
      if (auto id = ParseUlid(w.uuid)) rolled_back_.insert(*id);
    }
  }

  // One record read back; a partition's records in offset order.
  void Add(const KafkaRecord& r, const std::string& dlq_topic) {
    if (r.topic == dlq_topic) {
      ++out_.dlq;
      return;
    }
    ++out_.report.consumed;
    const KafkaHeader* h = r.FindHeader("_watermill_message_uuid");
    std::string uuid = h != nullptr && h->value ? *h->value : "";
    std::optional<Id> id = ParseUlid(uuid);
    auto it = id ? index_.find(*id) : index_.end();
    if (it == index_.end()) {
      if (id) {
        if (auto ex = excused_.find(*id); ex != excused_.end()) {
          ++ex->second;
          return;
        }
      }
      ++out_.report.phantom;
      bool from_rollback = id && rolled_back_.contains(*id);
      if (from_rollback) ++out_.report.phantom_rolled_back;
      Sample(fmt::format("phantom {} at {}/{}@{} ({})", Printable(uuid), r.topic, r.partition,
                         r.offset, from_rollback ? "a rolled-back row" : "unknown uuid"));
      return;
    }
    RowState& row = rows_[it->second];
    if (row.copies++ > 0) {
      ++out_.report.duplicates;
      if (out_.duplicate_samples.size() < 10) {
        out_.duplicate_samples.push_back(fmt::format(
            "duplicated {} (aggregate {} seq {}, xid {}): again at {}/{}@{}, first at @{}", uuid,
            aggregate_names_[row.aggregate], row.seq, row.xid, r.topic, r.partition, r.offset,
            row.first_offset));
      }
      return;  // order is judged on first copies
    }
    row.first_offset = r.offset;
    if (aggregate_names_[row.aggregate].empty()) return;
    AggregateState& agg = aggregates_[row.aggregate];
    int where = Where(r.topic, r.partition);
    if (agg.where < 0) agg.where = where;
    if (agg.where != where && !agg.split) {
      agg.split = true;
      ++out_.report.split_aggregates;
      Sample(fmt::format("aggregate {} in two partitions ({}/{})", aggregate_names_[row.aggregate],
                         r.topic, r.partition));
    }
    if (row.seq <= agg.last_seq) {
      ++out_.report.order_violations;
      if (out_.out_of_order_uuids.size() < kListed) out_.out_of_order_uuids.push_back(uuid);
      Sample(fmt::format("order: aggregate {} seq {} after seq {} (at {}/{}@{})",
                         aggregate_names_[row.aggregate], row.seq, agg.last_seq, r.topic,
                         r.partition, r.offset));
    }
    agg.last_seq = std::max(agg.last_seq, row.seq);
  }

  CampaignDelivery Finish() {
    size_t extra = 0;
    for (const auto& [id, n] : excused_) {
      if (n > 0) ++out_.gone_published;
      if (n > 1) extra += n - 1;
    }
    for (const auto& [id, i] : index_) {
      const RowState& row = rows_[i];
      if (row.copies > 1 && out_.duplicated_uuids.size() < kListed) {
        out_.duplicated_uuids.push_back(FormatUlid(id));
      }
      if (row.copies > 0) continue;
      ++out_.report.lost;
      bool reused = gone_xids_.contains(row.xid);
      if (reused) ++out_.lost_reused_xid;
      if (out_.lost_uuids.size() < kListed) out_.lost_uuids.push_back(FormatUlid(id));
      std::string what = fmt::format("lost {} (aggregate {} seq {}, xid {}{})", FormatUlid(id),
                                     aggregate_names_[row.aggregate], row.seq, row.xid,
                                     reused ? ", the xid of a row gone with the failover too" : "");
      if (out_.lost_samples.size() < 10) out_.lost_samples.push_back(what);
      Sample(what);
    }
    out_.duplicates = out_.report.duplicates + extra;
    out_.gone_copies = extra;
    return std::move(out_);
  }

 private:
  static constexpr size_t kListed = 200000;  // uuids listed for WhenWritten
  struct RowState {
    uint32_t aggregate = 0;
    int64_t seq = 0;
    uint64_t xid = 0;
    uint32_t copies = 0;
    int64_t first_offset = -1;  // of the first copy read back
  };
  struct AggregateState {
    int64_t last_seq = 0;
    int where = -1;
    bool split = false;
  };

  uint32_t Aggregate(const std::string& name) {
    auto [it, fresh] = aggregate_ids_.try_emplace(name, aggregate_names_.size());
    if (fresh) {
      aggregate_names_.push_back(name);
      aggregates_.emplace_back();
    }
    return it->second;
  }
  int Where(const std::string& topic, int32_t partition) {
    auto [it, fresh] =
        where_ids_.try_emplace(fmt::format("{}/{}", topic, partition), where_ids_.size());
    return it->second;
  }
  void Sample(std::string s) {
    if (out_.report.samples.size() < 10) out_.report.samples.push_back(std::move(s));
  }

  CampaignDelivery out_;
  std::unordered_map<Id, uint32_t, IdHash> index_;  // table row -> rows_
  std::vector<RowState> rows_;
  std::unordered_map<std::string, uint32_t> aggregate_ids_;
  std::vector<std::string> aggregate_names_;
  std::vector<AggregateState> aggregates_;
  std::unordered_map<std::string, int> where_ids_;
  std::unordered_map<Id, uint32_t, IdHash> excused_;  // gone row -> copies in Kafka
  std::unordered_set<Id, IdHash> rolled_back_;
  std::unordered_set<uint64_t> gone_xids_;
};

std::string Seconds(const std::vector<double>& v) {
  std::string out;
  for (double s : v) out += fmt::format("{}{:.1f}", out.empty() ? "" : " ", s);
  return out.empty() ? "-" : out;
}

void FaultCampaign::Run(bool exactly_once) {
  const std::string mode = exactly_once ? "exactly-once" : "at-least-once";
  const uint64_t seed = CampaignSeed();
  const double minutes = CampaignMinutes();
  fmt::print(
      "fault campaign, {}: seed {} (replay: OUTBOX_CAMPAIGN_SEED={}), {:.1f} min of faults "
      "(OUTBOX_CAMPAIGN_MINUTES)\n",
      mode, seed, seed, minutes);
  std::fflush(stdout);
  std::mt19937_64 rng(seed);
  const auto test_start = Clock::now();

  // ---- the stage ----
  KafkaClusterOptions kafka_options;
  kafka_options.nodes = 3;
  cluster_ = std::make_unique<KafkaCluster>(std::move(kafka_options));
  const double kafka_s = SecondsSince(test_start);

  // The campaign runs on PostgreSQL 15 whatever the services run: Debian's
  // build has pg_basebackup.
  const int base = 24100 + static_cast<int>(::getpid() % 400) * 2;
  port_a_ = FreeLocalPort(base);
  port_b_ = FreeLocalPort(port_a_ + 1);
  primary_ = std::make_unique<ThrowawayPostgres>(port_a_, kPgSettings, 15);
  {
    Pg p(primary_->url());
    p.Exec(OutboxTableDdl(name_));
    p.Exec(fmt::format("CREATE TABLE {} (id BIGSERIAL PRIMARY KEY, note TEXT)",
                       QuoteIdent(other_table_)));
  }
  MakeStandby(port_b_);
  db_ = std::make_unique<Pg>(primary_->url());

  // The foreign relay's database: the services' PostgreSQL.
  foreign_name_ = name_ + "_f";
  const std::string foreign_prefix = foreign_name_;
  {
    Pg services(env_.database_url);
    DropRelayObjects(env_.database_url, foreign_name_, foreign_name_,
                     {foreign_name_, foreign_name_ + "_side"}, 2000);
    services.Exec(OutboxTableDdl(foreign_name_));
    services.Exec(fmt::format("CREATE TABLE {} (id BIGSERIAL PRIMARY KEY, note TEXT)",
                              QuoteIdent(foreign_name_ + "_side")));
  }

  // ---- the relays ----
  // No --progress-topic: the relays of a Kafka cluster share the default one.
  const std::vector<std::string> common = {
      "--delivery", mode, "--topic-replication-factor", "3", "--shutdown-timeout-ms", kShutdownMs};
  const std::map<std::string, std::optional<std::string>> env = {
      {"DATABASE_URL", BothHosts()}, {"KAFKA_BROKERS", cluster_->client_brokers()}};
  for (size_t i = 0; i < 2; ++i) {
    std::string which(1, "ab"[i]);
    std::filesystem::remove(InstanceLogPath(which));
    pair_[i] = std::make_unique<RelayProcess>(RelayArgs(common), env, InstanceLogPath(which));
  }
  std::vector<std::string> foreign_args = {
      "run",
      "--table",
      "public." + foreign_name_,
      "--slot",
      foreign_name_,
      "--publication",
      foreign_name_,
      "--topic-template",
      foreign_prefix + ".{Source-Service}.{Event-Type:aggregate}",
      "--service",
      "foreign",
      "--metrics-addr",
      "",
      "--dlq-topic",
      foreign_prefix + ".dlq"};
  foreign_args.insert(foreign_args.end(), common.begin(), common.end());
  std::filesystem::remove(InstanceLogPath("foreign"));
  foreign_ = std::make_unique<RelayProcess>(
      foreign_args,
      std::map<std::string, std::optional<std::string>>{
          {"DATABASE_URL", env_.database_url}, {"KAFKA_BROKERS", cluster_->client_brokers()}},
      InstanceLogPath("foreign"));
  pair_[0]->Start();
  ASSERT_TRUE(WaitStreaming(*pair_[0], seconds(90))) << pair_[0]->LogTail();
  pair_[1]->Start();
  ASSERT_TRUE(pair_[1]->WaitForLog("standby:", seconds(60))) << pair_[1]->LogTail();
  foreign_->Start();
  ASSERT_TRUE(WaitStreaming(*foreign_, seconds(90))) << foreign_->LogTail();

  // ---- the load ----
  // Sizes of the hour's run: the ledgers keep ids, not records.
  Ledger ledger(/*keep_records=*/false);
  Ledger foreign_ledger(/*keep_records=*/false);
  WorkloadOptions options = Workload();
  options.database_url = BothHosts();
  load_ = std::make_unique<LoadGenerator>(options, &ledger, 2, MixedTx, milliseconds(25),
                                          LoadGenerator::OnFailure::kReconnect);
  load_->Seed(seed ^ 0x5bd1e995u);
  WorkloadOptions foreign_options = options;
  foreign_options.database_url = env_.database_url;
  foreign_options.table = foreign_name_;
  foreign_options.other_table = foreign_name_ + "_side";
  foreign_options.topic_prefix = foreign_prefix;
  foreign_load_ =
      std::make_unique<LoadGenerator>(foreign_options, &foreign_ledger, 1, MixedTx,
                                      milliseconds(40), LoadGenerator::OnFailure::kReconnect);
  foreign_load_->Seed(seed ^ 0x27d4eb2fu);
  load_->Start();
  foreign_load_->Start();
  const double setup_s = SecondsSince(test_start);
  fmt::print("stage: Kafka cluster {:.1f} s, everything streaming {:.1f} s after the start\n",
             kafka_s, setup_s);

  // ---- the faults ----
  phase_start_ = Clock::now();
  const auto phase_wall = std::chrono::system_clock::now();
  Idle(seconds(3));  // the load flows
  const auto phase_end = phase_start_ + std::chrono::duration_cast<Clock::duration>(
                                            std::chrono::duration<double>(minutes * 60));
  // Both modes promote the asynchronous standby. (Exactly-once did not
  // while rows the standby had without their marks came back from the
  // recreated slot's backfill: now the progress record lists a marked row
  // until the standbys have the mark, tracking::StandbyMarks.)
  // OUTBOX_CAMPAIGN_EOS_PROMOTIONS=0 leaves them out of the exactly-once run.
  const bool promotions = !exactly_once || EnvFlag("OUTBOX_CAMPAIGN_EOS_PROMOTIONS", true);
  std::vector<Fault> first;
  for (Fault f : kFaults) {
    if (f != Fault::kPromotion || promotions) first.push_back(f);
  }
  std::shuffle(first.begin(), first.end(), rng);
  std::array weights = kWeights;
  if (!promotions) weights[static_cast<size_t>(Fault::kPromotion)] = 0;
  std::discrete_distribution<size_t> draw(weights.begin(), weights.end());
  std::map<Fault, int> counts;
  size_t next_first = 0;
  while (next_first < first.size() || Clock::now() < phase_end) {
    Fault f = next_first < first.size() ? first[next_first] : kFaults[draw(rng)];
    if (!Available(f)) {
      Idle(milliseconds(500));
      continue;  // the same one of the first pass again; another draw after it
    }
    if (next_first < first.size()) ++next_first;
    const double start = SecondsSince(phase_start_);
    Apply(f, rng);
    size_t event = AddEvent(Name(f), start);
    if (f == Fault::kForeignFreeze) foreign_event_ = event;
    if (f == Fault::kBrokerKill) broker_event_ = event;
    ++counts[f];
    Supervise();
    Idle(milliseconds(500 + rng() % 2500));
  }
  const double phase_s = SecondsSince(phase_start_);

  // ---- the heal ----
  Note("faults over: the load stops, everything is thawed and restarted");
  const auto faults_over = Clock::now();
  // The writers reconnect after every fault: their errors are expected.
  (void)load_->Stop();
  (void)foreign_load_->Stop();
  if (foreign_frozen_) foreign_thaw_at_ = Clock::now();
  if (broker_state_ == BrokerState::kDown) broker_restart_at_ = Clock::now();
  while (foreign_frozen_ || broker_state_ != BrokerState::kUp) {
    Idle(milliseconds(200));
    if (Clock::now() - faults_over > seconds(300)) break;
  }
  ASSERT_EQ(broker_state_, BrokerState::kUp) << "the Kafka cluster did not heal";
  Supervise();
  const double thawed_s = SecondsSince(faults_over);
  db_ = std::make_unique<Pg>(primary_->url());
  int64_t unacked = WaitAllAcked(seconds(300));
  const double heal_s = SecondsSince(faults_over);
  EXPECT_EQ(unacked, 0) << "rows of the final primary still unacked 300 s after the faults\n"
                        << DescribeUnacked();
  EXPECT_EQ(MisackedRows(), 0);
  Pg services(env_.database_url);
  auto foreign_unacked = [&] {
    return services.Int(fmt::format("SELECT count(*) FROM {} WHERE offset_acked IS NULL",
                                    QuoteIdent(foreign_name_)));
  };
  for (auto until = Clock::now() + seconds(120); foreign_unacked() > 0 && Clock::now() < until;) {
    std::this_thread::sleep_for(milliseconds(200));
  }
  EXPECT_EQ(foreign_unacked(), 0) << "the foreign relay's rows are still unacked";

  // Every relay stops cleanly (an exactly-once zombie that found itself
  // fenced meanwhile is started again first, as everywhere above).
  Supervise();
  std::vector<std::pair<std::string, RelayProcess*>> all = {
      {"relay a", pair_[0].get()}, {"relay b", pair_[1].get()}, {"foreign relay", foreign_.get()}};
  for (auto& [which, r] : all) {
    ASSERT_TRUE(r->Running()) << which << " is not running\n" << r->LogTail();
    r->Terminate();
  }
  for (auto& [which, r] : all) {
    EXPECT_EQ(r->Wait(seconds(40)), std::optional<int>(0))
        << which << " did not exit 0 on SIGTERM\n"
        << r->LogTail();
  }

  // ---- the check ----
  auto read_start = Clock::now();
  // Reading runs at 10,000-15,000 records a second here: the hour's millions
  // take minutes.
  const seconds read_bound(120 +
                           (ledger.committed_count() + foreign_ledger.committed_count()) / 2000);
  auto check = [&](Pg& db, const std::string& table, const Ledger& l, const std::string& prefix) {
    DeliverySets sets;
    sets.LoadTable(db, table);
    sets.Ledger(l);
    const std::string dlq = prefix + ".dlq";
    KafkaReader reader(cluster_->brokers());
    reader.Read({}, prefix + ".",
                {.stable_for = milliseconds(3000),
                 .timeout = read_bound,
                 .read_committed = exactly_once,
                 .ids_only = true,
                 .each = [&](KafkaRecord&& r) { sets.Add(r, dlq); }});
    return sets.Finish();
  };
  CampaignDelivery d = check(*db_, name_, ledger, topic_prefix_);
  CampaignDelivery fd = check(services, foreign_name_, foreign_ledger, foreign_prefix);
  const double read_s = SecondsSince(read_start);

  std::string faults;
  int total = 0;
  for (Fault f : kFaults) {
    faults += fmt::format("{}{} {}", faults.empty() ? "" : ", ", Name(f), counts[f]);
    total += counts[f];
  }
  fmt::print("\n==== fault campaign, {} ====\n", mode);
  fmt::print("seed {} (replay: OUTBOX_CAMPAIGN_SEED={})\n", seed, seed);
  fmt::print("faults: {} in {:.1f} s: {}\n", total, phase_s, faults);
  fmt::print(
      "rows: {} in the final table ({} committed as the writers saw it, {} COMMITs without an "
      "answer); {} transactions, {} rolled back; writer reconnects {}\n",
      d.table_rows, d.ledger_committed, ledger.in_doubt().size(), load_->transactions(),
      ledger.aborted_transactions(), load_->failures());
  fmt::print(
      "lost {}, phantom {}, gone with the failover {} (+{} COMMITs without an answer not in the "
      "table; {} of these rows were published before it), order violations {}, duplicates {} "
      "(of rows of the table {}, extra copies of gone rows {})\n",
      d.report.lost, d.report.phantom, d.gone, d.in_doubt_gone, d.gone_published,
      d.report.order_violations, d.duplicates, d.report.duplicates, d.gone_copies);
  if (!d.lost_uuids.empty()) {
    fmt::print("lost rows, by when they were written (s into the faults):{}\n",
               Describe(WhenWritten(*db_, name_, d.lost_uuids, phase_wall)));
    fmt::print("lost rows with the xid of a row gone with the failover: {} of {}\n",
               d.lost_reused_xid, d.lost_uuids.size());
    for (const std::string& l : d.lost_samples) fmt::print("  {}\n", l);
  }
  if (!d.duplicated_uuids.empty()) {
    fmt::print("duplicated rows, by when they were written:{}\n",
               Describe(WhenWritten(*db_, name_, d.duplicated_uuids, phase_wall)));
    for (const std::string& l : d.duplicate_samples) fmt::print("  {}\n", l);
  }
  if (!d.out_of_order_uuids.empty()) {
    fmt::print("rows out of order, by when they were written:{}\n",
               Describe(WhenWritten(*db_, name_, d.out_of_order_uuids, phase_wall)));
  }
  fmt::print(
      "time to heal: {:.1f} s (faults over -> Kafka in sync, foreign relay thawed {:.1f} s -> "
      "every row marked); takeovers [{}] s; broker kill -> partitions in sync [{}] s\n",
      heal_s, thawed_s, Seconds(takeovers_), Seconds(broker_recoveries_));
  fmt::print(
      "relays' own exits {} ({} fenced: 'replaced'); mid-campaign SIGTERMs not exiting 0: {}; "
      "promotions {}\n",
      self_exits_, replaced_exits_, term_failures_, promotions_);
  fmt::print(
      "foreign relay: {} rows, lost {}, phantom {}, order violations {}, duplicates {}; {} "
      "dead letters\n",
      fd.table_rows, fd.report.lost, fd.report.phantom, fd.report.order_violations, fd.duplicates,
      d.dlq + fd.dlq);
  fmt::print("checked {} + {} records against the tables in {:.1f} s; total {:.1f} s\n",
             d.report.consumed, fd.report.consumed, read_s, SecondsSince(test_start));
  std::fflush(stdout);
  {
    const std::string path = LogDir() + "/campaign_figures.tsv";
    bool fresh = !std::filesystem::exists(path);
    std::ofstream tsv(path, std::ios::app);
    if (fresh) {
      tsv << "mode\tseed\tminutes\tfaults\tby_kind\trows\tlost\tphantom\tgone\tin_doubt_gone\t"
             "order_violations\tduplicates\theal_s\tforeign_rows\tforeign_lost\t"
             "foreign_duplicates\n";
    }
    tsv << fmt::format("{}\t{}\t{:.1f}\t{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}\t{:.1f}\t{}\t{}\t{}\n",
                       mode, seed, minutes, total, faults, d.table_rows, d.report.lost,
                       d.report.phantom, d.gone, d.in_doubt_gone, d.report.order_violations,
                       d.duplicates, heal_s, fd.table_rows, fd.report.lost, fd.duplicates);
  }

  EXPECT_GT(d.table_rows, 0u);
  if (promotions_ == 0) {
    EXPECT_EQ(d.gone, 0u) << "committed rows are missing from the table without a promotion";
  }
  EXPECT_EQ(d.report.lost, 0u) << "seed " << seed << "\n" << d.report.Samples();
  EXPECT_EQ(d.report.phantom, 0u) << "seed " << seed << "\n" << d.report.Samples();
  EXPECT_EQ(d.report.order_violations, 0u) << "seed " << seed << "\n" << d.report.Samples();
  EXPECT_EQ(d.report.split_aggregates, 0u) << "seed " << seed << "\n" << d.report.Samples();
  EXPECT_EQ(d.dlq + fd.dlq, 0u) << "dead letters from rows that are not poison";
  EXPECT_EQ(fd.report.lost, 0u) << "foreign relay, seed " << seed << "\n" << fd.report.Samples();
  EXPECT_EQ(fd.report.phantom, 0u) << "foreign relay, seed " << seed << "\n" << fd.report.Samples();
  EXPECT_EQ(fd.report.order_violations, 0u) << "foreign relay, seed " << seed << "\n"
                                            << fd.report.Samples();
  if (exactly_once) {
    // Over the rows the database has. A row gone with an asynchronous
    // promotion is already outside every guarantee (its records are phantoms
    // the failover made); a second copy of one is printed, not held against
    // exactly-once (DESIGN.md, guarantee 8: past the fork, produce again).
    EXPECT_EQ(d.report.duplicates, 0u) << "exactly-once, seed " << seed << "\n"
                                       << d.report.Samples();
    EXPECT_EQ(fd.duplicates, 0u) << "exactly-once, foreign relay, seed " << seed;
  }
}

TEST_F(FaultCampaign, AtLeastOnce) { Run(/*exactly_once=*/false); }

TEST_F(FaultCampaign, ExactlyOnce) { Run(/*exactly_once=*/true); }

}  // namespace
}  // namespace outbox_test
