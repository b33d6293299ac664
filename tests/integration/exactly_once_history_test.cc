// Exactly-once against what users do to a database and a Kafka cluster
// (issue 36): a failover to an asynchronous standby, two relays given one
// --transactional-id, another producer's transaction open in the progress
// topic, a slot lost while Kafka held rows the table had not marked. Each is
// the reproduction from the outside review of fb76bda (where it lost or
// repeated rows) run against the relay of today: for read_committed consumers,
// lost 0 and duplicates 0.
#include <fmt/format.h>
#include <unistd.h>

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

class ExactlyOnceHistory : public RelayTest {
 protected:
  // What a read_committed consumer sees of this test's topics (the progress
  // topic and the dead letters left out).
  std::vector<KafkaRecord> Committed() {
    std::vector<KafkaRecord> out;
    for (KafkaRecord& r : ReadTopics({.timeout = seconds(90), .read_committed = true})) {
      if (r.topic.ends_with(".progress") || r.topic == topic_prefix_ + ".dlq") continue;
      out.push_back(std::move(r));
    }
    return out;
  }
  DeliveryReport Check(const std::vector<WrittenRow>& committed,
                       const std::vector<KafkaRecord>& records, const std::string& what) {
    DeliveryReport r = CheckDelivery(committed, {}, records);
    fmt::print("{}: {}\n", what, r.Summary());
    EXPECT_EQ(r.lost, 0u) << r.Samples();
    EXPECT_EQ(r.phantom, 0u) << r.Samples();
    EXPECT_EQ(r.order_violations, 0u) << r.Samples();
    EXPECT_EQ(r.duplicates, 0u) << r.Samples();
    return r;
  }

  // A primary with the test's tables and an asynchronous standby that
  // streams from it through the physical slot standby1_slot; `both` reaches
  // whichever of them is writable. No standby when it does not stream.
  struct Promotable {
    std::unique_ptr<ThrowawayPostgres> primary;
    std::unique_ptr<ThrowawayPostgres> standby;
    std::string both;
  };
  Promotable StartPromotable(int base, bool physical_slot = true) {
    const std::string common =
        "-c wal_level=logical -c max_wal_senders=10 -c max_replication_slots=10 "
        "-c hot_standby=on -c wal_keep_size=512MB";
    Promotable out;
    out.primary = std::make_unique<ThrowawayPostgres>(
        FreeLocalPort(base + static_cast<int>(getpid() % 40)), common);
    ThrowawayPostgres& primary = *out.primary;
    {
      Pg pdb(primary.url());
      if (physical_slot) pdb.Exec("SELECT pg_create_physical_replication_slot('standby1_slot')");
      pdb.Exec(OutboxTableDdl(name_));
      pdb.Exec(fmt::format("CREATE TABLE {} (id BIGSERIAL PRIMARY KEY, note TEXT)",
                           QuoteIdent(other_table_)));
    }
    primary.Stop("fast");
    auto standby = ThrowawayPostgres::StandbyOf(
        primary, FreeLocalPort(primary.port() + 1), common + " -c hot_standby_feedback=on",
        fmt::format("primary_conninfo = 'host=127.0.0.1 port={} user=postgres dbname=postgres "
                    "application_name=standby1'{}",
                    primary.port(), physical_slot ? "\nprimary_slot_name = 'standby1_slot'" : ""));
    primary.Start();
    standby->Start();
    db_ = std::make_unique<Pg>(primary.url());
    if (!WaitFor(
            [&] {
              return db_->Int(
                         "SELECT count(*) FROM pg_stat_replication WHERE application_name = "
                         "'standby1' AND state = 'streaming'") == 1;
            },
            seconds(60))) {
      ADD_FAILURE() << "the standby does not stream; see " << standby->dir() << "/postgres.log";
      return out;
    }
    out.both = fmt::format(
        "postgresql://postgres@127.0.0.1:{},127.0.0.1:{}/postgres?target_session_attrs=read-write",
        primary.port(), standby->port());
    out.standby = std::move(standby);
    return out;
  }
  // The test of marks a promoted standby lacks (below).
  void PromoteAStandbyWithoutTheLastMarks(bool physical_slot);
  // Waits until the standby has replayed everything the primary wrote so far.
  bool StandbyCaughtUp(ThrowawayPostgres& standby) {
    std::string primary_end = db_->Scalar("SELECT pg_current_wal_lsn()::text").value_or("");
    return WaitFor(
        [&] {
          Pg sdb(standby.url());
          return sdb.Scalar("SELECT pg_last_wal_replay_lsn() >= $1::pg_lsn", {primary_end}) ==
                 std::optional<std::string>("t");
        },
        seconds(60));
  }
  // After a promotion: the relay streams from the promoted `standby` again
  // (a session after the first `sessions`), `fresh` one-row transactions
  // written there are delivered, the relay stops with 0; then Kafka holds
  // `shared` and the fresh rows once each, and every row of `gone` (published
  // before the promotion, gone from the database with the old timeline).
  void FinishOnThePromotedStandby(RelayProcess& relay, size_t sessions, ThrowawayPostgres& standby,
                                  int fresh_rows, uint64_t seed, const Ledger& shared,
                                  const Ledger& gone, const std::string& what) {
    ASSERT_TRUE(
        WaitFor([&] { return CountOccurrences(relay.Log(), "streaming from slot") > sessions; },
                seconds(120)))
        << "the relay did not stream from the promoted standby:\n"
        << relay.LogTail(60);
    WorkloadOptions on_standby = Workload();
    on_standby.database_url = standby.url();
    Ledger fresh;
    {
      Writer writer(on_standby, &fresh, -1, seed);
      for (int i = 0; i < fresh_rows; ++i) ASSERT_TRUE(writer.Transaction({.rows = 1}));
    }
    EXPECT_EQ(WaitAllAcked(seconds(120)), 0) << DescribeUnacked();
    relay.Terminate();
    EXPECT_EQ(relay.Wait(seconds(40)), std::optional<int>(0)) << relay.LogTail();

    std::set<std::string> gone_uuids;
    for (const WrittenRow& w : gone.committed()) gone_uuids.insert(w.uuid);
    std::vector<KafkaRecord> records;
    size_t gone_published = 0;
    for (KafkaRecord& r : Committed()) {
      const KafkaHeader* uuid = r.FindHeader("_watermill_message_uuid");
      if (uuid != nullptr && uuid->value && gone_uuids.contains(*uuid->value)) {
        ++gone_published;
        continue;
      }
      records.push_back(std::move(r));
    }
    EXPECT_EQ(gone_published, gone_uuids.size());
    std::vector<WrittenRow> truth = shared.committed();
    for (const WrittenRow& w : fresh.committed()) truth.push_back(w);
    fmt::print(
        "promotion: {} rows both timelines share, {} on the lost timeline only, {} new on "
        "the promoted one\n",
        shared.committed().size(), gone_uuids.size(), fresh.committed().size());
    Check(truth, records, what);
  }
};

