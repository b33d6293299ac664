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
// until the bound, and so does a standby seen within the last minute that is
// gone now (reconnecting, e.g. after a restart of the primary: the marker
// reads that as unknown). A standby the primary does not know of (away
// longer, without a physical slot) cannot be waited for: its rows may come
// twice.
//
// Bounded: past kMaxRuns the oldest runs are forgotten (their rows would be
// published again, never lost). Any thread; one lock, held briefly.
#pragma once

#include <cstddef>
#include <deque>
#include <functional>
#include <mutex>
#include <optional>

#include "outbox_relay/core/lsn.h"

namespace outbox_relay::tracking {

struct RowRange;

// Where the standbys are, read on the primary.
struct StandbyPositions {
  Lsn written;  // the server's WAL insert position: every commit before the read is below it
  std::optional<Lsn> lowest;  // every known standby has the WAL below it; nullopt: no standby
  bool unknown = false;       // a standby whose position cannot be read
};

class StandbyMarks {
 public:
  static constexpr size_t kMaxRuns = 50000;

  // Exactly-once only: nothing is kept before.
  void Enable();
  bool enabled() const;
  // Whether marks are kept now: enabled, and the last read found a standby
  // (or there was no read yet).
  bool keeping() const;

  // The rows `rows` of the transaction committed at `final_lsn` (kInvalidLsn:
  // a backfilled row) are marked, or will be by a mark committed before the
  // next Read: kept until every standby has that mark.
  void Keep(Lsn final_lsn, const RowRange& rows);
  // The standbys as read after some marks committed.
  void Read(const StandbyPositions& standbys);
  // Backfilled rows kept so far were committed before `lsn` (the slot's
  // consistent point).
  void DateBackfilled(Lsn lsn);
  // Forgets the rows of transactions committed at or after `lsn` (the server
  // now writes a timeline that parted from theirs there).
  void KeepBelow(Lsn lsn);
  // Every kept run, oldest first.
  void ForEach(const std::function<void(Lsn final_lsn, const RowRange& rows)>& fn) const;
  size_t size() const;

 private:
  struct Run {
    Lsn bound;  // a position the mark is below (kInvalidLsn: not read since)
    Lsn final_lsn;
    uint64_t transaction_id;
    int64_t first;
    int64_t last;
  };
  mutable std::mutex mu_;
  std::deque<Run> runs_;  // in the order kept; bounds never decrease along it
  bool enabled_ = false;
  bool standbys_ = true;  // the last read found one (or none was read yet)
};

}  // namespace outbox_relay::tracking
