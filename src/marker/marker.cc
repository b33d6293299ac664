#include "outbox_relay/marker/marker.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <charconv>
#include <future>

#include "outbox_relay/pg/commit_index.h"
#include "outbox_relay/pg/replication.h"
#include "outbox_relay/pg/rows.h"

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
  const std::string insert = pg::IndexCommitsSql();
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

Status Marker::Connect(size_t i) {
  Lane& lane = lanes_[i];
  lane.conn.reset();
  auto conn = pg::Connection::Open(options_.database_url, pg::Connection::Mode::kNormal,
                                   "outbox-relay-marker", options_.network);
  if (!conn) return std::unexpected(conn.error());
  conn->set_abort(&aborted_);
  timeline_refused_ = false;
  if (const uint32_t expected = timeline_.load(); expected != 0) {
    // The timeline the server writes: the first 8 hex digits of its WAL
    // file's name (a primary's; the marker only connects read-write).
    auto res = conn->Exec(
        "SELECT ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::bigint");
    if (!res) return std::unexpected(res.error());
    auto text = pg::Rows(res->get()).Text(0, 0);
    if (!text) return std::unexpected(text.error());
    if (*text != std::to_string(expected)) {
      timeline_refused_ = true;
      return Fail(ErrorCode::kTransient,
                  "the server writes timeline {}, the delivered transactions were read on "
                  "timeline {} (a standby was promoted): nothing is marked there before the "
                  "relay has read where the two timelines part",
                  *text, expected);
    }
  }
  if (auto set = conn->Exec(kSessionSettings); !set) return std::unexpected(set.error());
  if (options_.progress != nullptr) {
    if (std::string more = options_.progress->SessionSettings(); !more.empty()) {
      if (auto set = conn->Exec(more); !set) return std::unexpected(set.error());
    }
  }
  if (i == 0) {
    auto newest = pg::NewestIndexedCommit(*conn, options_.slot_name);
    if (!newest) return std::unexpected(newest.error());
    indexed_through_ = *newest;
  }
  if (auto st = conn->Prepare(kStatementName, MarkSql(options_), 11); !st) return st;
  lane.conn.emplace(std::move(*conn));
  return Ok();
}

void Marker::Disconnect() {
  for (Lane& lane : lanes_) lane.conn.reset();
}

void Marker::SetTimeline(uint32_t timeline, Lsn shared_below) {
  shared_below_.store(shared_below.value());
  timeline_.store(timeline);
  timeline_refused_.store(false);  // judged again at the next connection
}

std::vector<tracking::Transaction*> Marker::TakeUnshared(
    std::vector<tracking::Transaction*>* batch) {
  std::vector<tracking::Transaction*> unshared;
  const uint64_t below = shared_below_.load();
  if (below == kEndOfWal.value()) return unshared;
  std::erase_if(*batch, [&](tracking::Transaction* tx) {
    // A backfilled row has no position: it cannot be told apart.
    const bool shared = tx->end_lsn.value() != 0 && tx->end_lsn.value() <= below;
    if (!shared) unshared.push_back(tx);
    return !shared;
  });
  return unshared;
}