// #1. The relay publishes up to 0/X on timeline 1; the asynchronous standby
// has received timeline 1 only up to 0/D < 0/X when it is promoted. Its
// timeline 2 writes new transactions from 0/D on: at LSNs the old primary had
// published up to. fb76bda took them as already in Kafka, marked them and
// never produced them (50 of 50 rows lost).
TEST_F(ExactlyOnceHistory, NewRowsOfAPromotedAsyncStandbyAreNotTakenAsAlreadyInKafka) {
  Promotable pair = StartPromotable(25700);
  ASSERT_TRUE(pair.standby) << "the standby does not stream";
  ThrowawayPostgres& primary = *pair.primary;
  std::unique_ptr<ThrowawayPostgres>& standby = pair.standby;
  RelayProcess& relay = StartRelay(Eos(), {{"DATABASE_URL", pair.both}});
  ASSERT_TRUE(WaitStreaming(relay, seconds(60))) << relay.LogTail();

  WorkloadOptions on_primary = Workload();
  on_primary.database_url = primary.url();
  Ledger shared;  // both timelines have these rows, and their marks
  {
    Writer writer(on_primary, &shared, -1, 361);
    for (int i = 0; i < 20; ++i) ASSERT_TRUE(writer.Transaction({.rows = 5}));
  }
  ASSERT_EQ(WaitAllAcked(seconds(60)), 0) << DescribeUnacked();
  ASSERT_TRUE(StandbyCaughtUp(*standby));
  // From here the standby receives nothing: asynchronous, and behind.
  standby->Stop("fast");
  Ledger gone;  // only the old timeline has these: published, then lost with it
  {
    Writer writer(on_primary, &gone, -1, 362);
    for (int i = 0; i < 40; ++i) ASSERT_TRUE(writer.Transaction({.rows = 50}));
  }
  ASSERT_EQ(WaitAllAcked(seconds(60)), 0) << DescribeUnacked();
  const size_t sessions = CountOccurrences(relay.Log(), "streaming from slot");
  primary.Stop("immediate");
  standby->Start();
  standby->Promote();
  db_ = std::make_unique<Pg>(standby->url());
  // Timeline 2's new rows, at LSNs timeline 1 had published up to.
  FinishOnThePromotedStandby(relay, sessions, *standby, 50, 363, shared, gone,
                             "after the promotion of an asynchronous standby");
  EXPECT_NE(relay.Log().find("trusted below"), std::string::npos)
      << "the relay did not judge the progress against the new history:\n"
      << relay.LogTail(60);
}

