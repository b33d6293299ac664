// Exactly-once delivery: the progress the relay commits to Kafka inside each
// Kafka transaction, next to the records it describes (DESIGN §2, issue 14).
//
// One value per relay (its key is the relay's identity, the transactional.id)
// in a compacted topic:
//
//   {"v":1,"key":"...","lsn":"16/B374D848","rows":12,"complete":true,
//    "backfill":{"snapshot":"731:745:","transaction_id":"740","offset":"12345"}}
//
// lsn       Begin.final_lsn (the commit record's LSN) of the last PostgreSQL
//           transaction whose rows the committed Kafka transactions hold;
// rows      how many of its rows (in stream order) they hold;
// complete  all of them (its Commit was read): nothing of it is left to send;
// backfill  during a snapshot backfill: the stored snapshot it belongs to and
//           the last (transaction_id, offset) published, in the backfill's
//           keyset order.
//
// After a restart PostgreSQL sends again everything after the slot's
// confirmed position. Held: rows at or before this position are marked but
// not produced again — Kafka has them, committed.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "outbox_relay/core/lsn.h"
#include "outbox_relay/core/result.h"

namespace outbox_relay::pipeline {

struct BackfillCursor {
  std::string snapshot;
  uint64_t transaction_id = 0;
  int64_t offset = 0;
  bool operator==(const BackfillCursor&) const = default;
};

struct KafkaProgress {
  Lsn final_lsn;  // kInvalidLsn: nothing streamed yet
  uint64_t rows = 0;
  bool complete = true;
  std::optional<BackfillCursor> backfill;
  bool operator==(const KafkaProgress&) const = default;

  // Whether row `row` (0-based, in stream order) of the transaction whose
  // commit record is at `final_lsn` is held by this progress.
  bool Holds(Lsn final_lsn_of_row, uint64_t row) const {
    if (final_lsn == kInvalidLsn || final_lsn_of_row == kInvalidLsn) return false;
    if (final_lsn_of_row < final_lsn) return true;
    if (final_lsn_of_row > final_lsn) return false;
    return complete || row < rows;
  }
  // Whether the backfilled row (transaction_id, offset) of `snapshot` is held.
  bool HoldsBackfilled(std::string_view snapshot, uint64_t transaction_id, int64_t offset) const {
    if (!backfill || backfill->snapshot != snapshot) return false;
    if (transaction_id != backfill->transaction_id)
      return transaction_id < backfill->transaction_id;
    return offset <= backfill->offset;
  }
};

std::string EncodeProgress(const KafkaProgress& progress, std::string_view key);

// The default transactional.id (and progress key) of a relay: the cluster's
// system identifier, the database and the slot, so relays of different
// databases never share one and an instance taking a slot over uses its
// predecessor's (which fences it).
std::string DefaultTransactionalId(std::string_view system_id, std::string_view database,
                                   std::string_view slot);
// kInvalidArgument naming what is wrong.
Result<KafkaProgress> DecodeProgress(std::string_view json);

}  // namespace outbox_relay::pipeline
