#include "outbox_relay/ops/cleanup.h"

#include <spdlog/spdlog.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <map>
#include <optional>
#include <regex>
#include <thread>

#include "outbox_relay/app/commands.h"
#include "outbox_relay/app/logging.h"
#include "outbox_relay/core/progress.h"
#include "outbox_relay/ops/commands.h"
#include "outbox_relay/pg/commit_index.h"
#include "outbox_relay/pg/relay_schema.h"
#include "outbox_relay/pg/rows.h"
#include "outbox_relay/pipeline/progress_report.h"

namespace outbox_relay::ops {

namespace {

using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

Result<int64_t> Count(pg::Connection& conn, const std::string& sql,
                      std::span<const std::optional<std::string>> params) {
  auto res = conn.ExecParams(sql, params);
  if (!res) return std::unexpected(res.error());
  return pg::Rows(res->get()).Int(0, 0);
}

struct Batches {
  int64_t rows = 0;
  int64_t batches = 0;
};

// The planner's estimate of the rows `select_sql` returns (EXPLAIN: nothing
// is read), the total of a cleanup's progress. nullopt when it cannot tell.
std::optional<uint64_t> PlannerEstimate(pg::Connection& conn, const std::string& select_sql,
                                        std::span<const std::optional<std::string>> params) {
  auto res = conn.ExecParams("EXPLAIN (FORMAT JSON) " + select_sql, params);
  if (!res) return std::nullopt;
  auto plan = pg::Rows(res->get()).Text(0, 0);
  if (!plan) return std::nullopt;
  static const std::regex kPlanRows(R"re("Plan Rows":\s*([0-9]+))re");
  std::cmatch m;
  const std::string text(*plan);
  if (!std::regex_search(text.c_str(), m, kPlanRows)) return std::nullopt;
  return std::stoull(m[1].str());
}

// Runs `sql` (a batched DELETE of at most `batch` rows) until a batch comes
// back short, sleeping between batches; a progress line after each.
Result<Batches> DeleteInBatches(pg::Connection& conn, const std::string& sql,
                                std::span<const std::optional<std::string>> params, int64_t batch,
                                std::chrono::milliseconds sleep, std::string_view what,
                                std::optional<uint64_t> estimate) {
  Batches out;
  auto started = Clock::now();
  pipeline::ProgressReport progress(fmt::format("cleanup: {}", what), estimate,
                                    /*estimated=*/true);
  while (true) {
    auto res = conn.ExecParams(sql, params);
    if (!res) {
      Error e = res.error();
      e.message = fmt::format("deleting from {} (after {} rows in {} batches): {}", what, out.rows,
                              out.batches, e.message);
      return std::unexpected(std::move(e));
    }
    auto n = pg::Rows(res->get()).AffectedRows();
    if (!n) return std::unexpected(n.error());
    out.rows += *n;
    ++out.batches;
    if (progress.terminal()) {
      progress.Update(static_cast<uint64_t>(out.rows));
    } else {
      Progress p;
      p.done = static_cast<uint64_t>(out.rows);
      p.total = estimate;
      p.estimated = true;
      p.elapsed = std::chrono::duration<double>(SecondsSince(started));
      spdlog::info("cleanup: {}: batch {} deleted {} rows; {} rows so far ({})", what, out.batches,
                   *n, out.rows, DescribeProgress("in all", p));
    }
    if (*n < batch) break;
    if (sleep.count() > 0) std::this_thread::sleep_for(sleep);
  }
  progress.Finish(static_cast<uint64_t>(out.rows));
  return out;
}

// Checks that the table exists and has the configured columns, so a wrong
// setting is reported as one (exit 2) rather than as an SQL error.
Status CheckTable(pg::Connection& conn, const CleanupConfig& c) {
  std::optional<std::string> params[] = {c.table_name.Quoted()};
  auto res = conn.ExecParams(
      "SELECT a.attname, format_type(a.atttypid, a.atttypmod) FROM pg_attribute a "
      "WHERE a.attrelid = to_regclass($1) AND a.attnum > 0 AND NOT a.attisdropped",
      params);
  if (!res) return std::unexpected(res.error());
  pg::Rows rows(res->get());
  if (rows.size() == 0) {
    return app::BadSetting("--table", "OUTBOX_TABLE",
                           fmt::format("table {} does not exist", c.table_name.ToString()));
  }
  std::map<std::string, std::string, std::less<>> types;  // column name -> format_type()
  for (int i = 0; i < rows.size(); ++i) {
    auto name = rows.Text(i, 0);
    auto type = rows.Text(i, 1);
    if (const Error* e = pg::FirstError(name, type)) return std::unexpected(*e);
    types.emplace(*name, *type);
  }
  auto type_of = [&](const std::string& name) -> std::optional<std::string> {
    auto it = types.find(name);
    if (it == types.end()) return std::nullopt;
    return it->second;
  };
  struct Needed {
    const char* flag;
    const char* env;
    const std::string* name;
  };
  for (const Needed& n : {
           Needed{"--column-acked", "OUTBOX_COLUMN_ACKED", &c.acked_column},
           Needed{"--column-created-at", "OUTBOX_COLUMN_CREATED_AT", &c.created_at_column},
           Needed{"--column-transaction-id", "OUTBOX_COLUMN_TRANSACTION_ID",
                  &c.transaction_id_column},
           Needed{"--column-offset", "OUTBOX_COLUMN_OFFSET", &c.offset_column},
       }) {
    if (!type_of(*n.name)) {
      return app::BadSetting(
          n.flag, n.env,
          fmt::format("table {} has no column '{}'", c.table_name.ToString(), *n.name));
    }
  }
  std::string created_type = *type_of(c.created_at_column);
  if (!created_type.starts_with("timestamp") && created_type != "date") {
    return app::BadSetting(
        "--column-created-at", "OUTBOX_COLUMN_CREATED_AT",
        fmt::format("column '{}' is {}, not a timestamp", c.created_at_column, created_type));
  }
  return Ok();
}

}  // namespace

void AddCleanupFlags(CLI::App& app, CleanupConfig& c) {
  app.add_option("--database-url", c.database_url,
                 "PostgreSQL connection string or URI of the service database")
      ->envname("DATABASE_URL");
  app::AddIntOption(app, "--retention-days", "OUTBOX_RETENTION_DAYS", &c.retention_days, 0, 36500,
                    "Delete acked rows created more than this many days ago (at least 3; more "
                    "than 30 is allowed with a warning)");
  app::AddIntOption(app, "--batch-size", "OUTBOX_BATCH_SIZE", &c.batch_size, 1, 1'000'000,
                    "Rows per DELETE statement");
  app::AddIntOption(app, "--batch-sleep-ms", "OUTBOX_BATCH_SLEEP_MS", &c.batch_sleep_ms, 0, 600'000,
                    "Pause between batches, so cleanup does not dominate the I/O");
  app.add_option("--table", c.table, "The outbox table, schema-qualified")
      ->envname("OUTBOX_TABLE")
      ->capture_default_str();
  app.add_option("--column-acked", c.acked_column,
                 "Column set once the row is published (NULL until then: never deleted)")
      ->envname("OUTBOX_COLUMN_ACKED")
      ->capture_default_str();
  app.add_option("--column-created-at", c.created_at_column,
                 "Column with the row's creation time (timestamptz)")
      ->envname("OUTBOX_COLUMN_CREATED_AT")
      ->capture_default_str();
  app.add_option("--column-transaction-id", c.transaction_id_column,
                 "First primary-key column (batches go in primary-key order)")
      ->envname("OUTBOX_COLUMN_TRANSACTION_ID")
      ->capture_default_str();
  app.add_option("--column-offset", c.offset_column, "Second primary-key column")
      ->envname("OUTBOX_COLUMN_OFFSET")
      ->capture_default_str();
  app::AddWatermillTableFlags(app, c.watermill_flags);
  app.add_option("--prune-commits", c.prune_commits,
                 "Also delete outbox_relay.commits rows (the replay index, all slots) whose "
                 "commit_time is past the same retention")
      ->envname("OUTBOX_CLEANUP_PRUNE_COMMITS")
      ->capture_default_str();
  app.add_flag("--dry-run", c.dry_run, "Count what would be deleted; delete nothing")
      ->envname("OUTBOX_CLEANUP_DRY_RUN");
  app::AddLogFlags(app, c.log);
}

Status ValidateCleanup(CleanupConfig& c) {
  if (c.database_url.empty()) {
    return app::BadSetting("--database-url", "DATABASE_URL",
                           "required, e.g. postgresql://user@host/db");
  }
  if (c.retention_days < kMinRetentionDays) {
    return app::BadSetting(
        "--retention-days", "OUTBOX_RETENTION_DAYS",
        fmt::format("{} days is below the minimum of {}: acked rows are what a replay after a "
                    "weekend incident needs (the seed's rule: never less than 3 days, 7 "
                    "recommended)",
                    c.retention_days, kMinRetentionDays));
  }
  auto table = pg::QualifiedName::Parse(c.table);
  if (!table) return app::BadSetting("--table", "OUTBOX_TABLE", table.error().message);
  c.table_name = *table;
  struct Named {
    const char* flag;
    const char* env;
    const std::string* value;
  };
  for (const Named& n : {
           Named{"--column-acked", "OUTBOX_COLUMN_ACKED", &c.acked_column},
           Named{"--column-created-at", "OUTBOX_COLUMN_CREATED_AT", &c.created_at_column},
           Named{"--column-transaction-id", "OUTBOX_COLUMN_TRANSACTION_ID",
                 &c.transaction_id_column},
           Named{"--column-offset", "OUTBOX_COLUMN_OFFSET", &c.offset_column},
       }) {
    if (n.value->empty()) return app::BadSetting(n.flag, n.env, "empty column name");
  }
  return app::ParseWatermillFlags(c.watermill_flags, &c.watermill, &c.watermill_settings);
}

Status PruneCommitIndex(pg::Connection& conn, const CleanupConfig& c,
                        std::span<const std::optional<std::string>> params, CleanupReport* report) {
  const auto sleep = std::chrono::milliseconds(c.batch_sleep_ms);
  if (c.prune_commits) {
    auto found = pg::CommitIndexExists(conn);
    if (!found) return std::unexpected(found.error());
    report->commit_index_exists = *found;
  }
  if (c.prune_commits && report->commit_index_exists) {
    // What the index's rows mean is the relay schema's: a newer one that
    // does not declare itself readable by this release is not touched.
    auto schema = pg::ReadRelaySchema(conn);
    if (!schema) return std::unexpected(schema.error());
    if (auto st = pg::CheckRelaySchema(*schema); !st) return st;
    if (c.dry_run) {
      auto n = Count(conn, std::string(pg::kCountCommitsBefore), params.first(1));
      if (!n) return std::unexpected(n.error());
      report->commit_rows = *n;
    } else {
      auto deleted =
          DeleteInBatches(conn, std::string(pg::kPruneCommitsBatch), params, c.batch_size, sleep,
                          "outbox_relay.commits",
                          PlannerEstimate(conn, std::string(pg::kCommitsBefore), params.first(1)));
      if (!deleted) return std::unexpected(deleted.error());
      report->commit_rows = deleted->rows;
      report->commit_batches = deleted->batches;
    }
  }
  return Ok();
}

Result<CleanupReport> RunCleanup(const CleanupConfig& c) {
  if (c.watermill) return RunWatermillCleanup(c);
  auto started = Clock::now();
  CleanupReport report;
  auto conn =
      pg::Connection::Open(c.database_url, pg::Connection::Mode::kNormal, "outbox-relay-cleanup");
  if (!conn) return std::unexpected(conn.error());
  // Short statements run many times: JIT compilation (on a big table the
  // plan's cost crosses jit_above_cost) would cost more than it saves.
  if (auto jit = conn->Exec("SET jit = off"); !jit) return std::unexpected(jit.error());
  if (auto st = CheckTable(*conn, c); !st) return std::unexpected(st.error());

  // One cutoff for the whole run (NOW() would move with every batch's transaction).
  {
    std::optional<std::string> params[] = {std::to_string(c.retention_days)};
    auto res = conn->ExecParams("SELECT (NOW() - make_interval(days => $1::int))::text", params);
    if (!res) return std::unexpected(res.error());
    auto cutoff = pg::Rows(res->get()).Text(0, 0);
    if (!cutoff) return std::unexpected(cutoff.error());
    report.cutoff = std::string(*cutoff);
  }
  spdlog::info(
      "cleanup{}: {} rows acked and created before {} (retention {} days), batches of "
      "{}, {} ms apart",
      c.dry_run ? " (dry run)" : "", c.table_name.ToString(), report.cutoff, c.retention_days,
      c.batch_size, c.batch_sleep_ms);

  const std::string table = c.table_name.Quoted();
  const std::string acked = pg::QuoteIdent(c.acked_column);
  const std::string created = pg::QuoteIdent(c.created_at_column);
  const std::string xid = pg::QuoteIdent(c.transaction_id_column);
  const std::string off = pg::QuoteIdent(c.offset_column);
  std::optional<std::string> params[] = {report.cutoff, std::to_string(c.batch_size)};
  const auto sleep = std::chrono::milliseconds(c.batch_sleep_ms);

  {
    // The partial index on acked IS NULL makes this cheap.
    std::string sql = fmt::format(
        "SELECT count(*) FROM {} WHERE {} IS NULL AND {} < $1::timestamptz", table, acked, created);
    auto n = Count(*conn, sql, std::span(params, 1));
    if (!n) return std::unexpected(n.error());
    report.unacked_past_retention = *n;
  }

  if (c.dry_run) {
    std::string sql =
        fmt::format("SELECT count(*) FROM {} WHERE {} IS NOT NULL AND {} < $1::timestamptz", table,
                    acked, created);
    auto n = Count(*conn, sql, std::span(params, 1));
    if (!n) return std::unexpected(n.error());
    report.outbox_rows = *n;
  } else {
    std::string sql = fmt::format(
        "WITH victims AS ("
        " SELECT {xid}, {off} FROM {table}"
        " WHERE {acked} IS NOT NULL AND {created} < $1::timestamptz"
        " ORDER BY {xid}, {off} LIMIT $2::bigint"
        ") DELETE FROM {table} o USING victims v"
        " WHERE o.{xid} = v.{xid} AND o.{off} = v.{off} AND o.{acked} IS NOT NULL",
        fmt::arg("table", table), fmt::arg("acked", acked), fmt::arg("created", created),
        fmt::arg("xid", xid), fmt::arg("off", off));
    auto deleted =
        DeleteInBatches(*conn, sql, params, c.batch_size, sleep, c.table_name.ToString(),
                        PlannerEstimate(*conn,
                                        fmt::format("SELECT 1 FROM {} WHERE {} IS NOT NULL AND "
                                                    "{} < $1::timestamptz",
                                                    table, acked, created),
                                        std::span(params, 1)));
    if (!deleted) return std::unexpected(deleted.error());
    report.outbox_rows = deleted->rows;
    report.outbox_batches = deleted->batches;
  }

  if (auto st = PruneCommitIndex(*conn, c, params, &report); !st) {
    return std::unexpected(st.error());
  }
  report.seconds = SecondsSince(started);
  return report;
}

int CleanupCommand(CleanupConfig& c) {
  app::SetupLogging(c.log);
  if (auto st = ValidateCleanup(c); !st) {
    spdlog::error("{}", st.error().message);
    return app::kExitConfig;
  }
  if (c.retention_days > kWarnRetentionDays) {
    spdlog::warn(
        "OUTBOX_RETENTION_DAYS={} is above {}: allowed, but the table and its indexes "
        "grow and VACUUM suffers (the seed recommends 7)",
        c.retention_days, kWarnRetentionDays);
  }
  auto report = RunCleanup(c);
  if (!report) {
    spdlog::error("cleanup failed: {}", report.error().message);
    return app::ExitCodeOf(report.error());
  }
  const char* verb = c.dry_run ? "would delete" : "deleted";
  std::printf("cleanup%s: retention %lld days, cutoff %s\n", c.dry_run ? " (dry run)" : "",
              static_cast<long long>(c.retention_days), report->cutoff.c_str());
  std::printf(c.watermill ? "cleanup: %s %lld rows from %s (processed by every consumer group, "
                            "created before the cutoff)"
                          : "cleanup: %s %lld rows from %s (acked, created before the cutoff)",
              verb, static_cast<long long>(report->outbox_rows),
              c.watermill ? "the watermill tables" : c.table_name.ToString().c_str());
  if (!c.dry_run) std::printf(" in %lld batches", static_cast<long long>(report->outbox_batches));
  std::printf("\n");
  if (!c.prune_commits) {
    std::printf("cleanup: outbox_relay.commits not pruned (--prune-commits=false)\n");
  } else if (!report->commit_index_exists) {
    std::printf("cleanup: no outbox_relay.commits table (the relay never ran here)\n");
  } else {
    std::printf(
        "cleanup: %s %lld rows from outbox_relay.commits (commit_time before the "
        "cutoff, all slots)",
        verb, static_cast<long long>(report->commit_rows));
    if (!c.dry_run) std::printf(" in %lld batches", static_cast<long long>(report->commit_batches));
    std::printf("\n");
  }
  std::printf(c.watermill
                  ? "cleanup: kept %lld rows older than the cutoff that a consumer group "
                    "has not processed (never deleted)\n"
                  : "cleanup: kept %lld unacked rows older than the cutoff (never deleted)\n",
              static_cast<long long>(report->unacked_past_retention));
  std::printf("cleanup: done in %.2f s\n", report->seconds);
  std::fflush(stdout);
  if (report->unacked_past_retention > 0) {
    spdlog::warn(
        "{} rows older than the retention window are still unacked: they have not "
        "reached Kafka (is the relay running? see outbox_rows_total{{status=\"unacked\"}})",
        report->unacked_past_retention);
  }
  spdlog::info("cleanup: {} {} outbox rows and {} commit index rows in {:.2f} s", verb,
               report->outbox_rows, report->commit_rows, report->seconds);
  return app::kExitOk;
}

}  // namespace outbox_relay::ops
