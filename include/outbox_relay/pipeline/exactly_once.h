// ExactlyOnce: the exactly-once delivery protocol (--delivery=exactly-once),
// one unit: the Kafka transaction, the progress record, the decision that a
// re-sent row is already in Kafka, and the commit worker.
//
//   Start: fence (InitTransactions) → read the progress → trust it (TrustedProgress)
//   per row: Admit (held? then marked, not produced) → Join → the row's record
//            goes to the sink inside the open Kafka transaction → Produced
//   Tick:    the open Kafka transaction commits on its interval, its rows or a
//            full in-flight window, with a progress record of what Kafka then holds
//
// Consecutive PostgreSQL transactions go into one Kafka transaction together
// with the progress record (KafkaProgress, in the relay's progress topic under
// its transactional.id). The interval counts from the Kafka transaction's
// first row; the stream session bounds its wait for the server by
// CommitDueAt, so a lone row commits on its interval, not on the server's next
// message.
//
// A commit is two steps on a worker thread: its records are flushed (all
// acknowledged), then the sink hands the transaction over and the coordinator
// commits it while the loop fills the next Kafka transaction on the sink's
// other lane. During the flush the loop reads on: the next transaction's
// records wait here (Defer, within the in-flight window) and go to the sink at
// the hand-over, after every record of the one before. The next one commits
// only after the first has: a Kafka transaction fails, and is aborted, with
// every transaction after it.
//
// A PostgreSQL transaction of the open Kafka transaction is held (tracker
// Hold) until that commits; if it aborts, the transaction is abandoned and the
// session ends (kAborted): the slot sends it again, and what Kafka already has
// (what the trusted progress holds) is marked but not produced again.
//
// Trust (DESIGN §2.8): a progress record must be this relay's (kInvalidArgument
// otherwise), and holds only on the WAL history the server has now: after a
// promotion or a restore (Rebase with the new facts) a position beyond the
// fork holds nothing. When in doubt, produce again.
//
// Threads: everything from the loop thread, except OnDelivery (the sink's
// threads) and the worker (flush, commit, abort: the sink's blocking calls).
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "outbox_relay/core/mutex.h"
#include "outbox_relay/core/result.h"
#include "outbox_relay/kafka/sink.h"
#include "outbox_relay/metrics/metrics.h"
#include "outbox_relay/outbox/record.h"
#include "outbox_relay/pipeline/kafka_progress.h"
#include "outbox_relay/pipeline/keep_alive.h"
#include "outbox_relay/pipeline/stop.h"
#include "outbox_relay/tracking/ack_tracker.h"

namespace outbox_relay::pipeline {

struct TransactionOptions {
  std::chrono::milliseconds interval{20};
  int64_t max_rows = 10000;
  std::chrono::milliseconds init_timeout{30000};
  // Failpoint: false produces again what Kafka already has (the harness proves
  // it would see the duplicates).
  bool skip_committed = true;
};

class ExactlyOnce {
 public:
  // How a record reaches the sink: the publisher's Offer (waits while the
  // sink's queue is full, answering the walsender meanwhile).
  using Offer =
      std::function<Status(const outbox::KafkaRecord&, tracking::Transaction*, KeepAlive*)>;
  struct Parts {
    kafka::TransactionalSink* sink = nullptr;  // not owned (the publisher's)
    kafka::ProgressLog* log = nullptr;         // not owned
    tracking::AckTracker* tracker = nullptr;
    metrics::Metrics* metrics = nullptr;
    StopSignal* stop = nullptr;
    Offer offer;
    std::function<bool()> in_flight_full;
    // A record the broker refuses for good goes to the dead-letter topic
    // when the slot sends its row again (else it stops the relay).
    bool dead_letter_refused = true;
    std::chrono::milliseconds stop_grace{12500};
  };

  ExactlyOnce(TransactionOptions options, Parts parts);
  ~ExactlyOnce();  // gives up a commit or abort in progress and joins it
  ExactlyOnce(const ExactlyOnce&) = delete;
  ExactlyOnce& operator=(const ExactlyOnce&) = delete;

