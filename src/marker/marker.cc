#include "outbox_relay/marker/marker.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <charconv>

namespace outbox_relay::marker {

namespace {

using Clock = std::chrono::steady_clock;
constexpr const char* kStatementName = "outbox_relay_mark";

}  // namespace

Marker::Marker(MarkerOptions options, tracking::AckTracker* tracker, ErrorHook on_error)
    : options_(std::move(options)), tracker_(tracker), on_error_(std::move(on_error)) {}

Marker::~Marker() { Stop(std::chrono::milliseconds(0)); }

std::string Marker::MarkSql(const MarkerOptions& o) {
  // One statement, so one snapshot and one transaction.
  //
  // Visibility: logical decoding sends a transaction once its commit record
  // is flushed, but other sessions see its rows only after the committing
  // backend leaves the proc array — later, and much later while it waits for
  // a synchronous standby. An UPDATE in that window matches nothing. So only
  // the transactions visible in this statement's snapshot are marked and
  // indexed; the others come back in the last column and are retried.
  // No acked column (watermill-sql's tables): the commit index only.
  //
  // Rows are found by primary key, never through an index on the acked
  // column: "({acked} + 0) IS NULL" hides the column from the seed's partial
  // index ON outbox (offset_acked) WHERE offset_acked IS NULL. That index
  // keeps an entry for every row inserted since the last VACUUM (a row
  // enters it as NULL; marking moves the row out, not the entry), while the
  // statistics say it is nearly empty — so the planner scanned all of it for
  // every transaction of a batch: 2.2 ms per transaction on a table with
  // 67,000 stale entries, against 0.07 ms by primary key.
  //
  // The UPDATE joins the runs and nothing else: each run's visibility is
  // tested on the run itself, not by a join with the visible transactions.
  // With that second join the planner could put the table between the two
  // and compare every row found with every run of the batch: 3,998,000
  // comparisons and 0.42 s for a batch of 2,000 one-row transactions, against
  // 20 ms with one primary-key probe per run.
  //
  // The commit index gets one row per transaction, and on one-row
  // transactions that row was half of the statement's work. Kept cheap:
  // each commit's first xid comes as an xid8 (the others, almost never
  // present, as text in $10), and only a commit at or below $11 — the newest
  // commit LSN this slot had indexed when the marker connected, raised by
  // each statement — can be there already (sent again after a stream
  // restart, or delivered after a later one was indexed): those few go in
  // with ON CONFLICT DO NOTHING, the rest with a plain insert. Above $11
  // nothing can be indexed yet except by another instance (a zombie, or the
  // one a standby took over from): that insert fails with a unique violation,
  // and the marker connects again and reads $11 anew. ON CONFLICT for every
  // row cost a primary-key probe, a speculative insertion and its
  // confirmation record in the WAL: 26.2 ms for 2,000 one-row transactions
  // against 20.1 (with the transactions not yet visible found among the runs,
  // not by a set difference of all the batch's xids and the visible ones).
  // The lookup is ON CONFLICT's, through the primary key by definition: as a
  // subquery the generic plan, made once with the index's statistics of that
  // moment (empty after an install or a TRUNCATE), read every entry of the
  // slot for it, by one hashed scan (NOT EXISTS) or through the commit-time
  // index (a scalar subquery); the index grows by a row per transaction, and
  // in a drain of 100,000 one-row transactions the insert read 88,492 buffers
  // in the 48th statement and 92,090 in the 50th against 12,000-14,000, and
  // the marker's CPU doubled.
  const std::string marked = o.acked_column.empty()
                                 ? std::string("SELECT 1 WHERE false")
                                 : fmt::format(
                                       "UPDATE {table} o SET {acked} = o.{offset} FROM runs r"
                                       " WHERE o.{xid} = r.x AND o.{offset} BETWEEN r.first AND "
                                       "r.last AND (o.{acked} + 0) IS NULL"
                                       " AND pg_visible_in_snapshot(r.x, pg_current_snapshot())"
                                       " RETURNING 1",
                                       fmt::arg("table", o.table.Quoted()),
                                       fmt::arg("acked", pg::QuoteIdent(o.acked_column)),
                                       fmt::arg("offset", pg::QuoteIdent(o.offset_column)),
                                       fmt::arg("xid", pg::QuoteIdent(o.transaction_id_column)));
  // The visible commits of the batch, as commit-index rows.
  const std::string insert =
      "INSERT INTO outbox_relay.commits"
      " (slot_name, commit_lsn, end_lsn, transaction_ids, commit_time, row_count)"
      " SELECT $4, c.commit_lsn, c.end_lsn,"
      " CASE WHEN c.more IS NULL THEN ARRAY[c.x] ELSE c.x || c.more::xid8[] END,"
      " timestamptz '2000-01-01 00:00:00+00' + c.micros * interval '1 microsecond', c.row_count"
      " FROM unnest($5::pg_lsn[], $6::pg_lsn[], $7::xid8[], $10::text[], $8::bigint[], $9::int[])"
      " AS c(commit_lsn, end_lsn, x, more, micros, row_count)"
      " WHERE c.commit_lsn <> '0/0'::pg_lsn"  // backfilled rows have no commit LSN
      " AND pg_visible_in_snapshot(c.x, pg_current_snapshot())"
      " AND (c.more IS NULL OR NOT EXISTS (SELECT 1 FROM unnest(c.more::xid8[]) AS y"
      "  WHERE NOT pg_visible_in_snapshot(y, pg_current_snapshot())))";
  return fmt::format(
      "WITH runs AS (SELECT * FROM unnest($1::xid8[], $2::bigint[], $3::bigint[])"
      " AS r(x, first, last)"
      "), marked AS ({marked}"
      "), indexed AS ({insert} AND c.commit_lsn > $11::pg_lsn RETURNING 1"
      "), indexed_again AS ({insert} AND c.commit_lsn <= $11::pg_lsn"
      " ON CONFLICT DO NOTHING RETURNING 1"
      ") SELECT (SELECT count(*) FROM marked),"
      " (SELECT count(*) FROM indexed) + (SELECT count(*) FROM indexed_again),"
      " ARRAY(SELECT DISTINCT x FROM runs"
      "  WHERE NOT pg_visible_in_snapshot(x, pg_current_snapshot()))::text",
      fmt::arg("marked", marked), fmt::arg("insert", insert));
}

Status Marker::Connect() {
  conn_.reset();
  auto conn = pg::Connection::Open(options_.database_url, pg::Connection::Mode::kNormal,
                                   "outbox-relay-marker", options_.network);
  if (!conn) return std::unexpected(conn.error());
  conn->set_abort(&aborted_);
  if (auto set = conn->Exec(kSessionSettings); !set) return std::unexpected(set.error());
  std::optional<std::string> slot[] = {options_.slot_name};
  auto newest = conn->ExecParams(
      "SELECT coalesce(max(commit_lsn), '0/0')::text FROM outbox_relay.commits"
      " WHERE slot_name = $1",
      slot);
  if (!newest) return std::unexpected(newest.error());
  auto lsn = Lsn::Parse(pg::GetValue(newest->get(), 0, 0).value_or(""));
  if (!lsn) return std::unexpected(lsn.error());
  indexed_through_ = *lsn;
  if (auto st = conn->Prepare(kStatementName, MarkSql(options_), 11); !st) return st;
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
  // (At least 250 ms: a statement about to be answered on a healthy
  // connection still gets its answer when the timeout is already spent.)
  auto abort_at =
      std::max(deadline, std::chrono::steady_clock::now() + std::chrono::milliseconds(250));
  while (!exited_.load() && std::chrono::steady_clock::now() < abort_at) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  aborted_.store(true);  // past the timeout: cut short what still waits
  thread_.join();
}

void Marker::Loop() {
  struct Exited {
    std::atomic<bool>& flag;
    ~Exited() { flag.store(true); }
  } exited{exited_};
  std::vector<tracking::Transaction*> batch;
  std::vector<tracking::Transaction*> marked;
  std::vector<tracking::Transaction*> not_visible;  // retried in the next round
  auto backoff = std::chrono::milliseconds(100);
  auto waiting_since = std::chrono::steady_clock::time_point{};
  bool warned = false;
  uint64_t last_rows = 0;  // rows of the last statement's batch
  auto rows_of = [](const std::vector<tracking::Transaction*>& txs) {
    uint64_t n = 0;
    for (const tracking::Transaction* tx : txs) n += tx->rows_seen;
    return n;
  };
  while (true) {
    batch.assign(not_visible.begin(), not_visible.end());
    not_visible.clear();
    // Only transactions waiting to become visible: look again soon.
    auto wait = batch.empty() ? std::chrono::milliseconds(50) : std::chrono::milliseconds(2);
    tracker_->TakeDelivered(&batch, std::max(options_.batch_max, batch.size()), wait);
    const bool worth_a_statement = last_rows >= options_.rows_worth_a_statement ||
                                   rows_of(batch) >= options_.rows_worth_a_statement;
    if (!batch.empty() && batch.size() < options_.batch_max && options_.interval.count() > 0 &&
        !worth_a_statement && !stopping_.load()) {
      // Batch by time: what is delivered meanwhile joins this statement.
      tracker_->WaitDelivered(options_.batch_max - batch.size(), options_.interval);
      tracker_->TakeDelivered(&batch, options_.batch_max, std::chrono::milliseconds(0));
    }
    if (batch.empty()) {
      if (options_.progress != nullptr && (conn_ || Connect())) {
        if (auto st = options_.progress->Idle(*conn_); !st) {
          spdlog::warn("marker: {}", st.error().message);
          conn_.reset();
        }
      }
      if (stopping_.load()) return;
      continue;
    }
    bool conflict_retried = false;
    while (true) {
      marked.clear();
      not_visible.clear();
      Status st = conn_ ? Ok() : Connect();
      if (st) st = MarkBatch(batch, &marked, &not_visible);
      if (st && options_.progress != nullptr) st = options_.progress->AfterMark(*conn_);
      if (st) break;
      conn_.reset();
      if (!conflict_retried && st.error().code == ErrorCode::kDuplicateKey) {
        // Another instance indexed commits above indexed_through_ since this
        // one connected (see MarkSql): connect again, which reads it anew.
        conflict_retried = true;
        spdlog::info("marker: {}; reading the commit index again", st.error().message);
        continue;
      }
      if (on_error_) on_error_(st.error());
      spdlog::warn("marker: {} (retrying in {} ms)", st.error().message, backoff.count());
      if (stopping_.load() && Clock::now().time_since_epoch().count() > deadline_ns_.load()) {
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
    last_rows = rows_of(batch);
    tracker_->OnMarked(marked);
    if (not_visible.empty()) {
      waiting_since = {};
      warned = false;
      continue;
    }
    if (waiting_since == Clock::time_point{}) waiting_since = Clock::now();
    if (!warned && Clock::now() - waiting_since > std::chrono::seconds(10)) {
      warned = true;
      spdlog::warn(
          "marker: {} transactions are in the WAL but not yet visible after 10 s (commit "
          "waiting for a synchronous standby?); the slot is held before them until they are",
          not_visible.size());
    }
    if (stopping_.load() && Clock::now().time_since_epoch().count() > deadline_ns_.load()) {
      spdlog::error("marker: stopping with {} transactions not yet visible, unmarked",
                    not_visible.size());
      return;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

Status Marker::MarkBatch(const std::vector<tracking::Transaction*>& batch,
                         std::vector<tracking::Transaction*>* marked,
                         std::vector<tracking::Transaction*>* not_visible) {
  // Array literals in text form: {1,2,3}; the further xids of a commit as
  // "{a,b}" (NULL when it has one).
  for (std::string* s : {&run_xids_, &run_firsts_, &run_lasts_, &commit_lsns_, &end_lsns_,
                         &tx_xids_, &times_, &counts_, &more_xids_}) {
    s->clear();
    s->push_back('{');
  }
  auto out = [](std::string& s) { return std::back_inserter(s); };
  bool first_run = true;
  bool first_commit = true;
  batch_commits_.clear();
  for (const tracking::Transaction* tx : batch) {
    for (const tracking::RowRange& run : tx->row_ranges) {
      const char* rsep = first_run ? "" : ",";
      fmt::format_to(out(run_xids_), "{}{}", rsep, run.transaction_id);
      fmt::format_to(out(run_firsts_), "{}{}", rsep, run.first);
      fmt::format_to(out(run_lasts_), "{}{}", rsep, run.last);
      first_run = false;
    }
    // One index entry per commit: after a stream restart the same commit can
    // be here twice (delivered before, and re-sent), and two inserts of one
    // key in a statement would fail it every time.
    if (tx->final_lsn.value() != 0 && !batch_commits_.insert(tx->final_lsn.value()).second) {
      continue;
    }
    const char* sep = first_commit ? "" : ",";
    first_commit = false;
    fmt::format_to(out(commit_lsns_), "{}{}", sep, tx->final_lsn);
    fmt::format_to(out(end_lsns_), "{}{}", sep, tx->end_lsn);
    fmt::format_to(out(times_), "{}{}", sep, tx->commit_time.micros);
    uint64_t rows = 0;  // the rows noted: produced, or (exactly-once) already in Kafka
    for (const tracking::RowRange& run : tx->row_ranges) {
      rows += static_cast<uint64_t>(run.last - run.first + 1);
    }
    fmt::format_to(out(counts_), "{}{}", sep, rows);
    tracking::AckTracker::TransactionIds(*tx, &ids_);
    fmt::format_to(out(tx_xids_), "{}{}", sep, ids_.front());
    more_xids_.append(sep);
    if (ids_.size() == 1) {
      more_xids_.append("NULL");
    } else {
      more_xids_.append("\"{");
      for (size_t j = 1; j < ids_.size(); ++j) {
        fmt::format_to(out(more_xids_), "{}{}", j == 1 ? "" : ",", ids_[j]);
      }
      more_xids_.append("}\"");
    }
  }
  for (std::string* s : {&run_xids_, &run_firsts_, &run_lasts_, &commit_lsns_, &end_lsns_,
                         &tx_xids_, &times_, &counts_, &more_xids_}) {
    s->push_back('}');
  }
  const std::string indexed_through = indexed_through_.ToString();
  const char* values[11] = {run_xids_.c_str(),          run_firsts_.c_str(),    run_lasts_.c_str(),
                            options_.slot_name.c_str(), commit_lsns_.c_str(),   end_lsns_.c_str(),
                            tx_xids_.c_str(),           times_.c_str(),         counts_.c_str(),
                            more_xids_.c_str(),         indexed_through.c_str()};
  auto marked_rows = conn_->ExecPrepared(kStatementName, values);
  if (!marked_rows) {
    Error e = marked_rows.error();
    e.message = "mark delivered rows: " + e.message;
    return std::unexpected(std::move(e));
  }
  const pg::ResultHandle& res = *marked_rows;
  // "{12,15}": the transaction ids not visible yet.
  invisible_.clear();
  std::string_view list = pg::GetValue(res.get(), 0, 2).value_or("{}");
  for (size_t pos = 1; pos < list.size();) {
    size_t end = list.find_first_of(",}", pos);
    if (end == std::string_view::npos || end == pos) break;
    uint64_t id = 0;
    std::from_chars(list.data() + pos, list.data() + end, id);
    invisible_.push_back(id);
    pos = end + 1;
  }
  for (tracking::Transaction* tx : batch) {
    bool visible = std::none_of(
        tx->row_ranges.begin(), tx->row_ranges.end(), [&](const tracking::RowRange& run) {
          return std::find(invisible_.begin(), invisible_.end(), run.transaction_id) !=
                 invisible_.end();
        });
    (visible ? marked : not_visible)->push_back(tx);
    if (visible) indexed_through_ = std::max(indexed_through_, tx->final_lsn);
  }
  if (options_.on_statement) options_.on_statement();
  return Ok();
}

}  // namespace outbox_relay::marker
