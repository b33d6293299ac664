#include "outbox_relay/tracking/standby_marks.h"

#include <algorithm>

#include "outbox_relay/tracking/ack_tracker.h"

namespace outbox_relay::tracking {

void StandbyMarks::Enable() {
  MutexLock lock(&mu_);
  enabled_ = true;
}

bool StandbyMarks::enabled() const {
  MutexLock lock(&mu_);
  return enabled_;
}

bool StandbyMarks::keeping() const {
  MutexLock lock(&mu_);
  return enabled_ && standbys_;
}

void StandbyMarks::Keep(Lsn final_lsn, const RowRange& rows) {
  MutexLock lock(&mu_);
  KeepLocked(final_lsn, rows);
}

void StandbyMarks::KeepMarked(const std::vector<Transaction*>& txs) {
  MutexLock lock(&mu_);
  if (!enabled_ || !standbys_) return;
  for (const Transaction* tx : txs) {
    for (const RowRange& run : tx->row_ranges) KeepLocked(tx->final_lsn, run);
  }
}

void StandbyMarks::KeepLocked(Lsn final_lsn, const RowRange& rows) {
  if (!enabled_ || !standbys_) return;
  if (runs_.size() >= kMaxRuns) runs_.pop_front();
  const Lsn lsn = final_lsn != kInvalidLsn ? final_lsn : backfilled_before_;
  runs_.push_back(Run{kInvalidLsn, lsn, rows.transaction_id, rows.first, rows.last});
}

void StandbyMarks::SetBackfilledBefore(Lsn lsn) {
  MutexLock lock(&mu_);
  backfilled_before_ = lsn;
}

void StandbyMarks::SeenAt(TimePoint now) {
  MutexLock lock(&mu_);
  seen_ = std::max(seen_, now);
  // A standby seen lately is waited for, whatever a read before said: a new
  // instance's marker may read the positions (no standby yet: it reconnects
  // after a restart of the primary) before the instance has read the record
  // that says one was seen. Until its next read, that read's "none" made
  // Keep drop the marks the record listed, and a promotion then published
  // those rows again (the hour-long campaign's duplicates).
  if (SeenLatelyLocked(now)) standbys_ = true;
}

bool StandbyMarks::SeenLately(TimePoint now) const {
  MutexLock lock(&mu_);
  return SeenLatelyLocked(now);
}

bool StandbyMarks::SeenLatelyLocked(TimePoint now) const {
  return seen_ != TimePoint{} && now - seen_ < kAway;
}

void StandbyMarks::Read(const StandbyPositions& read, TimePoint now) {
  MutexLock lock(&mu_);
  StandbyPositions standbys = read;
  if (standbys.unknown || standbys.lowest) {
    seen_ = std::max(seen_, now);
  } else if (SeenLatelyLocked(now)) {
    standbys.unknown = true;  // away lately: reconnecting, its position unknown
  }
  standbys_ = standbys.unknown || standbys.lowest.has_value();
  if (!standbys_) {
    runs_.clear();
    return;
  }
  // The runs kept since the last read were marked before this one: their
  // marks are below the position it read.
  for (auto it = runs_.rbegin(); it != runs_.rend() && it->bound == kInvalidLsn; ++it) {
    it->bound = standbys.written;
  }
  if (standbys.unknown) return;
  while (!runs_.empty() && runs_.front().bound != kInvalidLsn &&
         runs_.front().bound <= *standbys.lowest) {
    runs_.pop_front();
  }
}

void StandbyMarks::KeepBelow(Lsn lsn) {
  MutexLock lock(&mu_);
  std::erase_if(runs_, [&](const Run& run) { return run.final_lsn >= lsn; });
}

void StandbyMarks::ForEach(const std::function<void(Lsn, const RowRange&)>& fn) const {
  MutexLock lock(&mu_);
  for (const Run& run : runs_) fn(run.final_lsn, RowRange{run.transaction_id, run.first, run.last});
}

size_t StandbyMarks::size() const {
  MutexLock lock(&mu_);
  return runs_.size();
}

}  // namespace outbox_relay::tracking
