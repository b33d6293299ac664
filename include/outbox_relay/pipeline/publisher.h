// Publisher: rows in, Kafka records out, deliveries back into the tracker.
//
//   row ──RecordMapper──▶ record ──Sink::Produce──▶ (sink's threads) ──▶ OnDelivery
//    │                                                                    │
//    └─ poison ──▶ dead letter ──Sink::Produce                 ack ──▶ AckTracker::OnDelivered
//                                                     refused record ──▶ refused queue
//                                                                         │
//   DeadLetterRefused (loop thread) ◀─────────────────────────────────────┘
//
// It owns the mapping (RecordMapper), the dead letters (DeadLetterBuilder) and
// the Sink; the AckTracker counts every message it hands over. Marking is by
// the primary keys of the rows whose record (or dead letter) the sink took:
// NoteRow happens only after the sink accepted it.
//
// Backpressure: Produce waits while the sink's queue is full (or a topic is
// still being prepared), and meanwhile calls the KeepAlive it is given (the
// stream session sends its status updates) — never longer than the stop
// grace once a stop is asked for: then it gives up with kCancelled.
//
// Threads: everything from the loop thread, except OnDelivery, which the
// sink calls on its own threads (one per producer lane). A record the broker
// refused for good is not dead-lettered there: the poller is the only thread
// that frees producer queue space, so it must never wait for some. It is
// queued, and the loop thread dead-letters it (DeadLetterRefused).
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "outbox_relay/core/result.h"
#include "outbox_relay/kafka/producer.h"
#include "outbox_relay/kafka/sink.h"
#include "outbox_relay/metrics/metrics.h"
#include "outbox_relay/outbox/dead_letter.h"
#include "outbox_relay/outbox/record.h"
#include "outbox_relay/pipeline/kafka_progress.h"
#include "outbox_relay/pipeline/stats.h"
#include "outbox_relay/pipeline/stop.h"
#include "outbox_relay/tracking/ack_tracker.h"

namespace outbox_relay::pipeline {

// What becomes of a row that cannot be published as itself.
enum class OnPoison {
  kDeadLetter,  // to the dead-letter topic, marked, and the stream goes on
  kHalt,        // stop before it, confirming nothing past it
};

struct PublisherOptions {
  std::string table;  // "schema.name": named in dead letters and messages
  outbox::MapperOptions mapper;
  outbox::ColumnNames columns;
  OnPoison on_poison = OnPoison::kDeadLetter;
  std::string dlq_topic = "outbox-relay.dlq";
  size_t dlq_max_bytes = 1000000;
  int64_t max_in_flight = 20000;                // rows produced, not yet acknowledged
  int64_t max_in_flight_bytes = 1 << 20;        // their bytes the sink holds (BytesInFlight)
  size_t max_awaiting_mark = 8000;              // delivered transactions not yet marked
  std::chrono::milliseconds stop_grace{12500};  // waits give up this long after a stop
  // Distinct topics rows may go to (--max-topics): the topic comes from the
  // row (the template), and each new one costs the producer a topic handle
  // kept for good, a wait for its metadata and, with --create-topics, a
  // topic on the cluster. A row whose topic would be one more is poison.
  size_t max_topics = 1000;
};

// Log lines whose number rows decide (one per dead-lettered row): at most
// `burst` per `window`, then one line saying how many were left out.
// The loop thread's.
class LogBudget {
 public:
  LogBudget(int burst, std::chrono::seconds window) : burst_(burst), window_(window) {}
  // True when this line may be logged. `*suppressed` is set to the lines
  // left out since the last one logged (to say so in it).
  bool Allow(uint64_t* suppressed);

 private:
  const int burst_;
  const std::chrono::seconds window_;
  std::chrono::steady_clock::time_point window_start_{};
  int used_ = 0;
  uint64_t suppressed_ = 0;
};

// Exactly-once delivery (--delivery=exactly-once): the sink is a
// transactional producer; consecutive PostgreSQL transactions go into one
// Kafka transaction together with a progress record (KafkaProgress, in
// `progress_topic` under `key`), committed every `interval` or `max_rows`.
// The interval counts from the Kafka transaction's first row. The stream
// session bounds its wait for the server by CommitDueAt, so a lone row
// commits on its interval, not on the server's next message.
// A commit is two steps on a worker thread: its records are flushed (all
// acknowledged), then the producer hands the transaction over and the
// coordinator commits it while the loop fills the next Kafka transaction on
// the producer's other lane. During the flush the loop reads on: the next
// transaction's records wait in the publisher (within the in-flight window)
// and go to the producer at the hand-over, after every record of the one
// before. The next one commits only after the first has: a Kafka
// transaction fails, and is aborted, with every transaction after it.
// A PostgreSQL transaction of the open Kafka transaction is held (tracker
// Hold) until that commits; if it aborts, the transaction is abandoned and
// the session ends (kAborted): the slot sends it again, and what Kafka already
// has (at or before the committed progress) is marked but not produced again.
struct TransactionOptions {
  std::string progress_topic = "outbox-relay.progress";
  std::string key;  // the relay's identity: its transactional.id
  std::chrono::milliseconds interval{20};
  int64_t max_rows = 10000;
  // Failpoint: false produces again what Kafka already has (the harness proves
  // it would see the duplicates).
  bool skip_committed = true;
};

// Called while the publisher waits, to keep the walsender content.
class KeepAlive {
 public:
  virtual ~KeepAlive() = default;
  virtual Status Touch() = 0;
};

class Publisher {
 public:
  static Result<std::unique_ptr<Publisher>> Create(PublisherOptions options,
                                                   tracking::AckTracker* tracker, RelayStats* stats,
                                                   metrics::Metrics* metrics, StopSignal* stop);
  ~Publisher();  // joins a commit or abort in progress
  Publisher(const Publisher&) = delete;
  Publisher& operator=(const Publisher&) = delete;

