#include "outbox_relay/pipeline/sampler.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <optional>
#include <utility>

#include "outbox_relay/pg/connection.h"
#include "outbox_relay/pg/replication.h"
#include "outbox_relay/pg/rows.h"
#include "outbox_relay/pipeline/watermill.h"

namespace outbox_relay::pipeline {

namespace {

struct RowCounts {
  double acked = 0;
  double pending = 0;
  double lag_seconds = 0;
};

// watermill mode: per table, the rows at or before the consumer group's
// position are "acked" (processed, as watermill-sql's subscriber counts
// them), the rest pending; the lag is the oldest pending created_at (a
// TIMESTAMP without time zone, read in this session's TimeZone).
Result<RowCounts> WatermillCounts(pg::Connection& conn, const SamplerOptions& config, bool counts) {
  auto resolved = ResolveWatermillTables(conn, config.watermill_settings);
  if (!resolved) return std::unexpected(resolved.error());
  auto positions =
      ReadWatermillPositions(conn, resolved->tables, config.watermill_settings.consumer_group);
  if (!positions) return std::unexpected(positions.error());
  RowCounts out;
  for (const OutboxTable& t : resolved->tables) {
    outbox::TablePosition p{0, INT64_MIN};
    if (auto it = positions->find(t.name.ToString()); it != positions->end()) p = it->second;
    std::optional<std::string> params[] = {std::to_string(p.transaction_id),
                                           std::to_string(p.offset)};
    const std::string pending = "(transaction_id, \"offset\") > ($1::xid8, $2::bigint)";
    std::string sql =
        counts ? fmt::format(
                     "SELECT count(*) FILTER (WHERE NOT ({p})), count(*) FILTER (WHERE {p}) "
                     "FROM {t}",
                     fmt::arg("p", pending), fmt::arg("t", t.name.Quoted()))
               : fmt::format(
                     "SELECT 0, 0, COALESCE(EXTRACT(EPOCH FROM now() - "
                     "min(created_at::timestamptz)), 0) FROM {t} WHERE {p}",
                     fmt::arg("p", pending), fmt::arg("t", t.name.Quoted()));
    auto res = conn.ExecParams(sql, params);
    if (!res) return std::unexpected(res.error());
    pg::Rows rows(res->get());
    auto acked = rows.Double(0, 0);
    auto pending_rows = rows.Double(0, 1);
    auto lag = counts ? Result<double>(0.0) : rows.Double(0, 2);
    if (const Error* e = pg::FirstError(acked, pending_rows, lag)) return std::unexpected(*e);
    out.acked += *acked;
    out.pending += *pending_rows;
    out.lag_seconds = std::max(out.lag_seconds, *lag);
  }
  return out;
}

}  // namespace

Sampler::Sampler(SamplerOptions options, metrics::Metrics* metrics)
    : config_(std::move(options)), metrics_(metrics) {}

Sampler::~Sampler() { Stop(); }

void Sampler::Start() {
  thread_ = std::thread([this] { Loop(); });
}

void Sampler::Stop() {
  aborting_ = true;
  stop_.Set();
  if (thread_.joinable()) thread_.join();
}

void Sampler::Loop() {
  using Clock = std::chrono::steady_clock;
  const std::string table = config_.table.Quoted();
  const std::string acked = pg::QuoteIdent(config_.acked_column);
  const std::string counts_sql = fmt::format(
      "SELECT count(*) FILTER (WHERE {a} IS NOT NULL), count(*) FILTER (WHERE {a} IS NULL) "
      "FROM {t}",
      fmt::arg("a", acked), fmt::arg("t", table));
  const std::string lag_sql = fmt::format(
      "SELECT COALESCE(EXTRACT(EPOCH FROM now() - min({c})), 0) FROM {t} WHERE {a} IS NULL",
      fmt::arg("a", acked), fmt::arg("t", table),
      fmt::arg("c", pg::QuoteIdent(config_.created_at_column)));
  std::optional<pg::Connection> conn;
  auto next_counts = Clock::now();
  auto next_lag = Clock::now();
  while (true) {
    if (stop_.SleepUntil(std::min(next_counts, next_lag))) return;
    if (!conn) {
      // The row counts read the whole table: a longer statement timeout.
      pg::NetworkOptions network = config_.network;
      if (network.statement_timeout.count() > 0) {
        network.statement_timeout =
            std::max<std::chrono::milliseconds>(network.statement_timeout, std::chrono::minutes(2));
      }
      auto c = pg::Connection::Open(config_.database_url, pg::Connection::Mode::kNormal,
                                    "outbox-relay-metrics", network);
      if (!c) {
        metrics_->CountError(metrics::ErrorReason::kDbRead);
        spdlog::debug("metrics sampler: {}", c.error().message);
        next_lag = Clock::now() + std::chrono::seconds(10);
        next_counts = std::max(next_counts, next_lag);
        continue;
      }
      conn.emplace(std::move(*c));
      conn->set_abort(&aborting_);
    }
    auto now = Clock::now();
    bool failed = false;
    bool counts_due = now >= next_counts;
    if (counts_due) next_counts = now + std::chrono::seconds(config_.row_count_interval_s);
    if (config_.mark && counts_due && config_.watermill) {
      if (auto c = WatermillCounts(*conn, config_, true)) {
        metrics_->rows_acked().Set(c->acked);
        metrics_->rows_pending().Set(c->pending);
        metrics_->rows_unacked().Set(c->pending);
      } else {
        failed = true;
        if (!aborting_) spdlog::warn("metrics sampler: {}", c.error().message);
      }
    } else if (config_.mark && counts_due) {
      auto res = conn->Exec(counts_sql);
      Result<double> acked_rows =
          res ? pg::Rows(res->get()).Double(0, 0) : Result<double>(std::unexpected(res.error()));
      Result<double> unacked_rows = res ? pg::Rows(res->get()).Double(0, 1) : acked_rows;
      if (const Error* e = pg::FirstError(acked_rows, unacked_rows)) {
        failed = true;
        if (!aborting_) spdlog::warn("metrics sampler: {}", e->message);
      } else {
        metrics_->rows_acked().Set(*acked_rows);
        metrics_->rows_pending().Set(*unacked_rows);
        metrics_->rows_unacked().Set(*unacked_rows);
      }
    }
    if (now >= next_lag) {
      // Lag and slot every 10 s, or as often as the row counts when those are more frequent.
      next_lag = now + std::chrono::seconds(std::min<int64_t>(10, config_.row_count_interval_s));
      if (config_.mark && config_.watermill) {
        if (auto c = WatermillCounts(*conn, config_, false)) {
          metrics_->lag_seconds().Set(c->lag_seconds);
        } else {
          failed = true;
        }
      } else if (config_.mark && !config_.created_at_column.empty()) {
        auto res = conn->Exec(lag_sql);
        auto lag = res ? pg::Rows(res->get()).Double(0, 0)  // COALESCE(..., 0): never NULL
                       : Result<double>(std::unexpected(res.error()));
        if (lag) {
          metrics_->lag_seconds().Set(*lag);
        } else {
          failed = true;
        }
      }
      if (auto slot = pg::QuerySlot(*conn, config_.slot)) {
        metrics_->slot_retained_bytes().Set(static_cast<double>(slot->retained_bytes.value_or(0)));
        metrics_->slot_active().Set(slot->active ? 1 : 0);
      } else {
        failed = true;
      }
    }
    if (aborting_) return;  // stopping: what failed was cut short by Stop()
    if (failed) {
      metrics_->CountError(metrics::ErrorReason::kDbRead);
      conn.reset();
    }
  }
}

}  // namespace outbox_relay::pipeline