  // Fences every earlier producer of the transactional.id, makes sure of the
  // progress topic and reads what Kafka holds, trusted for `facts`.
  // kInvalidArgument: the record is another relay's, or of a newer format.
  Status Start(const ProgressFacts& facts);
  // The server's history or the slot's incarnation changed (a promotion, a
  // recreated slot): trust the newest record again for `facts`. Only between
  // Kafka transactions (nothing open).
  Status Rebase(const ProgressFacts& facts);
  // How to read the server's WAL end now (IDENTIFY_SYSTEM's xlogpos). Start
  // and Rebase read it after the fencing, in place of the facts' own: those
  // were gathered before, and the instance this one takes over from may have
  // published past that position meanwhile, on WAL the server has; against
  // the stale position its record would look restored away, be trusted for
  // nothing, and what it published come twice. None: the facts' is used.
  void ReadWalEndWith(std::function<Result<Lsn>()> read) { read_wal_end_ = std::move(read); }
  const KafkaProgress& committed() const { return committed_; }
  const ProgressFacts& facts() const { return facts_; }

  // --- per row (loop thread) ----------------------------------------------
  enum class Verdict {
    kHeld,     // Kafka has it, committed: mark it, do not produce it
    kProduce,  // produce it, in the open Kafka transaction (joined)
    kRefused,  // the broker refused it for good in an aborted transaction: dead-letter it
  };
  Result<Verdict> Admit(tracking::Transaction* tx, uint64_t row_index,
                        const outbox::RowIdentity& id);
  // Its record (or dead letter) was taken: the open Kafka transaction holds it.
  void Produced(const tracking::Transaction& tx, uint64_t row_index, const outbox::RowIdentity& id);
  // While a Kafka transaction is flushed, the next one's records wait here.
  bool deferring() const { return state_ == State::kFlushing; }
  void Defer(const outbox::KafkaRecord& record, tracking::Transaction* tx);
  int64_t deferred_bytes() const { return deferred_bytes_; }
  bool aborting() const { return state_ == State::kAborting; }
  // A commit or an abort is under way; a Kafka transaction is open.
  bool busy() const { return state_ != State::kIdle; }
  bool has_open() const { return txn_open_; }

  // --- the sink's threads ----------------------------------------------------
  // A delivery report; true when it was this unit's to settle (a record that
  // failed inside a Kafka transaction, the progress record).
  bool OnDelivery(const kafka::Delivery& d);

  // --- loop thread -------------------------------------------------------------
  // Commits the open Kafka transaction when it is due (its interval, its rows,
  // a full in-flight window, or `force`) and finishes a commit or abort in
  // progress. kAborted: the open Kafka transaction was aborted and the session
  // must end; kFenced: another producer took the transactional.id over.
  Status Tick(bool force = false);
  // Commits the open Kafka transaction and waits for it, at most `timeout`.
  Status Finish(std::chrono::milliseconds timeout, KeepAlive* keep);
  // Aborts the open Kafka transaction (if any) and waits, at most `timeout`:
  // what it held is sent again.
  Status Abort(std::chrono::milliseconds timeout);
  // When the loop must look again (time_point::max(): nothing to wait for).
  Clock::time_point CommitDueAt() const;
  // The transaction `tx` was read to its Commit.
  void NotePgCommit(tracking::Transaction* tx);
  // The backfill under way (its stored snapshot), or none.
  void SetBackfill(std::optional<std::string> snapshot);

