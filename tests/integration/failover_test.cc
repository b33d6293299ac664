// Failover under load (issue: PostgreSQL 17 failover slots): a primary and a
// physical standby of the major under test, synchronous replication, the
// relay given both servers (target_session_attrs=read-write), writers
// writing; the primary crashes (pg_ctl stop -m immediate), the standby is
// promoted, the writers and the relay carry on against it.
//
// 17+: the relay runs with --failover-slot, the primary with
// synchronized_standby_slots naming the standby's physical slot, the standby
// with sync_replication_slots = on: the promoted standby holds a synced copy
// of the slot and the relay streams from it: no backfill; what lies between
// the synced position and the relay's own is published again (duplicates).
// 14 to 16: the promoted standby has no slot; the relay finds it missing and
// reconciles (recreates it, backfills every unacked row: more duplicates).
//
// Either way: lost 0, phantom 0, per-aggregate order kept, every row marked on
// the new primary. The figures (rows, duplicates, time to resume) are printed
// for the comparison in docs/failover.md.
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <regex>
#include <set>
#include <thread>

#include "fixture.h"
#include "ops_support.h"
#include "resilience_support.h"
#include "support/throwaway_pg.h"

namespace outbox_test {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;
using namespace resilience;

size_t Count(const std::string& text, const std::string& needle) {
  size_t n = 0;
  for (size_t p = 0; (p = text.find(needle, p)) != std::string::npos; p += needle.size()) ++n;
  return n;
}

class Failover : public RelayTest {};

// A primary with the outbox table `table` and an asynchronous standby
// streaming from it; `both` names the two, the read-write one taken.
struct AsyncPair {
  std::unique_ptr<ThrowawayPostgres> primary;
  std::unique_ptr<ThrowawayPostgres> standby;
  std::string both;

