// `cleanup` in --table-mode=watermill. watermill-sql deletes nothing itself;
// its tables grow until someone does. A row may go once it is past retention
// and every consumer group in its offsets table has processed it: the
// relay's group, a polling forwarder's, any other subscriber's (a group the
// subscriber registered with its zero row has processed nothing yet, so
// nothing goes). Per table, batches of
//
//   WITH horizon AS (the smallest (last_processed_transaction_id,
//                    offset_acked) of the offsets table),
//        victims AS (SELECT transaction_id, "offset" FROM t, horizon
//                     WHERE created_at < $cutoff AND (transaction_id, "offset") <= horizon
//                     ORDER BY transaction_id, "offset" LIMIT $batch)
//   DELETE FROM t USING victims ...
//
// until a batch comes back short. created_at is a TIMESTAMP without time
// zone holding the writer's CURRENT_TIMESTAMP in its session's TimeZone; it
// is compared in this session's (the server's default unless the role or
// database sets one).
#include <spdlog/spdlog.h>

#include <thread>

#include "outbox_relay/ops/cleanup.h"
#include "outbox_relay/pg/rows.h"
#include "outbox_relay/pipeline/watermill.h"

namespace outbox_relay::ops {

namespace {

using Clock = std::chrono::steady_clock;

// The smallest position of every consumer group, as a row: (x, o). An
// offset_acked NULL counts as "every row of that transaction", as the
// subscriber's own query reads it.
constexpr const char* kHorizon =
    "SELECT last_processed_transaction_id AS x, COALESCE(offset_acked, 9223372036854775807) AS o "
    "FROM {offsets} ORDER BY 1, 2 LIMIT 1";

}  // namespace

Result<CleanupReport> RunWatermillCleanup(const CleanupConfig& c) {
  auto started = Clock::now();
  CleanupReport report;
  auto conn =
      pg::Connection::Open(c.database_url, pg::Connection::Mode::kNormal, "outbox-relay-cleanup");
  if (!conn) return std::unexpected(conn.error());
  if (auto jit = conn->Exec("SET jit = off"); !jit) return std::unexpected(jit.error());
  auto resolved = pipeline::ResolveWatermillTables(*conn, c.watermill_settings);
  if (!resolved) return std::unexpected(resolved.error());
  for (const std::string& why : resolved->skipped) spdlog::warn("not cleaned: {}", why);
  {
    std::optional<std::string> params[] = {std::to_string(c.retention_days)};
    auto res = conn->ExecParams("SELECT (NOW() - make_interval(days => $1::int))::text", params);
    if (!res) return std::unexpected(res.error());
    auto cutoff = pg::Rows(res->get()).Text(0, 0);
    if (!cutoff) return std::unexpected(cutoff.error());
    report.cutoff = std::string(*cutoff);
  }
  std::optional<std::string> params[] = {report.cutoff, std::to_string(c.batch_size)};
  const auto sleep = std::chrono::milliseconds(c.batch_sleep_ms);
  for (const pipeline::OutboxTable& t : resolved->tables) {
    std::optional<std::string> offsets[] = {t.offsets.Quoted()};
    auto exists = conn->ExecParams("SELECT to_regclass($1) IS NOT NULL", offsets);
    if (!exists) return std::unexpected(exists.error());
    auto offsets_exist = pg::Rows(exists->get()).Bool(0, 0);
    if (!offsets_exist) return std::unexpected(offsets_exist.error());
    const std::string horizon =
        fmt::format(fmt::runtime(kHorizon), fmt::arg("offsets", t.offsets.Quoted()));
    const std::string table = t.name.Quoted();
    if (!*offsets_exist) {
      spdlog::warn(
          "cleanup: {} has no offsets table {}: no consumer group has processed "
          "anything, nothing is deleted",
          t.name.ToString(), t.offsets.ToString());
      continue;
    }
    // Kept: past retention but not processed by some group.
    auto kept = conn->ExecParams(
        fmt::format("WITH horizon AS ({h}) SELECT count(*) FROM {t} m LEFT JOIN horizon h ON true "
                    "WHERE m.created_at < $1::timestamptz AND (h.x IS NULL OR "
                    "(m.transaction_id, m.\"offset\") > (h.x, h.o))",
                    fmt::arg("h", horizon), fmt::arg("t", table)),
        std::span(params, 1));
    if (!kept) return std::unexpected(kept.error());
    auto kept_rows = pg::Rows(kept->get()).Int(0, 0);
    if (!kept_rows) return std::unexpected(kept_rows.error());
    report.unacked_past_retention += *kept_rows;
    if (c.dry_run) {
      auto n = conn->ExecParams(
          fmt::format("WITH horizon AS ({h}) SELECT count(*) FROM {t} m, horizon h "
                      "WHERE m.created_at < $1::timestamptz "
                      "AND (m.transaction_id, m.\"offset\") <= (h.x, h.o)",
                      fmt::arg("h", horizon), fmt::arg("t", table)),
          std::span(params, 1));
      if (!n) return std::unexpected(n.error());
      auto rows = pg::Rows(n->get()).Int(0, 0);
      if (!rows) return std::unexpected(rows.error());
      report.outbox_rows += *rows;
      continue;
    }
    const std::string sql = fmt::format(
        "WITH horizon AS ({h}), victims AS ("
        " SELECT m.transaction_id, m.\"offset\" FROM {t} m, horizon h"
        " WHERE m.created_at < $1::timestamptz AND (m.transaction_id, m.\"offset\") <= (h.x, h.o)"
        " ORDER BY m.transaction_id, m.\"offset\" LIMIT $2::bigint"
        ") DELETE FROM {t} d USING victims v"
        " WHERE d.transaction_id = v.transaction_id AND d.\"offset\" = v.\"offset\"",
        fmt::arg("h", horizon), fmt::arg("t", table));
    int64_t deleted = 0;
    while (true) {
      auto res = conn->ExecParams(sql, params);
      if (!res) {
        Error e = res.error();
        e.message = fmt::format("deleting from {} (after {} rows): {}", t.name.ToString(), deleted,
                                e.message);
        return std::unexpected(std::move(e));
      }
      auto affected = pg::Rows(res->get()).AffectedRows();
      if (!affected) return std::unexpected(affected.error());
      const int64_t n = *affected;
      deleted += n;
      ++report.outbox_batches;
      spdlog::info("cleanup: {}: batch deleted {} rows; {} rows so far", t.name.ToString(), n,
                   deleted);
      if (n < c.batch_size) break;
      if (sleep.count() > 0) std::this_thread::sleep_for(sleep);
    }
    report.outbox_rows += deleted;
  }
  if (auto st = PruneCommitIndex(*conn, c, params, &report); !st) {
    return std::unexpected(st.error());
  }
  report.seconds = std::chrono::duration<double>(Clock::now() - started).count();
  return report;
}

}  // namespace outbox_relay::ops
