// `--table-mode=watermill`: watermill-sql's own tables instead of the house
// outbox table.
//
//   which tables   the ones listed (--watermill-tables, and the forwarder's
//                  envelope tables, --watermill-forwarder-tables), and every
//                  table matching --watermill-table-pattern that has
//                  watermill-sql's columns, followed as new ones appear
//   their topics   "watermill_<topic>" -> <topic>, or --watermill-topic-map
//                  (a name the application chose, or one PostgreSQL cut at
//                  63 bytes, which cannot be read back)
//   progress       the consumer group's row in "watermill_offsets_<topic>"
//                  (marker::WatermillProgress), never a per-row column
//   first start    the rows the group has not processed, by watermill-sql's
//                  own rule: (transaction_id, "offset") after the group's
//                  (last_processed_transaction_id, offset_acked)
//
// Tables joining the publication. A table that is not in the publication
// yet (a new topic, or a new entry in the list) joins it between two stream
// sessions, in one transaction that
//   LOCK TABLE t IN SHARE MODE         waits for every transaction that has
//                                      inserted into t, and holds new inserts
//                                      back until the commit
//   ALTER PUBLICATION p ADD TABLE t
//   stores pg_current_snapshot()       in outbox_relay.state ('watermill_catchup:<t>')
// Logical decoding judges publication membership at each change's position:
// rows inserted after the commit are streamed; every row inserted before it
// belongs to a transaction that had finished when the snapshot was taken.
// So the rows visible in that snapshot (and not yet processed by the group)
// are exactly the ones the stream will never send: the catch-up publishes
// them before the next session starts, and a crash in between finds the
// stored snapshot again. The lock waits at most --watermill-join-lock-timeout
// (then the join is retried at the next session): inserts into that table
// wait that long at most.
//
// While streaming, a thread looks for new matching tables every
// --watermill-discover-interval-s and asks the session to end between
// transactions; a Relation for a selected table the session does not know
// (another instance joined it) ends the session too (kTransient).
//
// Rows the group had processed when a session starts are skipped
// (ColumnMap::processed): after the polling forwarder ran for a while, the
// relay resumes without republishing what it published.
//
// Tables that change under the relay. The discovery thread also notices a
// followed table that is gone (dropped, renamed) or no longer has
// watermill-sql's columns, and the TableRouter a Relation that says so
// (OnUnrouted); either ends the session between transactions, and
// BeforeStream resolves the tables again:
//   - listed (--watermill-tables, --watermill-forwarder-tables): the relay
//     delivers what it read and stops, naming the table and the setting;
//   - matched by the pattern: the table is unfollowed (no position is
//     written for it any more) but stays "retired": rows written to it
//     before it went, which the stream sends under its old name, are still
//     published. A name that ended a session once and still cannot be
//     followed is retired likewise (the relay restarted meanwhile), or
//     skipped when its topic cannot be told: a table never stalls the
//     stream by ending session after session.
//   - truncated: nothing to do for the stream (it carries inserts only);
//     a TRUNCATE's lock held on the table delays that table's position
//     only (marker::WatermillProgress);
//   - its offsets table dropped: created again by the progress writer.
//
// Threads: everything on the loop thread, except the discovery thread (its
// own connection; it only sets end_requested).
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "outbox_relay/core/mutex.h"
#include "outbox_relay/core/result.h"
#include "outbox_relay/marker/watermill_progress.h"
#include "outbox_relay/outbox/record.h"
#include "outbox_relay/pg/connection.h"
#include "outbox_relay/pipeline/progress_report.h"
#include "outbox_relay/pipeline/publisher.h"
#include "outbox_relay/pipeline/stats.h"
#include "outbox_relay/pipeline/stop.h"
#include "outbox_relay/pipeline/tables.h"
#include "outbox_relay/tracking/ack_tracker.h"

namespace outbox_relay::pipeline {

// '*' matches any run of characters, everything else itself.
bool GlobMatch(std::string_view pattern, std::string_view text);

struct WatermillSettings {
  std::vector<pg::QualifiedName> tables;             // direct tables, listed
  std::vector<pg::QualifiedName> forwarder_tables;   // envelope tables, listed
  std::optional<pg::QualifiedName> pattern;          // its name may hold '*'
  std::map<std::string, std::string> topics;         // "schema.table" -> topic
  std::map<std::string, pg::QualifiedName> offsets;  // "schema.table" -> offsets table
  std::string consumer_group;

