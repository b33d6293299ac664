// The ack tracker: which WAL position may be confirmed to the server.
//
// Confirmation rule (DESIGN §2.4). The slot's flush LSN may move to the
// `end_lsn` of transaction T only when every row of T and of every transaction
// committed before T is (a) acknowledged by Kafka and (b) marked
// `offset_acked` in the table. Kafka acknowledges out of order across
// partitions, so "the last delivery report" says nothing about what came
// before it; the tracker keeps the transactions in commit order and confirms
// the longest fully-done prefix.
//
// Idle rule (DESIGN §2.5). When nothing is in flight and the stream is not
// inside a transaction, every commit before the server's reported WAL end has
// already been received and confirmed, so the confirmed position may follow
// the keepalive's `wal_end`. That keeps an idle outbox from pinning WAL on a
// busy database.
//
// Threads. `Begin`, `AddRow`, `Commit`, `Abandon` and `FollowServer` are
// called by the replication loop only, in stream order. `OnDelivered` is
// called from the Kafka delivery-report thread, `TakeDelivered` and
// `OnMarked` from the marker thread; everything else from any thread.
// The hot path (`AddRow`, `OnDelivered` of a row that does not complete its
// transaction) touches one atomic counter and takes no lock.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "outbox_relay/core/failpoint.h"
#include "outbox_relay/core/lsn.h"
#include "outbox_relay/core/mutex.h"
#include "outbox_relay/core/pg_time.h"
#include "outbox_relay/tracking/standby_marks.h"

namespace outbox_relay::tracking {

// The primary keys of rows produced for one transaction, as runs of
// consecutive offsets under one xid8: [first, last]. A run holds only rows
// the relay itself produced, so marking by runs marks exactly what was
// delivered — never a row a backfill page, a row filter or another relation
// kept from the relay (DESIGN §5: marking by transaction_id alone lost rows).
struct RowRange {
  uint64_t transaction_id = 0;  // xid8
  int64_t first = 0;            // offset of the first row of the run
  int64_t last = 0;             // offset of the last row of the run (inclusive)

  bool operator==(const RowRange&) const = default;
};

// One transaction from Begin to confirmation. Owned by the tracker; its
// address is stable while the transaction is in flight and is what each
// produced message carries as its delivery opaque.
struct Transaction {
  uint64_t seq = 0;                  // position in stream order
  Lsn final_lsn;                     // Begin.final_lsn: the commit record's LSN
  Lsn end_lsn;                       // Commit.end_lsn, set by Commit()
  PgTimestamp commit_time;           // from Begin
  uint32_t xid = 0;                  // 32-bit xid from Begin
  std::vector<RowRange> row_ranges;  // primary keys of its produced rows, for marking
  uint64_t rows = 0;                 // rows produced (incl. dead letters)
  uint64_t rows_seen = 0;            // rows received, incl. those Kafka already had (exactly-once)
  bool abandoned = false;            // stream broke before its Commit: never confirms, never marked

  // 1 for the open transaction (released by Commit/Abandon) + 1 per message
  // not yet acknowledged. The thread that brings it to 0 completes it.
  std::atomic<int64_t> pending{1};
  // For the delivery deadline (ExpireOverdue): messages handed over and not
  // yet reported, and when the newest of them was handed over (steady clock).
  std::atomic<int64_t> unreported{0};
  std::atomic<int64_t> last_message_ns{0};
  // Guarded by the tracker's mutex:
  bool delivered = false;
  bool marked = false;
};

struct TrackerStats {
  size_t transactions = 0;     // in flight (not yet confirmed)
  int64_t rows_in_flight = 0;  // produced, not yet acknowledged
  size_t awaiting_mark = 0;    // delivered, not yet marked
  Lsn confirmed;
};

class AckTracker {
 public:
  // `marking`: when false, a delivered transaction counts as marked at once
  // (no marker runs, e.g. a benchmark with marking off).
  explicit AckTracker(Lsn start, bool marking = true);

  // TEST ONLY: breaks the confirmation rule the way a naive relay does: on
  // every delivery report, confirm the end of the newest transaction received,
  // whatever is still in flight before it. Exists so the crash tests can prove
  // they detect loss.
  // Without failpoints (core/failpoint.h) OnDelivered ignores it.
  void EnableUnsafeConfirmNewest() { unsafe_confirm_newest_ = true; }

