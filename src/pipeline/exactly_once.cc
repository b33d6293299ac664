#include "outbox_relay/pipeline/exactly_once.h"

#include <spdlog/spdlog.h>

#include <utility>

namespace outbox_relay::pipeline {

namespace {

using std::chrono::milliseconds;

}  // namespace

ExactlyOnce::ExactlyOnce(TransactionOptions options, Parts parts)
    : options_(options), parts_(std::move(parts)), sink_(parts_.sink), tracker_(parts_.tracker) {
  tracker_->standby_marks().Enable();
}

ExactlyOnce::~ExactlyOnce() {
  giving_up_.store(true);
  if (worker_.joinable()) worker_.join();
}

Status ExactlyOnce::Start(const ProgressFacts& facts) {
  // Fence every earlier producer of this transactional.id (a frozen old
  // instance) and complete what it left open; only then is Kafka's progress
  // final enough to be read.
  if (auto st = sink_->InitTransactions(options_.init_timeout); !st) return st;
  if (auto st = parts_.log->Prepare(); !st) return st;
  auto value = parts_.log->ReadLast(facts.key);
  if (!value) return std::unexpected(value.error());
  // Read after the record: every position it names was on the server then.
  auto now = WithWalEndNow(facts);
  if (!now) return std::unexpected(now.error());
  if (value->has_value()) {
    if (auto shared = NewerSharedRecord(**value, *now)) value = std::move(shared);
  }
  has_last_value_ = value->has_value();
  last_value_ = value->value_or("");
  return Trust(*value, *now);
}

Result<ProgressFacts> ExactlyOnce::WithWalEndNow(const ProgressFacts& facts) {
  ProgressFacts now = facts;
  if (!read_wal_end_) return now;
  auto wal_end = read_wal_end_();
  if (!wal_end) return std::unexpected(wal_end.error());
  now.wal_end = *wal_end;
  return now;
}

std::optional<std::string> ExactlyOnce::NewerSharedRecord(const std::string& own,
                                                          const ProgressFacts& facts) {
  // Relays before 0.2 kept every relay's record in one shared topic. After a
  // rollback to such a release and forward again, its record there holds
  // what it published since this relay's own was written (docs/upgrading.md).
  // Either is true, so the one that holds more is trusted; what cannot be
  // read or trusted of the shared one is left out (duplicates at worst).
  auto shared = parts_.log->ReadShared(facts.key);
  if (!shared) {
    spdlog::warn(
        "exactly-once: the record in the shared progress topic was not read ({}): "
        "this relay's own is used",
        shared.error().message);
    return std::nullopt;
  }
  if (!*shared || **shared == own) return std::nullopt;
  auto trusted = [&](const std::string& value) -> std::optional<KafkaProgress> {
    auto record = DecodeProgress(value);
    if (!record) return std::nullopt;
    auto t = TrustedProgress(*record, facts);
    if (!t) return std::nullopt;
    return std::move(*t);
  };
  std::optional<KafkaProgress> theirs = trusted(**shared);
  std::optional<KafkaProgress> mine = trusted(own);
  if (!theirs) {
    spdlog::warn(
        "exactly-once: the record under {} in the shared progress topic cannot be "
        "read or is not this relay's: left out",
        facts.key);
    return std::nullopt;
  }
  if (!mine || !theirs->Beyond(*mine)) return std::nullopt;
  spdlog::info(
      "exactly-once: the shared progress topic holds this relay's progress up to {} (a release "
      "before 0.2 wrote it), its own topic up to {}: the further one is taken",
      theirs->final_lsn, mine->final_lsn);
  return std::move(*shared);
}

Status ExactlyOnce::Rebase(const ProgressFacts& facts) {
  if (state_ != State::kIdle || txn_open_ || ending_) {
    return Fail(ErrorCode::kFatal, "internal: exactly-once rebased with a Kafka transaction open");
  }
  std::optional<std::string> value;
  if (has_last_value_) value = last_value_;
  auto now = WithWalEndNow(facts);
  if (!now) return std::unexpected(now.error());
  return Trust(value, *now);
}

Status ExactlyOnce::Trust(const std::optional<std::string>& value, const ProgressFacts& facts) {
  KafkaProgress trusted;
  if (value) {
    auto record = DecodeProgress(*value);
    if (!record) {
      return Fail(ErrorCode::kInvalidArgument, "the progress in {} under {} cannot be read: {}",
                  parts_.log->topic(), facts.key, record.error().message);
    }
    std::string note;
    auto t = TrustedProgress(*record, facts, &note);
    if (!t) return std::unexpected(t.error());
    if (!note.empty()) spdlog::warn("exactly-once: {}", note);
    trusted = std::move(*t);
  }
  // Marks kept for the standbys of rows the server's history no longer has
  // (a promotion): their (transaction_id, offset) may name new rows there.
  if (facts_.history.timeline != 0 && facts.history != facts_.history) {
    tracker_->standby_marks().KeepBelow(DivergencePoint(facts_.history, facts.history));
  }
  // Rows a backfill publishes were committed before the slot's consistent point.
  tracker_->standby_marks().SetBackfilledBefore(Lsn::Parse(facts.incarnation).value_or(Lsn()));
  // The instance before saw a standby lately: one that is away now (it
  // reconnects after a restart of the primary) is waited for.
  if (trusted.standbys) tracker_->standby_marks().SeenAt();
  facts_ = facts;
  committed_ = std::move(trusted);
  pending_ = committed_;
  pending_.unmarked.Clear();
  spdlog::info(
      "exactly-once: transactional.id {}, timeline {}; Kafka holds up to {} (rows {}{}){}{}",
      facts_.key, facts_.history.timeline, committed_.final_lsn, committed_.rows,
      committed_.complete ? ", complete" : "",
      committed_.backfill
          ? fmt::format("; backfill of {} up to ({}, {})", committed_.backfill->snapshot,
                        committed_.backfill->transaction_id, committed_.backfill->offset)
          : "",
      committed_.unmarked.empty()
          ? ""
          : fmt::format("; {} runs of rows it holds may be unmarked", committed_.unmarked.size()));
  return Ok();
}

Result<ExactlyOnce::Verdict> ExactlyOnce::Admit(tracking::Transaction* tx, uint64_t row_index,
                                                const outbox::RowIdentity& id) {
  bool held = tx->final_lsn != kInvalidLsn
                  ? committed_.Holds(tx->final_lsn, row_index)
                  : backfill_snapshot_ && committed_.HoldsBackfilled(*backfill_snapshot_,
                                                                     id.transaction_id, id.offset);
  if (held && options_.skip_committed) return Verdict::kHeld;
  if (auto st = Join(tx); !st) return std::unexpected(st.error());
  MutexLock lock(&refused_mu_);
  // Forgotten once it is dead-lettered: the set holds what one aborted
  // transaction refused, not every refusal ever (a refused again record
  // comes back through Delivered).
  if (auto it = id.uuid.empty() ? refused_uuids_.end() : refused_uuids_.find(id.uuid);
      it != refused_uuids_.end()) {
    refused_uuids_.erase(it);
    return Verdict::kRefused;
  }
  return Verdict::kProduce;
}

void ExactlyOnce::Produced(const tracking::Transaction& tx, uint64_t row_index,
                           const outbox::RowIdentity& id) {
  ++txn_rows_;
  if (tx.final_lsn != kInvalidLsn) {
    pending_.final_lsn = tx.final_lsn;
    pending_.rows = row_index + 1;
    pending_.complete = false;
  } else if (backfill_snapshot_) {
    pending_.backfill = BackfillCursor{*backfill_snapshot_, id.transaction_id, id.offset};
  }
}

void ExactlyOnce::NotePgCommit(tracking::Transaction* tx) {
  if (tx->final_lsn != kInvalidLsn && pending_.final_lsn == tx->final_lsn) {
    pending_.rows = tx->rows_seen;
    pending_.complete = true;
  }
}

void ExactlyOnce::SetBackfill(std::optional<std::string> snapshot) {
  backfill_snapshot_ = std::move(snapshot);
  if (!backfill_snapshot_) pending_.backfill.reset();  // later records leave it out
}

bool ExactlyOnce::OnDelivery(const kafka::Delivery& d) {
  auto* tx = static_cast<tracking::Transaction*>(d.opaque);
  if (d.error && d.error->code != ErrorCode::kFatal) {
    // A failed record fails its Kafka transaction, which is aborted; the
    // message is settled here (its PostgreSQL transaction stays held until
    // the abort abandons it). A refusal for good is remembered: when the
    // slot sends the row again, it goes to the dead-letter topic.
    {
      MutexLock lock(&refused_mu_);
      if (d.error->code == ErrorCode::kPoison && parts_.dead_letter_refused) {
        for (const auto& [name, value] : d.headers) {
          if (name == outbox::kUuidHeader) refused_uuids_.insert(std::string(value));
        }
      }
      if (must_abort_reason_.empty()) must_abort_reason_ = d.error->message;
    }
    if (d.error->code == ErrorCode::kPoison && !parts_.dead_letter_refused) {
      if (tx != nullptr) tracker_->OnFailed(tx, d.error->message);
      return true;
    }
    must_abort_.store(true, std::memory_order_release);
    if (tx != nullptr) tracker_->OnDelivered(tx);
    tracker_->Notify();
    return true;
  }
  if (tx == nullptr) {
    // The progress record: it commits with its transaction.
    if (d.error) {
      if (!tracker_->failure()) spdlog::error("{}", d.error->message);
      must_abort_.store(true, std::memory_order_release);
    }
    return true;
  }
  return false;
}

std::chrono::steady_clock::time_point ExactlyOnce::CommitDueAt() const {
  if (state_ == State::kFlushing || state_ == State::kCommitting) {
    // The loop waits on the server meanwhile; the hand-over and the commit's
    // end (which the next commit waits for) are seen by looking again this soon.
    return parts_.stop->clock().Now() + kCommitPoll;
  }
  if (!txn_open_ || state_ != State::kIdle) return Clock::time_point::max();
  return txn_started_ + options_.interval;
}

Status ExactlyOnce::Join(tracking::Transaction* tx) {
  if (state_ == State::kAborting) {
    return Fail(ErrorCode::kFatal, "internal: a row produced while Kafka transactions abort");
  }
  if (!txn_open_) {
    // While the one before is flushed, it begins at the hand-over.
    begin_deferred_ = state_ == State::kFlushing;
    if (!begin_deferred_) {
      if (auto st = sink_->BeginTransaction(); !st) return st;
    }
    txn_open_ = true;
    txn_rows_ = 0;
    txn_started_ = parts_.stop->clock().Now();
  }
  if (txn_members_.empty() || txn_members_.back() != tx) {
    tracker_->Hold(tx);
    txn_members_.push_back(tx);
  }
  return Ok();
}

Status ExactlyOnce::Poll() {
  if (state_ == State::kFlushing && handed_over_.load(std::memory_order_acquire)) {
    // Every record of it is acknowledged: the next Kafka transaction begins,
    // on the sink's other lane, while this one commits.
    state_ = State::kCommitting;
    if (auto st = ProduceDeferred(); !st) return st;
  }
  if (state_ != State::kIdle && worker_done_.load(std::memory_order_acquire)) {
    return FinishWorker();
  }
  return Ok();
}

Status ExactlyOnce::Tick(bool force) {
  if (auto st = Poll(); !st) return st;
  if (state_ == State::kFlushing || state_ == State::kAborting) return Ok();
  if (must_abort_.load(std::memory_order_acquire)) {
    // A Kafka transaction handed over commits, or fails, on its own first.
    if (state_ == State::kCommitting) return Ok();
    std::string reason;
    {
      MutexLock lock(&refused_mu_);
      reason = std::exchange(must_abort_reason_, "");
    }
    StartAbort(reason.empty() ? "a record failed" : reason);
    return Ok();
  }
  // One Kafka transaction ends at a time: the open one waits for the one
  // handed over (which the in-flight window bounds meanwhile).
  if (!txn_open_ || state_ != State::kIdle) return Ok();
  // A full in-flight window commits at once: its records wait for nothing
  // else (the transactional linger is the interval; the commit sends them).
  if (force || txn_rows_ >= options_.max_rows ||
      parts_.stop->clock().Now() - txn_started_ >= options_.interval ||
      (parts_.in_flight_full && parts_.in_flight_full())) {
    return StartCommit();
  }
  return Ok();
}

void ExactlyOnce::Defer(const outbox::KafkaRecord& record, tracking::Transaction* tx) {
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

Status ExactlyOnce::ProduceDeferred() {
  if (txn_open_ && begin_deferred_) {
    begin_deferred_ = false;
    if (auto st = sink_->BeginTransaction(); !st) return st;
  }
  if (deferred_.empty()) return Ok();
  spdlog::debug("Kafka transaction handed over: {} records read during its flush go into the next",
                deferred_.size());
  // The state is kCommitting: the offer produces, and nothing is deferred meanwhile.
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
    if (auto st = parts_.offer(view, deferred_[i], nullptr); !st) {
      // Not taken: neither are those after it; their transactions end with the session.
      for (size_t j = i; j < deferred_.size(); ++j) tracker_->CancelMessage(deferred_[j]);
      // The progress counted them when they were deferred (Produced): the
      // open Kafka transaction lacks rows its record would say it holds, so
      // it must not commit (a later Finish would): it is aborted, and its
      // PostgreSQL transactions are sent again.
      {
        MutexLock lock(&refused_mu_);
        if (must_abort_reason_.empty()) {
          must_abort_reason_ =
              fmt::format("records read during a flush were not taken: {}", st.error().message);
        }
      }
      must_abort_.store(true, std::memory_order_release);
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

void ExactlyOnce::DropDeferred() {
  for (tracking::Transaction* tx : deferred_) tracker_->CancelMessage(tx);
  deferred_.clear();
  deferred_data_.clear();
  deferred_lengths_.clear();
  deferred_bytes_ = 0;
}

Status ExactlyOnce::RetryStep(const std::function<Status(milliseconds)>& step) const {
  // Resumable: on a timeout the step goes on in the background and the call
  // picks it up again; a stop request gives up after the stop grace.
  auto stop_seen = Clock::time_point{};
  while (true) {
    Status st = step(milliseconds(1000));
    if (st || st.error().code != ErrorCode::kTransient) return st;
    if (giving_up_.load()) return Fail(ErrorCode::kCancelled, "given up: {}", st.error().message);
    if (parts_.stop->flag().load()) {
      auto now = parts_.stop->clock().Now();
      if (stop_seen == Clock::time_point{}) stop_seen = now;
      if (now - stop_seen >= parts_.stop_grace) {
        return Fail(ErrorCode::kCancelled, "stopping while Kafka does not commit: {}",
                    st.error().message);
      }
    }
  }
}

void ExactlyOnce::BuildRecord() {
  record_.key = facts_.key;
  record_.owner = facts_.me;
  record_.incarnation = facts_.incarnation;
  record_.history = facts_.history;
  KafkaProgress& p = record_.progress;
  p.final_lsn = pending_.final_lsn;
  p.rows = pending_.rows;
  p.complete = pending_.complete;
  p.backfill = pending_.backfill;
  p.unmarked.Clear();
  tracking::StandbyMarks& standby_marks = tracker_->standby_marks();
  // The rows a record read at start listed as unmarked stay listed until they
  // are surely marked: no backfill pending (the backfill marks those it finds
  // held), and the slot confirmed past them (the slot sent them again, and
  // they were marked before it was confirmed). Then as marks a standby may
  // not have yet.
  if (!committed_.unmarked.empty() && !backfill_snapshot_ &&
      tracker_->confirmed() > committed_.unmarked.max_lsn()) {
    for (const HeldRun& run : committed_.unmarked.runs()) {
      standby_marks.Keep(run.final_lsn, {run.transaction_id, run.first, run.last});
    }
    committed_.unmarked.Clear();
  }
  for (const HeldRun& run : committed_.unmarked.runs()) p.unmarked.Add(run);
  // Rows a backfill published were committed before the slot's consistent point.
  const Lsn backfilled_before = Lsn::Parse(facts_.incarnation).value_or(Lsn());
  tracker_->ForEachUnmarked([&](const tracking::Transaction& tx) {
    const Lsn lsn = tx.final_lsn != kInvalidLsn ? tx.final_lsn : backfilled_before;
    for (const tracking::RowRange& r : tx.row_ranges) {
      p.unmarked.Add(HeldRun{lsn, r.transaction_id, r.first, r.last});
    }
  });
  // Marked rows an asynchronous standby may still show unmarked: listed
  // last, so that past the bound they are the ones forgotten.
  standby_marks.ForEach([&](Lsn lsn, const tracking::RowRange& r) {
    p.unmarked.Add(HeldRun{lsn, r.transaction_id, r.first, r.last});
  });
  p.standbys = standby_marks.SeenLately();
  progress_value_ = EncodeProgress(record_);
}

Status ExactlyOnce::StartCommit() {
  // The progress record goes into the same Kafka transaction: it commits, or
  // aborts, with the rows it describes.
  BuildRecord();
  outbox::KafkaRecord record;
  record.topic = parts_.log->topic();
  record.key = facts_.key;
  record.value = progress_value_;
  if (auto st = parts_.offer(record, nullptr, nullptr); !st) {
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
  state_ = State::kFlushing;
  commit_started_ = parts_.stop->clock().Now();
  handed_over_.store(false);
  worker_done_.store(false);
  if (worker_.joinable()) worker_.join();
  worker_ = std::thread([this] {
    Status st = RetryStep([this](milliseconds t) { return sink_->FlushTransaction(t); });
    if (st) {
      ending_lane_ = sink_->HandOver();
      handed_over_.store(true, std::memory_order_release);
      tracker_->Notify();
      const int lane = ending_lane_;
      st = RetryStep([this, lane](milliseconds t) { return sink_->CommitTransaction(lane, t); });
    }
    worker_result_ = st;
    worker_done_.store(true, std::memory_order_release);
    tracker_->Notify();
  });
  return Ok();
}

void ExactlyOnce::StartAbort(std::string reason) {
  // Every Kafka transaction not committed: one whose commit failed, and the
  // open one after it (which must not commit without it).
  std::vector<int> lanes;
  if (ending_) lanes.push_back(handed_over_.load() ? ending_lane_ : sink_->OpenLane());
  if (txn_open_ && !begin_deferred_) lanes.push_back(sink_->OpenLane());
  DropDeferred();
  spdlog::warn("aborting {} Kafka transaction{} ({} PostgreSQL transactions): {}", lanes.size(),
               lanes.size() == 1 ? "" : "s", ending_members_.size() + txn_members_.size(), reason);
  abort_reason_ = std::move(reason);
  aborting_ = static_cast<int>(lanes.size());
  state_ = State::kAborting;
  worker_done_.store(false);
  if (worker_.joinable()) worker_.join();
  if (lanes.empty()) {  // nothing began: nothing to abort
    worker_result_ = Ok();
    worker_done_.store(true);
    return;
  }
  worker_ = std::thread([this, lanes] {
    Status result;
    for (int lane : lanes) {
      Status st;
      for (int attempt = 0; attempt < 30 && !giving_up_.load(); ++attempt) {
        st = sink_->AbortTransaction(lane, milliseconds(1000));
        if (st || st.error().code != ErrorCode::kTransient) break;
      }
      if (!st && result) result = st;
    }
    worker_result_ = result;
    worker_done_.store(true, std::memory_order_release);
    tracker_->Notify();
  });
}

Status ExactlyOnce::FinishWorker() {
  if (worker_.joinable()) worker_.join();
  Status result = worker_result_;
  State state = std::exchange(state_, State::kIdle);
  if (state == State::kFlushing || state == State::kCommitting) {
    if (result) {
      parts_.metrics->kafka_transactions_committed().Increment();
      parts_.metrics->kafka_transaction_commit().Observe(
          std::chrono::duration<double>(parts_.stop->clock().Now() - commit_started_).count());
      committed_.final_lsn = ending_progress_.final_lsn;
      committed_.rows = ending_progress_.rows;
      committed_.complete = ending_progress_.complete;
      committed_.backfill = ending_progress_.backfill;
      last_value_ = progress_value_;
      has_last_value_ = true;
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
    return result;  // kFenced, kFatal, kCancelled
  }
  // Aborts: what the Kafka transactions held is sent again by the slot.
  for (int i = 0; i < aborting_; ++i) parts_.metrics->kafka_transactions_aborted().Increment();
  aborting_ = 0;
  txn_open_ = false;
  begin_deferred_ = false;
  ending_ = false;
  must_abort_.store(false);
  pending_.final_lsn = committed_.final_lsn;
  pending_.rows = committed_.rows;
  pending_.complete = committed_.complete;
  pending_.backfill = committed_.backfill;
  // One hold per Kafka transaction a PostgreSQL transaction joined: one split
  // across both is released twice.
  std::vector<tracking::Transaction*> held = std::exchange(ending_members_, {});
  for (tracking::Transaction* tx : std::exchange(txn_members_, {})) held.push_back(tx);
  tracker_->AbandonHeld(held);
  if (!result) return result;
  return Fail(ErrorCode::kAborted, "Kafka transaction aborted ({}); sending its rows again",
              abort_reason_);
}

Status ExactlyOnce::Abort(milliseconds timeout) {
  auto deadline = parts_.stop->clock().Now() + timeout;
  while (true) {
    // One handed over may still commit; what follows it is aborted.
    if (auto st = Poll(); !st && st.error().code != ErrorCode::kAborted) return st;
    if (state_ == State::kIdle) {
      if (!txn_open_ && !ending_) return Ok();
      StartAbort("the session ended");
      continue;
    }
    if (parts_.stop->clock().Now() >= deadline) {
      return Fail(ErrorCode::kTransient, "the Kafka transaction did not end within {} ms",
                  timeout.count());
    }
    tracker_->WaitForProgress(milliseconds(5));
  }
}

Status ExactlyOnce::Finish(milliseconds timeout, KeepAlive* keep) {
  auto deadline = parts_.stop->clock().Now() + timeout;
  while (true) {
    if (auto st = Poll(); !st) return st;
    if (state_ == State::kIdle) {
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
    if (parts_.stop->clock().Now() >= deadline) {
      return Fail(ErrorCode::kTransient, "the Kafka transaction did not end within {} ms",
                  timeout.count());
    }
    if (keep != nullptr) (void)keep->Touch();
    tracker_->WaitForProgress(milliseconds(5));
  }
}

}  // namespace outbox_relay::pipeline
