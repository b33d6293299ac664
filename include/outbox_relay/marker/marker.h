// The marker: writes `offset_acked = offset_consumed` for delivered
// transactions and records them in the commit-LSN index, on its own
// connection, in batches (a large batch as two statements at once, on two
// connections: MarkerOptions::rows_worth_two_statements).
//
// It is the (b) half of the confirmation rule: the tracker hands it
// transactions whose rows Kafka has acknowledged; only after the marker's
// statement commits does the tracker consider them done, so the slot never
// moves past a row that the table still shows as unpublished. Marking is by
// primary key, exactly the rows the relay produced, as runs of consecutive
// offsets per xid8 (tracking::RowRange):
//   UPDATE outbox o SET offset_acked = o.offset_consumed FROM runs r
//    WHERE o.transaction_id = r.x AND o.offset_consumed BETWEEN r.first AND r.last
//      AND o.offset_acked IS NULL
// an index range scan on the primary key per run. Never by transaction_id
// alone: a backfill page can hold part of a transaction, and a publication
// row filter or a partition can keep some of its rows from the relay; a row
// marked without being delivered is never looked at again. Idempotent: a
// re-sent transaction marks nothing twice.
//
// Database errors are retried with backoff on a fresh connection; marking
// stalls meanwhile and the relay's backpressure holds the stream (the seed's
// reason db_ack).
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <unordered_set>
#include <vector>

#include "outbox_relay/core/result.h"
#include "outbox_relay/core/wal_history.h"
#include "outbox_relay/pg/connection.h"
#include "outbox_relay/tracking/ack_tracker.h"

namespace outbox_relay::marker {

// Progress kept somewhere other than a per-row acked column (watermill-sql's
// offsets tables, marker::WatermillProgress). Called on the marker's thread
// and connection: AfterMark after every marking statement, before the
// tracker learns the batch is marked (an error is retried with the batch,
// like a marking error); Idle when there was nothing to mark for a while,
// and once more when the marker stops.
//
// A failure of the connection fails the round (retried, as a marking error).
// A failure that concerns one part of the progress only (one Watermill
// table's position: its table dropped, locked, its offsets table gone)
// must not: the writer goes on with the rest, returns ok, and says what
// failed through Failing() until it succeeds again, so that one table never
// holds back the slot or another table's position.
class ProgressWriter {
 public:
  virtual ~ProgressWriter() = default;
  virtual Status AfterMark(pg::Connection& conn) = 0;
  virtual Status Idle(pg::Connection& conn) = 0;
  // What is failing without failing the rounds (one line; empty: nothing).
  virtual std::string Failing() const { return {}; }
  // Statements for each new marker connection, after the marker's own.
  virtual std::string SessionSettings() const { return {}; }
};

struct MarkerOptions {
  std::string database_url;
  pg::QualifiedName table;
  std::string transaction_id_column = "transaction_id";
  std::string offset_column = "offset_consumed";
  // Empty: no row is marked, only the commit index is written (and the
  // progress writer, if any, records progress).
  std::string acked_column = "offset_acked";
  ProgressWriter* progress = nullptr;  // not owned; outlives the marker
  std::string slot_name;
  size_t batch_max = 2000;  // transactions per statement
  // After the first delivered transaction, the marker waits this long for
  // more before its statement (unless batch_max are waiting): at a steady
  // rate one statement marks many transactions instead of one each. Delays
  // marking and confirmation (WAL retention, what a crash re-sends), never
  // Kafka. Zero: mark at once.
  std::chrono::milliseconds interval{0};
  // ...but not for a batch of at least this many rows, nor after a statement
  // that marked as many: a statement's fixed cost (~0.4 ms) is then a small
  // part of its rows' (~5-15 us each), and at a backlog's pace the statement
  // itself gathers the next batch. Without this the last transactions of a
  // drain waited a whole interval for nothing.
  uint64_t rows_worth_a_statement = 1000;
  // A batch of at least this many rows is marked by two statements at once,
  // each with half of its transactions, on two connections (the second one
  // opened when first needed): one backend marking a backlog's last batch
  // kept one core busy while the other waited. Zero: always one statement.
  uint64_t rows_worth_two_statements = 8000;
  // Called on the marker's thread after every marking statement that
  // succeeded (metrics).
  std::function<void()> on_statement;
  // Called on the marker's thread after the tracker has learnt of marked
  // transactions (the stream's loop then sends the slot's new position).
  std::function<void()> on_marked;
  // Called on the marker's thread after every round that had something to
  // do (a batch, or the progress writer's idle pass): ok, or what failed in
  // it (the statement, or ProgressWriter::Failing). /readyz and a metric.
  std::function<void(const Status& round)> on_round;
  // Connect and statement timeouts: a black-holed connection fails its
  // statement and is replaced (pg::NetworkOptions).
  pg::NetworkOptions network;
};

class Marker {
 public:
  using ErrorHook = std::function<void(const Error&)>;

  Marker(MarkerOptions options, tracking::AckTracker* tracker, ErrorHook on_error = {});
  ~Marker();
  Marker(const Marker&) = delete;
  Marker& operator=(const Marker&) = delete;