// After #1: rows an asynchronous standby has, whose marks it does not have
// when it is promoted. The relay published and marked them on the primary
// while the standby was away (stopped; its physical slot kept its place);
// later Kafka transactions' progress records no longer listed them as
// unmarked. The promoted server shows them unmarked, its slot is made anew
// (PostgreSQL 15 keeps no logical slot on a standby), and the backfill met
// them: published twice (150 duplicates of 150 before the standby marks).
void ExactlyOnceHistory::PromoteAStandbyWithoutTheLastMarks(bool physical_slot) {
  Promotable pair = StartPromotable(25760, physical_slot);
  ASSERT_TRUE(pair.standby) << "the standby does not stream";
  ThrowawayPostgres& primary = *pair.primary;
  ThrowawayPostgres& standby = *pair.standby;
  // `check` says whether the relay can see where the standbys are: as the
  // superuser it can; a role without pg_read_all_stats is told to get it.
  db_->Exec("CREATE ROLE no_stats LOGIN REPLICATION");
  auto check = [&](const std::string& url) {
    std::vector<std::string> args = RelayArgs({"--delivery", "exactly-once"});
    args[0] = "check";
    return RunRelayCommand(args, {{"DATABASE_URL", url}, {"KAFKA_BROKERS", env_.kafka_brokers}});
  };
  CommandResult seen = check(primary.url());
  EXPECT_NE(seen.out.find("OK    standby positions: the standbys have the WAL up to"),
            std::string::npos)
      << seen.Describe();
  CommandResult hidden =
      check(fmt::format("postgresql://no_stats@127.0.0.1:{}/postgres", primary.port()));
  EXPECT_NE(hidden.out.find("WARN  standby positions: 1 physical walsenders' positions are "
                            "hidden from role no_stats"),
            std::string::npos)
      << hidden.Describe();
  EXPECT_NE(hidden.out.find("GRANT pg_read_all_stats TO \"no_stats\";"), std::string::npos)
      << hidden.Describe();
  RelayProcess& relay = StartRelay(Eos(), {{"DATABASE_URL", pair.both}});
  ASSERT_TRUE(WaitStreaming(relay, seconds(60))) << relay.LogTail();

  WorkloadOptions on_primary = Workload();
  on_primary.database_url = primary.url();
  // The relay waits while the rows are written and the standby takes them:
  // the standby has the rows, and none of their marks.
  relay.Pause();
  Ledger shared;
  {
    Writer writer(on_primary, &shared, -1, 371);
    for (int i = 0; i < 30; ++i) ASSERT_TRUE(writer.Transaction({.rows = 5}));
  }
  ASSERT_TRUE(StandbyCaughtUp(standby));
  standby.Stop("fast");
  relay.Resume();
  ASSERT_EQ(WaitAllAcked(seconds(60)), 0) << DescribeUnacked();
  // More Kafka transactions after the marks: their progress records are the
  // last ones the promoted server's relay reads.
  Ledger gone;
  {
    Writer writer(on_primary, &gone, -1, 372);
    for (int i = 0; i < 20; ++i) ASSERT_TRUE(writer.Transaction({.rows = 2}));
  }
  ASSERT_EQ(WaitAllAcked(seconds(60)), 0) << DescribeUnacked();
  const size_t sessions = CountOccurrences(relay.Log(), "streaming from slot");
  primary.Stop("immediate");
  standby.Start();
  {
    Pg sdb(standby.url());  // a hot standby still: read-only, as the relay cannot use it
    ASSERT_EQ(sdb.Int(fmt::format("SELECT count(*) FROM {} WHERE offset_acked IS NULL",
                                  QuoteIdent(name_))),
              static_cast<int64_t>(shared.committed().size()))
        << "the standby should show every shared row unmarked";
  }
  standby.Promote();
  db_ = std::make_unique<Pg>(standby.url());
  FinishOnThePromotedStandby(relay, sessions, standby, 20, 373, shared, gone,
                             "after promoting a standby without the last marks");
}

TEST_F(ExactlyOnceHistory, RowsAPromotedStandbyShowsUnmarkedButKafkaHoldsAreNotPublishedAgain) {
  PromoteAStandbyWithoutTheLastMarks(/*physical_slot=*/true);
}

