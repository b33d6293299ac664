// `outbox-relay cleanup` (alias `outbox-cleanup`): the seed's retention
// CronJob ("Cleanup и retention"), for the outbox table and for the relay's
// own commit-LSN index.
//
// Settings, as the seed's CronJob passes them:
//   DATABASE_URL, OUTBOX_RETENTION_DAYS (7; below 3 refused: a Friday incident
//   is investigated on Monday and needs the rows for replay; above 30 allowed
//   with a warning), OUTBOX_BATCH_SIZE (10000), OUTBOX_BATCH_SLEEP_MS (500),
//   plus OUTBOX_TABLE and the column names (the seed's schema by default).
//
// The cutoff `NOW() - retention` is taken once, at the start, so the loop
// converges and --dry-run counts exactly what a real run would delete then.
// Each batch is one statement (one short transaction), the seed's SQL:
//
//   WITH victims AS (
//       SELECT transaction_id, offset_consumed FROM outbox
//        WHERE offset_acked IS NOT NULL AND created_at < $cutoff
//        ORDER BY transaction_id, offset_consumed LIMIT $batch)
//   DELETE FROM outbox o USING victims v
//    WHERE o.transaction_id = v.transaction_id AND o.offset_consumed = v.offset_consumed
//      AND o.offset_acked IS NOT NULL
//
// repeated until a batch deletes fewer than $batch rows, with the sleep in
// between. An unacked row (offset_acked IS NULL) is never deleted, however
// old: it has not reached Kafka yet. Then outbox_relay.commits rows (every
// slot) whose commit_time is before the same cutoff go, batched the same way.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>

#include "outbox_relay/app/config.h"
#include "outbox_relay/core/result.h"
#include "outbox_relay/pg/connection.h"

namespace CLI {
class App;
}

namespace outbox_relay::ops {

struct CleanupConfig {
  std::string database_url;
  std::string table = "public.outbox";
  std::string acked_column = "offset_acked";
  std::string created_at_column = "created_at";
  std::string transaction_id_column = "transaction_id";
  std::string offset_column = "offset_consumed";
  int64_t retention_days = 7;  // at least kMinRetentionDays (ValidateCleanup)
  int64_t batch_size = 10000;
  int64_t batch_sleep_ms = 500;
  bool prune_commits = true;
  bool dry_run = false;
  app::LogConfig log;
  // --table-mode=watermill: watermill-sql's tables; a row goes once every
  // consumer group in its offsets table has processed it (cleanup_watermill.cc).
  app::WatermillFlags watermill_flags;

  // Filled by ValidateCleanup():
  pg::QualifiedName table_name;
  bool watermill = false;
  pipeline::WatermillSettings watermill_settings;
};

inline constexpr int64_t kMinRetentionDays = 3;
inline constexpr int64_t kWarnRetentionDays = 30;

void AddCleanupFlags(CLI::App& app, CleanupConfig& config);
// kInvalidArgument naming the setting (flag and variable).
Status ValidateCleanup(CleanupConfig& config);

struct CleanupReport {
  std::string cutoff;       // timestamptz text: rows created before it are past retention
  int64_t outbox_rows = 0;  // deleted (dry run: would be deleted)
  int64_t commit_rows = 0;  // outbox_relay.commits rows deleted (or would be)
  int64_t unacked_past_retention = 0;  // old rows kept because they are not acked
  int64_t outbox_batches = 0;
  int64_t commit_batches = 0;
  bool commit_index_exists = false;
  double seconds = 0;
};

// Runs the deletion (or the counting, with dry_run) on a validated config.
// Progress lines are logged after every batch.
Result<CleanupReport> RunCleanup(const CleanupConfig& config);
// The same for watermill-sql's tables: per table, rows created before the
// cutoff and at or before the position of every consumer group in its
// offsets table (the smallest; a table without one keeps every row).
Result<CleanupReport> RunWatermillCleanup(const CleanupConfig& config);
// Both: outbox_relay.commits rows (every slot) with commit_time before the
// cutoff `params[0]`, in batches of `params[1]` (unless --prune-commits=false).
Status PruneCommitIndex(pg::Connection& conn, const CleanupConfig& config,
                        std::span<const std::optional<std::string>> params, CleanupReport* report);

// The whole command: logging, validation, RunCleanup, the summary on stdout.
// Returns the exit code.
int CleanupCommand(CleanupConfig& config);

}  // namespace outbox_relay::ops