  // The table is listed, or matches the pattern.
  bool Selects(std::string_view schema, std::string_view name) const;
  bool IsForwarder(const pg::QualifiedName& table) const;
};

struct WatermillOptions {
  std::string database_url;
  std::string publication;
  std::string slot;
  bool mark = true;  // write positions (false: a benchmark without marking)
  int64_t backfill_batch = 5000;
  std::chrono::milliseconds join_lock_timeout{2000};
  std::chrono::seconds discover_interval{10};
};

// The selected tables with watermill-sql's shape, their topics and offsets
// tables. Listed tables must exist and fit (kInvalidArgument naming the
// setting); tables matched only by the pattern that do not fit are left out
// (`skipped` says why).
struct ResolvedTables {
  std::vector<OutboxTable> tables;
  std::vector<std::string> skipped;
};
Result<ResolvedTables> ResolveWatermillTables(pg::Connection& conn, const WatermillSettings& s);

// What is wrong with `table`'s columns for watermill-sql's schema (empty: fits).
Result<std::string> WatermillShapeProblem(pg::Connection& conn, const pg::QualifiedName& table);

// The group's position per table ("schema.table"); tables without an
// offsets row (or table) are absent.
Result<std::map<std::string, outbox::TablePosition>> ReadWatermillPositions(
    pg::Connection& conn, const std::vector<OutboxTable>& tables, const std::string& group);

// The statement that creates watermill-sql's offsets table (its own DDL).
std::string OffsetsTableDdl(const pg::QualifiedName& offsets);
std::string CreateWatermillPublicationSql(std::string_view publication,
                                          const std::vector<OutboxTable>& tables);

class WatermillTables {
 public:
  WatermillTables(WatermillSettings settings, WatermillOptions options, Publisher* publisher,
                  tracking::AckTracker* tracker, RelayStats* stats, StopSignal* stop,
                  marker::WatermillProgress* progress);
  ~WatermillTables();
  WatermillTables(const WatermillTables&) = delete;
  WatermillTables& operator=(const WatermillTables&) = delete;

  // At start: the tables, their offsets tables (created when missing), the
  // publication (created, or checked and joined).
  Status Prepare(pg::Connection& conn);
  // SlotSetup's backfill: every table's rows visible in the slot's snapshot
  // that the group has not processed. Pending catch-ups are covered by it.
  Status Backfill(pg::Connection& conn, const std::string& snapshot);
  // Before every stream session: under the slot's setup lock, resolve the
  // tables again, join new ones, run pending catch-ups, read the positions.
  // kSlotInUse: another instance holds the lock (we are its standby).
  Status BeforeStream();

  const std::vector<OutboxTable>& tables() const { return tables_; }
  // What the stream routes: the followed tables and the retired ones.
  std::vector<OutboxTable> routed_tables() const;
  // TableRouter::Unrouted, on the loop thread: true (and the session ends)
  // the first time a Relation names a selected table that is not routed, or
  // a routed table renamed or no longer fitting; false after that, or for a
  // table the settings do not select.
  bool OnUnrouted(std::string_view schema, std::string_view name, const OutboxTable* previous);
  const std::map<std::string, outbox::TablePosition>& positions() const { return positions_; }

  // Looks for selected tables outside the publication while the stream runs.
  void StartDiscovery();
  void StopDiscovery();
  const std::atomic<bool>* end_requested() const { return &end_requested_; }
  // Ends the stream session between transactions (a Relation for a table
  // the session does not know yet).
  void RequestEnd() { end_requested_.store(true); }

 private:
  Status Resolve(pg::Connection& conn);
  Status EnsureOffsetsTables(pg::Connection& conn);
  Status EnsurePublication(pg::Connection& conn);
  Status Join(pg::Connection& conn, const OutboxTable& table);
  Status CatchUp(pg::Connection& conn);
  // Publishes `table`'s rows visible in `snapshot` after the group's
  // position, page by page, each page delivered and the position moved to
  // its last row below `bound_xid` before the next.
  // `progress` (may be null) is updated once a page with `*rows`.
  Status PublishTable(pg::Connection& conn, const OutboxTable& table, const std::string& snapshot,
                      uint64_t bound_xid, uint64_t* rows, ProgressReport* progress);
  // The parameters of kUnprocessedRows for `table` (watermill.cc): the
  // snapshot and the group's position.
  Result<std::array<std::optional<std::string>, 3>> UnprocessedParams(pg::Connection& conn,
                                                                      const OutboxTable& table,
                                                                      const std::string& snapshot);
  // How many rows PublishTable would publish: those of `tables` visible in
  // `snapshot` after the group's position. nullopt (said in the log) when it
  // cannot be counted: the work goes on without a total.
  std::optional<uint64_t> CountUnprocessed(pg::Connection& conn,
                                           const std::vector<OutboxTable>& tables,
                                           const std::string& snapshot);
  Status WaitDelivered();
  void UpdateProgressTables();
  void DiscoveryLoop();
  // After Resolve (`resolved`) and the joins: the tables followed `before`
  // that no longer resolve, and the names that ended a session without being
  // followed since, become retired ones.
  void Retire(const std::vector<OutboxTable>& before, const std::vector<OutboxTable>& resolved);

  const WatermillSettings settings_;
  const WatermillOptions options_;
  Publisher* const publisher_;
  tracking::AckTracker* const tracker_;
  RelayStats* const stats_;
  StopSignal* const stop_;
  marker::WatermillProgress* const progress_;  // null without marking
  std::vector<OutboxTable> tables_;
  std::vector<OutboxTable> retired_;  // routed, no position written
  std::map<std::string, outbox::TablePosition> positions_;
  std::set<std::string> unrouted_seen_;            // OnUnrouted's keys
  std::vector<pg::QualifiedName> unrouted_names_;  // since the last BeforeStream

  std::atomic<bool> end_requested_{false};
  std::thread discovery_;
  StopLatch discovery_stop_;
  Mutex discovery_mu_;
  std::set<std::string> followed_names_ GUARDED_BY(discovery_mu_);
};

}  // namespace outbox_relay::pipeline