  // Waits (30 s at most) until the standby replayed what the primary wrote so far.
  bool StandbyHasAllWritten() const {
    const std::string written =
        Pg(primary->url()).Scalar("SELECT pg_current_wal_lsn()::text").value_or("");
    return WaitFor(
        [&] {
          return Pg(standby->url())
                     .Scalar("SELECT pg_last_wal_replay_lsn() >= $1::pg_lsn", {written}) == "t";
        },
        seconds(30));
  }
};

// `standby_config`: a line for the standby's configuration file (not the
// command line, so that ALTER SYSTEM can change it later), or "".
AsyncPair StartAsyncPair(int base, const std::string& table, const std::string& standby_config) {
  const std::string common =
      "-c wal_level=logical -c max_wal_senders=10 -c max_replication_slots=10 "
      "-c hot_standby=on -c wal_keep_size=256MB";
  AsyncPair pair;
  pair.primary = std::make_unique<ThrowawayPostgres>(FreeLocalPort(base), common);
  Pg(pair.primary->url()).Exec(OutboxTableDdl(table));
  pair.primary->Stop("fast");
  pair.standby = ThrowawayPostgres::StandbyOf(
      *pair.primary, FreeLocalPort(pair.primary->port() + 1), common,
      fmt::format("primary_conninfo = 'host=127.0.0.1 port={} user=postgres dbname=postgres'",
                  pair.primary->port()));
  if (!standby_config.empty()) pair.standby->AppendConfig(standby_config);
  pair.primary->Start();
  pair.standby->Start();
  Pg pdb(pair.primary->url());
  EXPECT_TRUE(WaitFor([&] { return pdb.Int("SELECT count(*) FROM pg_stat_replication") == 1; },
                      seconds(60)));
  pair.both = fmt::format(
      "postgresql://postgres@127.0.0.1:{},127.0.0.1:{}/postgres?target_session_attrs=read-write",
      pair.primary->port(), pair.standby->port());
  return pair;
}

TEST_F(Failover, PrimaryCrashesUnderLoadAndTheStandbyIsPromoted) {
  const int major = TestPgVersion();
  const bool failover_slots = major >= 17;
  const int base = 25640 + static_cast<int>(getpid() % 40);
  const std::string common =
      "-c wal_level=logical -c max_wal_senders=10 -c max_replication_slots=10 "
      "-c hot_standby=on -c wal_keep_size=512MB";
  ThrowawayPostgres primary(FreeLocalPort(base), common);
  Pg pdb(primary.url());
  pdb.Exec("SELECT pg_create_physical_replication_slot('standby1_slot')");
  pdb.Exec(OutboxTableDdl(name_));
  pdb.Exec(fmt::format("CREATE TABLE {} (id BIGSERIAL PRIMARY KEY, note TEXT)",
                       QuoteIdent(other_table_)));

  // The standby: a copy of the cleanly stopped primary (no pg_basebackup in
  // the npm builds), streaming over the physical slot.
  primary.Stop("fast");
  // sync_replication_slots is turned on once the relay's slot exists: a
  // synchronization worker that found nothing to sync backs off up to 30 s.
  std::string standby_settings = common + " -c hot_standby_feedback=on";
  auto standby = ThrowawayPostgres::StandbyOf(
      primary, FreeLocalPort(primary.port() + 1), standby_settings,
      fmt::format("primary_conninfo = 'host=127.0.0.1 port={} user=postgres dbname=postgres "
                  "application_name=standby1'\nprimary_slot_name = 'standby1_slot'",
                  primary.port()));
  primary.Start();
  standby->Start();
  pdb = Pg(primary.url());
  ASSERT_TRUE(WaitFor(
      [&] {
        return pdb.Int(
                   "SELECT count(*) FROM pg_stat_replication WHERE application_name = "
                   "'standby1' AND state = 'streaming'") == 1;
      },
      seconds(60)))
      << "the standby does not stream; see " << standby->dir() << "/postgres.log";
  // Commits wait for the standby: a commit a writer saw acknowledged survives the failover.
  pdb.Exec("ALTER SYSTEM SET synchronous_standby_names = 'standby1'");
  if (failover_slots) {
    pdb.Exec("ALTER SYSTEM SET synchronized_standby_slots = 'standby1_slot'");
  }
  pdb.Exec("SELECT pg_reload_conf()");

  const std::string both = fmt::format(
      "postgresql://postgres@127.0.0.1:{},127.0.0.1:{}/postgres?target_session_attrs=read-write",
      primary.port(), standby->port());
  std::vector<std::string> extra;
  if (failover_slots) extra = {"--failover-slot", "true"};
  RelayProcess& relay = StartRelay(extra, {{"DATABASE_URL", both}});
  ASSERT_TRUE(WaitStreaming(relay)) << relay.LogTail();

  auto synced_at = std::chrono::steady_clock::now();
  double sync_s = 0;
  if (failover_slots) {
    // The standby's copy of the slot must be synced and persistent before a
    // failover can rely on it (the runbook's first check).
    Pg sdb(standby->url());
    sdb.Exec("ALTER SYSTEM SET sync_replication_slots = on");
    sdb.Exec("SELECT pg_reload_conf()");
    // The copy is persisted once the primary's slot has moved past where the
    // standby created it; that takes a running-transactions record, which an
    // idle primary writes every 15 s: ask for one instead of waiting.
    ASSERT_TRUE(WaitFor(
        [&] {
          pdb.Exec("SELECT pg_log_standby_snapshot()");
          return sdb.Scalar(
                     "SELECT synced AND NOT temporary FROM pg_replication_slots "
                     "WHERE slot_name = $1",
                     {name_}) == "t";
        },
        seconds(60)))
        << "the standby has no synced copy of the slot; see " << standby->dir() << "/postgres.log";
    sync_s = SecondsSince(synced_at);
    // check --standby-url agrees.
    CommandResult check =
        RunRelayCommand({"check", "--table", "public." + name_, "--slot", name_, "--publication",
                         name_, "--failover-slot", "true", "--standby-url", standby->url(),
                         "--sample-rows", "0", "--dlq-topic", topic_prefix_ + ".dlq"},
                        {{"DATABASE_URL", both}});
    EXPECT_EQ(check.exit_code, 0) << check.Describe();
    for (const char* line :
         {"OK    failover slot: slot", "OK    synchronized_standby_slots: standby1_slot",
          "OK    sync_replication_slots:", "OK    hot_standby_feedback:",
          "OK    primary_slot_name: standby1_slot",
          "OK    primary_conninfo:", "OK    synced slot:"}) {
      EXPECT_NE(check.out.find(line), std::string::npos) << "no '" << line << "' in:\n"
                                                         << check.Describe();
    }
  }
  WorkloadOptions options = Workload();
  options.database_url = both;
  Ledger ledger;
  LoadGenerator load(
      options, &ledger, 2,
      [](std::mt19937_64& rng) {
        TxSpec tx;
        tx.rows = 1 + static_cast<int>(rng() % 20);
        tx.rollback = rng() % 10 == 0;
        if (rng() % 10 == 0) tx.savepoint_rolled_back_rows = 2;
        if (rng() % 10 == 0) tx.other_table_rows = 3;
        return tx;
      },
      std::chrono::microseconds(3000), LoadGenerator::OnFailure::kReconnect);
  load.Start();

  std::this_thread::sleep_for(seconds(4));  // load flows and the relay streams

  uint64_t confirmed_before = 0;
  if (auto s = QuerySlot(pdb, name_); s && s->confirmed_flush_lsn) {
    confirmed_before = *s->confirmed_flush_lsn;
  }
  size_t sessions = Count(relay.Log(), "streaming from slot");
  const size_t log_at_crash = relay.Log().size();
  auto crash = std::chrono::steady_clock::now();
  primary.Stop("immediate");
  standby->Promote();
  double promote_s = SecondsSince(crash);
  auto promoted = std::chrono::steady_clock::now();
  ASSERT_TRUE(
      WaitFor([&] { return Count(relay.Log(), "streaming from slot") > sessions; }, seconds(120)))
      << "the relay did not stream from the promoted standby:\n"
      << relay.LogTail(60);
  double resume_s = SecondsSince(promoted);
  std::this_thread::sleep_for(seconds(4));  // writers carry on against the new primary
  (void)load.Stop();                        // failures are expected here: load.failures()

  db_ = std::make_unique<Pg>(standby->url());
  auto drain = std::chrono::steady_clock::now();
  int64_t unacked = WaitAllAcked(seconds(120));
  double drain_s = SecondsSince(drain);
  EXPECT_EQ(unacked, 0) << DescribeUnacked();
  EXPECT_EQ(MisackedRows(), 0);
  ASSERT_TRUE(relay.Running()) << relay.LogTail(60);

  // What committed is what the new primary holds; every commit a writer saw
  // acknowledged must be there (synchronous replication).
  std::vector<WrittenRow> committed = RowsFromTable(*db_, name_);
  std::set<std::string> in_table;
  for (const WrittenRow& w : committed) in_table.insert(w.uuid);
  size_t missing = 0;
  for (const WrittenRow& w : ledger.committed()) {
    if (!in_table.contains(w.uuid)) ++missing;
  }
  std::vector<KafkaRecord> records = ReadTopics({.timeout = seconds(60)});
  DeliveryReport delivery = CheckDelivery(committed, ledger.rolled_back(), records);
  std::string log = relay.Log().substr(log_at_crash);  // what the relay did after the crash
  size_t backfills = Count(log, "backfill: publishing unacked rows");
  size_t backfilled = 0;  // "backfill: 123 rows in 45 transactions published in 0.1 s"
  std::regex published("backfill: ([0-9]+) rows in");
  for (std::sregex_iterator it(log.begin(), log.end(), published), end; it != end; ++it) {
    backfilled += std::stoul((*it)[1].str());
  }
  auto slot = QuerySlot(*db_, name_);

  fmt::print(
      "failover on PostgreSQL {} ({}): {} rows committed, {} acknowledged to writers ({} not on "
      "the new primary), {} writer failures; crash + promote {:.1f} s; relay streaming {:.1f} s "
      "after the promotion; all rows marked {:.1f} s after the load stopped; {} backfill(s) of {} "
      "rows; "
      "slot confirmed {} before the crash, now {}\n",
      major,
      failover_slots ? fmt::format("failover slot, synced to the standby {:.1f} s after "
                                   "sync_replication_slots was turned on",
                                   sync_s)
                     : std::string("no failover slots: reconcile by backfill"),
      committed.size(), ledger.committed_count(), missing, load.failures(), promote_s, resume_s,
      drain_s, backfills, backfilled, FormatLsn(confirmed_before),
      slot && slot->confirmed_flush_lsn ? FormatLsn(*slot->confirmed_flush_lsn) : "-");
  fmt::print("{}\n", delivery.Summary());

  EXPECT_EQ(missing, 0u) << "commits acknowledged to a writer are not on the new primary";
  EXPECT_EQ(delivery.lost, 0u) << delivery.Samples();
  EXPECT_EQ(delivery.phantom, 0u) << delivery.Samples();
  EXPECT_EQ(delivery.order_violations, 0u) << delivery.Samples();
  EXPECT_EQ(delivery.split_aggregates, 0u) << delivery.Samples();
  EXPECT_NE(log.find("a standby was promoted"), std::string::npos) << relay.LogTail(60);
  if (failover_slots) {
    EXPECT_EQ(backfills, 0u) << "the synced slot needs no backfill:\n" << relay.LogTail(60);
    EXPECT_EQ(Count(log, "is missing"), 0u) << relay.LogTail(60);
    EXPECT_NE(log.find("(synced from the old primary)"), std::string::npos) << relay.LogTail(60);
  } else {
    EXPECT_EQ(backfills, 1u) << "a missing slot is recreated and backfilled:\n"
                             << relay.LogTail(60);
    EXPECT_NE(log.find("replication slot " + name_ + " is missing"), std::string::npos)
        << relay.LogTail(60);
  }

  relay.Terminate();
  EXPECT_EQ(relay.Wait(seconds(40)), std::optional<int>(0)) << relay.LogTail();
  fmt::print("total {:.1f} s\n", SecondsSince(started_));
}

// An asynchronous standby promoted while delivered transactions wait to be
// marked. The old primary's last transactions never reached the standby: gone
// from the database (their records are in Kafka), and the promoted standby
// hands out their transaction ids again. Every transaction here writes
// offset_consumed 1, so a reused xid names, by (transaction_id, offset), a
// row of the new primary that the relay has not published. The marker's
// batch of the gone transactions must not be marked there: that marks the new
// rows, the backfill of the recreated slot skips them, and they are lost
// (before the fix: the rows with a reused xid, e.g. 20 of 60). The
// transactions the standby did receive are marked there, not sent again.
TEST_F(Failover, MarksOfTransactionsGoneWithAnAsyncPromotionMarkNothingOnTheNewPrimary) {
  // Read-only by default once promoted, so the relay (read-write only) comes
  // to it after the test has written there.
  AsyncPair pair = StartAsyncPair(25700 + static_cast<int>(getpid() % 40), name_,
                                  "default_transaction_read_only = on");
  ThrowawayPostgres& primary = *pair.primary;
  auto& standby = pair.standby;
  const std::string& both = pair.both;
  Pg pdb(primary.url());
  RelayProcess& relay = StartRelay({}, {{"DATABASE_URL", both}});
  ASSERT_TRUE(WaitStreaming(relay)) << relay.LogTail();

  // Nothing is marked on the old primary from here on: the marker's
  // statement also writes the commit index, which this lock holds (the
  // writers' inserts into the outbox table do not wait for it).
  Pg locker(primary.url());
  locker.Exec("BEGIN");
  locker.Exec("LOCK TABLE outbox_relay.commits IN SHARE MODE");
  // Delivered, unmarked, and on the standby too: the same transactions on
  // the promoted server, marked there and not sent again.
  int64_t seq = 0;
  std::vector<WrittenRow> before;
  for (int i = 0; i < 5; ++i) before.push_back(InsertRow(pdb, {.seq = ++seq, .offset = 1}));
  ASSERT_TRUE(pair.StandbyHasAllWritten());
  standby->Stop("fast");

  // The gone transactions: delivered and unmarked too.
  constexpr int kGone = 20;
  std::set<std::string> gone;
  std::vector<std::string> gone_xids;
  for (int i = 0; i < kGone; ++i) {
    WrittenRow w = InsertRow(pdb, {.seq = ++seq, .offset = 1});
    gone.insert(w.uuid);
    gone_xids.push_back(w.xid);
  }
  ASSERT_TRUE(
      WaitFor([&] { return ReadTopics({.timeout = seconds(5)}).size() >= before.size() + kGone; },
              seconds(30)))
      << relay.LogTail();
  ASSERT_EQ(
      pdb.Int(fmt::format("SELECT count(*) FROM {} WHERE offset_acked IS NULL", QuoteIdent(name_))),
      static_cast<int64_t>(before.size()) + kGone)
      << "the transactions must be waiting for their marks when the primary dies";

  primary.Stop("immediate");
  standby->Start();
  standby->Promote();
  // The new primary's rows: the first of them take the gone transactions' ids again.
  Pg sdb(standby->url());
  sdb.Exec("SET default_transaction_read_only = off");
  std::vector<WrittenRow> after;
  for (int i = 0; i < 3 * kGone; ++i) after.push_back(InsertRow(sdb, {.seq = ++seq, .offset = 1}));
  size_t reused = 0;
  for (const WrittenRow& w : after) {
    reused += std::find(gone_xids.begin(), gone_xids.end(), w.xid) != gone_xids.end();
  }
  ASSERT_GT(reused, 0u) << "the promoted standby did not hand out the gone xids again";
  sdb.Exec("ALTER SYSTEM SET default_transaction_read_only = off");
  sdb.Exec("SELECT pg_reload_conf()");

  db_ = std::make_unique<Pg>(standby->url());
  EXPECT_EQ(WaitAllAcked(seconds(120)), 0) << DescribeUnacked() << relay.LogTail(60);
  std::vector<WrittenRow> committed = RowsFromTable(*db_, name_);
  std::vector<KafkaRecord> records;
  for (KafkaRecord& r : ReadTopics({.timeout = seconds(60)})) {
    const KafkaHeader* h = r.FindHeader("_watermill_message_uuid");
    if (h == nullptr || !h->value || !gone.contains(*h->value)) records.push_back(std::move(r));
  }
  DeliveryReport delivery = CheckDelivery(committed, {}, records);
  fmt::print(
      "async promotion with {} gone transactions ({} of {} new rows with a reused xid): {}\n",
      kGone, reused, after.size(), delivery.Summary());
  EXPECT_EQ(committed.size(), before.size() + after.size());
  EXPECT_EQ(delivery.lost, 0u) << delivery.Samples() << relay.LogTail(80);
  EXPECT_EQ(delivery.phantom, 0u) << delivery.Samples();
  EXPECT_EQ(delivery.order_violations, 0u) << delivery.Samples();
  EXPECT_EQ(delivery.duplicates, 0u) << "the shared transactions are marked, not sent again";
  relay.Terminate();
  EXPECT_EQ(relay.Wait(seconds(40)), std::optional<int>(0)) << relay.LogTail();
}

// A stop that comes after a promotion the stream has not followed yet (its
// connection was lost and not made again; the test fault no-restream keeps it
// so): the marker, on the promoted server, refuses to mark what was read on
// the old timeline. The stop reads where the timelines part itself: the
// transactions both share are marked there, and it exits 0. It used to wait
// out the shutdown timeout and exit 1 with them unmarked (the fault campaign
// met it when its final SIGTERM came just after a promotion).
TEST_F(Failover, AStopRightAfterAPromotionMarksWhatTheTimelinesShare) {
  AsyncPair pair = StartAsyncPair(25800 + static_cast<int>(getpid() % 40), name_, "");
  ThrowawayPostgres& primary = *pair.primary;
  auto& standby = pair.standby;
  const std::string& both = pair.both;
  Pg pdb(primary.url());
  RelayProcess& relay =
      StartRelay({}, {{"DATABASE_URL", both}, {"OUTBOX_TEST_FAULT", "no-restream"}});
  ASSERT_TRUE(WaitStreaming(relay)) << relay.LogTail();

  // Delivered, unmarked (the lock holds the marker's statement), on the standby too.
  Pg locker(primary.url());
  locker.Exec("BEGIN");
  locker.Exec("LOCK TABLE outbox_relay.commits IN SHARE MODE");
  std::vector<WrittenRow> rows;
  for (int i = 0; i < 5; ++i) rows.push_back(InsertRow(pdb, {.seq = i + 1, .offset = 1}));
  ASSERT_TRUE(pair.StandbyHasAllWritten());
  ASSERT_TRUE(WaitFor([&] { return ReadTopics({.timeout = seconds(5)}).size() >= rows.size(); },
                      seconds(30)))
      << relay.LogTail();

  primary.Stop("immediate");
  standby->Promote();
  db_ = std::make_unique<Pg>(standby->url());
  // The marker connects to the promoted server and refuses to mark there.
  ASSERT_TRUE(WaitFor(
      [&] {
        return relay.Log().find("the delivered transactions were read on timeline") !=
               std::string::npos;
      },
      seconds(60)))
      << relay.LogTail();
  auto stopped = std::chrono::steady_clock::now();
  relay.Terminate();
  auto code = relay.Wait(seconds(40));
  double stop_s = SecondsSince(stopped);
  const int64_t unmarked = db_->Int(
      fmt::format("SELECT count(*) FROM {} WHERE offset_acked IS NULL", QuoteIdent(name_)));
  fmt::print("stop after an unfollowed promotion: exit {} after {:.1f} s, {} of {} rows unmarked\n",
             code ? std::to_string(*code) : "none", stop_s, unmarked, rows.size());
  EXPECT_EQ(code, std::optional<int>(0)) << relay.LogTail(30);
  EXPECT_EQ(unmarked, 0) << "the shared transactions are marked on the promoted server\n"
                         << relay.LogTail(30);
  EXPECT_NE(relay.Log().find("stopping: the server writes timeline"), std::string::npos)
      << relay.LogTail(30);
}

}  // namespace
}  // namespace outbox_test
