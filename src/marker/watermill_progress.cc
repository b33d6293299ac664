#include "outbox_relay/marker/watermill_progress.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <charconv>
#include <utility>

namespace outbox_relay::marker {

namespace {

using Clock = std::chrono::steady_clock;

// Samples are taken at most this often, and at most this many kept: when
// the relay lags far behind the WAL, the older half is thinned out.
constexpr auto kSampleEvery = std::chrono::milliseconds(20);
constexpr size_t kMaxSamples = 256;
constexpr auto kIdleEvery = std::chrono::milliseconds(200);

uint64_t ParseU64(std::string_view text) {
  uint64_t v = 0;
  std::from_chars(text.data(), text.data() + text.size(), v);
  return v;
}

}  // namespace

WatermillProgress::WatermillProgress(std::vector<WatermillProgressTable> tables,
                                     std::string consumer_group, tracking::AckTracker* tracker)
    : tables_(std::move(tables)), group_(std::move(consumer_group)), tracker_(tracker) {
  state_.assign(tables_.size(), TableState{});
}

std::string WatermillProgress::CreateOffsetsSql(const pg::QualifiedName& offsets) {
  return fmt::format(
      "CREATE TABLE IF NOT EXISTS {} (consumer_group VARCHAR(255) NOT NULL, offset_acked BIGINT, "
      "last_processed_transaction_id xid8 NOT NULL, PRIMARY KEY(consumer_group))",
      offsets.Quoted());
}

std::string WatermillProgress::SessionSettings() const {
  return fmt::format("SET lock_timeout = '{}ms'", kLockTimeout.count());
}

std::string WatermillProgress::Failing() const {
  std::lock_guard lock(mu_);
  size_t failing = 0;
  const TableState* oldest = nullptr;
  for (const TableState& s : state_) {
    if (s.failing_since == Clock::time_point{}) continue;
    ++failing;
    if (oldest == nullptr || s.failing_since < oldest->failing_since) oldest = &s;
  }
  if (oldest == nullptr) return {};
  // The error says which table and offsets table; the marker's caller says since when.
  return fmt::format(
      "{}{}", oldest->error,
      failing > 1 ? fmt::format(" (and the positions of {} more tables)", failing - 1) : "");
}

void WatermillProgress::SetStreaming(bool on) {
  std::lock_guard lock(mu_);
  streaming_.store(on);
  // Samples from before a backfill are dropped: simpler than proving them
  // still usable against positions the backfill moved.
  samples_.clear();
}

void WatermillProgress::SetTables(std::vector<WatermillProgressTable> tables) {
  std::lock_guard lock(mu_);
  next_tables_ = std::move(tables);
  tables_changed_.store(true);
}

Status WatermillProgress::AfterMark(pg::Connection& conn) { return Advance(conn); }

Status WatermillProgress::Idle(pg::Connection& conn) {
  auto now = Clock::now();
  if (now - last_idle_ < kIdleEvery) return Ok();
  last_idle_ = now;
  return Advance(conn);
}

Status WatermillProgress::Advance(pg::Connection& conn) {
  std::unique_lock lock(mu_);
  if (tables_changed_.exchange(false)) {
    tables_ = std::move(next_tables_);
    next_tables_.clear();
    state_.assign(tables_.size(), TableState{});
    ++generation_;
  }
  if (!streaming_.load() || tables_.empty()) return Ok();

  auto now = Clock::now();
  if (samples_.empty() || now - samples_.back().at >= kSampleEvery) {
    // One statement: its snapshot is taken before the WAL position is read.
    lock.unlock();
    auto res = conn.Exec(
        "SELECT pg_snapshot_xmin(pg_current_snapshot())::text, "
        "pg_current_wal_insert_lsn()::text");
    if (!res) return std::unexpected(res.error());
    auto wal = Lsn::Parse(pg::GetValue(res->get(), 0, 1).value_or("0/0"));
    if (!wal) return std::unexpected(wal.error());
    Sample sample{ParseU64(pg::GetValue(res->get(), 0, 0).value_or("0")), *wal, now};
    lock.lock();
    if (!streaming_.load()) return Ok();
    samples_.push_back(sample);
    if (samples_.size() > kMaxSamples) {
      // Keep every other one of the older half.
      std::deque<Sample> thinned;
      for (size_t i = 0; i < samples_.size(); ++i) {
        if (i >= samples_.size() / 2 || i % 2 == 0) thinned.push_back(samples_[i]);
      }
      samples_.swap(thinned);
    }
  }
  // The newest sample whose WAL position every delivered transaction covers.
  const Lsn delivered = tracker_->DeliveredThrough();
  while (!samples_.empty() && samples_.front().wal <= delivered) {
    bound_ = std::max(bound_, samples_.front().xmin);
    samples_.pop_front();
  }
  const uint64_t bound = bound_;
  std::vector<WatermillProgressTable> tables = tables_;
  std::vector<TableState> state = state_;
  const uint64_t generation = generation_;
  lock.unlock();

  Status st = Ok();
  for (size_t i = 0; i < tables.size() && st; ++i) {
    if (bound <= state[i].written_bound || now < state[i].retry_at) continue;
    st = AdvanceTable(conn, tables[i], bound, state[i]);
  }
  lock.lock();
  if (generation_ == generation) state_ = std::move(state);
  return st;
}

Status WatermillProgress::AdvanceTable(pg::Connection& conn, const WatermillProgressTable& table,
                                       uint64_t bound, TableState& state) {
  auto moved = AdvanceTo(conn, table, group_, bound);
  if (!moved && conn.ok()) {
    // Which of the two tables is missing, if one is: the offsets table is
    // watermill-sql's to create, and the relay creates it (at start too).
    std::optional<std::string> names[] = {table.messages.Quoted(), table.offsets.Quoted()};
    auto found =
        conn.ExecParams("SELECT to_regclass($1) IS NOT NULL, to_regclass($2) IS NOT NULL", names);
    if (found && pg::GetValue(found->get(), 0, 0) == std::optional<std::string_view>("t") &&
        pg::GetValue(found->get(), 0, 1) == std::optional<std::string_view>("f")) {
      if (auto created = conn.Exec(CreateOffsetsSql(table.offsets)); created) {
        spdlog::warn(
            "watermill: the offsets table {} of {} was dropped while the relay ran: created it "
            "again; consumer group '{}' starts there from the relay's position",
            table.offsets.ToString(), table.messages.ToString(), group_);
        moved = AdvanceTo(conn, table, group_, bound);
      } else {
        moved = Fail(created.error().code, "the offsets table {} is gone and cannot be created: {}",
                     table.offsets.ToString(), created.error().message);
      }
    } else if (found && pg::GetValue(found->get(), 0, 0) == std::optional<std::string_view>("f")) {
      moved = Fail(ErrorCode::kFatal,
                   "table {} does not exist any more (dropped or renamed while the relay ran)",
                   table.messages.ToString());
    }
  }
  if (!moved) {
    // The connection's failure is the round's (retried on a new one).
    if (!conn.ok()) return std::unexpected(moved.error());
    const auto now = Clock::now();
    if (state.failing_since == Clock::time_point{}) {
      state.failing_since = now;
      spdlog::warn(
          "watermill: {}; the other tables' positions and the slot go on, this one is retried",
          moved.error().message);
    }
    state.error = moved.error().message;
    state.backoff = std::clamp(state.backoff * 2, std::chrono::milliseconds(250),
                               std::chrono::milliseconds(5000));
    state.retry_at = now + state.backoff;
    return Ok();
  }
  if (state.failing_since != Clock::time_point{}) {
    spdlog::info(
        "watermill: the position of {} is written again (after {} s)", table.messages.ToString(),
        std::chrono::duration_cast<std::chrono::seconds>(Clock::now() - state.failing_since)
            .count());
  }
  state = TableState{};
  state.written_bound = bound;
  if (*moved) written_.fetch_add(1, std::memory_order_relaxed);
  return Ok();
}

Result<std::optional<WatermillPosition>> WatermillProgress::AdvanceTo(
    pg::Connection& conn, const WatermillProgressTable& table, const std::string& group,
    uint64_t below_xid, std::optional<WatermillPosition> upto) {
  // The subscriber's own AckMessageQuery upsert, except that it never moves
  // a position back (the relay and a polling forwarder are never meant to
  // run together, but a stale write must not undo a newer one).
  std::string sql = fmt::format(
      "WITH target AS (SELECT transaction_id, \"offset\" FROM {messages}"
      " WHERE transaction_id < $2::xid8{upto}"
      " ORDER BY transaction_id DESC, \"offset\" DESC LIMIT 1)"
      " INSERT INTO {offsets} AS o (consumer_group, offset_acked, last_processed_transaction_id)"
      " SELECT $1, t.\"offset\", t.transaction_id FROM target t"
      " ON CONFLICT (consumer_group) DO UPDATE SET offset_acked = excluded.offset_acked,"
      " last_processed_transaction_id = excluded.last_processed_transaction_id"
      " WHERE (o.last_processed_transaction_id, COALESCE(o.offset_acked, 9223372036854775807))"
      " < (excluded.last_processed_transaction_id, excluded.offset_acked)"
      " RETURNING last_processed_transaction_id::text, offset_acked",
      fmt::arg("messages", table.messages.Quoted()), fmt::arg("offsets", table.offsets.Quoted()),
      fmt::arg("upto", upto ? " AND (transaction_id, \"offset\") <= ($3::xid8, $4::bigint)" : ""));
  std::vector<std::optional<std::string>> params = {group, std::to_string(below_xid)};
  if (upto) {
    params.emplace_back(std::to_string(upto->transaction_id));
    params.emplace_back(std::to_string(upto->offset));
  }
  auto res = conn.ExecParams(sql, params);
  if (!res) {
    // The server's words, not the statement (the error text starts with it).
    // The server's first line and the SQLSTATE, not the statement (the
    // error text starts with it) nor the LINE/caret context.
    std::string_view text = res.error().message;
    std::string_view why = text;
    if (size_t at = why.find("ERROR:"); at != std::string_view::npos) why.remove_prefix(at);
    why = why.substr(0, why.find('\n'));
    std::string_view state;
    if (size_t at = text.rfind(" (SQLSTATE ");
        at != std::string_view::npos && why.find("(SQLSTATE") == std::string_view::npos) {
      state = text.substr(at);
    }
    return Fail(res.error().code, "writing the Watermill position of {} to {}: {}{}",
                table.messages.ToString(), table.offsets.ToString(), why, state);
  }
  if (PQntuples(res->get()) == 0) return std::optional<WatermillPosition>();
  WatermillPosition p;
  p.transaction_id = ParseU64(pg::GetValue(res->get(), 0, 0).value_or("0"));
  auto offset = pg::GetValue(res->get(), 0, 1).value_or("0");
  std::from_chars(offset.data(), offset.data() + offset.size(), p.offset);
  spdlog::debug("watermill position of {} for group '{}': ({}, {})", table.messages.ToString(),
                group, p.transaction_id, p.offset);
  return std::optional<WatermillPosition>(p);
}

}  // namespace outbox_relay::marker
