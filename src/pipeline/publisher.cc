#include "outbox_relay/pipeline/publisher.h"

#include <spdlog/spdlog.h>

#include <utility>

#include "outbox_relay/core/failpoint.h"

namespace outbox_relay::pipeline {

namespace {

using std::chrono::milliseconds;

}  // namespace

bool LogBudget::Allow(uint64_t* suppressed) {
  const auto now = std::chrono::steady_clock::now();
  if (now - window_start_ >= window_) {
    window_start_ = now;
    used_ = 0;
  }
  if (used_ >= burst_) {
    ++suppressed_;
    return false;
  }
  ++used_;
  *suppressed = std::exchange(suppressed_, 0);
  return true;
}

Result<std::unique_ptr<Publisher>> Publisher::Create(PublisherOptions options,
                                                     tracking::AckTracker* tracker,
                                                     RelayStats* stats, metrics::Metrics* metrics,
                                                     StopSignal* stop) {
  auto mapper = outbox::RecordMapper::Create(options.mapper);
  if (!mapper) return std::unexpected(mapper.error());
  return std::unique_ptr<Publisher>(
      new Publisher(std::move(options), std::move(*mapper), tracker, stats, metrics, stop));
}

Publisher::Publisher(PublisherOptions options, outbox::RecordMapper mapper,
                     tracking::AckTracker* tracker, RelayStats* stats, metrics::Metrics* metrics,
                     StopSignal* stop)
    : options_(std::move(options)),
      tracker_(tracker),
      stats_(stats),
      metrics_(metrics),
      stop_(stop),
      mapper_(std::move(mapper)),
      dead_letters_(options_.dlq_topic, options_.dlq_max_bytes, options_.columns) {}

Publisher::~Publisher() { CloseSink(); }

void Publisher::AttachSink(std::unique_ptr<kafka::Sink> sink) { sink_ = std::move(sink); }

kafka::DeliveryCallback Publisher::DeliveryCallback() {
  return [this](const kafka::Delivery& d) { OnDelivery(d); };
}

void Publisher::CloseSink() {
  eos_.reset();  // bound to this sink: a new one starts (and reads back) anew
  sink_.reset();
}

void Publisher::InjectFatalAfter(uint64_t n, std::function<void()> inject) {
  fatal_after_ = n;
  inject_fatal_ = std::move(inject);
}

bool Publisher::InFlightFull() const {
  const int64_t rows = tracker_->rows_in_flight();
  const int64_t bytes = BytesInFlight();
  if (rows >= options_.max_in_flight || bytes >= options_.max_in_flight_bytes) {
    in_flight_full_ = true;
  } else if (in_flight_full_ && rows <= options_.max_in_flight * 3 / 4 &&
             bytes <= options_.max_in_flight_bytes * 3 / 4) {
    // Read again only once a quarter of the window is free: resuming at the
    // first acknowledgement would produce one record per delivery report,
    // waking the loop and sending a batch of one each time.
    in_flight_full_ = false;
  }
  return in_flight_full_;
}

bool Publisher::Backpressured() const {
  return InFlightFull() || tracker_->awaiting_mark() >= options_.max_awaiting_mark ||
         (eos_ && eos_->aborting());
}

bool Publisher::Reachable() const { return sink_ != nullptr && sink_->Reachable(); }

int64_t Publisher::BytesInFlight() const {
  return (sink_ != nullptr ? sink_->BytesInFlight() : 0) + (eos_ ? eos_->deferred_bytes() : 0);
}

Status Publisher::Flush(milliseconds timeout) {
  if (sink_ == nullptr) return Ok();
  return sink_->Flush(timeout);
}

Status Publisher::MapAndProduce(const outbox::ColumnMap& columns, const pgoutput::TupleData& row,
                                tracking::Transaction* tx, KeepAlive* keep) {
  auto mapped = mapper_.Map(columns, row, tx->final_lsn);
  if (!mapped) return std::unexpected(mapped.error());
  const uint64_t row_index = tx->rows_seen++;
  if (mapped->already_processed) {
    // A Watermill table's row the consumer group had processed when the
    // stream started (the polling forwarder published it): not again.
    stats_->already_processed.fetch_add(1, std::memory_order_relaxed);
    return Ok();
  }
  std::optional<Error> refused_before;
  if (eos_) {
    auto verdict = eos_->Admit(tx, row_index, mapped->identity);
    if (!verdict) return std::unexpected(verdict.error());
    if (*verdict == ExactlyOnce::Verdict::kHeld) {
      // Kafka has it, committed: marked, not produced again.
      tracking::AckTracker::NoteRow(tx, mapped->identity.transaction_id, mapped->identity.offset);
      stats_->already_in_kafka.fetch_add(1, std::memory_order_relaxed);
      metrics_->rows_already_in_kafka().Increment();
      return Ok();
    }
    if (*verdict == ExactlyOnce::Verdict::kRefused) {
      refused_before = Error{ErrorCode::kPoison,
                             "the broker refused this record for good in an earlier (aborted) "
                             "Kafka transaction"};
    }
  }
  if (!mapped->poison && !refused_before && !topics_.contains(mapped->record->topic)) {
    if (topics_.size() >= options_.max_topics) {
      refused_before = Error{
          ErrorCode::kPoison,
          fmt::format("its topic '{}' would be one more than the {} topics this relay publishes "
                      "to (--max-topics, OUTBOX_MAX_TOPICS): a topic from instance data (a "
                      "request id in Event-Type?); raise the cap if the topics are real",
                      mapped->record->topic, options_.max_topics)};
    } else {
      topics_.emplace(mapped->record->topic);
    }
  }
  Status st = mapped->poison ? DeadLetter(*mapped->poison, mapped->identity, columns, row, tx, keep)
              : refused_before
                  ? DeadLetter(*refused_before, mapped->identity, columns, row, tx, keep)
                  : Produce(*mapped->record, tx, keep);
  if (!st && st.error().code == ErrorCode::kPoison && !mapped->poison) {
    // Refused by the producer itself (e.g. larger than message.max.bytes).
    st = DeadLetter(st.error(), mapped->identity, columns, row, tx, keep);
  }
  // Only a row whose record (or dead letter) the sink took is marked, once
  // it is acknowledged: never one whose production was given up.
  if (st) {
    tracking::AckTracker::NoteRow(tx, mapped->identity.transaction_id, mapped->identity.offset);
    if (eos_) eos_->Produced(*tx, row_index, mapped->identity);
  }
  return st;
}

Status Publisher::DeadLetter(const Error& reason, const outbox::RowIdentity& identity,
                             const outbox::ColumnMap& columns, const pgoutput::TupleData& row,
                             tracking::Transaction* tx, KeepAlive* keep) {
  metrics_->CountError(metrics::ErrorReason::kMarshal);
  if (options_.on_poison == OnPoison::kHalt) {
    return Fail(ErrorCode::kFatal,
                "poison row in {} (transaction_id={} offset={} uuid='{}', commit {}): {}. The "
                "relay stopped before it and confirmed nothing past it. It reads the row from "
                "the WAL, so it stops here again whatever is done to the row in the table: run "
                "with OUTBOX_ON_POISON=dlq (--on-poison=dlq) to send it to the dead-letter topic "
                "and go on, then republish a corrected row if it is needed.",
                columns.table.empty() ? options_.table : columns.table, identity.transaction_id,
                identity.offset, identity.uuid, tx->final_lsn, reason.message);
  }
  auto text = [&](int index) -> std::optional<std::string_view> {
    if (index < 0 || static_cast<size_t>(index) >= row.values.size()) return std::nullopt;
    const auto& v = row.values[static_cast<size_t>(index)];
    if (v.kind != pgoutput::TupleValue::Kind::kText) return std::nullopt;
    return v.text;
  };
  const outbox::KafkaRecord& record =
      dead_letters_.Build(reason, identity, columns.table.empty() ? options_.table : columns.table,
                          tx->final_lsn, text(columns.payload), text(columns.metadata));
  if (uint64_t left_out = 0; dead_letter_log_.Allow(&left_out)) {
    spdlog::warn("dead-lettering row transaction_id={} offset={} to {}: {}{}",
                 identity.transaction_id, identity.offset, options_.dlq_topic, reason.message,
                 left_out == 0 ? std::string()
                               : fmt::format(" ({} more dead-lettered rows not logged before this "
                                             "one: outbox_relay_dead_lettered_total)",
                                             left_out));
  }
  stats_->dead_lettered.fetch_add(1, std::memory_order_relaxed);
  auto st = Produce(record, tx, keep);
  if (!st && st.error().code != ErrorCode::kCancelled) {
    return Fail(ErrorCode::kFatal, "cannot dead-letter row transaction_id={} offset={}: {}",
                identity.transaction_id, identity.offset, st.error().message);
  }
  return st;
}

Status Publisher::Produce(const outbox::KafkaRecord& record, tracking::Transaction* tx,
                          KeepAlive* keep) {
  tracker_->AddMessage(tx);
  auto st = Offer(record, tx, keep);
  if (!st && !eos_ && st.error().code == ErrorCode::kAborted) {
    // At-least-once: the producer failed for good and is replaced (a
    // pipeline restart); this record goes again from the slot with the rest.
    if (!tracker_->failure()) spdlog::error("{}", st.error().message);
    tracker_->OnFailed(tx, st.error().message, /*retryable=*/true);
    return st;
  }
  // Not taken: undo the count so the transaction can still complete.
  if (!st) tracker_->CancelMessage(tx);
  return st;
}

Status Publisher::Offer(const outbox::KafkaRecord& record, tracking::Transaction* tx,
                        KeepAlive* keep) {
  if (sink_ == nullptr) return Fail(ErrorCode::kFatal, "internal: no sink attached");
  if (eos_ && eos_->deferring()) {
    // The next Kafka transaction's: after every record of the one flushed.
    eos_->Defer(record, tx);
    return Ok();
  }
  while (true) {
    auto accepted = sink_->Produce(record, tx);
    if (!accepted) return std::unexpected(accepted.error());
    if (*accepted == kafka::Sink::Accepted::kQueued) {
      uint64_t n = stats_->produced.fetch_add(1, std::memory_order_relaxed) + 1;
      if (failpoint::kCompiledIn && n == fatal_after_ && inject_fatal_) [[unlikely]] {
        inject_fatal_();
      }
      return Ok();
    }
    // The producer's queue is full (or the topic is still being prepared):
    // keep the walsender content while waiting.
    stats_->Beat();
    if (auto failure = tracker_->failure()) return Fail(ErrorCode::kFatal, "{}", *failure);
    if (stop_->Over(options_.stop_grace)) {
      // Kafka takes nothing and we are asked to stop: give up this
      // transaction (it is abandoned and re-sent after the restart) rather
      // than wait here past the shutdown timeout.
      return Fail(ErrorCode::kCancelled,
                  "stopping while the Kafka producer takes nothing more: the open transaction "
                  "is sent again after the restart");
    }
    if (keep != nullptr) {
      if (auto st = keep->Touch(); !st) return st;
    }
    tracker_->WaitForProgress(milliseconds(1));
  }
}

void Publisher::OnDelivery(const kafka::Delivery& d) {
  if (eos_ && eos_->OnDelivery(d)) return;  // a record of a Kafka transaction that failed
  auto* tx = static_cast<tracking::Transaction*>(d.opaque);
  metrics_->ObservePublish(d.topic, d.event_type, static_cast<double>(d.latency.count()) / 1e6,
                           !d.error);
  if (!d.error) {
    if (tx->commit_time.micros != 0) {
      metrics_->ObserveCommitToAck(
          static_cast<double>(UnixMicrosNow() - tx->commit_time.ToUnixMicros()) / 1e6);
    }
    stats_->delivered.fetch_add(1, std::memory_order_relaxed);
    tracker_->OnDelivered(tx);
    return;
  }
  if (d.error->code != ErrorCode::kPoison) {
    metrics_->CountError(metrics::ErrorReason::kKafkaUnavailable);
  }
  if (d.error->code == ErrorCode::kPoison && options_.on_poison == OnPoison::kDeadLetter &&
      d.topic != options_.dlq_topic) {
    // Hand it to the loop thread; the message keeps its pending token, so its
    // transaction cannot complete meanwhile.
    RefusedRecord refused{tx, {}, std::nullopt, d.error->message};
    for (const auto& [name, value] : d.headers) {
      if (name == outbox::kUuidHeader) refused.uuid = value;
    }
    if (d.value) refused.value = std::string(*d.value);
    {
      MutexLock lock(&refused_mu_);
      refused_.push_back(std::move(refused));
    }
    has_refused_.store(true, std::memory_order_release);
    tracker_->Notify();
    return;
  }
  if (!tracker_->failure()) spdlog::error("{}", d.error->message);  // the first says it all
  // kAborted: the producer failed for good and is replaced; its records are
  // sent again from the slot (a pipeline restart).
  tracker_->OnFailed(tx, d.error->message, d.error->code == ErrorCode::kAborted);
}

void Publisher::DropRefused() {
  MutexLock lock(&refused_mu_);
  refused_.clear();
  has_refused_.store(false, std::memory_order_relaxed);
}

Status Publisher::DeadLetterRefused(KeepAlive* keep) {
  if (!has_refused_.load(std::memory_order_acquire)) return Ok();
  std::vector<RefusedRecord> batch;
  {
    MutexLock lock(&refused_mu_);
    batch.swap(refused_);
    has_refused_.store(false, std::memory_order_relaxed);
  }
  for (RefusedRecord& r : batch) {
    // The row itself is gone from memory; what identifies it is its uuid
    // header and its transaction.
    outbox::RowIdentity identity;
    identity.offset = -1;
    identity.uuid = r.uuid;
    if (!r.tx->row_ranges.empty())
      identity.transaction_id = r.tx->row_ranges.front().transaction_id;
    Error reason{ErrorCode::kPoison,
                 fmt::format("{} (offset unknown: select the row by uuid '{}')", r.reason, r.uuid)};
    const outbox::KafkaRecord& record = dead_letters_.Build(
        reason, identity, options_.table, r.tx->final_lsn,
        r.value ? std::optional<std::string_view>(*r.value) : std::nullopt, std::nullopt);
    if (uint64_t left_out = 0; dead_letter_log_.Allow(&left_out)) {
      spdlog::warn(
          "dead-lettering refused record uuid='{}' of transaction {} to {}: {}{}", r.uuid,
          identity.transaction_id, options_.dlq_topic, r.reason,
          left_out == 0
              ? std::string()
              : fmt::format(" ({} more dead-lettered rows not logged before this one)", left_out));
    }
    stats_->dead_lettered.fetch_add(1, std::memory_order_relaxed);
    tracker_->AddDeadLetter(r.tx);
    if (auto st = Offer(record, r.tx, keep); !st) {
      // Neither settled nor confirmable: nothing at or after it moves the slot.
      tracker_->OnFailed(r.tx, fmt::format("cannot dead-letter refused record uuid='{}': {}",
                                           r.uuid, st.error().message));
      return st;
    }
    tracker_->OnDelivered(r.tx);  // the refused original is settled by its dead letter
  }
  return Ok();
}

ExactlyOnce* Publisher::EnableTransactions(TransactionOptions options,
                                           kafka::TransactionalSink* sink,
                                           kafka::ProgressLog* log) {
  ExactlyOnce::Parts parts;
  parts.sink = sink;
  parts.log = log;
  parts.tracker = tracker_;
  parts.metrics = metrics_;
  parts.stop = stop_;
  parts.offer = [this](const outbox::KafkaRecord& record, tracking::Transaction* tx,
                       KeepAlive* keep) { return Offer(record, tx, keep); };
  parts.in_flight_full = [this] { return InFlightFull(); };
  parts.dead_letter_refused = options_.on_poison == OnPoison::kDeadLetter;
  parts.stop_grace = options_.stop_grace;
  eos_ = std::make_unique<ExactlyOnce>(options, std::move(parts));
  return eos_.get();
}

}  // namespace outbox_relay::pipeline