Status Marker::Start() {
  auto ok = Connect(0);
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
  auto last_idle_report = Clock::time_point{};
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
      ReadStandbys();
      if (options_.progress != nullptr) {
        Status st = lanes_[0].conn ? Ok() : Connect(0);
        if (st) st = options_.progress->Idle(*lanes_[0].conn);
        if (!st) {
          spdlog::warn("marker: {}", st.error().message);
          Disconnect();
        }
        // Idle passes come every 50 ms: reported once a second (a failing
        // table is retried at most that often anyway).
        if (Clock::now() - last_idle_report >= std::chrono::seconds(1)) {
          last_idle_report = Clock::now();
          Report(st);
        }
      }
      if (stopping_.load()) return;
      continue;
    }
    bool conflict_retried = false;
    bool unmarkable = false;
    bool refusal_logged = false;
    while (true) {
      marked.clear();
      not_visible.clear();
      Status st = lanes_[0].conn ? Ok() : Connect(0);
      if (st) {
        if (auto unshared = TakeUnshared(&batch); !unshared.empty()) {
          std::string why = fmt::format(
              "read on the timeline the server left at {}, they end past it (a standby was "
              "promoted): not marked, their rows are sent again",
              Lsn(shared_below_.load()));
          spdlog::warn("marker: {} transactions {}", unshared.size(), why);
          tracker_->Unmarkable(unshared, why);
          if (batch.empty()) {
            unmarkable = true;
            break;
          }
        }
      }
      if (st) st = MarkBatch(batch, &marked, &not_visible);
      if (st && options_.progress != nullptr) st = options_.progress->AfterMark(*lanes_[0].conn);
      if (st) break;
      // Both connections: a half that committed raised the newest indexed
      // commit, and the reconnection reads it.
      Disconnect();
      if (!conflict_retried && st.error().code == ErrorCode::kDuplicateKey) {
        // Another instance indexed commits above indexed_through_ since this
        // one connected (see MarkSql): connect again, which reads it anew.
        conflict_retried = true;
        spdlog::info("marker: {}; reading the commit index again", st.error().message);
        continue;
      }
      if (on_error_) on_error_(st.error());
      Report(st);
      // A refusal for another timeline repeats every 100 ms: said once.
      if (!timeline_refused_ || !refusal_logged) {
        spdlog::warn("marker: {} (retrying in {} ms)", st.error().message, backoff.count());
      }
      refusal_logged = timeline_refused_;
      if (stopping_.load() && Clock::now().time_since_epoch().count() > deadline_ns_.load()) {
        spdlog::error(
            "marker: stopping with {} delivered transactions unmarked; they will be "
            "re-sent and marked after the restart",
            batch.size());
        return;
      }
      std::this_thread::sleep_for(backoff);
      // Another timeline: the relay is about to follow it (FollowTimeline),
      // and its stream waits for this batch; ask again soon.
      backoff = timeline_refused_ ? std::chrono::milliseconds(100)
                                  : std::min(backoff * 2, std::chrono::milliseconds(5000));
    }
    if (unmarkable) {
      if (stopping_.load()) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      continue;
    }
    backoff = std::chrono::milliseconds(100);
    last_rows = rows_of(batch);
    tracker_->OnMarked(marked);
    ReadStandbys();
    Report(Ok());
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

void Marker::ReadStandbys() {
  tracking::StandbyMarks& marks = tracker_->standby_marks();
  if (!marks.enabled() || !lanes_[0].conn) return;
  const auto now = std::chrono::steady_clock::now();
  const auto every = marks.size() > 0 ? std::chrono::milliseconds(100) : std::chrono::seconds(1);
  if (now - standbys_read_ < every) return;
  standbys_read_ = now;
  auto read = pg::ReadStandbyPositions(*lanes_[0].conn);
  if (!read) {
    spdlog::debug("marker: where the standbys are was not read: {}", read.error().message);
    return;
  }
  if (read->hidden > 0 && !standbys_hidden_said_) {
    standbys_hidden_said_ = true;
    spdlog::warn(
        "marker: {} standbys' positions are hidden from this role (grant it pg_read_all_stats): "
        "exactly-once keeps every mark in its progress record until its bound, so that a "
        "promoted standby does not publish marked rows again",
        read->hidden);
  }
  marks.Read(tracking::StandbyPositions{.written = read->written,
                                        .lowest = read->lowest,
                                        .unknown = read->hidden + read->starting > 0});
}

void Marker::Report(const Status& round) {
  if (!options_.on_round) return;
  if (!round) {
    options_.on_round(round);
    return;
  }
  // A round that went through may still have left a part of the progress
  // behind (a Watermill table's position).
  std::string failing = options_.progress != nullptr ? options_.progress->Failing() : "";
  if (failing.empty()) {
    options_.on_round(Ok());
  } else {
    options_.on_round(Fail(ErrorCode::kTransient, "{}", failing));
  }
}

