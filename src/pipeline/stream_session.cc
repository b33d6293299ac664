#include "outbox_relay/pipeline/stream_session.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <utility>

namespace outbox_relay::pipeline {

namespace {

using std::chrono::milliseconds;

// A reply-requested keepalive while the marker cannot reach PostgreSQL
// within this long: the server is probably stopping (see Run).
constexpr std::chrono::seconds kMarkerErrorRecent{10};

}  // namespace

StreamSession::StreamSession(SessionOptions options, ReplicationSource* source,
                             Publisher* publisher, tracking::AckTracker* tracker, RelayStats* stats,
                             StopSignal* stop, const std::atomic<int64_t>* last_marker_error_ns)
    : options_(std::move(options)),
      source_(source),
      publisher_(publisher),
      tracker_(tracker),
      stats_(stats),
      stop_(stop),
      last_marker_error_ns_(last_marker_error_ns),
      progress_(options_.status_interval),
      liveness_(options_.receive_timeout, stop->clock().Now()),
      router_(options_.tables.empty()
                  ? std::vector<OutboxTable>{OutboxTable{options_.table, outbox::TableKind::kSeed}}
                  : options_.tables,
              options_.columns, options_.processed, options_.unrouted) {}

tracking::Transaction* StreamSession::TakeOpenTransaction() {
  return std::exchange(open_tx_, nullptr);
}

Status StreamSession::Run() {
  while (true) {
    auto step = Step();
    if (!step) return std::unexpected(step.error());
    switch (step->state) {
      case StepResult::kDone:
        return Ok();
      case StepResult::kBusy:
        break;
      case StepResult::kHeldBack:
        tracker_->WaitForProgress(milliseconds(2));
        break;
      case StepResult::kWaiting:
        if (auto st = source_->Wait(WaitBound()); !st) return st;
        break;
    }
  }
}

Result<StreamSession::StepResult> StreamSession::Step() {
  const Clock& clock = stop_->clock();
  stats_->Beat();
  if (auto failure = tracker_->failure()) return Fail(ErrorCode::kFatal, "{}", *failure);
  // Stop between transactions: a half-read transaction would be sent again
  // in full after a restart, and its first rows would be duplicates. But
  // not at any price: when its end does not come (Kafka holds everything
  // back), give it up within the stop grace.
  if (stop_->requested()) {
    if (open_tx_ == nullptr) return StepResult{StepResult::kDone};
    if (stop_->Over(options_.stop_grace)) {
      return Fail(ErrorCode::kCancelled,
                  "stopping inside transaction xid {}: it is given up and sent again after the "
                  "restart",
                  open_tx_->xid);
    }
  }
  if (options_.end_requested != nullptr && open_tx_ == nullptr && options_.end_requested->load()) {
    return Fail(ErrorCode::kTransient, "the stream ends between transactions, as asked");
  }
  if (auto st = publisher_->DeadLetterRefused(this); !st) return std::unexpected(st.error());
  if (auto st = publisher_->Tick(); !st) {  // exactly-once: commit when due
    return std::unexpected(st.error());
  }
  stats_->kafka_reachable.store(publisher_->Reachable(), std::memory_order_relaxed);
  stats_->in_flight_bytes.store(publisher_->BytesInFlight(), std::memory_order_relaxed);
  if (auto st = SendStatus(false); !st) return std::unexpected(st.error());
  LogProgress();
  if (publisher_->Backpressured()) {
    liveness_.NotListening(clock.Now());
    return StepResult{StepResult::kHeldBack};
  }
  auto msg = source_->TryRead();
  if (!msg) return std::unexpected(msg.error());
  if (!*msg) {
    // Nothing to read: silent for too long? (What the wait before brought,
    // bytes of a message on their way included, counts as heard.)
    auto now = clock.Now();
    liveness_.SawBytes(source_->BytesReceived(), now);
    if (auto silent = liveness_.Silent(now)) {
      return Fail(ErrorCode::kTransient,
                  "replication connection silent for {:.1f} s: nothing received, not even "
                  "the reply requested {:.1f} s ago; taking it for dead (bound {} ms, "
                  "--pg-receive-timeout-ms)",
                  static_cast<double>(silent->count()) / 1000,
                  (static_cast<double>(silent->count()) -
                   static_cast<double>(liveness_.bound().count()) / 2) /
                      1000,
                  liveness_.bound().count());
    }
    return StepResult{StepResult::kWaiting};
  }
  liveness_.Heard(clock.Now());
  auto server_msg = walproto::DecodeServerMessage(**msg);
  if (!server_msg) return std::unexpected(server_msg.error());
  if (auto* k = std::get_if<walproto::PrimaryKeepalive>(&*server_msg)) {
    stats_->keepalives.fetch_add(1, std::memory_order_relaxed);
    progress_.SawWalEnd(k->wal_end);
    // Idle rule: nothing in flight and not inside a transaction, so every
    // commit before wal_end was received and confirmed already.
    if (open_tx_ == nullptr) tracker_->FollowServer(k->wal_end);
    if (k->reply_requested) {
      if (auto st = SendStatus(true); !st) return std::unexpected(st.error());
      // A stopping server (pg_ctl stop -m fast) waits until we confirm all
      // it sent, asking for replies meanwhile; it ended the marker's session
      // first, so we cannot confirm what awaits marking. Holding on would
      // hold its shutdown forever: let go, and resume from the confirmed
      // position (re-sending the rest) once it is back.
      int64_t marker_error = last_marker_error_ns_->load();
      auto since_marker_error =
          std::chrono::steady_clock::now().time_since_epoch().count() - marker_error;
      if (marker_error != 0 && tracker_->awaiting_mark() > 0 &&
          since_marker_error < std::chrono::nanoseconds(kMarkerErrorRecent).count()) {
        return Fail(ErrorCode::kTransient,
                    "the server asks for a confirmation the relay cannot give (the marker "
                    "cannot reach PostgreSQL: is it stopping?); closing the replication "
                    "connection, resuming from {}",
                    tracker_->confirmed());
      }
    }
    return StepResult{StepResult::kBusy};
  }
  const auto& x = std::get<walproto::XLogData>(*server_msg);
  progress_.SawWalEnd(x.wal_end);
  if (auto st = HandleXLogData(x.data); !st) return std::unexpected(st.error());
  return StepResult{StepResult::kBusy};
}

Status StreamSession::HandleXLogData(std::string_view data) {
  // Inserts decode into their own message so its tuple storage survives the
  // Begin/Commit around it: no allocation per row.
  bool is_insert = !data.empty() && data[0] == 'I';
  pgoutput::DecodedMessage& msg = is_insert ? insert_message_ : message_;
  if (auto st = pgoutput::Decode(data, &msg); !st) {
    return Fail(ErrorCode::kProtocol, "pgoutput: {}", st.error().message);
  }
  if (is_insert) return HandleInsert(std::get<pgoutput::Insert>(msg));
  if (auto* b = std::get_if<pgoutput::Begin>(&message_)) {
    if (open_tx_ != nullptr) {
      return Fail(ErrorCode::kProtocol, "pgoutput: Begin of xid {} inside xid {}", b->xid,
                  open_tx_->xid);
    }
    open_tx_ = tracker_->Begin(b->final_lsn, b->commit_time, b->xid);
    return Ok();
  }
  if (auto* c = std::get_if<pgoutput::Commit>(&message_)) {
    if (open_tx_ == nullptr) {
      return Fail(ErrorCode::kProtocol, "pgoutput: Commit at {} without Begin", c->commit_lsn);
    }
    publisher_->NotePgCommit(open_tx_);
    if (open_tx_->rows_seen > 0) {  // 14 also sends the transactions that published nothing
      stats_->transactions.fetch_add(1, std::memory_order_relaxed);
      stats_->last_commit_unix_micros.store(c->commit_time.ToUnixMicros(),
                                            std::memory_order_relaxed);
    }
    tracker_->Commit(std::exchange(open_tx_, nullptr), c->end_lsn);  // may be gone after this
    return Ok();
  }
  if (auto* r = std::get_if<pgoutput::Relation>(&message_)) return HandleRelation(*r);
  if (auto* t = std::get_if<pgoutput::Truncate>(&message_)) {
    for (pgoutput::Oid id : t->relation_ids) {
      if (const outbox::ColumnMap* columns = router_.Find(id)) {
        spdlog::warn("the outbox table {} was truncated: rows not yet published are gone",
                     columns->table);
      }
    }
    return Ok();
  }
  // Type, Origin, Message, and Update/Delete from a publication that sends
  // them: nothing to publish.
  return Ok();
}

Status StreamSession::HandleRelation(const pgoutput::Relation& relation) {
  if (auto st = router_.OnRelation(relation); !st) return st;
  relations_.Put(relation);
  return Ok();
}

Status StreamSession::HandleInsert(const pgoutput::Insert& insert) {
  if (open_tx_ == nullptr) {
    return Fail(ErrorCode::kProtocol, "pgoutput: Insert outside a transaction");
  }
  const outbox::ColumnMap* columns = router_.Find(insert.relation_id);
  if (columns == nullptr) {
    if (relations_.Find(insert.relation_id) == nullptr) {
      return Fail(ErrorCode::kProtocol, "pgoutput: Insert for relation {} never described",
                  insert.relation_id);
    }
    return Ok();  // another table in a shared publication
  }
  stats_->rows.fetch_add(1, std::memory_order_relaxed);
  return publisher_->MapAndProduce(*columns, insert.new_tuple, open_tx_, this);
}

milliseconds StreamSession::WaitBound() const {
  // Exactly-once: not past the open Kafka transaction's commit.
  constexpr milliseconds kMax{100};
  auto due = publisher_->CommitDueAt();
  if (due == Clock::time_point::max()) return kMax;
  auto left = std::chrono::ceil<milliseconds>(due - stop_->clock().Now());
  return std::clamp(left, milliseconds(0), kMax);
}

Status StreamSession::Touch() {
  liveness_.NotListening(stop_->clock().Now());  // a Publisher wait: the loop reads nothing
  return SendStatus(false);
}

Status StreamSession::SendStatus(bool force) {
  auto now = stop_->clock().Now();
  Lsn flush = tracker_->confirmed();
  auto update = progress_.Due(now, flush, liveness_.ProbeDue(now) || force);
  if (!update) return Ok();
  update->reply_requested = liveness_.WantReply(now);
  if (auto st = source_->SendStatus(*update); !st) return st;
  progress_.Sent(now, flush);
  stats_->status_updates.fetch_add(1, std::memory_order_relaxed);
  stats_->Beat();
  return Ok();
}

void StreamSession::LogProgress() {
  auto now = stop_->clock().Now();
  if (now - last_progress_log_ < std::chrono::seconds(30)) return;
  last_progress_log_ = now;
  auto s = tracker_->stats();
  spdlog::info(
      "progress: {} transactions, {} rows, {} delivered, {} dead-lettered; "
      "confirmed {}, {} rows in flight",
      stats_->transactions.load(), stats_->rows.load(), stats_->delivered.load(),
      stats_->dead_lettered.load(), s.confirmed, s.rows_in_flight);
}

}  // namespace outbox_relay::pipeline