  // The sink records go to; it must report to DeliveryCallback(). Owned
  // until CloseSink (which joins its threads).
  void AttachSink(std::unique_ptr<kafka::Sink> sink);
  kafka::DeliveryCallback DeliveryCallback();
  void CloseSink();
  bool has_sink() const { return sink_ != nullptr; }
  kafka::Sink* sink() const { return sink_.get(); }

  // Maps one row of `tx` and produces its record, or its dead letter. An
  // error stops the stream: kFatal (halt on poison, a broken sink, a row
  // that cannot be identified), kCancelled (stop requested while Kafka takes
  // nothing).
  Status MapAndProduce(const outbox::ColumnMap& columns, const pgoutput::TupleData& row,
                       tracking::Transaction* tx, KeepAlive* keep);
  // Dead-letters the records the sink's threads handed over (loop thread).
  Status DeadLetterRefused(KeepAlive* keep);
  // Forgets them instead, for a restart from the slot after CloseSink: the
  // server sends their rows again and the broker refuses them again.
  void DropRefused();

  // Too much in flight: the loop should stop reading. InFlightFull: the rows
  // produced and not yet acknowledged, or their bytes, reached their bound
  // and have not yet fallen to three quarters of it;
  // Backpressured: that, or too much waits for the marker or a Kafka
  // transaction's commit.
  bool InFlightFull() const;
  bool Backpressured() const;
  bool Reachable() const;
  int64_t BytesInFlight() const;  // the sink's (0 without one)
  Status Flush(std::chrono::milliseconds timeout);

  // TEST ONLY (failpoint): the producer fails fatally after `n` records.
  void InjectFatalAfter(uint64_t n, std::function<void()> inject);

  // --- exactly-once (loop thread) -------------------------------------------
  // `producer` is the attached sink, transactional and initialised;
  // `committed` what Kafka holds (read back at start).
  void EnableTransactions(TransactionOptions options, kafka::KafkaProducer* producer,
                          KafkaProgress committed);
  bool transactional() const { return txn_.has_value(); }
  // Commits the open Kafka transaction when it is due (its interval, its
  // rows, or a full in-flight window; or `force`), and
  // finishes a commit or an abort in progress. kAborted: the open Kafka
  // transaction was aborted and the session must end; kFatal (fenced).
  Status Tick(bool force = false);
  // Commits the open Kafka transaction and waits for it, at most `timeout`
  // (a session that ends for a reason other than an abort, shutdown).
  Status FinishTransaction(std::chrono::milliseconds timeout, KeepAlive* keep);
  // Aborts the open Kafka transaction (if any) and waits for it, at most
  // `timeout`: what it held is sent again.
  Status AbortTransaction(std::chrono::milliseconds timeout);
  // When the loop must look again: the open Kafka transaction's commit is
  // due by its interval, or one ending may have ended (time_point::max():
  // nothing to wait for).
  std::chrono::steady_clock::time_point CommitDueAt() const;
  // The transaction `tx` is read to its Commit.
  void NotePgCommit(tracking::Transaction* tx);
  // The backfill under way (its stored snapshot), or none.
  void SetBackfill(std::optional<std::string> snapshot);
  const KafkaProgress& committed_progress() const { return committed_; }

 private:
  struct RefusedRecord {
    tracking::Transaction* tx = nullptr;
    std::string uuid;
    std::optional<std::string> value;
    std::string reason;
  };

  Publisher(PublisherOptions options, outbox::RecordMapper mapper, tracking::AckTracker* tracker,
            RelayStats* stats, metrics::Metrics* metrics, StopSignal* stop);
  Status DeadLetter(const Error& reason, const outbox::RowIdentity& identity,
                    const outbox::ColumnMap& columns, const pgoutput::TupleData& row,
                    tracking::Transaction* tx, KeepAlive* keep);
  // Tracker count + Offer.
  Status Produce(const outbox::KafkaRecord& record, tracking::Transaction* tx, KeepAlive* keep);
  // Offers `record` until the sink takes it; no tracker accounting.
  Status Offer(const outbox::KafkaRecord& record, tracking::Transaction* tx, KeepAlive* keep);
  void OnDelivery(const kafka::Delivery& delivery);  // the sink's threads

