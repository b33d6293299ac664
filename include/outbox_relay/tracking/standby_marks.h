// Exactly-once across a promotion: the marked rows a standby may still show
// unmarked (DESIGN §2.8).
//
// A row marked `offset_acked` on the primary stays unmarked on a standby
// until the standby has the mark's WAL, which for an asynchronous standby can
// be later than it has the row. Promoted in between, it shows the row
// unmarked; a slot made anew there backfills it, and the row, which Kafka
// holds, would be published twice. So the progress record keeps listing a
// marked row among its unmarked ones ("the table may not show it marked")
// until every standby the primary knows of has the mark: the lowest position
// its physical walsenders report flushed and its physical slots keep
// (pg::ReadStandbyPositions, read by the marker after it marks). A promoted
// server then finds the row in the record and marks it without producing it.
//
// Nothing is kept while the primary has no standby. A standby whose position
// cannot be read (the relay's role lacks pg_read_all_stats) keeps every mark
// until the bound, and so does a standby seen within the last minute (kAway)
// that is gone now: reconnecting, e.g. after a restart of the primary (it
// waits up to wal_retrieve_retry_interval). "Seen" outlives a pipeline
// restart (the tracker is the process's) and a process restart (the progress
// record says it, KafkaProgress::standbys). A standby the primary does not
// know of (away longer, without a physical slot) cannot be waited for: its
// rows may come twice.
//
// Bounded: past kMaxRuns the oldest runs are forgotten (their rows would be
// published again, never lost). Any thread; one lock, held briefly.
#pragma once

#include <chrono>
#include <cstddef>
#include <deque>
#include <functional>
#include <optional>
#include <vector>

#include "outbox_relay/core/lsn.h"
#include "outbox_relay/core/mutex.h"

namespace outbox_relay::tracking {

struct RowRange;
struct Transaction;

// Where the standbys are, read on the primary.
struct StandbyPositions {
  Lsn written;  // the server's WAL insert position: every commit before the read is below it
  std::optional<Lsn> lowest;  // every known standby has the WAL below it; nullopt: no standby
  bool unknown = false;       // a standby whose position cannot be read
};

class StandbyMarks {
 public:
  using TimePoint = std::chrono::steady_clock::time_point;
  static constexpr size_t kMaxRuns = 50000;
  static constexpr std::chrono::seconds kAway{60};

  // Exactly-once only: nothing is kept before.
  void Enable();
  bool enabled() const;
  // Whether marks are kept now: enabled, and the last read found a standby
  // (or there was no read yet).
  bool keeping() const;

  // The rows `rows` of the transaction committed at `final_lsn` (kInvalidLsn:
  // a backfilled row, committed before SetBackfilledBefore's position) are
  // marked, or will be by a mark committed before the next Read: kept until
  // every standby has that mark.
  void Keep(Lsn final_lsn, const RowRange& rows);
  // The rows of `txs`, marked (AckTracker::OnMarked): Keep for each, under
  // one lock.
  void KeepMarked(const std::vector<Transaction*>& txs);
  // Backfilled rows kept from now on were committed before `lsn` (the
  // consistent point of the slot the relay reads now).
  void SetBackfilledBefore(Lsn lsn);
  // The standbys as read after some marks committed, at `now`.
  void Read(const StandbyPositions& standbys, TimePoint now = std::chrono::steady_clock::now());
  // A standby was seen at `now` (by an earlier process: its progress record
  // says so): marks are kept from now on, even after a read that found none.
  void SeenAt(TimePoint now = std::chrono::steady_clock::now());
  // Whether a standby was seen within kAway of `now`.
  bool SeenLately(TimePoint now = std::chrono::steady_clock::now()) const;
  // Forgets the rows of transactions committed at or after `lsn` (the server
  // now writes a timeline that parted from theirs there).
  void KeepBelow(Lsn lsn);
  // Every kept run, oldest first.
  void ForEach(const std::function<void(Lsn final_lsn, const RowRange& rows)>& fn) const;
  size_t size() const;

 private:
  void KeepLocked(Lsn final_lsn, const RowRange& rows) REQUIRES(mu_);
  bool SeenLatelyLocked(TimePoint now) const REQUIRES(mu_);
  struct Run {
    Lsn bound;  // a position the mark is below (kInvalidLsn: not read since)
    Lsn final_lsn;
    uint64_t transaction_id;
    int64_t first;
    int64_t last;
  };
  mutable Mutex mu_;
  std::deque<Run> runs_ GUARDED_BY(mu_);  // in the order kept; bounds never decrease along it
  bool enabled_ GUARDED_BY(mu_) = false;
  bool standbys_ GUARDED_BY(mu_) = true;   // the last read found one (or none was read yet)
  TimePoint seen_ GUARDED_BY(mu_){};       // when a standby was last seen (none: never)
  Lsn backfilled_before_ GUARDED_BY(mu_);  // SetBackfilledBefore
};

}  // namespace outbox_relay::tracking
