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

#include "outbox_relay/core/mutex.h"
#include "outbox_relay/core/result.h"
#include "outbox_relay/kafka/producer.h"
#include "outbox_relay/kafka/sink.h"
#include "outbox_relay/metrics/metrics.h"
#include "outbox_relay/outbox/dead_letter.h"
#include "outbox_relay/outbox/record.h"
#include "outbox_relay/pipeline/exactly_once.h"
#include "outbox_relay/pipeline/keep_alive.h"
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

class Publisher {
 public:
  static Result<std::unique_ptr<Publisher>> Create(PublisherOptions options,
                                                   tracking::AckTracker* tracker, RelayStats* stats,
                                                   metrics::Metrics* metrics, StopSignal* stop);
  ~Publisher();  // ends the exactly-once unit (a commit in progress), then the sink
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
  // Exactly-once delivery (ExactlyOnce, exactly_once.h): `sink` is the attached
  // sink, transactional; `log` where the progress is kept. The unit lives
  // until the sink is closed; ExactlyOnce::Start fences and reads back.
  ExactlyOnce* EnableTransactions(TransactionOptions options, kafka::TransactionalSink* sink,
                                  kafka::ProgressLog* log);
  ExactlyOnce* transactions() const { return eos_.get(); }
  bool transactional() const { return eos_ != nullptr; }
  // The unit's, when there is one (see ExactlyOnce); no-ops without.
  Status Tick(bool force = false) { return eos_ ? eos_->Tick(force) : Ok(); }
  Status FinishTransaction(std::chrono::milliseconds timeout, KeepAlive* keep) {
    return eos_ ? eos_->Finish(timeout, keep) : Ok();
  }
  Status AbortTransaction(std::chrono::milliseconds timeout) {
    return eos_ ? eos_->Abort(timeout) : Ok();
  }
  std::chrono::steady_clock::time_point CommitDueAt() const {
    return eos_ ? eos_->CommitDueAt() : std::chrono::steady_clock::time_point::max();
  }
  void NotePgCommit(tracking::Transaction* tx) {
    if (eos_) eos_->NotePgCommit(tx);
  }
  void SetBackfill(std::optional<std::string> snapshot) {
    if (eos_) eos_->SetBackfill(std::move(snapshot));
  }

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

  Mutex refused_mu_;  // the sink's threads push, the loop thread takes
  std::vector<RefusedRecord> refused_ GUARDED_BY(refused_mu_);
  std::atomic<bool> has_refused_{false};

  // InFlightFull's hysteresis (the loop thread's alone): set at the bound,
  // cleared at three quarters of it.
  mutable bool in_flight_full_ = false;
  // Exactly-once: declared after the sink, destroyed before it (it calls it).
  std::unique_ptr<ExactlyOnce> eos_;
};

}  // namespace outbox_relay::pipeline
