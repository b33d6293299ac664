// `outbox-relay replay`: re-publishes a range of already published
// transactions, from the commit-LSN index (DESIGN §6).
//
// A slot can never be rewound, so replay reads the relay's own index:
// outbox_relay.commits has one row per published transaction (slot, commit
// LSN, xid8s, commit time, row count). For the transactions of one slot whose
// commit_lsn (--from-lsn/--to-lsn) or commit_time (--from-time/--to-time) is in
// the range, inclusive, the rows still in the table are produced again:
//
//   SELECT c.commit_lsn, o.* FROM outbox_relay.commits c
//     JOIN outbox o ON o.transaction_id = ANY(c.transaction_ids)
//    WHERE c.slot_name = $slot AND <range>
//      AND (c.commit_lsn, o.offset_consumed) > ($last_lsn, $last_offset)
//    ORDER BY c.commit_lsn, o.offset_consumed LIMIT 5000
//
// in pages (keyset, bounded memory), i.e. in original commit order and in
// insert order inside a transaction, with their original UUIDs, mapped by
// the same RecordMapper and run flags as `run` (topic template, key, headers,
// columns, Kafka properties), plus two headers after the contract's ones:
//
//   outbox_replay             "true"
//   outbox_replay_commit_lsn  the transaction's commit LSN, "X/Y"
//
// Produced from one thread with the idempotent producer (order per partition
// holds under retries); replay waits for every delivery report and exits 1
// if any failed, saying how many were delivered and from which commit LSN a
// rerun continues. It never touches offset_acked or the index.
//
// Poison rows (the mapper cannot turn them into a record, or the producer
// refuses them, e.g. too large) are skipped with a warning and counted: the
// original run already sent them to the dead-letter topic, and sending them
// there again would only duplicate the dead letters. --on-poison and --dlq-*
// do not apply to replay.
//
// Before producing, replay says how much of the range cleanup already
// removed (rows in the index's row_count that are no longer in the table).
// Backfilled rows (published from the slot's snapshot, not from the stream)
// have no commit LSN and are not in the index, so replay cannot reach them.
#pragma once

#include <libpq-fe.h>

#include <cstdint>
#include <map>
#include <string>

#include "outbox_relay/app/config.h"
#include "outbox_relay/core/lsn.h"
#include "outbox_relay/core/result.h"
#include "outbox_relay/pgoutput/messages.h"

namespace CLI {
class App;
}

namespace outbox_relay::ops {

inline constexpr std::string_view kReplayHeader = "outbox_replay";
inline constexpr std::string_view kReplayCommitLsnHeader = "outbox_replay_commit_lsn";

struct ReplayConfig {
  app::RelayConfig relay;  // run's flags: database, Kafka, table, slot, mapping
  std::string from_lsn;
  std::string to_lsn;
  std::string from_time;
  std::string to_time;
  bool dry_run = false;
  int64_t page_rows = 5000;

  // Filled by ValidateReplay():
  bool by_time = false;
  Lsn from;
  Lsn to{~uint64_t{0}};
};

// run's flags (AddRunFlags, AddLogFlags) plus the range and --dry-run.
void AddReplayFlags(CLI::App& app, ReplayConfig& config);
// kInvalidArgument naming the setting. The time bounds are checked by the
// server when the replay starts (anything timestamptz accepts).
Status ValidateReplay(ReplayConfig& config);

struct ReplayCounts {
  int64_t rows = 0;
  std::map<std::string, int64_t> event_types;  // "" = no Event-Type
};

struct ReplayReport {
  // The range in the index, and what cleanup took from it.
  int64_t transactions = 0;          // in the index, in range
  int64_t indexed_rows = 0;          // sum of their row_count
  int64_t rows_found = 0;            // of those, still in the table
  int64_t transactions_missing = 0;  // with fewer rows found than row_count
  int64_t rows_missing = 0;          // row_count - found, summed
  std::string first_commit_lsn, last_commit_lsn;
  std::string first_commit_time, last_commit_time;
  // What replay did.
  int64_t produced = 0;
  int64_t delivered = 0;
  int64_t failed = 0;
  int64_t poison_skipped = 0;
  std::map<std::string, ReplayCounts> topics;  // per topic (dry run: would be)
  std::string first_failure;
  Lsn resume_from;  // failure/interrupt: every transaction before it was delivered in full
  bool interrupted = false;
  double seconds = 0;
};

// The whole command: logging, validation, the replay, the summary on
// stdout. Returns the exit code.
int ReplayCommand(ReplayConfig& config);

}  // namespace outbox_relay::ops