// The same standby without a physical slot: stopped, the primary no longer
// knows of it at all. Seen within the last minute, it is waited for as one
// whose position is unknown (it may be reconnecting: after a restart of the
// primary it waits up to wal_retrieve_retry_interval), so its marks are kept.
TEST_F(ExactlyOnceHistory, AStandbyWithoutASlotAwayForLessThanAMinuteIsWaitedFor) {
  PromoteAStandbyWithoutTheLastMarks(/*physical_slot=*/false);
}

// #2. Two relays of different databases given the same --transactional-id.
// fb76bda let the second read the first one's progress and skip its own rows
// (40 of 40 rows marked, none in Kafka). Now the second refuses to start,
// naming both relays, and marks nothing.
TEST_F(ExactlyOnceHistory, TwoRelaysSharingATransactionalIdAreRefusedNotSkipped) {
  CreateTables();
  const std::string db2 = name_ + "_b";
  db_->Exec("DROP DATABASE IF EXISTS " + QuoteIdent(db2));
  db_->Exec("CREATE DATABASE " + QuoteIdent(db2));
  const std::string url2 =
      std::regex_replace(env_.database_url, std::regex("/[^/?]*($|\\?)"), "/" + db2 + "$1");
  const std::string slot2 = name_ + "_b";
  {
    Pg other(url2);
    other.Exec(OutboxTableDdl(name_));
  }
  const std::vector<std::string> shared_id = {"--transactional-id", "svc.shared." + name_};
  auto eos_b = [&] {
    std::vector<std::string> args = shared_id;
    args.insert(args.end(), {"--slot", slot2, "--delivery", "exactly-once"});
    return Eos(args);
  };
  // The second relay's slot exists first (an earlier run, at least once);
  // its rows are written before the first relay publishes past them.
  {
    RelayProcess& b = StartRelay({"--slot", slot2}, {{"DATABASE_URL", url2}});
    ASSERT_TRUE(WaitStreaming(b)) << b.LogTail();
    b.Terminate();
    ASSERT_EQ(b.Wait(seconds(40)), std::optional<int>(0)) << b.LogTail();
  }
  WorkloadOptions on_b = Workload();
  on_b.database_url = url2;
  Ledger ledger_b;
  {
    Writer writer(on_b, &ledger_b, -1, 364);
    for (int i = 0; i < 40; ++i) ASSERT_TRUE(writer.Transaction({.rows = 1}));
  }
  RelayProcess& a = StartRelay(Eos(shared_id));
  ASSERT_TRUE(WaitStreaming(a, seconds(60))) << a.LogTail();
  Ledger ledger_a;
  {
    Writer writer(Workload(), &ledger_a, -1, 365);
    for (int i = 0; i < 40; ++i) ASSERT_TRUE(writer.Transaction({.rows = 1}));
  }
  ASSERT_EQ(WaitAllAcked(seconds(60)), 0) << DescribeUnacked();
  a.Terminate();
  ASSERT_EQ(a.Wait(seconds(40)), std::optional<int>(0)) << a.LogTail();

  RelayProcess& b = StartRelay(eos_b(), {{"DATABASE_URL", url2}});
  auto code = b.Wait(seconds(60));
  ASSERT_TRUE(code.has_value()) << "still running:\n" << b.LogTail();
  EXPECT_EQ(*code, 2) << b.LogTail();
  EXPECT_NE(b.Log().find("invalid setting --transactional-id"), std::string::npos) << b.LogTail();
  EXPECT_NE(b.Log().find("database " + db2), std::string::npos) << b.LogTail();
  {
    Pg other(url2);
    EXPECT_EQ(other.Int(fmt::format("SELECT count(*) FROM {} WHERE offset_acked IS NOT NULL",
                                    QuoteIdent(name_))),
              0)
        << "the refused relay marked rows it never published";
    other.Exec(fmt::format("SELECT pg_drop_replication_slot('{}')", slot2));
  }
  for (int i = 0; i < 50; ++i) {
    try {
      db_->Exec("DROP DATABASE IF EXISTS " + QuoteIdent(db2));
      break;
    } catch (const std::exception&) {
      std::this_thread::sleep_for(milliseconds(200));
    }
  }
}