size_t Marker::SplitPoint(const std::vector<tracking::Transaction*>& batch) {
  if (options_.rows_worth_two_statements == 0 || batch.size() < 2) return 0;
  uint64_t rows = 0;
  for (const tracking::Transaction* tx : batch) rows += tx->rows_seen;
  if (rows < options_.rows_worth_two_statements) return 0;
  // Two statements must not touch the same rows or index entries: they would
  // wait for each other's locks (or deadlock), and both would insert the
  // commit's entry. So only commits, each once: no backfilled rows (a page
  // re-read after a restart may overlap the first reading's) and no commit
  // that came again (re-sent after a stream restart) in the batch.
  std::unordered_set<uint64_t> commits;
  commits.reserve(batch.size());
  for (const tracking::Transaction* tx : batch) {
    if (tx->final_lsn.value() == 0 || !commits.insert(tx->final_lsn.value()).second) return 0;
  }
  uint64_t sum = 0;
  for (size_t i = 0; i + 1 < batch.size(); ++i) {
    sum += batch[i]->rows_seen;
    if (sum * 2 >= rows) return i + 1;
  }
  return 0;
}

Status Marker::MarkBatch(const std::vector<tracking::Transaction*>& batch,
                         std::vector<tracking::Transaction*>* marked,
                         std::vector<tracking::Transaction*>* not_visible) {
  const std::span<tracking::Transaction* const> all(batch);
  const std::string indexed_through = indexed_through_.ToString();
  const size_t cut = SplitPoint(batch);
  lanes_[1].invisible.clear();
  int succeeded = 0;
  Status st = Ok();
  if (cut == 0) {
    st = MarkPart(lanes_[0], all, indexed_through);
    succeeded = st ? 1 : 0;
  } else {
    if (!lanes_[1].conn) st = Connect(1);
    if (!st) return st;
    // The second half on a thread of its own, the first on this one; each
    // commits by itself. When one fails the batch is retried whole: the
    // other's rows are marked already (the statement skips them) and its
    // commits are indexed at or below the newest indexed commit, which the
    // reconnection reads (ON CONFLICT DO NOTHING).
    auto second = std::async(
        std::launch::async, [&] { return MarkPart(lanes_[1], all.subspan(cut), indexed_through); });
    st = MarkPart(lanes_[0], all.first(cut), indexed_through);
    Status st2 = second.get();
    succeeded = (st ? 1 : 0) + (st2 ? 1 : 0);
    if (st && !st2) st = std::move(st2);
  }
  if (options_.on_statement) {
    for (int i = 0; i < succeeded; ++i) options_.on_statement();
  }
  if (!st) return st;
  for (size_t i = 0; i < batch.size(); ++i) {
    tracking::Transaction* tx = batch[i];
    const std::vector<uint64_t>& invisible = lanes_[cut != 0 && i >= cut ? 1 : 0].invisible;
    bool visible = std::none_of(
        tx->row_ranges.begin(), tx->row_ranges.end(), [&](const tracking::RowRange& run) {
          return std::find(invisible.begin(), invisible.end(), run.transaction_id) !=
                 invisible.end();
        });
    (visible ? marked : not_visible)->push_back(tx);
    if (visible) indexed_through_ = std::max(indexed_through_, tx->final_lsn);
  }
  return Ok();
}

