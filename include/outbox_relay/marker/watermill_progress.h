// Watermill's progress, written the way watermill-sql's polling subscriber
// writes it, so a team can switch back to the polling forwarder (or a relay
// can backfill after a lost slot) without republishing what was published.
//
// What the subscriber keeps, per topic and consumer group, in
// "watermill_offsets_<topic>": (last_processed_transaction_id, offset_acked),
// a position in (transaction_id, "offset") order. Its rule for "processed":
// every row at or before that position. It only reads rows whose
// transaction_id is below pg_snapshot_xmin(pg_current_snapshot()) — rows of
// transactions with a smaller xid than every running one — so that no
// transaction can still commit behind its position. The relay keeps the same
// invariant: it moves a table's position to a row (x, o) only when every row
// with a transaction id below the bound it uses has been delivered to Kafka,
// and the bound is below every transaction that could still commit.
//
// The bound (the "horizon"). The relay receives transactions in commit order,
// not xid order. So it samples, on the marker's connection,
//   xmin = pg_snapshot_xmin(pg_current_snapshot()), then W = pg_current_wal_insert_lsn()
// (in one statement: its snapshot is taken before W is read). Every
// transaction with an xid below xmin had finished when the snapshot was
// taken, so its commit record ends at or before W. Once the tracker says
// every transaction ending at or before W is delivered
// (AckTracker::DeliveredThrough), xmin is a safe bound: the position may
// move to the last row (in (transaction_id, "offset") order) of the table
// with a transaction id below xmin. It is read from the table itself:
//   SELECT transaction_id, "offset" FROM <table> WHERE transaction_id < $xmin
//    ORDER BY transaction_id DESC, "offset" DESC LIMIT 1     (the primary key, backwards)
// and written with the subscriber's own upsert, never backwards.
//
// The confirmation rule holds as it is: a transaction is confirmed only
// after Kafka acknowledged it and a marking round (the commit index and this
// writer's positions) committed after that. The positions may lag the
// confirmed transactions: a transaction's rows are covered once every
// transaction with a smaller xid has finished and been delivered — the same
// wait the subscriber has, which one long transaction anywhere in the
// cluster stretches. The relay does not hold the slot for that (it would
// stall the stream behind such a transaction, and deadlock with the
// backpressure); what is not covered yet is published again at most once on
// a switch to the polling forwarder (counted as duplicates).
//
// Backfills (first start, lost slot, a table joining the publication) have
// no LSNs; they write positions themselves (AdvanceTo), with the snapshot's
// xmin as the bound, and turn the streaming rule off meanwhile
// (SetStreaming).
//
// One table's failure is that table's alone (ProgressWriter's contract): a
// position that cannot be written (its table dropped or renamed, an
// ACCESS EXCLUSIVE lock held on it by a TRUNCATE or a migration, a row
// locked by a polling forwarder) is retried for that table with a backoff,
// while the other tables' positions, the commit index and the slot move on.
// The marker's connections wait at most kLockTimeout for a lock, so that a
// lock held for minutes holds nobody else. An offsets table dropped while
// the relay runs is created again (watermill-sql's own DDL) and the
// position written anew. Which table fails, since when and why is
// Failing(): /readyz reports it once it lasts (--readyz-stall-timeout-s).
// Tables that are gone are unfollowed by pipeline::WatermillTables (pattern)
// or stop the relay (listed), which then calls SetTables.
//
// Threads: AfterMark and Idle on the marker thread; SetStreaming from the
// loop thread; AdvanceTo on the caller's own connection; Failing anywhere.
#pragma once

#include <atomic>
#include <chrono>
#include <deque>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "outbox_relay/core/lsn.h"
#include "outbox_relay/core/result.h"
#include "outbox_relay/marker/marker.h"
#include "outbox_relay/pg/connection.h"
#include "outbox_relay/tracking/ack_tracker.h"

namespace outbox_relay::marker {

struct WatermillProgressTable {
  pg::QualifiedName messages;  // "watermill_<topic>"
  pg::QualifiedName offsets;   // "watermill_offsets_<topic>"
};

// (last_processed_transaction_id, offset_acked) of a consumer group.
struct WatermillPosition {
  uint64_t transaction_id = 0;
  int64_t offset = 0;
};

class WatermillProgress final : public ProgressWriter {
 public:
  WatermillProgress(std::vector<WatermillProgressTable> tables, std::string consumer_group,
                    tracking::AckTracker* tracker);

  // The streaming rule applies only while the relay streams (a backfill's
  // transactions have no LSN for DeliveredThrough to be about).
  void SetStreaming(bool on);
  // A table joined while the relay ran (before the next stream starts).
  void SetTables(std::vector<WatermillProgressTable> tables);

  Status AfterMark(pg::Connection& conn) override;
  Status Idle(pg::Connection& conn) override;
  std::string Failing() const override;
  std::string SessionSettings() const override;

  // A position write waits this long for a lock, then fails for its table alone.
  static constexpr std::chrono::milliseconds kLockTimeout{200};

  // watermill-sql's DDL of an offsets table (as its subscriber creates it).
  static std::string CreateOffsetsSql(const pg::QualifiedName& offsets);

  // Moves `table`'s position for `group` to the last row with a transaction
  // id below `below_xid` and at or before `upto` (when given); never back.
  // Returns the position written (nullopt: nothing to move to, or not further).
  static Result<std::optional<WatermillPosition>> AdvanceTo(
      pg::Connection& conn, const WatermillProgressTable& table, const std::string& group,
      uint64_t below_xid, std::optional<WatermillPosition> upto = std::nullopt);

  uint64_t positions_written() const { return written_.load(); }

 private:
  struct Sample {
    uint64_t xmin = 0;
    Lsn wal;
    std::chrono::steady_clock::time_point at;
  };
  // Per table: how far its position is written, and its failure, if any.
  struct TableState {
    uint64_t written_bound = 0;                             // the bound last written with
    std::chrono::steady_clock::time_point failing_since{};  // {}: not failing
    std::chrono::steady_clock::time_point retry_at{};
    std::chrono::milliseconds backoff{0};
    std::string error;
  };
  Status Advance(pg::Connection& conn);
  // One table's position; an error that is the table's own is noted in
  // `state` and returns ok; the connection's is returned.
  Status AdvanceTable(pg::Connection& conn, const WatermillProgressTable& table, uint64_t bound,
                      TableState& state);

  std::vector<WatermillProgressTable> tables_;
  std::vector<TableState> state_;  // parallel to tables_
  uint64_t generation_ = 0;        // bumped by every change of tables_
  std::string group_;
  tracking::AckTracker* tracker_;
  std::atomic<bool> streaming_{false};
  std::atomic<bool> tables_changed_{false};
  std::vector<WatermillProgressTable> next_tables_;  // under mu_ via tables_changed_
  mutable std::mutex mu_;
  std::deque<Sample> samples_;
  uint64_t bound_ = 0;  // the newest safe bound found
  std::chrono::steady_clock::time_point last_idle_{};
  std::atomic<uint64_t> written_{0};
};

}  // namespace outbox_relay::marker