// #3. The progress is read read_committed, up to the partition's last
// stable offset: another producer's transaction open in the progress topic
// (another relay frozen in its commit window, or killed inside it) hid this
// relay's newer records, and a restart published again what they covered
// (16 duplicates of 898 rows). Each relay now has a progress topic of its
// own, and a read waits out any open transaction before it trusts what it
// read. Here the other producer writes this relay's own topic (a setting
// shared by mistake), its transaction open across a kill -9 under load.
TEST_F(ExactlyOnceHistory, AnotherProducersOpenTransactionDoesNotMakeTheProgressStale) {
  CreateTables();
  Ledger ledger;
  const std::string progress = topic_prefix_ + ".progress";
  RelayProcess* relay = &StartRelay(Eos());
  ASSERT_TRUE(WaitStreaming(*relay, seconds(60))) << relay->LogTail();
  LoadGenerator load(Workload(), &ledger, 2, MixedTx, std::chrono::microseconds(3000));
  load.Start();
  std::this_thread::sleep_for(milliseconds(1500));
  // Opened now: the relay's records after it are beyond the stable offset.
  auto foreign = std::make_unique<OpenKafkaTransaction>(env_.kafka_brokers, "it.foreign." + name_,
                                                        progress, "another-relay");
  std::this_thread::sleep_for(milliseconds(2500));
  relay->Kill(SIGKILL);
  relay->Wait(seconds(10));
  // Its transaction ends a few seconds into the restart.
  std::thread ender([&] {
    std::this_thread::sleep_for(seconds(4));
    foreign->Abort();
  });
  relay = &StartRelay(Eos());
  ASSERT_TRUE(WaitStreaming(*relay, seconds(90))) << relay->LogTail();
  ender.join();
  std::this_thread::sleep_for(milliseconds(1000));
  ASSERT_EQ(load.Stop(), "");
  EXPECT_EQ(WaitAllAcked(seconds(120)), 0) << DescribeUnacked();
  relay->Terminate();
  EXPECT_EQ(relay->Wait(seconds(40)), std::optional<int>(0)) << relay->LogTail();
  EXPECT_NE(relay->Log().find("another producer's transaction is open"), std::string::npos)
      << "the restart did not see the open transaction:\n"
      << relay->LogTail(40);
  Check(ledger.committed(), Committed(), "restart behind another producer's open transaction");
}

// #4. The slot is lost while the relay is down, after Kafka committed rows the
// marker had not marked yet (a kill -9 between the two). The reconcile
// backfill finds them unacked; fb76bda published them again (8 duplicates of
// 654 rows). The progress record lists them, and the backfill marks them.
TEST_F(ExactlyOnceHistory, ALostSlotsBackfillDoesNotPublishAgainWhatKafkaHolds) {
  CreateTables();
  Ledger ledger;
  // Marking once a second: Kafka commits every 20 ms, so under load Kafka
  // holds rows the table does not show marked.
  RelayProcess* relay = &StartRelay(Eos({"--marker-interval-ms", "1000"}));
  ASSERT_TRUE(WaitStreaming(*relay, seconds(60))) << relay->LogTail();
  int64_t unacked_at_kill = 0;
  {
    LoadGenerator load(Workload(), &ledger, 2, MixedTx, std::chrono::microseconds(3000));
    load.Start();
    std::this_thread::sleep_for(milliseconds(2500));
    unacked_at_kill = UnackedRows();
    relay->Kill(SIGKILL);
    relay->Wait(seconds(10));
    ASSERT_EQ(load.Stop(), "");
  }
  EXPECT_GT(unacked_at_kill, 0) << "everything was marked before the kill: nothing to prove";
  db_->Exec(fmt::format("SELECT pg_drop_replication_slot('{}')", name_));
  relay = &StartRelay(Eos());
  ASSERT_TRUE(relay->WaitForLog("backfill: publishing", seconds(60))) << relay->LogTail();
  ASSERT_TRUE(WaitStreaming(*relay, seconds(90))) << relay->LogTail();
  EXPECT_EQ(WaitAllAcked(seconds(120)), 0) << DescribeUnacked();
  relay->Terminate();
  EXPECT_EQ(relay->Wait(seconds(40)), std::optional<int>(0)) << relay->LogTail();
  Check(ledger.committed(), Committed(), "backfill after a lost slot");
  // The start read the record listing what Kafka held unmarked: "...; N runs
  // of rows it holds may be unmarked".
  std::smatch m;
  std::string log = relay->Log();
  EXPECT_TRUE(std::regex_search(log, m, std::regex("; ([0-9]+) runs of rows it holds may be")))
      << "Kafka held no unmarked row at the kill: nothing to prove\n"
      << relay->LogTail(40);
  if (!m.empty()) {
    fmt::print("lost slot: {} rows unacked at the kill, {} transactions of them in Kafka\n",
               unacked_at_kill, m[1].str());
  }
}

}  // namespace
}  // namespace outbox_test