  // Connects and starts the thread. Fails when the first connection fails.
  Status Start();
  // Marks what is already delivered (bounded by `timeout`), then stops.
  void Stop(std::chrono::milliseconds timeout);
  // The timeline the stream reads the delivered transactions on (0: not
  // known yet, nothing checked). A connection to a server on another one
  // marks nothing (the batch waits for FollowTimeline): a standby promoted after the last WAL it
  // received hands out again the transaction ids the old primary used after it, so (xid, offset) of
  // a transaction read past that point can name another row there. The relay sets it when the
  // tracker holds nothing of an older timeline.
  void ExpectTimeline(uint32_t timeline) { SetTimeline(timeline, kEndOfWal); }
  // After a promotion, while the tracker still holds transactions read on
  // the old timeline: the server writes `timeline`, which took over the old
  // one's WAL below `shared_below`. Transactions that end at or below it are
  // the same transactions there and are marked; the others (and backfilled
  // rows, which carry no position) go back to the tracker as unmarkable: the
  // pipeline restarts and sends their rows again if the server has them.
  void FollowTimeline(uint32_t timeline, Lsn shared_below) { SetTimeline(timeline, shared_below); }
  // Its last connection found the server on another timeline than the one
  // set: nothing is marked until the relay follows it (FollowTimeline), so
  // waiting for the marks is pointless meanwhile. Any thread.
  bool timeline_refused() const { return timeline_refused_.load(); }

  // The statement text (exposed for tests and `check`).
  static std::string MarkSql(const MarkerOptions& options);
  // Run once on the marker's connection, before the statement is prepared.
  // Rows are found by primary key, never by reading the whole table: plans
  // made for each statement's arrays (and the planner's disk-based costs)
  // chose a sequential scan of the table for some batches of 250 or 2,000
  // transactions, and a generic plan, which cannot know a batch's size, chose
  // one on a table of 20,000 rows. With sequential scans ruled out, one
  // generic plan fits every batch (a nested loop over the runs, probing the
  // primary key), and no statement is planned again: planning each one cost
  // about 0.2 ms, a third of a 10-transaction statement's CPU.
  static constexpr const char* kSessionSettings =
      "SET plan_cache_mode = force_generic_plan; SET enable_seqscan = off";

 private:
  // A connection and the buffers of one statement's parameters.
  struct Lane {
    std::optional<pg::Connection> conn;
    std::string run_xids, run_firsts, run_lasts, commit_lsns, end_lsns, times, counts, tx_xids,
        more_xids;
    std::vector<uint64_t> ids;
    std::unordered_set<uint64_t> commits;  // commit LSNs already in the statement
    std::vector<uint64_t> invisible;       // the statement's transaction ids not yet visible
  };

  void Loop();
  // Tells options_.on_round how the round went.
  void Report(const Status& round);
  // Opens lane `i`'s connection; lane 0's also reads indexed_through_.
  // Refuses (timeline_refused_) a server on another timeline than timeline_.
  Status Connect(size_t i);
  void Disconnect();
  // Marks the visible transactions of `batch` into `marked`; the ones whose
  // commit is not visible yet go to `not_visible`.
  Status MarkBatch(const std::vector<tracking::Transaction*>& batch,
                   std::vector<tracking::Transaction*>* marked,
                   std::vector<tracking::Transaction*>* not_visible);
  // One statement on `lane` for `part`: fills lane.invisible.
  Status MarkPart(Lane& lane, std::span<tracking::Transaction* const> part,
                  const std::string& indexed_through);
  // Where `batch` is cut into two statements' halves; 0 when it is one
  // statement.
  size_t SplitPoint(const std::vector<tracking::Transaction*>& batch);
  // Exactly-once: reads where the server's standbys are, after marks
  // committed, for the tracker's standby marks: at most every 100 ms while
  // marks are kept, every second otherwise. A failed read changes nothing.
  void ReadStandbys();

  MarkerOptions options_;
  tracking::AckTracker* tracker_;
  ErrorHook on_error_;
  std::array<Lane, 2> lanes_;
  std::thread thread_;
  std::atomic<bool> stopping_{false};
  std::atomic<int64_t> deadline_ns_{0};
  // Set by Stop() once its timeout has passed with the thread still running:
  // a statement waiting for an answer on a silent connection is given up
  // (pg::Connection::set_abort) instead of holding the shutdown for its
  // whole deadline.
  std::atomic<bool> aborted_{false};
  std::atomic<bool> exited_{false};  // Loop has returned
  void SetTimeline(uint32_t timeline, Lsn shared_below);
  // The transactions of `batch` that end above shared_below_ (none when the
  // stream's timeline is the server's): moved out of `batch`.
  std::vector<tracking::Transaction*> TakeUnshared(std::vector<tracking::Transaction*>* batch);

  std::atomic<uint32_t> timeline_{0};  // ExpectTimeline, FollowTimeline
  std::atomic<uint64_t> shared_below_{kEndOfWal.value()};
  std::atomic<bool> timeline_refused_{false};  // the last Connect met another timeline
  // No commit of this slot above it is in the commit index, but for another
  // instance's (see MarkSql): read when connecting, raised by each statement.
  Lsn indexed_through_;
  std::chrono::steady_clock::time_point standbys_read_{};  // ReadStandbys' last read
  bool standbys_hidden_said_ = false;
};

}  // namespace outbox_relay::marker
