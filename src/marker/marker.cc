#include "outbox_relay/marker/marker.h"

#include <spdlog/spdlog.h>

#include <algorithm>

namespace outbox_relay::marker {

namespace {

constexpr const char* kStatementName = "outbox_relay_mark";

}  // namespace

Marker::Marker(MarkerOptions options, tracking::AckTracker* tracker, ErrorHook on_error)
    : options_(std::move(options)), tracker_(tracker), on_error_(std::move(on_error)) {}

Marker::~Marker() { Stop(std::chrono::milliseconds(0)); }

std::string Marker::MarkSql(const MarkerOptions& o) {
  // One statement, so one transaction: the rows are marked and the commits
  // recorded together or not at all.
  return fmt::format(
      "WITH marked AS ("
      " UPDATE {table} SET {acked} = {offset}"
      " WHERE {xid} = ANY($1::xid8[]) AND {acked} IS NULL RETURNING 1"
      "), indexed AS ("
      " INSERT INTO outbox_relay.commits"
      " (slot_name, commit_lsn, end_lsn, transaction_ids, commit_time, row_count)"
      " SELECT $2, c.commit_lsn, c.end_lsn, c.xids::xid8[],"
      " timestamptz '2000-01-01 00:00:00+00' + c.micros * interval '1 microsecond', c.row_count"
      " FROM unnest($3::pg_lsn[], $4::pg_lsn[], $5::text[], $6::bigint[], $7::int[])"
      " AS c(commit_lsn, end_lsn, xids, micros, row_count)"
      " WHERE c.commit_lsn <> '0/0'::pg_lsn"  // backfilled rows have no commit LSN
      " ON CONFLICT (slot_name, commit_lsn) DO NOTHING RETURNING 1"
      ") SELECT (SELECT count(*) FROM marked), (SELECT count(*) FROM indexed)",
      fmt::arg("table", o.table.Quoted()), fmt::arg("acked", pg::QuoteIdent(o.acked_column)),
      fmt::arg("offset", pg::QuoteIdent(o.offset_column)),
      fmt::arg("xid", pg::QuoteIdent(o.transaction_id_column)));
}

Status Marker::Connect() {
  conn_.reset();
  auto conn = pg::Connection::Open(options_.database_url, pg::Connection::Mode::kNormal,
                                   "outbox-relay-marker");
  if (!conn) return std::unexpected(conn.error());
  std::string sql = MarkSql(options_);
  pg::ResultHandle res(PQprepare(conn->get(), kStatementName, sql.c_str(), 7, nullptr));
  if (!res || PQresultStatus(res.get()) != PGRES_COMMAND_OK) {
    return std::unexpected(pg::ErrorFromResult(res.get(), conn->get(), "prepare marking"));
  }
  conn_.emplace(std::move(*conn));
  return Ok();
}

Status Marker::Start() {
  auto ok = Connect();
  if (!ok) return ok;
  thread_ = std::thread([this] { Loop(); });
  return Ok();
}

void Marker::Stop(std::chrono::milliseconds timeout) {
  if (!thread_.joinable()) return;
  auto deadline = std::chrono::steady_clock::now() + timeout;
  deadline_ns_.store(deadline.time_since_epoch().count());
  stopping_.store(true);
  tracker_->Wake();
  thread_.join();
}

MarkerStats Marker::stats() const {
  return MarkerStats{batches_.load(), transactions_.load(), rows_marked_.load(), errors_.load()};
}

void Marker::Loop() {
  std::vector<tracking::Transaction*> batch;
  auto backoff = std::chrono::milliseconds(100);
  while (true) {
    batch.clear();
    tracker_->TakeDelivered(&batch, options_.batch_max, std::chrono::milliseconds(50));
    if (batch.empty()) {
      if (stopping_.load()) return;
      continue;
    }
    while (true) {
      Status st = conn_ ? Ok() : Connect();
      if (st) st = MarkBatch(batch);
      if (st) break;
      errors_.fetch_add(1);
      if (on_error_) on_error_(st.error());
      spdlog::warn("marker: {} (retrying in {} ms)", st.error().message, backoff.count());
      conn_.reset();
      if (stopping_.load() &&
          std::chrono::steady_clock::now().time_since_epoch().count() > deadline_ns_.load()) {
        spdlog::error(
            "marker: stopping with {} delivered transactions unmarked; they will be "
            "re-sent and marked after the restart",
            batch.size());
        return;
      }
      std::this_thread::sleep_for(backoff);
      backoff = std::min(backoff * 2, std::chrono::milliseconds(5000));
    }
    backoff = std::chrono::milliseconds(100);
    tracker_->OnMarked(batch);
  }
}

Status Marker::MarkBatch(const std::vector<tracking::Transaction*>& batch) {
  // Array literals in text form: {1,2,3}; transaction_ids per commit as {a,b}.
  xids_.assign("{");
  commit_lsns_.assign("{");
  end_lsns_.assign("{");
  tx_xids_.assign("{");
  times_.assign("{");
  counts_.assign("{");
  bool first_xid = true;
  for (size_t i = 0; i < batch.size(); ++i) {
    const tracking::Transaction* tx = batch[i];
    const char* sep = i == 0 ? "" : ",";
    fmt::format_to(std::back_inserter(commit_lsns_), "{}{}", sep, tx->final_lsn);
    fmt::format_to(std::back_inserter(end_lsns_), "{}{}", sep, tx->end_lsn);
    fmt::format_to(std::back_inserter(times_), "{}{}", sep, tx->commit_time.micros);
    fmt::format_to(std::back_inserter(counts_), "{}{}", sep, tx->rows);
    tx_xids_.append(sep).append("\"{");
    for (size_t j = 0; j < tx->transaction_ids.size(); ++j) {
      fmt::format_to(std::back_inserter(tx_xids_), "{}{}", j == 0 ? "" : ",",
                     tx->transaction_ids[j]);
      fmt::format_to(std::back_inserter(xids_), "{}{}", first_xid ? "" : ",",
                     tx->transaction_ids[j]);
      first_xid = false;
    }
    tx_xids_.append("}\"");
  }
  for (std::string* s : {&xids_, &commit_lsns_, &end_lsns_, &tx_xids_, &times_, &counts_}) {
    s->push_back('}');
  }
  const char* values[7] = {xids_.c_str(),     options_.slot_name.c_str(), commit_lsns_.c_str(),
                           end_lsns_.c_str(), tx_xids_.c_str(),           times_.c_str(),
                           counts_.c_str()};
  pg::ResultHandle res(
      PQexecPrepared(conn_->get(), kStatementName, 7, values, nullptr, nullptr, 0));
  if (!res || PQresultStatus(res.get()) != PGRES_TUPLES_OK) {
    return std::unexpected(pg::ErrorFromResult(res.get(), conn_->get(), "mark delivered rows"));
  }
  uint64_t marked = 0;
  if (auto v = pg::GetValue(res.get(), 0, 0)) marked = std::stoull(std::string(*v));
  batches_.fetch_add(1, std::memory_order_relaxed);
  transactions_.fetch_add(batch.size(), std::memory_order_relaxed);
  rows_marked_.fetch_add(marked, std::memory_order_relaxed);
  return Ok();
}

}  // namespace outbox_relay::marker
