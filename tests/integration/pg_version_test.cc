// What differs between the PostgreSQL majors the relay supports (14 to 18),
// checked on the major under test (scripts/test runs this suite on each):
//
// - the matrix really runs the major it says (a cluster left on 15 would make
//   every other major's run a copy of 15's);
// - 14 sends every transaction as Begin/Commit, also one that changed nothing
//   the publication holds (the marker's own UPDATEs among them): an idle relay
//   must then still be idle, not feed the marker its own writes;
// - pg_replication_slots has more columns on newer majors: `slot status`
//   shows what the server has (conflicting 16+; invalidation_reason,
//   inactive_since, failover, synced 17+) and null for the rest;
// - --failover-slot needs 17 (older majors: refused at start, naming it); on
//   17+ it creates the slot with failover = true, and alters an existing one;
// - 18 invalidates a slot that stayed inactive longer than
//   idle_replication_slot_timeout (invalidation_reason idle_timeout): `check`
//   says so, and run recovers by backfill, nothing lost.
#include <fmt/format.h>
#include <unistd.h>

#include <thread>

#include "fixture.h"
#include "ops_support.h"
#include "support/throwaway_pg.h"

namespace outbox_test {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

class PgVersion : public RelayTest {
 protected:
  int ServerMajor(Pg& db) { return static_cast<int>(db.Int("SHOW server_version_num") / 10000); }
};

TEST_F(PgVersion, TheServerIsTheMajorUnderTest) {
  const int major = TestPgVersion();
  EXPECT_EQ(ServerMajor(*db_), major)
      << "DATABASE_URL's server is not PostgreSQL " << major
      << " (OUTBOX_PG_VERSION): eval \"$(scripts/services env)\" after switching";
  ThrowawayPostgres cluster(FreeLocalPort(25660 + static_cast<int>(getpid() % 30)), "");
  Pg cdb(cluster.url());
  EXPECT_EQ(ServerMajor(cdb), major) << "a test's own cluster runs another major";
  fmt::print("PostgreSQL {} (services and throwaway clusters): {}\n", major,
             *db_->Scalar("SELECT version()"));
}

TEST_F(PgVersion, AnIdleRelayStaysIdleAfterItsWork) {
  // A cluster of the test's own: the WAL counted is the cluster's, and the
  // tests of the other lane write to the shared one (15,397,272 bytes in 4 s
  // in one CI run, where this relay wrote next to nothing).
  UseOwnCluster();
  CreateTables();
  RelayProcess& relay = StartRelay();
  ASSERT_TRUE(WaitStreaming(relay)) << relay.LogTail();
  Ledger ledger;
  {
    Writer writer(Workload(), &ledger, -1, 11);
    for (int i = 0; i < 40; ++i) {
      ASSERT_TRUE(writer.Transaction({.rows = 1 + i % 3, .other_table_rows = i % 2}));
    }
    writer.OtherTableOnly(5);
  }
  ASSERT_EQ(WaitAllAcked(seconds(60)), 0) << relay.LogTail();
  std::this_thread::sleep_for(seconds(2));  // the last marking and status updates settle

  auto commits = [&] {
    return db_->Int("SELECT count(*) FROM outbox_relay.commits WHERE slot_name = $1", {name_});
  };
  int64_t indexed = commits();
  uint64_t wal_before = CurrentWalLsn(*db_);
  std::this_thread::sleep_for(seconds(4));
  uint64_t wal_growth = CurrentWalLsn(*db_) - wal_before;
  fmt::print("idle for 4 s after 40 transactions: commit index {} -> {} rows, {} bytes of WAL\n",
             indexed, commits(), wal_growth);
  // One row per transaction with outbox rows, none for the empty ones.
  EXPECT_EQ(indexed, 40);
  EXPECT_EQ(commits(), indexed) << "the relay indexes transactions nobody wrote";
  // A marker feeding on its own empty transactions writes without pause
  // (megabytes in 4 s); an idle relay writes next to nothing. Nothing else
  // writes to this cluster but its own background (autovacuum, a checkpoint),
  // so 256 KiB leaves room; the commit index above is the exact check.
  EXPECT_LT(wal_growth, 256u * 1024) << relay.LogTail();
  CheckCommitIndex(ledger);
}

TEST_F(PgVersion, SlotStatusShowsTheColumnsOfThisMajor) {
  const int major = TestPgVersion();
  db_->Exec("SELECT pg_create_logical_replication_slot($1, 'pgoutput')", {name_});
  CommandResult r = RunRelayCommand({"slot", "status", "--slot", name_, "--output", "json"},
                                    {{"DATABASE_URL", env_.database_url}});
  ASSERT_EQ(r.exit_code, 0) << r.Describe();
  EXPECT_EQ(JsonPath(*db_, r.out, "{wal_status}"), "reserved");
  EXPECT_EQ(JsonPath(*db_, r.out, "{conflicting}"),
            major >= 16 ? std::optional<std::string>("false") : std::nullopt)
      << r.out;
  EXPECT_EQ(JsonPath(*db_, r.out, "{failover}"),
            major >= 17 ? std::optional<std::string>("false") : std::nullopt)
      << r.out;
  EXPECT_EQ(JsonPath(*db_, r.out, "{synced}"),
            major >= 17 ? std::optional<std::string>("false") : std::nullopt)
      << r.out;
  EXPECT_EQ(JsonPath(*db_, r.out, "{inactive_since}").has_value(), major >= 17) << r.out;
  EXPECT_EQ(JsonPath(*db_, r.out, "{invalidation_reason}"), std::nullopt) << r.out;

  CommandResult text =
      RunRelayCommand({"slot", "status", "--slot", name_}, {{"DATABASE_URL", env_.database_url}});
  ASSERT_EQ(text.exit_code, 0) << text.Describe();
  EXPECT_EQ(text.out.find("failover") != std::string::npos, major >= 17) << text.out;
}

TEST_F(PgVersion, FailoverSlotFlagNeedsSeventeen) {
  const int major = TestPgVersion();
  CreateTables();
  if (major < 17) {
    RelayProcess& relay = StartRelay({"--failover-slot", "true"});
    EXPECT_EQ(relay.Wait(seconds(60)), std::optional<int>(2)) << relay.LogTail();
    std::string log = relay.Log();
    EXPECT_NE(log.find("invalid setting --failover-slot (OUTBOX_FAILOVER_SLOT)"), std::string::npos)
        << log;
    EXPECT_NE(log.find("PostgreSQL 17"), std::string::npos) << log;
    EXPECT_FALSE(QuerySlot(*db_, name_).has_value()) << "a refused setting created the slot";
    return;
  }
  // A slot created without failover (before the flag was set) is altered.
  RelayProcess& plain = StartRelay();
  ASSERT_TRUE(WaitStreaming(plain)) << plain.LogTail();
  plain.Terminate();
  ASSERT_EQ(plain.Wait(seconds(30)), std::optional<int>(0)) << plain.LogTail();
  auto failover = [&] {
    return db_->Scalar("SELECT failover::text FROM pg_replication_slots WHERE slot_name = $1",
                       {name_});
  };
  EXPECT_EQ(failover(), "false");
  // The walsender lets go of the slot a moment after the relay exits.
  for (int i = 0; i < 100 && QuerySlot(*db_, name_)->active; ++i) {
    std::this_thread::sleep_for(milliseconds(100));
  }
  RelayProcess& relay = StartRelay({"--failover-slot", "true"});
  ASSERT_TRUE(WaitStreaming(relay)) << relay.LogTail();
  EXPECT_EQ(failover(), "true") << relay.LogTail();

  // And a slot the flag creates has it from the start.
  relay.Terminate();
  ASSERT_EQ(relay.Wait(seconds(30)), std::optional<int>(0)) << relay.LogTail();
  DropRelayObjects(env_.database_url, name_, name_, {});
  RelayProcess& fresh = StartRelay({"--failover-slot", "true"});
  ASSERT_TRUE(WaitStreaming(fresh)) << fresh.LogTail();
  EXPECT_EQ(failover(), "true") << fresh.LogTail();
}

TEST_F(PgVersion, IdleTimeoutInvalidationOfEighteenIsReconciled) {
  const int major = TestPgVersion();
  ThrowawayPostgres cluster(FreeLocalPort(25660 + static_cast<int>(getpid() % 30)),
                            std::string("-c wal_level=logical -c max_wal_senders=4 "
                                        "-c max_replication_slots=4") +
                                (major >= 18 ? " -c idle_replication_slot_timeout=1" : ""));
  Pg cdb(cluster.url());
  if (major < 18) {
    // Nothing but WAL retention (max_slot_wal_keep_size) invalidates an idle
    // slot before 18: the setting does not exist.
    EXPECT_THROW(cdb.Exec("SHOW idle_replication_slot_timeout"), std::runtime_error);
    return;
  }
  db_ = std::make_unique<Pg>(cluster.url());
  CreateTables();
  std::map<std::string, std::optional<std::string>> env = {{"DATABASE_URL", cluster.url()}};
  RelayProcess& relay = StartRelay({}, env);
  ASSERT_TRUE(WaitStreaming(relay)) << relay.LogTail();
  Ledger ledger;
  WorkloadOptions options = Workload();
  options.database_url = cluster.url();
  Writer writer(options, &ledger, -1, 3);
  for (int i = 0; i < 10; ++i) ASSERT_TRUE(writer.Transaction({.rows = 2}));
  ASSERT_EQ(WaitAllAcked(seconds(60)), 0) << relay.LogTail();
  relay.Terminate();
  ASSERT_EQ(relay.Wait(seconds(30)), std::optional<int>(0)) << relay.LogTail();

  // Rows written while the relay is away; the slot idles past the timeout and
  // the next checkpoint invalidates it.
  for (int i = 0; i < 10; ++i) ASSERT_TRUE(writer.Transaction({.rows = 3}));
  std::this_thread::sleep_for(seconds(2));
  cdb.Exec("CHECKPOINT");
  EXPECT_EQ(cdb.Scalar("SELECT invalidation_reason FROM pg_replication_slots "
                       "WHERE slot_name = $1",
                       {name_}),
            "idle_timeout");

  CommandResult check =
      RunRelayCommand({"check", "--table", "public." + name_, "--slot", name_, "--publication",
                       name_, "--sample-rows", "0", "--dlq-topic", topic_prefix_ + ".dlq"},
                      env);
  EXPECT_EQ(check.exit_code, 1) << check.Describe();
  EXPECT_NE(check.out.find("invalidation_reason = idle_timeout"), std::string::npos)
      << check.Describe();

  RelayProcess& again = StartRelay({}, env);
  ASSERT_TRUE(WaitStreaming(again)) << again.LogTail();
  EXPECT_EQ(WaitAllAcked(seconds(60)), 0) << again.LogTail();
  std::string log = again.Log();
  EXPECT_NE(log.find("invalidation_reason=idle_timeout"), std::string::npos) << log;
  EXPECT_NE(log.find("backfill: publishing unacked rows"), std::string::npos) << log;
  DeliveryReport delivery = CheckDelivery(ledger.committed(), ledger.rolled_back(), ReadTopics());
  fmt::print("idle_timeout invalidation, then reconcile: {}\n", delivery.Summary());
  EXPECT_EQ(delivery.lost, 0u) << delivery.Samples();
  EXPECT_EQ(delivery.phantom, 0u) << delivery.Samples();
  EXPECT_EQ(delivery.order_violations, 0u) << delivery.Samples();
}

}  // namespace
}  // namespace outbox_test
