// Exactly-once delivery: the progress the relay commits to Kafka inside each
// Kafka transaction, next to the records it describes (DESIGN §2.8), and the
// rule that decides what of it a relay may act on.
//
// One value per relay, under its key (the transactional.id), in a compacted
// topic of its own:
//
//   {"v":1,"format":2,"key":"outbox-relay.7312.review.outbox_relay",
//    "relay":{"system_id":"7312","database":"review","slot":"outbox_relay",
//             "incarnation":"0/16B3748"},
//    "timeline":2,"history":[[1,"0/5000148"]],
//    "lsn":"16/B374D848","rows":12,"complete":true,
//    "backfill":{"snapshot":"731:745:","transaction_id":"740","offset":"12345"},
//    "unmarked":"1A2B3C,740,12345,0;40,1,1,0*17","standbys":true}
//
// v         the oldest record format that can read this one safely: a reader
//           refuses a record whose v is above its own format (the fields a
//           reader of format v knows mean what they meant to it; what was
//           added later is ignored by it). 1: relays since 0.1 read it.
// format    the writer's format (1 when absent: the first relays).
// relay     whose record it is: the cluster (system identifier), database and
//           slot, and the slot's incarnation (the consistent point it was
//           created at: a recreated slot is a new incarnation). Format 1 has
//           none; it belongs to the relay whose default transactional.id is
//           its key, or to nobody anyone can verify.
// timeline, history
//           the WAL `lsn` lies on (core/wal_history.h): a position is trusted
//           only below the point where this history and the server's part.
// lsn       Begin.final_lsn (the commit record's LSN) of the last PostgreSQL
//           transaction whose rows the committed Kafka transactions hold;
// rows      how many of its rows (in stream order) they hold;
// complete  all of them (its Commit was read): nothing of it is left to send;
// backfill  during a snapshot backfill: the stored snapshot it belongs to and
//           the last (transaction_id, offset) published, in keyset order;
// unmarked  the rows Kafka holds that the table may not show `offset_acked`
//           yet (published, not yet marked): by primary key, with the commit
//           LSN of their transaction (HeldRows). A backfill after a lost slot
//           finds them unacked and must not publish them again. With
//           standbys, also marked rows until the standbys have the marks
//           (tracking::StandbyMarks).
// standbys  the relay saw a standby of the primary within the last minute
//           (absent: it did not): the next instance waits for one that is
//           away a while (reconnecting) instead of taking it for none.
//
// After a restart PostgreSQL sends again everything after the slot's
// confirmed position: rows at or before the trusted position are marked but
// not produced again (Kafka has them, committed).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "outbox_relay/core/lsn.h"
#include "outbox_relay/core/result.h"
#include "outbox_relay/core/wal_history.h"

namespace outbox_relay::pipeline {

// The record format this build writes, and the newest it reads.
inline constexpr uint32_t kProgressFormat = 2;

// Whose progress it is.
struct RelayIdentity {
  std::string system_id;  // the cluster's system identifier (IDENTIFY_SYSTEM)
  std::string database;
  std::string slot;
  bool operator==(const RelayIdentity&) const = default;
  std::string ToString() const;  // "system 7312…, database review, slot outbox_relay"
};

// A run of rows Kafka holds: consecutive offsets of one transaction_id, and
// the commit LSN of the PostgreSQL transaction they belong to (for rows a
// backfill published: the consistent point of its slot, before which they
// were committed).
struct HeldRun {
  Lsn final_lsn;
  uint64_t transaction_id = 0;
  int64_t first = 0;
  int64_t last = 0;
  bool operator==(const HeldRun&) const = default;
};

// A set of held rows, kept in stream order (as written) with a sorted copy
// for lookups. Bounded: past kMaxRuns further runs are forgotten (their rows
// would only be published again, never lost).
class HeldRows {
 public:
  static constexpr size_t kMaxRuns = 50000;

  void Add(HeldRun run);
  void Clear();
  bool empty() const { return runs_.empty(); }
  size_t size() const { return runs_.size(); }
  const std::vector<HeldRun>& runs() const { return runs_; }
  // Forgets the runs of transactions committed at or after `lsn`.
  void KeepBelow(Lsn lsn);
  Lsn max_lsn() const;
  // Whether row (transaction_id, offset) is held.
  bool Contains(uint64_t transaction_id, int64_t offset) const;

  // Compact text: one item per run, each field the difference from the run
  // before (lsn, transaction_id, first - previous last, last - first), and an
  // item repeated k times written once with "*k". One-row transactions of one
  // writer come out as "…;179,1,1,0*40".
  std::string Encode() const;
  static Result<HeldRows> Decode(std::string_view text);

  bool operator==(const HeldRows& o) const { return runs_ == o.runs_; }