  const PublisherOptions options_;
  tracking::AckTracker* const tracker_;
  RelayStats* const stats_;
  metrics::Metrics* const metrics_;
  StopSignal* const stop_;
  outbox::RecordMapper mapper_;
  outbox::DeadLetterBuilder dead_letters_;
  // The topics rows went to (at most options_.max_topics; loop thread).
  std::set<std::string, std::less<>> topics_;
  LogBudget dead_letter_log_{20, std::chrono::seconds(60)};
  std::unique_ptr<kafka::Sink> sink_;
  uint64_t fatal_after_ = 0;  // failpoint
  std::function<void()> inject_fatal_;

  std::mutex refused_mu_;  // the sink's threads push, the loop thread takes
  std::vector<RefusedRecord> refused_;
  std::atomic<bool> has_refused_{false};

  // Exactly-once state: the loop thread's, but for `must_abort_`,
  // `refused_uuids_` (the sink's threads write) and the worker's result.
  // kFlushing: the ending Kafka transaction's records are being flushed (the
  // next one's wait in deferred_); kCommitting: it was handed over and is
  // committing; kAborting: every Kafka transaction not committed is being
  // aborted (the loop reads nothing).
  enum class TxnState { kIdle, kFlushing, kCommitting, kAborting };
  Status JoinTransaction(tracking::Transaction* tx);
  Status StartCommit();
  void StartAbort(std::string reason);
  // The worker's step the loop has to see: a hand-over, then its end.
  Status Poll();
  // Calls `step` (a bounded wait) until it is done or fails for good; a
  // stop request gives up after the stop grace (kCancelled).
  Status RetryStep(const std::function<Status(std::chrono::milliseconds)>& step) const;
  // How often the loop looks whether a commit handed over has ended.
  static constexpr std::chrono::milliseconds kCommitPoll{2};
  Status FinishWorker();
  std::optional<TransactionOptions> txn_;
  kafka::KafkaProducer* producer_ = nullptr;
  KafkaProgress committed_;  // what Kafka holds, committed
  KafkaProgress pending_;    // what it holds once the open Kafka transaction commits
  std::optional<std::string> backfill_snapshot_;
  bool txn_open_ = false;
  int64_t txn_rows_ = 0;
  std::chrono::steady_clock::time_point txn_started_;  // its first row
  std::chrono::steady_clock::time_point commit_started_;
  std::vector<tracking::Transaction*> txn_members_;  // held until the commit
  TxnState state_ = TxnState::kIdle;
  // The Kafka transaction ending (kFlushing, kCommitting), or one whose
  // commit failed and is to be aborted with the open one: its members, what
  // Kafka holds once it commits, and its producer lane once handed over.
  bool ending_ = false;
  std::vector<tracking::Transaction*> ending_members_;
  KafkaProgress ending_progress_;
  int ending_lane_ = 0;                   // written by the worker before handed_over_
  std::atomic<bool> handed_over_{false};  // ... and it stays set until the next StartCommit
  // The open Kafka transaction's first rows, read while the one before is
  // flushed: it begins, and they go to the producer, at the hand-over.
  bool begin_deferred_ = false;
  // Their transactions in order; their topic, event type, key, value and
  // headers one after another in deferred_data_, with the lengths in
  // deferred_lengths_ (-1: no key or value; before the headers, their count).
  // Cleared, not freed, at each hand-over: no allocation per row.
  std::vector<tracking::Transaction*> deferred_;
  std::string deferred_data_;
  std::vector<int64_t> deferred_lengths_;
  int64_t deferred_bytes_ = 0;
  void Defer(const outbox::KafkaRecord& record, tracking::Transaction* tx);
  // At the hand-over: begins the open transaction and produces deferred_.
  Status ProduceDeferred();
  void DropDeferred();
  int aborting_ = 0;  // Kafka transactions the abort under way ends
  // InFlightFull's hysteresis (the loop thread's alone): set at the bound,
  // cleared at three quarters of it.
  mutable bool in_flight_full_ = false;
  std::string abort_reason_;
  std::string progress_value_;  // the progress record being committed
  std::thread worker_;          // runs a blocking flush and commit, or the aborts
  std::atomic<bool> worker_done_{false};
  Status worker_result_;
  std::atomic<bool> must_abort_{false};
  std::mutex refused_uuids_mu_;
  // Refused by the broker in an aborted transaction; std::less<> looks a
  // row's uuid up as a string_view (no allocation per row).
  std::set<std::string, std::less<>> refused_uuids_;
  std::string must_abort_reason_;  // guarded by refused_uuids_mu_
};

}  // namespace outbox_relay::pipeline
