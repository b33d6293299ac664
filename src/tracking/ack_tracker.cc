#include "outbox_relay/tracking/ack_tracker.h"

#include <algorithm>

namespace outbox_relay::tracking {

AckTracker::AckTracker(Lsn start, bool marking) : marking_(marking) {
  confirmed_.store(start.value(), std::memory_order_release);
}

Transaction* AckTracker::Begin(Lsn final_lsn, PgTimestamp commit_time, uint32_t xid) {
  auto tx = std::make_unique<Transaction>();
  tx->seq = next_seq_++;
  tx->final_lsn = final_lsn;
  tx->commit_time = commit_time;
  tx->xid = xid;
  Transaction* raw = tx.get();
  MutexLock lock(&mu_);
  in_flight_.push_back(std::move(tx));
  return raw;
}

namespace {

int64_t SteadyNanos() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

void AckTracker::AddMessage(Transaction* tx) {
  tx->pending.fetch_add(1, std::memory_order_relaxed);
  tx->last_message_ns.store(SteadyNanos(), std::memory_order_relaxed);
  tx->unreported.fetch_add(1, std::memory_order_release);
  ++tx->rows;
  rows_in_flight_.fetch_add(1, std::memory_order_relaxed);
}

void AckTracker::AddDeadLetter(Transaction* tx) {
  tx->pending.fetch_add(1, std::memory_order_relaxed);
  tx->last_message_ns.store(SteadyNanos(), std::memory_order_relaxed);
  tx->unreported.fetch_add(1, std::memory_order_release);
  rows_in_flight_.fetch_add(1, std::memory_order_relaxed);
}

void AckTracker::CancelMessage(Transaction* tx) {
  --tx->rows;
  tx->unreported.fetch_sub(1, std::memory_order_relaxed);
  rows_in_flight_.fetch_sub(1, std::memory_order_relaxed);
  Release(tx, 1);  // never the last token: the transaction is still open
}

void AckTracker::NoteRow(Transaction* tx, uint64_t xid8, int64_t offset) {
  auto& runs = tx->row_ranges;
  // Rows of one writer arrive with consecutive offsets (one sequence, one
  // session): almost always this extends the last run.
  if (!runs.empty() && runs.back().transaction_id == xid8 && runs.back().last + 1 == offset) {
    runs.back().last = offset;
    return;
  }
  runs.push_back(RowRange{xid8, offset, offset});
}

void AckTracker::TransactionIds(const Transaction& tx, std::vector<uint64_t>* out) {
  out->clear();
  // Almost always one value per transaction; a linear scan beats a set.
  for (const RowRange& run : tx.row_ranges) {
    if (!out->empty() && out->back() == run.transaction_id) continue;
    if (std::find(out->begin(), out->end(), run.transaction_id) == out->end()) {
      out->push_back(run.transaction_id);
    }
  }
}

void AckTracker::Commit(Transaction* tx, Lsn end_lsn) {
  tx->end_lsn = end_lsn;
  newest_end_.store(std::max(newest_end_.load(std::memory_order_relaxed), end_lsn.value()),
                    std::memory_order_relaxed);
  Release(tx, 1);  // the "open" token: from here only deliveries remain
}

void AckTracker::Abandon(Transaction* tx) {
  tx->abandoned = true;
  Release(tx, 1);
}

void AckTracker::Hold(Transaction* tx) { tx->pending.fetch_add(1, std::memory_order_relaxed); }

void AckTracker::ReleaseHold(Transaction* tx) { Release(tx, 1); }

void AckTracker::AbandonHeld(const std::vector<Transaction*>& txs) {
  if (txs.empty()) return;
  uint64_t first = UINT64_MAX;
  for (const Transaction* tx : txs) first = std::min(first, tx->seq);
  {
    MutexLock lock(&mu_);
    for (const auto& tx : in_flight_) {
      if (tx->seq >= first) tx->abandoned = true;
    }
  }
  for (Transaction* tx : txs) Release(tx, 1);
}

void AckTracker::OnDelivered(Transaction* tx) {
  tx->unreported.fetch_sub(1, std::memory_order_relaxed);
  rows_in_flight_.fetch_sub(1, std::memory_order_relaxed);
  if (failpoint::kCompiledIn && unsafe_confirm_newest_) [[unlikely]] {
    MutexLock lock(&mu_);
    confirmed_.store(std::max(confirmed_.load(), newest_end_.load()), std::memory_order_release);
  }
  Release(tx, 1);
}

void AckTracker::OnFailed(Transaction* tx, std::string reason, bool retryable) {
  tx->unreported.fetch_sub(1, std::memory_order_relaxed);
  rows_in_flight_.fetch_sub(1, std::memory_order_relaxed);
  MutexLock lock(&mu_);
  failure_retryable_ = (failure_ ? failure_retryable_ : true) && retryable;
  if (!failure_) failure_ = std::move(reason);
  failed_seq_ = std::min(failed_seq_, tx->seq);
  // The transaction never completes: its pending count keeps the token of
  // the failed message, so it can neither be marked nor confirmed.
  progress_.NotifyAll();
  delivered_.NotifyAll();
}

void AckTracker::Release(Transaction* tx, int64_t count) {
  // acq_rel: the thread that completes the transaction sees every write made
  // before any release (end_lsn, rows, row_ranges).
  if (tx->pending.fetch_sub(count, std::memory_order_acq_rel) == count) Complete(tx);
}

void AckTracker::Complete(Transaction* tx) {
  MutexLock lock(&mu_);
  tx->delivered = true;

  if (tx->abandoned || !marking_ || tx->row_ranges.empty()) {
    // Nothing to mark: abandoned rows come again with the re-sent
    // transaction; a transaction without outbox rows (another table's, or an
    // empty one that PostgreSQL 14 still sends) has no row and needs no entry
    // in the commit index — whose own INSERT would come back as one more such
    // transaction, for ever. (Rows Kafka already had, not produced again in
    // exactly-once mode, are noted, and marked.)
    tx->marked = true;
  } else {
    to_mark_.push_back(tx);
    ++awaiting_mark_;
    delivered_.NotifyOne();
  }
  AdvanceLocked();
  progress_.NotifyAll();
}

void AckTracker::AdvanceLocked() {
  uint64_t confirmed = confirmed_.load(std::memory_order_relaxed);
  while (!in_flight_.empty()) {
    Transaction* head = in_flight_.front().get();
    if (!head->delivered || !head->marked || head->seq >= failed_seq_) break;
    if (head->abandoned) {
      follow_when_drained_ = 0;  // it comes again: nothing past it
    } else {
      confirmed = std::max(confirmed, head->end_lsn.value());
    }
    in_flight_.pop_front();
  }
  if (in_flight_.empty() && !failure_) {
    // A keepalive that came while these were in flight: its wal_end now holds.
    confirmed = std::max(confirmed, follow_when_drained_);
    follow_when_drained_ = 0;
  }
  confirmed_.store(confirmed, std::memory_order_release);
}

bool AckTracker::ResetConfirmed(Lsn position) {
  MutexLock lock(&mu_);
  if (!in_flight_.empty()) return false;
  follow_when_drained_ = 0;
  confirmed_.store(position.value(), std::memory_order_release);
  return true;
}

void AckTracker::RaiseConfirmed(Lsn position) {
  MutexLock lock(&mu_);
  if (position.value() > confirmed_.load(std::memory_order_relaxed)) {
    confirmed_.store(position.value(), std::memory_order_release);
  }
}

void AckTracker::ForEachUnmarked(const std::function<void(const Transaction&)>& fn) const {
  MutexLock lock(&mu_);
  for (const auto& tx : in_flight_) {
    if (tx->marked || tx->abandoned || tx->row_ranges.empty()) continue;
    fn(*tx);
  }
}

bool AckTracker::FollowServer(Lsn wal_end) {
  MutexLock lock(&mu_);
  // Between transactions: every commit before wal_end was received.
  idle_wal_end_.store(std::max(idle_wal_end_.load(std::memory_order_relaxed), wal_end.value()),
                      std::memory_order_relaxed);
  if (failure_) return false;
  if (!in_flight_.empty()) {
    // Followed once they are confirmed: otherwise the slot would wait for
    // the next keepalive, which the server sends only once its WAL moves
    // past the write position we report (idle_wal_end_ and beyond). Not
    // when the newest one is still open (no commit seen).
    if (in_flight_.back()->end_lsn.value() != 0) {
      follow_when_drained_ = std::max(follow_when_drained_, wal_end.value());
    }
    return false;
  }
  if (wal_end.value() <= confirmed_.load(std::memory_order_relaxed)) return false;
  confirmed_.store(wal_end.value(), std::memory_order_release);
  return true;
}

void AckTracker::TakeDelivered(std::vector<Transaction*>* out, size_t max,
                               std::chrono::milliseconds timeout) {
  const auto deadline = CondVar::Clock::now() + timeout;
  MutexLock lock(&mu_);
  while (to_mark_.empty()) {
    if (!delivered_.WaitUntil(&mu_, deadline)) break;
  }
  while (!to_mark_.empty() && out->size() < max) {
    out->push_back(to_mark_.front());
    to_mark_.pop_front();
  }
}

void AckTracker::WaitDelivered(size_t count, std::chrono::milliseconds timeout) {
  const auto deadline = CondVar::Clock::now() + timeout;
  MutexLock lock(&mu_);
  const uint64_t woken = wakes_;
  while (to_mark_.size() < count && wakes_ == woken) {
    if (!delivered_.WaitUntil(&mu_, deadline)) break;
  }
}

void AckTracker::OnMarked(const std::vector<Transaction*>& txs) {
  MutexLock lock(&mu_);
  for (Transaction* tx : txs) {
    tx->marked = true;
    --awaiting_mark_;
  }
  standby_marks_.KeepMarked(txs);  // before AdvanceLocked may free them
  AdvanceLocked();
  progress_.NotifyAll();
}

void AckTracker::Unmarkable(const std::vector<Transaction*>& txs, std::string reason) {
  if (txs.empty()) return;
  MutexLock lock(&mu_);
  for (const Transaction* tx : txs) {
    --awaiting_mark_;
    failed_seq_ = std::min(failed_seq_, tx->seq);
  }
  failure_retryable_ = failure_ ? failure_retryable_ : true;
  if (!failure_) failure_ = std::move(reason);
  progress_.NotifyAll();
}

Lsn AckTracker::DeliveredThrough() const {
  MutexLock lock(&mu_);
  for (const auto& tx : in_flight_) {
    if (!tx->delivered) return tx->final_lsn;
  }
  return Lsn(std::max({newest_end_.load(std::memory_order_relaxed),
                       idle_wal_end_.load(std::memory_order_relaxed),
                       confirmed_.load(std::memory_order_relaxed)}));
}

std::optional<std::string> AckTracker::ExpireOverdue(std::chrono::steady_clock::time_point now,
                                                     std::chrono::milliseconds timeout) {
  const int64_t now_ns =
      std::chrono::duration_cast<std::chrono::nanoseconds>(now.time_since_epoch()).count();
  MutexLock lock(&mu_);
  if (failure_) return std::nullopt;
  for (const auto& tx : in_flight_) {
    if (tx->delivered || tx->unreported.load(std::memory_order_acquire) <= 0) continue;
    // Messages are handed over in stream order: the first transaction with
    // messages out holds the oldest, and all of its are at least this old.
    int64_t age_ns = now_ns - tx->last_message_ns.load(std::memory_order_relaxed);
    if (age_ns < std::chrono::nanoseconds(timeout).count()) return std::nullopt;
    failure_ = "Kafka has not acknowledged " + std::to_string(tx->unreported.load()) +
               " record(s) of transaction xid " + std::to_string(tx->xid) + " (commit " +
               tx->final_lsn.ToString() + ") " + std::to_string(age_ns / 1000000) +
               " ms after they were produced";
    failure_retryable_ = true;
    failed_seq_ = std::min(failed_seq_, tx->seq);
    progress_.NotifyAll();
    delivered_.NotifyAll();
    return failure_;
  }
  return std::nullopt;
}

bool AckTracker::failure_retryable() const {
  MutexLock lock(&mu_);
  return failure_.has_value() && failure_retryable_;
}

bool AckTracker::Restart() {
  MutexLock lock(&mu_);
  if (!to_mark_.empty() || awaiting_mark_.load() != 0) return false;
  in_flight_.clear();
  follow_when_drained_ = 0;
  rows_in_flight_.store(0, std::memory_order_relaxed);
  failure_.reset();
  failure_retryable_ = false;
  failed_seq_ = UINT64_MAX;
  progress_.NotifyAll();
  return true;
}

bool AckTracker::empty() const {
  MutexLock lock(&mu_);
  return in_flight_.empty();
}

size_t AckTracker::awaiting_mark() const { return awaiting_mark_.load(std::memory_order_relaxed); }

std::optional<std::string> AckTracker::failure() const {
  MutexLock lock(&mu_);
  return failure_;
}

TrackerStats AckTracker::stats() const {
  MutexLock lock(&mu_);
  return TrackerStats{in_flight_.size(), rows_in_flight_.load(std::memory_order_relaxed),
                      awaiting_mark_.load(), Lsn(confirmed_.load(std::memory_order_relaxed))};
}

void AckTracker::WaitForProgress(std::chrono::milliseconds timeout) {
  const auto deadline = CondVar::Clock::now() + timeout;
  MutexLock lock(&mu_);
  progress_.WaitUntil(&mu_, deadline);
}

bool AckTracker::WaitEmpty(std::chrono::milliseconds timeout) {
  const auto deadline = CondVar::Clock::now() + timeout;
  MutexLock lock(&mu_);
  while (!in_flight_.empty() && !failure_.has_value()) {
    if (!progress_.WaitUntil(&mu_, deadline)) break;
  }
  return in_flight_.empty() && !failure_;
}

void AckTracker::Notify() {
  MutexLock lock(&mu_);
  progress_.NotifyAll();
}

void AckTracker::Wake() {
  MutexLock lock(&mu_);
  ++wakes_;
  progress_.NotifyAll();
  delivered_.NotifyAll();
}

}  // namespace outbox_relay::tracking