 private:
  void Index() const;
  std::vector<HeldRun> runs_;
  mutable std::vector<HeldRun> sorted_;  // by (transaction_id, first); built on first lookup
  mutable bool indexed_ = false;
};

struct BackfillCursor {
  std::string snapshot;
  uint64_t transaction_id = 0;
  int64_t offset = 0;
  bool operator==(const BackfillCursor&) const = default;
};

// What Kafka holds, as a position in the stream (and a backfill's cursor),
// and the rows it holds that may still be unmarked.
struct KafkaProgress {
  Lsn final_lsn;  // kInvalidLsn: nothing streamed yet
  uint64_t rows = 0;
  bool complete = true;
  std::optional<BackfillCursor> backfill;
  HeldRows unmarked;
  bool standbys = false;  // a standby was seen lately
  bool operator==(const KafkaProgress&) const = default;

  // Whether row `row` (0-based, in stream order) of the transaction whose
  // commit record is at `final_lsn` is held by this progress.
  bool Holds(Lsn final_lsn_of_row, uint64_t row) const {
    if (final_lsn == kInvalidLsn || final_lsn_of_row == kInvalidLsn) return false;
    if (final_lsn_of_row < final_lsn) return true;
    if (final_lsn_of_row > final_lsn) return false;
    return complete || row < rows;
  }
  // Whether this position lies further in the stream than `o`'s (a later
  // transaction, or more rows of the same one). Of two trusted records of one
  // relay each holds what Kafka held when it was written: the further one
  // holds more.
  bool Beyond(const KafkaProgress& o) const {
    if (final_lsn != o.final_lsn) return final_lsn > o.final_lsn;
    if (complete != o.complete) return complete;
    return !complete && rows > o.rows;
  }
  // Whether the backfilled row (transaction_id, offset) of `snapshot` is
  // held: behind this backfill's cursor, or among the unmarked rows.
  bool HoldsBackfilled(std::string_view snapshot, uint64_t transaction_id, int64_t offset) const {
    if (backfill && backfill->snapshot == snapshot) {
      if (transaction_id != backfill->transaction_id) {
        if (transaction_id < backfill->transaction_id) return true;
      } else if (offset <= backfill->offset) {
        return true;
      }
    }
    return unmarked.Contains(transaction_id, offset);
  }
};

// The record as stored.
struct ProgressRecord {
  uint32_t format = kProgressFormat;
  std::string key;
  std::optional<RelayIdentity> owner;  // format 1: none
  std::string incarnation;             // the slot's consistent point at creation ("": unknown)
  WalHistory history;                  // timeline 0: unknown (format 1)
  KafkaProgress progress;
  bool operator==(const ProgressRecord&) const = default;
};

std::string EncodeProgress(const ProgressRecord& record);
// kInvalidArgument naming what is wrong (a record of a newer format that
// this one cannot read included).
Result<ProgressRecord> DecodeProgress(std::string_view json);

// What a relay knows of itself when it reads its progress.
struct ProgressFacts {
  RelayIdentity me;
  std::string key;          // its transactional.id
  std::string incarnation;  // its slot's (state slot_created; "": none yet)
  WalHistory history;       // the server's WAL history now
  Lsn wal_end;              // the server's WAL position now (IDENTIFY_SYSTEM xlogpos)
};

// The progress a relay with `facts` may act on, from `record` (DESIGN §2.8):
// - another relay's record is a setting error (kInvalidArgument naming both);
//   a format-1 record under a key that is not `me`'s default transactional.id
//   cannot say whose it is and is trusted for nothing;
// - the position and the unmarked rows hold only below the point where the
//   record's history and the server's part (a promotion, a restore); a
//   position beyond the server's WAL end (a restore onto the same timeline)
//   holds nothing;
// - the backfill cursor holds only for the same slot incarnation.
// `note` (may be null) says what was not trusted and why, for the log.
Result<KafkaProgress> TrustedProgress(const ProgressRecord& record, const ProgressFacts& facts,
                                      std::string* note = nullptr);

// The default transactional.id (and progress key) of a relay: the cluster's
// system identifier, the database and the slot, so relays of different
// databases never share one and an instance taking a slot over uses its
// predecessor's (which fences it).
std::string DefaultTransactionalId(std::string_view system_id, std::string_view database,
                                   std::string_view slot);
// The default progress topic of a relay: its own ("<transactional.id>.progress",
// characters Kafka does not allow in a topic name as '_'), so that no other
// relay's open transaction can hide its newest record.
std::string DefaultProgressTopic(std::string_view transactional_id);
// The progress topic every relay shared before format 2 (0.1.0): read when a
// relay's own topic has no record yet, and at every start for a record there
// that holds more than its own (after a rollback to 0.1.0 and forward again;
// kafka::ProgressLog::ReadShared), as long as the relay's topic is its default.
inline constexpr const char* kLegacyProgressTopic = "outbox-relay.progress";

}  // namespace outbox_relay::pipeline