Status Marker::MarkPart(Lane& lane, std::span<tracking::Transaction* const> part,
                        const std::string& indexed_through) {
  // Array literals in text form: {1,2,3}; the further xids of a commit as
  // "{a,b}" (NULL when it has one).
  for (std::string* s :
       {&lane.run_xids, &lane.run_firsts, &lane.run_lasts, &lane.commit_lsns, &lane.end_lsns,
        &lane.tx_xids, &lane.times, &lane.counts, &lane.more_xids}) {
    s->clear();
    s->push_back('{');
  }
  auto out = [](std::string& s) { return std::back_inserter(s); };
  bool first_run = true;
  bool first_commit = true;
  lane.commits.clear();
  for (const tracking::Transaction* tx : part) {
    for (const tracking::RowRange& run : tx->row_ranges) {
      const char* rsep = first_run ? "" : ",";
      fmt::format_to(out(lane.run_xids), "{}{}", rsep, run.transaction_id);
      fmt::format_to(out(lane.run_firsts), "{}{}", rsep, run.first);
      fmt::format_to(out(lane.run_lasts), "{}{}", rsep, run.last);
      first_run = false;
    }
    // One index entry per commit: after a stream restart the same commit can
    // be here twice (delivered before, and re-sent), and two inserts of one
    // key in a statement would fail it every time.
    if (tx->final_lsn.value() != 0 && !lane.commits.insert(tx->final_lsn.value()).second) {
      continue;
    }
    const char* sep = first_commit ? "" : ",";
    first_commit = false;
    fmt::format_to(out(lane.commit_lsns), "{}{}", sep, tx->final_lsn);
    fmt::format_to(out(lane.end_lsns), "{}{}", sep, tx->end_lsn);
    fmt::format_to(out(lane.times), "{}{}", sep, tx->commit_time.micros);
    uint64_t rows = 0;  // the rows noted: produced, or (exactly-once) already in Kafka
    for (const tracking::RowRange& run : tx->row_ranges) {
      rows += static_cast<uint64_t>(run.last - run.first + 1);
    }
    fmt::format_to(out(lane.counts), "{}{}", sep, rows);
    tracking::AckTracker::TransactionIds(*tx, &lane.ids);
    fmt::format_to(out(lane.tx_xids), "{}{}", sep, lane.ids.front());
    lane.more_xids.append(sep);
    if (lane.ids.size() == 1) {
      lane.more_xids.append("NULL");
    } else {
      lane.more_xids.append("\"{");
      for (size_t j = 1; j < lane.ids.size(); ++j) {
        fmt::format_to(out(lane.more_xids), "{}{}", j == 1 ? "" : ",", lane.ids[j]);
      }
      lane.more_xids.append("}\"");
    }
  }
  for (std::string* s :
       {&lane.run_xids, &lane.run_firsts, &lane.run_lasts, &lane.commit_lsns, &lane.end_lsns,
        &lane.tx_xids, &lane.times, &lane.counts, &lane.more_xids}) {
    s->push_back('}');
  }
  const char* values[11] = {
      lane.run_xids.c_str(),      lane.run_firsts.c_str(),  lane.run_lasts.c_str(),
      options_.slot_name.c_str(), lane.commit_lsns.c_str(), lane.end_lsns.c_str(),
      lane.tx_xids.c_str(),       lane.times.c_str(),       lane.counts.c_str(),
      lane.more_xids.c_str(),     indexed_through.c_str()};
  auto marked_rows = lane.conn->ExecPrepared(kStatementName, values);
  if (!marked_rows) {
    Error e = marked_rows.error();
    e.message = "mark delivered rows: " + e.message;
    return std::unexpected(std::move(e));
  }
  // "{12,15}": the transaction ids not visible yet.
  lane.invisible.clear();
  std::string_view list = pg::GetValue(marked_rows->get(), 0, 2).value_or("{}");
  for (size_t pos = 1; pos < list.size();) {
    size_t end = list.find_first_of(",}", pos);
    if (end == std::string_view::npos || end == pos) break;
    uint64_t id = 0;
    std::from_chars(list.data() + pos, list.data() + end, id);
    lane.invisible.push_back(id);
    pos = end + 1;
  }
  return Ok();
}

}  // namespace outbox_relay::marker
