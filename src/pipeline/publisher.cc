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

Publisher::~Publisher() {
  if (worker_.joinable()) worker_.join();
  CloseSink();
}

void Publisher::AttachSink(std::unique_ptr<kafka::Sink> sink) { sink_ = std::move(sink); }

kafka::DeliveryCallback Publisher::DeliveryCallback() {
  return [this](const kafka::Delivery& d) { OnDelivery(d); };
}

void Publisher::CloseSink() { sink_.reset(); }

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
         state_ == TxnState::kAborting;
}

bool Publisher::Reachable() const { return sink_ != nullptr && sink_->Reachable(); }

int64_t Publisher::BytesInFlight() const {
  return (sink_ != nullptr ? sink_->BytesInFlight() : 0) + deferred_bytes_;
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
  if (txn_) {
    const outbox::RowIdentity& id = mapped->identity;
    bool held = tx->final_lsn != kInvalidLsn
                    ? committed_.Holds(tx->final_lsn, row_index)
                    : backfill_snapshot_ && committed_.HoldsBackfilled(
                                                *backfill_snapshot_, id.transaction_id, id.offset);
    if (held && txn_->skip_committed) {
      // Kafka has it, committed: marked, not produced again.
      tracking::AckTracker::NoteRow(tx, id.transaction_id, id.offset);
      stats_->already_in_kafka.fetch_add(1, std::memory_order_relaxed);
      metrics_->rows_already_in_kafka().Increment();
      return Ok();
    }
    if (auto st = JoinTransaction(tx); !st) return st;
    std::lock_guard lock(refused_uuids_mu_);
    // Forgotten once it is dead-lettered: the set holds what one aborted
    // transaction refused, not every refusal ever.
    if (auto it = id.uuid.empty() ? refused_uuids_.end() : refused_uuids_.find(id.uuid);
        it != refused_uuids_.end()) {
      refused_uuids_.erase(it);
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
    if (txn_) {
      // What the open Kafka transaction holds, once committed.
      ++txn_rows_;
      if (tx->final_lsn != kInvalidLsn) {
        pending_.final_lsn = tx->final_lsn;
        pending_.rows = row_index + 1;
        pending_.complete = false;
      } else if (backfill_snapshot_) {
        pending_.backfill = BackfillCursor{*backfill_snapshot_, mapped->identity.transaction_id,
                                           mapped->identity.offset};
      }
    }
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
  if (!st && !txn_ && st.error().code == ErrorCode::kAborted) {
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
  if (state_ == TxnState::kFlushing) {
    // The next Kafka transaction's: after every record of the one flushed.
    Defer(record, tx);
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
  auto* tx = static_cast<tracking::Transaction*>(d.opaque);
  if (txn_ && d.error && d.error->code != ErrorCode::kFatal) {
    // Exactly-once: a failed record fails its Kafka transaction, which is
    // aborted; the message is settled here (its PostgreSQL transaction stays
    // held until the abort abandons it). A refusal for good is remembered:
    // when the slot sends the row again, it goes to the dead-letter topic.
    {
      std::lock_guard lock(refused_uuids_mu_);
      if (d.error->code == ErrorCode::kPoison && options_.on_poison == OnPoison::kDeadLetter) {
        for (const auto& [name, value] : d.headers) {
          if (name == outbox::kUuidHeader) refused_uuids_.insert(std::string(value));
        }
      }
      if (must_abort_reason_.empty()) must_abort_reason_ = d.error->message;
    }
    if (d.error->code == ErrorCode::kPoison && options_.on_poison == OnPoison::kHalt) {
      if (tx != nullptr) tracker_->OnFailed(tx, d.error->message);
      return;
    }
    must_abort_.store(true, std::memory_order_release);
    if (tx != nullptr) tracker_->OnDelivered(tx);
    tracker_->Notify();
    return;
  }
  if (tx == nullptr) {
    // The progress record (exactly-once): it commits with its transaction.
    if (d.error) {
      if (!tracker_->failure()) spdlog::error("{}", d.error->message);
      must_abort_.store(true, std::memory_order_release);
    }
    return;
  }
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
      std::lock_guard lock(refused_mu_);
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
  std::lock_guard lock(refused_mu_);
  refused_.clear();
  has_refused_.store(false, std::memory_order_relaxed);
}

Status Publisher::DeadLetterRefused(KeepAlive* keep) {
  if (!has_refused_.load(std::memory_order_acquire)) return Ok();
  std::vector<RefusedRecord> batch;
  {
    std::lock_guard lock(refused_mu_);
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

void Publisher::EnableTransactions(TransactionOptions options, kafka::KafkaProducer* producer,
                                   KafkaProgress committed) {
  txn_ = std::move(options);
  producer_ = producer;
  committed_ = std::move(committed);
  pending_ = committed_;
}

std::chrono::steady_clock::time_point Publisher::CommitDueAt() const {
  if (!txn_) return std::chrono::steady_clock::time_point::max();
  if (state_ == TxnState::kFlushing || state_ == TxnState::kCommitting) {
    // The loop waits on the server meanwhile; the hand-over and the commit's
    // end (which the next commit waits for) are seen by looking again this soon.
    return std::chrono::steady_clock::now() + kCommitPoll;
  }
  if (!txn_open_ || state_ != TxnState::kIdle) {
    return std::chrono::steady_clock::time_point::max();
  }
  return txn_started_ + txn_->interval;
}

void Publisher::SetBackfill(std::optional<std::string> snapshot) {
  backfill_snapshot_ = std::move(snapshot);
  if (!backfill_snapshot_) pending_.backfill.reset();  // later records leave it out
}

void Publisher::NotePgCommit(tracking::Transaction* tx) {
  if (txn_ && tx->final_lsn != kInvalidLsn && pending_.final_lsn == tx->final_lsn) {
    pending_.rows = tx->rows_seen;
    pending_.complete = true;
  }
}

Status Publisher::JoinTransaction(tracking::Transaction* tx) {
  if (state_ == TxnState::kAborting) {
    return Fail(ErrorCode::kFatal, "internal: a row produced while Kafka transactions abort");
  }
  if (!txn_open_) {
    // While the one before is flushed, it begins at the hand-over.
    begin_deferred_ = state_ == TxnState::kFlushing;
    if (!begin_deferred_) {
      if (auto st = producer_->BeginTransaction(); !st) return st;
    }
    txn_open_ = true;
    txn_rows_ = 0;
    txn_started_ = std::chrono::steady_clock::now();
  }
  if (txn_members_.empty() || txn_members_.back() != tx) {
    tracker_->Hold(tx);
    txn_members_.push_back(tx);
  }
  return Ok();
}

Status Publisher::Poll() {
  if (state_ == TxnState::kFlushing && handed_over_.load(std::memory_order_acquire)) {
    // Every record of it is acknowledged: the next Kafka transaction begins,
    // on the producer's other lane, while this one commits.
    state_ = TxnState::kCommitting;
    if (auto st = ProduceDeferred(); !st) return st;
  }
  if (state_ != TxnState::kIdle && worker_done_.load(std::memory_order_acquire)) {
    return FinishWorker();
  }
  return Ok();
}

Status Publisher::Tick(bool force) {
  if (!txn_) return Ok();
  if (auto st = Poll(); !st) return st;
  if (state_ == TxnState::kFlushing || state_ == TxnState::kAborting) return Ok();
  if (must_abort_.load(std::memory_order_acquire)) {
    // A Kafka transaction handed over commits, or fails, on its own first.
    if (state_ == TxnState::kCommitting) return Ok();
    std::string reason;
    {
      std::lock_guard lock(refused_uuids_mu_);
      reason = std::exchange(must_abort_reason_, "");
    }
    StartAbort(reason.empty() ? "a record failed" : reason);
    return Ok();
  }
  // One Kafka transaction ends at a time: the open one waits for the one
  // handed over (which the in-flight window bounds meanwhile).
  if (!txn_open_ || state_ != TxnState::kIdle) return Ok();
  auto now = std::chrono::steady_clock::now();
  // A full in-flight window commits at once: its records wait for nothing
  // else (the transactional linger is the interval; the commit sends them).
  if (force || txn_rows_ >= txn_->max_rows || now - txn_started_ >= txn_->interval ||
      InFlightFull()) {
    return StartCommit();
  }
  return Ok();
}

void Publisher::Defer(const outbox::KafkaRecord& record, tracking::Transaction* tx) {
  auto put = [this](std::string_view v) {
    deferred_lengths_.push_back(static_cast<int64_t>(v.size()));
    deferred_data_.append(v);
  };
  auto put_optional = [&](const std::optional<std::string_view>& v) {
    if (v) {
      put(*v);
      deferred_bytes_ += static_cast<int64_t>(v->size());
    } else {
      deferred_lengths_.push_back(-1);
    }
  };
  put(record.topic);
  put(record.event_type);
  put_optional(record.key);
  put_optional(record.value);
  deferred_lengths_.push_back(static_cast<int64_t>(record.headers.size()));
  for (const auto& [name, value] : record.headers) {
    put(name);
    put(value);
    deferred_bytes_ += static_cast<int64_t>(name.size() + value.size());
  }
  deferred_.push_back(tx);
}

Status Publisher::ProduceDeferred() {
  if (txn_open_ && begin_deferred_) {
    begin_deferred_ = false;
    if (auto st = producer_->BeginTransaction(); !st) return st;
  }
  if (deferred_.empty()) return Ok();
  spdlog::debug("Kafka transaction handed over: {} records read during its flush go into the next",
                deferred_.size());
  // The state is kCommitting: Offer produces, and nothing is deferred meanwhile.
  size_t part = 0;
  size_t at = 0;
  auto take = [&]() -> std::string_view {
    auto n = static_cast<size_t>(deferred_lengths_[part++]);
    std::string_view v(deferred_data_.data() + at, n);
    at += n;
    return v;
  };
  auto take_optional = [&]() -> std::optional<std::string_view> {
    if (deferred_lengths_[part] < 0) {
      ++part;
      return std::nullopt;
    }
    return take();
  };
  Status result = Ok();
  outbox::KafkaRecord view;
  for (size_t i = 0; i < deferred_.size(); ++i) {
    view.topic = take();
    view.event_type = take();
    view.key = take_optional();
    view.value = take_optional();
    auto headers = static_cast<size_t>(deferred_lengths_[part++]);
    view.headers.clear();
    for (size_t h = 0; h < headers; ++h) {
      std::string_view name = take();
      view.headers.emplace_back(name, take());
    }
    if (auto st = Offer(view, deferred_[i], nullptr); !st) {
      // Not taken: neither are those after it; their transactions end with the session.
      for (size_t j = i; j < deferred_.size(); ++j) tracker_->CancelMessage(deferred_[j]);
      result = st;
      break;
    }
  }
  deferred_.clear();
  deferred_data_.clear();
  deferred_lengths_.clear();
  deferred_bytes_ = 0;
  return result;
}

void Publisher::DropDeferred() {
  for (tracking::Transaction* tx : deferred_) tracker_->CancelMessage(tx);
  deferred_.clear();
  deferred_data_.clear();
  deferred_lengths_.clear();
  deferred_bytes_ = 0;
}

Status Publisher::RetryStep(const std::function<Status(milliseconds)>& step) const {
  // Resumable: on a timeout the step goes on in the background and the call
  // picks it up again; a stop request gives up after the stop grace.
  auto stop_seen = std::chrono::steady_clock::time_point{};
  while (true) {
    Status st = step(milliseconds(1000));
    if (st || st.error().code != ErrorCode::kTransient) return st;
    if (stop_->flag().load()) {
      auto now = std::chrono::steady_clock::now();
      if (stop_seen == std::chrono::steady_clock::time_point{}) stop_seen = now;
      if (now - stop_seen >= options_.stop_grace) {
        return Fail(ErrorCode::kCancelled, "stopping while Kafka does not commit: {}",
                    st.error().message);
      }
    }
  }
}

Status Publisher::StartCommit() {
  // The progress record goes into the same Kafka transaction: it commits, or
  // aborts, with the rows it describes.
  progress_value_ = EncodeProgress(pending_, txn_->key);
  outbox::KafkaRecord record;
  record.topic = txn_->progress_topic;
  record.key = txn_->key;
  record.value = progress_value_;
  if (auto st = Offer(record, nullptr, nullptr); !st) {
    if (st.error().code == ErrorCode::kAborted || st.error().code == ErrorCode::kPoison) {
      StartAbort(st.error().message);
      return Ok();
    }
    return st;
  }
  ending_progress_ = pending_;
  ending_ = true;
  ending_members_ = std::exchange(txn_members_, {});
  txn_open_ = false;
  state_ = TxnState::kFlushing;
  commit_started_ = std::chrono::steady_clock::now();
  handed_over_.store(false);
  worker_done_.store(false);
  worker_ = std::thread([this] {
    Status st = RetryStep([this](milliseconds t) { return producer_->FlushTransaction(t); });
    if (st) {
      ending_lane_ = producer_->HandOver();
      handed_over_.store(true, std::memory_order_release);
      tracker_->Notify();
      const int lane = ending_lane_;
      st =
          RetryStep([this, lane](milliseconds t) { return producer_->CommitTransaction(lane, t); });
    }
    worker_result_ = st;
    worker_done_.store(true, std::memory_order_release);
    tracker_->Notify();
  });
  return Ok();
}

void Publisher::StartAbort(std::string reason) {
  // Every Kafka transaction not committed: one whose commit failed, and the
  // open one after it (which must not commit without it).
  std::vector<int> lanes;
  if (ending_) lanes.push_back(handed_over_.load() ? ending_lane_ : producer_->OpenLane());
  if (txn_open_ && !begin_deferred_) lanes.push_back(producer_->OpenLane());
  DropDeferred();
  spdlog::warn("aborting {} Kafka transaction{} ({} PostgreSQL transactions): {}", lanes.size(),
               lanes.size() == 1 ? "" : "s", ending_members_.size() + txn_members_.size(), reason);
  abort_reason_ = std::move(reason);
  aborting_ = static_cast<int>(lanes.size());
  state_ = TxnState::kAborting;
  worker_done_.store(false);
  if (lanes.empty()) {  // nothing began: nothing to abort
    worker_result_ = Ok();
    worker_done_.store(true);
    return;
  }
  worker_ = std::thread([this, lanes] {
    Status result;
    for (int lane : lanes) {
      Status st;
      for (int attempt = 0; attempt < 30; ++attempt) {
        st = producer_->AbortTransaction(lane, milliseconds(1000));
        if (st || st.error().code != ErrorCode::kTransient) break;
      }
      if (!st && result) result = st;
    }
    worker_result_ = result;
    worker_done_.store(true, std::memory_order_release);
    tracker_->Notify();
  });
}

Status Publisher::FinishWorker() {
  if (worker_.joinable()) worker_.join();
  Status result = worker_result_;
  TxnState state = std::exchange(state_, TxnState::kIdle);
  if (state == TxnState::kFlushing || state == TxnState::kCommitting) {
    if (result) {
      metrics_->kafka_transactions_committed().Increment();
      metrics_->kafka_transaction_commit().Observe(
          std::chrono::duration<double>(std::chrono::steady_clock::now() - commit_started_)
              .count());
      committed_ = ending_progress_;
      ending_ = false;
      for (tracking::Transaction* tx : std::exchange(ending_members_, {})) {
        tracker_->ReleaseHold(tx);
      }
      return Ok();
    }
    if (result.error().code == ErrorCode::kAborted) {
      StartAbort(result.error().message);
      return Ok();
    }
    return result;  // kFatal (fenced), kCancelled
  }
  // Aborts: what the Kafka transactions held is sent again by the slot.
  for (int i = 0; i < aborting_; ++i) metrics_->kafka_transactions_aborted().Increment();
  aborting_ = 0;
  txn_open_ = false;
  begin_deferred_ = false;
  ending_ = false;
  must_abort_.store(false);
  pending_ = committed_;
  for (tracking::Transaction* tx : std::exchange(ending_members_, {})) tracker_->AbandonHeld(tx);
  for (tracking::Transaction* tx : std::exchange(txn_members_, {})) tracker_->AbandonHeld(tx);
  if (!result) return result;
  return Fail(ErrorCode::kAborted, "Kafka transaction aborted ({}); sending its rows again",
              abort_reason_);
}

Status Publisher::AbortTransaction(std::chrono::milliseconds timeout) {
  if (!txn_) return Ok();
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (true) {
    // One handed over may still commit; what follows it is aborted.
    if (auto st = Poll(); !st && st.error().code != ErrorCode::kAborted) return st;
    if (state_ == TxnState::kIdle) {
      if (!txn_open_ && !ending_) return Ok();
      StartAbort("the session ended");
      continue;
    }
    if (std::chrono::steady_clock::now() >= deadline) {
      return Fail(ErrorCode::kTransient, "the Kafka transaction did not end within {} ms",
                  timeout.count());
    }
    tracker_->WaitForProgress(milliseconds(5));
  }
}

Status Publisher::FinishTransaction(std::chrono::milliseconds timeout, KeepAlive* keep) {
  if (!txn_) return Ok();
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (true) {
    if (auto st = Poll(); !st) return st;
    if (state_ == TxnState::kIdle) {
      if (ending_) {
        // Its commit did not end (a stop gave up on it): it and what
        // follows are aborted and sent again.
        StartAbort("the commit did not end");
        continue;
      }
      if (!txn_open_) return Ok();
      if (auto st = Tick(/*force=*/true); !st) return st;
      continue;
    }
    if (std::chrono::steady_clock::now() >= deadline) {
      return Fail(ErrorCode::kTransient, "the Kafka transaction did not end within {} ms",
                  timeout.count());
    }
    if (keep != nullptr) (void)keep->Touch();
    tracker_->WaitForProgress(milliseconds(5));
  }
}

}  // namespace outbox_relay::pipeline
