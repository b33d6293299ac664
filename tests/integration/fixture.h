// The common fixture of the integration tests: per-test unique names (outbox
// table, unpublished side table, slot, publication, topic prefix), the relay's
// command line for them, and cleanup of everything the test created.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "support/delivery.h"
#include "support/env.h"
#include "support/kafka.h"
#include "support/pg.h"
#include "support/relay_process.h"
#include "support/throwaway_pg.h"
#include "support/workload.h"

namespace outbox_test {

class RelayTest : public ::testing::Test {
 protected:
  void SetUp() override;
  void TearDown() override;

  // Creates the outbox table (seed schema) and the side table.
  void CreateTables();

  // `outbox-relay run` for this test's table, slot, publication and topics, plus `extra`
  // (a "--flag value" pair in `extra` replaces the fixture's value of that flag).
  std::vector<std::string> RelayArgs(const std::vector<std::string>& extra = {}) const;
  // Starts a relay (owned by the fixture, killed at TearDown at the latest).
  RelayProcess& StartRelay(const std::vector<std::string>& extra = {},
                           std::map<std::string, std::optional<std::string>> env = {});
  // Waits until the relay logs that it streams (false: it did not within `timeout`).
  static bool WaitStreaming(RelayProcess& relay,
                            std::chrono::milliseconds timeout = std::chrono::seconds(30));

  WorkloadOptions Workload() const;

  // `extra` and the arguments of --delivery exactly-once (the progress topic
  // under this test's prefix, a shutdown bound for the last transaction).
  std::vector<std::string> Eos(std::vector<std::string> extra = {}) const;

  // One row of this test's table, inserted by `pg` (inside its transaction,
  // if one is open): aggregate `agg`, event type `event_type` of service
  // `service`, payload {"agg":...,"seq":...} (padded with `pad` bytes), with
  // Go-marshalled metadata; and the record the contract says it becomes.
  // `stored_payload` replaces the payload in the table (the expectation keeps
  // the normal one: for rows that are expected not to arrive as themselves).
  struct RowSpec {
    std::string service = "small";
    std::string event_type = "small.made";
    std::string agg = "small-1";
    int64_t seq = 1;
    size_t pad = 0;
    std::optional<std::string> created_at;      // default: the column's default
    std::optional<std::string> stored_payload;  // default: the expected payload
    std::optional<int64_t> offset;              // default: the column's sequence
  };
  WrittenRow InsertRow(Pg& pg, const RowSpec& spec);

  // Polls until no row of the outbox table is unacked; returns the unacked count left.
  int64_t WaitAllAcked(std::chrono::milliseconds timeout);
  // Rows whose offset_acked is NULL, and rows whose offset_acked differs from offset_consumed.
  int64_t UnackedRows();
  // The unacked rows (first few): offset, uuid, xid, whether the commit index
  // has their transaction (then the relay published it and believes it marked).
  std::string DescribeUnacked();
  int64_t MisackedRows();

  // Polls the slot (default: the fixture's) until confirmed_flush_lsn >= `lsn`;
  // returns the last value seen.
  uint64_t WaitConfirmedAtLeast(uint64_t lsn, std::chrono::milliseconds timeout,
                                const std::string& slot = "");

  // The commit-LSN index (outbox_relay.commits) against the committed
  // transactions: one row per transaction with outbox rows, one xid, the right
  // row_count. Adds a failure per problem (the first few) and prints the figures.
  void CheckCommitIndex(const Ledger& ledger);

  // Every record in this test's topics, from the beginning, once the topics are stable.
  std::vector<KafkaRecord> ReadTopics(const ReadOptions& options = {});
  std::map<std::string, int> PartitionCounts(const std::vector<KafkaRecord>& records);

  // A PostgreSQL cluster of this test's own, set up as scripts/services sets
  // up the shared one; DATABASE_URL (the fixture's, the relays', the
  // writers') names it until TearDown. Called by SetUp with
  // OUTBOX_IT_OWN_CLUSTER=1 (the tests of the lane `side`, so that the shared
  // cluster carries one test's WAL, catalog changes and walsender traffic at a
  // time), or first thing by a test that measures the whole cluster.
  void UseOwnCluster();

  std::unique_ptr<ThrowawayPostgres> own_cluster_;
  std::optional<std::string> shared_database_url_;  // DATABASE_URL before UseOwnCluster
  Env env_;
  std::string name_;  // it_<test>_<pid>: table, slot and publication
  std::string other_table_;
  std::string topic_prefix_;
  std::unique_ptr<Pg> db_;
  std::unique_ptr<KafkaReader> kafka_;
  std::vector<std::unique_ptr<RelayProcess>> relays_;
  std::chrono::steady_clock::time_point started_;
};

// Seconds since `t`, for the printed figures.
double SecondsSince(std::chrono::steady_clock::time_point t);

}  // namespace outbox_test