 private:
  enum class State {
    kIdle,
    kFlushing,    // the ending Kafka transaction's records are flushed (the next one's deferred)
    kCommitting,  // it was handed over and commits
    kAborting,    // every Kafka transaction not committed is aborted (the loop reads nothing)
  };
  // Trusts `value` (the newest record, or none) for `facts`.
  Status Trust(const std::optional<std::string>& value, const ProgressFacts& facts);
  // `facts` with the WAL end read now (ReadWalEndWith), when there is a reader.
  Result<ProgressFacts> WithWalEndNow(const ProgressFacts& facts);
  // The record under the key in the topic relays before 0.2 shared, when it
  // holds more than `own` (the log's ReadShared); nullopt otherwise.
  std::optional<std::string> NewerSharedRecord(const std::string& own, const ProgressFacts& facts);
  Status Join(tracking::Transaction* tx);
  Status StartCommit();
  void StartAbort(std::string reason);
  // The progress record of the Kafka transaction about to commit.
  void BuildRecord();
  // The worker's step the loop has to see: a hand-over, then its end.
  Status Poll();
  Status FinishWorker();
  // Calls `step` (a bounded wait) until it is done or fails for good; a stop
  // request gives up after the stop grace (kCancelled).
  Status RetryStep(const std::function<Status(std::chrono::milliseconds)>& step) const;
  // At the hand-over: begins the open transaction and produces deferred_.
  Status ProduceDeferred();
  void DropDeferred();

  // How often the loop looks whether a commit handed over has ended.
  static constexpr std::chrono::milliseconds kCommitPoll{2};

  const TransactionOptions options_;
  const Parts parts_;
  std::function<Result<Lsn>()> read_wal_end_;  // ReadWalEndWith
  kafka::TransactionalSink* const sink_;
  tracking::AckTracker* const tracker_;

  ProgressFacts facts_;
  std::string last_value_;  // the newest record committed (or read at Start)
  bool has_last_value_ = false;
  // What Kafka holds, committed, as far as this relay may trust it; its
  // unmarked rows are those a record read at Start or Rebase listed (kept
  // until no backfill is pending and the slot is confirmed past them).
  KafkaProgress committed_;
  KafkaProgress pending_;  // what it holds once the open Kafka transaction commits
  std::optional<std::string> backfill_snapshot_;
  State state_ = State::kIdle;
  bool txn_open_ = false;
  int64_t txn_rows_ = 0;
  Clock::time_point txn_started_;  // its first row
  Clock::time_point commit_started_;
  std::vector<tracking::Transaction*> txn_members_;  // held until the commit
  // The Kafka transaction ending (kFlushing, kCommitting), or one whose
  // commit failed and is to be aborted with the open one: its members, what
  // Kafka holds once it commits, and its lane once handed over.
  bool ending_ = false;
  std::vector<tracking::Transaction*> ending_members_;
  KafkaProgress ending_progress_;
  int ending_lane_ = 0;                   // written by the worker before handed_over_
  std::atomic<bool> handed_over_{false};  // ... and it stays set until the next StartCommit
  // The open Kafka transaction's first rows, read while the one before is
  // flushed: it begins, and they go to the sink, at the hand-over.
  bool begin_deferred_ = false;
  // Their transactions in order; their topic, event type, key, value and
  // headers one after another in deferred_data_, with the lengths in
  // deferred_lengths_ (-1: no key or value; before the headers, their count).
  // Cleared, not freed, at each hand-over: no allocation per row.
  std::vector<tracking::Transaction*> deferred_;
  std::string deferred_data_;
  std::vector<int64_t> deferred_lengths_;
  int64_t deferred_bytes_ = 0;
  int aborting_ = 0;  // Kafka transactions the abort under way ends
  std::string abort_reason_;
  ProgressRecord record_;       // reused: the record being built
  std::string progress_value_;  // the progress record being committed
  std::thread worker_;          // a blocking flush and commit, or the aborts
  std::atomic<bool> worker_done_{false};
  std::atomic<bool> giving_up_{false};  // the destructor: the worker stops retrying
  Status worker_result_;
  std::atomic<bool> must_abort_{false};
  Mutex refused_mu_;  // the sink's threads write, the loop thread reads
  // Refused by the broker in an aborted transaction; std::less<> looks a
  // row's uuid up as a string_view (no allocation per row).
  std::set<std::string, std::less<>> refused_uuids_ GUARDED_BY(refused_mu_);
  std::string must_abort_reason_ GUARDED_BY(refused_mu_);
};

}  // namespace outbox_relay::pipeline
