// PostgreSQL restarts under load (DESIGN §2.1, §2.3): `pg_ctl restart -m fast`
// (sessions terminated, clean checkpoint) and `-m immediate` (a crash: WAL
// replay on start, slots as of the last checkpoint) of a cluster of the
// test's own, while writers keep writing. The relay must reconnect with
// backoff and resume at the confirmed position: nothing lost, nothing out of
// order. Writers whose COMMIT got no answer do not know whether it happened,
// so the rows the test expects are the rows the table holds afterwards.
#include <fmt/format.h>
#include <unistd.h>

#include <thread>

#include "fixture.h"
#include "resilience_support.h"
#include "support/throwaway_pg.h"

namespace outbox_test {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;
using namespace resilience;

class ResiliencePg : public RelayTest {};

size_t Count(const std::string& text, const std::string& needle) {
  size_t n = 0;
  for (size_t p = 0; (p = text.find(needle, p)) != std::string::npos; p += needle.size()) ++n;
  return n;
}

TEST_F(ResiliencePg, RestartFastAndImmediateUnderLoad) {
  ThrowawayPostgres cluster(FreeLocalPort(26400 + static_cast<int>(getpid() % 300)),
                            "-c wal_level=logical -c max_wal_senders=4 -c max_replication_slots=4");
  db_ = std::make_unique<Pg>(cluster.url());
  CreateTables();
  RelayProcess& relay = StartRelay({}, {{"DATABASE_URL", cluster.url()}});
  ASSERT_TRUE(WaitStreaming(relay)) << relay.LogTail();
  WorkloadOptions options = Workload();
  options.database_url = cluster.url();

  Ledger ledger;
  LoadGenerator load(
      options, &ledger, 2,
      [](std::mt19937_64& rng) {
        TxSpec tx;
        tx.rows = 1 + static_cast<int>(rng() % 20);
        tx.rollback = rng() % 10 == 0;
        if (rng() % 10 == 0) tx.savepoint_rolled_back_rows = 2;
        return tx;
      },
      std::chrono::microseconds(3000), LoadGenerator::OnFailure::kReconnect);
  load.Start();

  struct Restart {
    const char* mode;
    double restart_s = 0;    // pg_ctl restart
    double streaming_s = 0;  // from the server being back to the relay streaming again
  };
  std::vector<Restart> restarts = {{"fast"}, {"immediate"}};
  for (Restart& r : restarts) {
    std::this_thread::sleep_for(seconds(3));  // load flows first
    size_t sessions = Count(relay.Log(), "streaming from slot");
    auto t0 = std::chrono::steady_clock::now();
    PgCtl(cluster, fmt::format("restart -m {}", r.mode));
    r.restart_s = SecondsSince(t0);
    auto back = std::chrono::steady_clock::now();
    while (Count(relay.Log(), "streaming from slot") <= sessions && SecondsSince(back) < 60 &&
           relay.Running()) {
      std::this_thread::sleep_for(milliseconds(50));
    }
    r.streaming_s = SecondsSince(back);
    ASSERT_TRUE(relay.Running()) << "the relay exited after restart -m " << r.mode << ":\n"
                                 << relay.LogTail();
    ASSERT_GT(Count(relay.Log(), "streaming from slot"), sessions)
        << "the relay did not stream again within 60 s of restart -m " << r.mode << ":\n"
        << relay.LogTail();
  }
  std::this_thread::sleep_for(seconds(2));  // and after the last restart
  (void)load.Stop();                        // failures are expected here: load.failures()

  db_ = std::make_unique<Pg>(cluster.url());  // the old session died with the server
  auto catch_up = std::chrono::steady_clock::now();
  int64_t unacked = WaitAllAcked(seconds(120));
  double catch_up_s = SecondsSince(catch_up);
  EXPECT_EQ(unacked, 0) << DescribeUnacked();
  EXPECT_EQ(MisackedRows(), 0);
  EXPECT_TRUE(relay.Running()) << relay.LogTail();

  // What committed: the table. Every commit a writer saw acknowledged is in it.
  std::vector<WrittenRow> committed = RowsFromTable(*db_, name_);
  std::set<std::string> in_table;
  for (const WrittenRow& w : committed) in_table.insert(w.uuid);
  size_t acknowledged = 0, missing = 0;
  for (const WrittenRow& w : ledger.committed()) {
    ++acknowledged;
    if (!in_table.contains(w.uuid)) ++missing;
  }
  std::vector<KafkaRecord> records = ReadTopics({.timeout = seconds(60)});
  DeliveryReport delivery = CheckDelivery(committed, ledger.rolled_back(), records);
  std::string log = relay.Log();

  fmt::print(
      "pg restarts under load: {} writer transactions, {} writer failures (first: {}); {} rows "
      "in the table, {} acknowledged to the writers ({} of those missing), {} in doubt\n",
      load.transactions(), load.failures(),
      load.first_error().substr(0, load.first_error().find('\n')), committed.size(), acknowledged,
      missing, committed.size() - (acknowledged - missing));
  for (const Restart& r : restarts) {
    fmt::print("restart -m {}: pg_ctl {:.1f} s; relay streaming again {:.1f} s later\n", r.mode,
               r.restart_s, r.streaming_s);
  }
  fmt::print(
      "relay: {} replication sessions, {} replication errors logged, {} setup retries; "
      "catch-up {:.1f} s after the load stopped\n",
      Count(log, "streaming from slot"), Count(log, "replication: "), Count(log, "retrying in"),
      catch_up_s);
  fmt::print("{}\n", delivery.Summary());

  EXPECT_EQ(missing, 0u) << "commits acknowledged to a writer are not in the table";
  EXPECT_EQ(delivery.lost, 0u) << delivery.Samples();
  EXPECT_EQ(delivery.phantom, 0u) << delivery.Samples();
  EXPECT_EQ(delivery.order_violations, 0u) << delivery.Samples();
  EXPECT_EQ(delivery.split_aggregates, 0u) << delivery.Samples();

  relay.Terminate();
  EXPECT_EQ(relay.Wait(seconds(40)), std::optional<int>(0)) << relay.LogTail();
  fmt::print("total {:.1f} s\n", SecondsSince(started_));
}

}  // namespace
}  // namespace outbox_test