  // A new slot starts at a new position. Only while nothing is in flight.
  bool ResetConfirmed(Lsn position);
  // The slot itself is confirmed up to `position` (e.g. by an instance that
  // held it while we were away): never report less, since PostgreSQL 15
  // would move confirmed_flush_lsn back to whatever we send.
  void RaiseConfirmed(Lsn position);
  AckTracker(const AckTracker&) = delete;
  AckTracker& operator=(const AckTracker&) = delete;

  // --- replication loop ---
  Transaction* Begin(Lsn final_lsn, PgTimestamp commit_time, uint32_t xid);
  // Call before producing a message for `tx` (a row or its dead letter).
  void AddMessage(Transaction* tx);
  // From the delivery thread: one more message for `tx`, which must still
  // hold a pending token of its own (the refused message being replaced).
  void AddDeadLetter(Transaction* tx);
  // Undoes AddMessage for a message the sink did not take.
  void CancelMessage(Transaction* tx);
  // Records the primary key of one row produced for `tx` (a record or its
  // dead letter): marking marks exactly these rows.
  static void NoteRow(Transaction* tx, uint64_t xid8, int64_t offset);
  // The distinct xid8 values of `tx`'s rows, in first-seen order, into `*out`
  // (cleared first; a buffer the caller reuses).
  static void TransactionIds(const Transaction& tx, std::vector<uint64_t>* out);
  void Commit(Transaction* tx, Lsn end_lsn);
  // The stream broke inside `tx`: its rows will be re-sent by the server.
  void Abandon(Transaction* tx);
  // Exactly-once: `tx` also waits for the commit of a Kafka transaction that
  // holds some of its rows (one hold per such Kafka transaction).
  void Hold(Transaction* tx);
  void ReleaseHold(Transaction* tx);
  // Those Kafka transactions were aborted: `txs` never confirm and are never
  // marked (their rows are sent again); releases their holds. Every
  // transaction after the first of them is abandoned too: the stream ends and
  // the slot sends them all again, so none of them (a transaction without
  // rows, one whose rows Kafka already had) may move the confirmed position
  // past the first.
  void AbandonHeld(const std::vector<Transaction*>& txs);
  // Exactly-once: calls `fn` for every transaction in flight that has rows
  // and is neither marked nor abandoned, in stream order: what Kafka holds, or
  // will once the open Kafka transaction commits, and the table may not show
  // marked (the progress record's unmarked rows). Under the tracker's lock:
  // keep `fn` short.
  void ForEachUnmarked(const std::function<void(const Transaction&)>& fn) const;
  // Idle rule: if nothing is in flight, confirm up to the server's `wal_end`.
  // Returns true when the confirmed position moved.
  bool FollowServer(Lsn wal_end);

  // --- delivery-report thread ---
  void OnDelivered(Transaction* tx);
  // A message failed: nothing at or after `tx` may be confirmed. `retryable`:
  // the transaction can be sent again from the slot (see Restart).
  void OnFailed(Transaction* tx, std::string reason, bool retryable = false);

  // --- marker thread ---
  // Waits up to `timeout` for delivered transactions and moves up to `max` of
  // them (in the order they were delivered) into `*out`.
  void TakeDelivered(std::vector<Transaction*>* out, size_t max, std::chrono::milliseconds timeout);
  // Waits up to `timeout` until `count` more transactions are delivered than
  // the marker has taken, or Wake is called; moves nothing.
  void WaitDelivered(size_t count, std::chrono::milliseconds timeout);
  // Their rows are also kept among the standby marks while those keep any.
  void OnMarked(const std::vector<Transaction*>& txs);
  // `txs` cannot be marked on the server the marker reaches (another
  // timeline: a promoted standby, where their transaction ids may name other
  // rows): never marked nor confirmed, a retryable failure as a failed
  // delivery is, so the pipeline restarts and their rows come again (from
  // the slot, or the backfill of a slot made anew).
  void Unmarkable(const std::vector<Transaction*>& txs, std::string reason);

  // --- delivery deadline (any thread) ---
  // If the oldest transaction with messages not yet reported handed over its
  // newest one `timeout` or more before `now`, every one of those messages is
  // that old: fails it (retryable) and returns why; nullopt otherwise.
  std::optional<std::string> ExpireOverdue(std::chrono::steady_clock::time_point now,
                                           std::chrono::milliseconds timeout);
  // Every failure so far can be retried from the slot.
  bool failure_retryable() const;
  // After a retryable failure, once no message can be reported any more (the
  // sink is closed) and the marker holds nothing (awaiting_mark() == 0):
  // forgets every transaction in flight and the failure; confirmed() stays,
  // and the stream restarts there, so the server sends them all again.
  // False (nothing changed) while the marker still holds some.
  bool Restart();

  // --- anyone ---
  Lsn confirmed() const { return Lsn(confirmed_.load(std::memory_order_acquire)); }
  // Every transaction whose commit ends at or before this position has been
  // received from the stream and delivered (acknowledged by Kafka), marked or
  // not: the first undelivered transaction's commit LSN, or, when all are
  // delivered, the furthest position known to be received (a commit's end,
  // an idle keepalive's WAL end, the confirmed position). Watermill's
  // progress may cover a transaction id only once every transaction that
  // finished before it was sampled is delivered (marker::WatermillProgress).
  // Meaningless while a backfill runs (its transactions have no LSN: then
  // it is 0 or the slot's start).
  Lsn DeliveredThrough() const;
  bool empty() const;  // nothing in flight
  int64_t rows_in_flight() const { return rows_in_flight_.load(std::memory_order_relaxed); }
  size_t awaiting_mark() const;
  std::optional<std::string> failure() const;
  TrackerStats stats() const;
  // Waits until something completes (a delivery, a mark) or `timeout` passes.
  void WaitForProgress(std::chrono::milliseconds timeout);
  // Waits until nothing is in flight; false on timeout or failure.
  bool WaitEmpty(std::chrono::milliseconds timeout);
  // Wakes every waiter, the marker's wait for more transactions included
  // (shutdown).
  void Wake();
  // Wakes the threads waiting for progress (WaitForProgress, WaitEmpty), not
  // the marker: a Kafka transaction's hand-over or end, or a refused record,
  // is news for the loop only. (Woken by the publisher at each Kafka commit,
  // the marker ended its wait for more transactions each time: in
  // exactly-once mode a statement every ~20 ms instead of every 200.)
  void Notify();
  // Exactly-once: the marked rows a standby may not have the marks of yet.
  StandbyMarks& standby_marks() { return standby_marks_; }

 private:
  void Complete(Transaction* tx) EXCLUDES(mu_);  // pending reached 0
  void AdvanceLocked() REQUIRES(mu_);            // pop the done prefix
  void Release(Transaction* tx, int64_t count);  // pending -= count

  mutable Mutex mu_;
  CondVar progress_;                    // deliveries, marks, confirmations
  CondVar delivered_;                   // for the marker
  uint64_t wakes_ GUARDED_BY(mu_) = 0;  // Wake calls (ends WaitDelivered)
  std::deque<std::unique_ptr<Transaction>> in_flight_ GUARDED_BY(mu_);  // stream order
  std::deque<Transaction*> to_mark_ GUARDED_BY(mu_);                    // delivered, not taken yet
  std::atomic<size_t> awaiting_mark_{0};  // written under mu_, read without it
  std::optional<std::string> failure_ GUARDED_BY(mu_);
  bool failure_retryable_ GUARDED_BY(mu_) = false;
  uint64_t failed_seq_ GUARDED_BY(mu_) = UINT64_MAX;  // nothing at or after it is confirmed
  std::atomic<uint64_t> confirmed_{0};
  std::atomic<int64_t> rows_in_flight_{0};
  uint64_t next_seq_ = 0;
  const bool marking_;
  bool unsafe_confirm_newest_ = false;
  std::atomic<uint64_t> newest_end_{0};    // end of the last committed transaction received
  std::atomic<uint64_t> idle_wal_end_{0};  // wal_end of the last keepalive between transactions
  // wal_end of a keepalive between transactions that came while some were in
  // flight: confirmed once they all are (0: none).
  uint64_t follow_when_drained_ GUARDED_BY(mu_) = 0;
  StandbyMarks standby_marks_;
};

}  // namespace outbox_relay::tracking
