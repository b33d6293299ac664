#include "outbox_relay/pipeline/watermill.h"

#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <array>
#include <charconv>
#include <set>

#include "outbox_relay/outbox/watermill.h"
#include "outbox_relay/pg/publication.h"
#include "outbox_relay/pg/relay_schema.h"
#include "outbox_relay/pg/rows.h"

namespace outbox_relay::pipeline {

namespace {

using std::chrono::milliseconds;

constexpr std::string_view kCatchUpKeyPrefix = "watermill_catchup:";

// The columns watermill-sql's DefaultPostgreSQLSchema creates, and the types
// each may have (payload: JSON by default, BYTEA with GeneratePayloadType).
struct NeededColumn {
  const char* name;
  std::vector<std::string_view> types;  // pg_type.typname
};
const std::vector<NeededColumn>& NeededColumns() {
  static const std::vector<NeededColumn> kColumns = {
      {"offset", {"int8", "int4"}},
      {"uuid", {"varchar", "text", "bpchar", "uuid"}},
      {"payload", {"json", "jsonb", "bytea"}},
      {"metadata", {"json", "jsonb"}},
      {"transaction_id", {"xid8"}},
  };
  return kColumns;
}

// LIKE pattern of a '*' glob.
std::string LikeOf(std::string_view glob) {
  std::string out;
  for (char c : glob) {
    if (c == '*') {
      out.push_back('%');
    } else {
      if (c == '%' || c == '_' || c == '\\') out.push_back('\\');
      out.push_back(c);
    }
  }
  return out;
}

uint64_t ParseU64(std::string_view text) {
  uint64_t v = 0;
  std::from_chars(text.data(), text.data() + text.size(), v);
  return v;
}

marker::WatermillProgressTable ProgressTableOf(const OutboxTable& t) {
  return marker::WatermillProgressTable{t.name, t.offsets};
}

Result<std::optional<outbox::TablePosition>> ReadPosition(pg::Connection& conn,
                                                          const OutboxTable& table,
                                                          const std::string& group) {
  std::optional<std::string> exists[] = {table.offsets.Quoted()};
  auto found = conn.ExecParams("SELECT to_regclass($1) IS NOT NULL", exists);
  if (!found) return std::unexpected(found.error());
  if (pg::GetValue(found->get(), 0, 0) != std::optional<std::string_view>("t")) {
    return std::optional<outbox::TablePosition>();
  }
  std::optional<std::string> params[] = {group};
  auto res = conn.ExecParams(
      fmt::format("SELECT last_processed_transaction_id::text, offset_acked FROM {} "
                  "WHERE consumer_group = $1",
                  table.offsets.Quoted()),
      params);
  if (!res) return std::unexpected(res.error());
  if (PQntuples(res->get()) == 0) return std::optional<outbox::TablePosition>();
  outbox::TablePosition p;
  p.transaction_id = ParseU64(pg::GetValue(res->get(), 0, 0).value_or("0"));
  // offset_acked NULL: the subscriber's `"offset" > NULL` selects no row of
  // that transaction, as if all of them were processed.
  if (auto offset = pg::GetValue(res->get(), 0, 1)) {
    std::from_chars(offset->data(), offset->data() + offset->size(), p.offset);
  } else {
    p.offset = INT64_MAX;
  }
  return std::optional<outbox::TablePosition>(p);
}

}  // namespace

bool GlobMatch(std::string_view pattern, std::string_view text) {
  // Iterative matching with backtracking to the last '*'.
  size_t p = 0, t = 0, star = std::string_view::npos, mark = 0;
  while (t < text.size()) {
    if (p < pattern.size() && pattern[p] == '*') {
      star = p++;
      mark = t;
    } else if (p < pattern.size() && pattern[p] == text[t]) {
      ++p;
      ++t;
    } else if (star != std::string_view::npos) {
      p = star + 1;
      t = ++mark;
    } else {
      return false;
    }
  }
  while (p < pattern.size() && pattern[p] == '*') ++p;
  return p == pattern.size();
}

bool WatermillSettings::Selects(std::string_view schema, std::string_view name) const {
  auto listed = [&](const std::vector<pg::QualifiedName>& list) {
    return std::any_of(list.begin(), list.end(), [&](const pg::QualifiedName& q) {
      return q.schema == schema && q.name == name;
    });
  };
  if (listed(tables) || listed(forwarder_tables)) return true;
  return pattern && pattern->schema == schema && GlobMatch(pattern->name, name);
}

bool WatermillSettings::IsForwarder(const pg::QualifiedName& table) const {
  return std::any_of(
      forwarder_tables.begin(), forwarder_tables.end(),
      [&](const pg::QualifiedName& q) { return q.schema == table.schema && q.name == table.name; });
}

Result<std::string> WatermillShapeProblem(pg::Connection& conn, const pg::QualifiedName& table) {
  std::optional<std::string> params[] = {table.Quoted()};
  auto res = conn.ExecParams(
      "SELECT a.attname, t.typname FROM pg_attribute a JOIN pg_type t ON t.oid = a.atttypid "
      "WHERE a.attrelid = to_regclass($1) AND a.attnum > 0 AND NOT a.attisdropped",
      params);
  if (!res) return std::unexpected(res.error());
  std::map<std::string, std::string, std::less<>> columns;
  for (int i = 0; i < PQntuples(res->get()); ++i) {
    columns.emplace(pg::GetValue(res->get(), i, 0).value_or(""),
                    pg::GetValue(res->get(), i, 1).value_or(""));
  }
  std::vector<std::string> problems;
  for (const NeededColumn& c : NeededColumns()) {
    auto it = columns.find(c.name);
    if (it == columns.end()) {
      problems.push_back(fmt::format("no column \"{}\"", c.name));
    } else if (std::find(c.types.begin(), c.types.end(), it->second) == c.types.end()) {
      problems.push_back(fmt::format("column \"{}\" is {}, expected {}", c.name, it->second,
                                     fmt::join(c.types, " or ")));
    }
  }
  if (problems.empty()) return std::string();
  return fmt::format("{} does not have watermill-sql's columns: {}", table.ToString(),
                     fmt::join(problems, "; "));
}

Result<ResolvedTables> ResolveWatermillTables(pg::Connection& conn, const WatermillSettings& s) {
  ResolvedTables out;
  std::set<std::string> seen;
  // The topic of a table: the map, else its default name; nullopt when neither tells.
  auto topic_of = [&](const pg::QualifiedName& t) -> std::optional<std::string> {
    if (auto it = s.topics.find(t.ToString()); it != s.topics.end()) return it->second;
    return outbox::WatermillTopicOfTable(t.name);
  };
  auto add = [&](const pg::QualifiedName& t, bool listed) -> Status {
    if (!seen.insert(t.ToString()).second) return Ok();
    const char* setting = listed
                              ? (s.IsForwarder(t) ? "--watermill-forwarder-tables "
                                                    "(OUTBOX_WATERMILL_FORWARDER_TABLES)"
                                                  : "--watermill-tables (OUTBOX_WATERMILL_TABLES)")
                              : "--watermill-table-pattern (OUTBOX_WATERMILL_TABLE_PATTERN)";
    auto refuse = [&](std::string why) -> Status {
      if (listed) {
        return Fail(ErrorCode::kInvalidArgument, "invalid setting {}: {}", setting, why);
      }
      out.skipped.push_back(std::move(why));
      return Ok();
    };
    auto info = pg::QueryTable(conn, t);
    if (!info) return std::unexpected(info.error());
    if (!info->exists) return refuse(fmt::format("table {} does not exist", t.ToString()));
    if (info->relkind != 'r' && info->relkind != 'p') {
      return refuse(fmt::format("{} is not a table (relkind '{}')", t.ToString(), info->relkind));
    }
    auto shape = WatermillShapeProblem(conn, t);
    if (!shape) return std::unexpected(shape.error());
    if (!shape->empty()) return refuse(*shape);
    OutboxTable table;
    table.name = t;
    table.kind = s.IsForwarder(t) ? outbox::TableKind::kForwarder : outbox::TableKind::kWatermill;
    auto topic = topic_of(t);
    auto offsets = s.offsets.find(t.ToString());
    if (!topic) {
      if (table.kind == outbox::TableKind::kWatermill || offsets == s.offsets.end()) {
        return refuse(fmt::format(
            "the topic of table {} cannot be told from its name (not \"watermill_<topic>\", or "
            "{} bytes long: PostgreSQL may have cut it short): name it with "
            "--watermill-topic-map '{}=<topic>' (OUTBOX_WATERMILL_TOPIC_MAP)",
            t.ToString(), t.name.size(), t.ToString()));
      }
    }
    table.topic = topic.value_or("");
    if (table.kind == outbox::TableKind::kWatermill && !outbox::IsKafkaTopicName(table.topic)) {
      return refuse(fmt::format(
          "the topic \"{}\" of table {} is not a legal Kafka topic name (1..249 of A-Z a-z 0-9 "
          ". _ -; watermill-sql allows ':' and '$', Kafka does not): map it with "
          "--watermill-topic-map '{}=<topic>'",
          table.topic, t.ToString(), t.ToString()));
    }
    table.offsets = offsets != s.offsets.end()
                        ? offsets->second
                        : pg::QualifiedName{t.schema, outbox::WatermillOffsetsTable(table.topic)};
    out.tables.push_back(std::move(table));
    return Ok();
  };
  for (const auto& t : s.tables) {
    if (auto st = add(t, true); !st) return std::unexpected(st.error());
  }
  for (const auto& t : s.forwarder_tables) {
    if (auto st = add(t, true); !st) return std::unexpected(st.error());
  }
  if (s.pattern) {
    std::optional<std::string> params[] = {s.pattern->schema, LikeOf(s.pattern->name)};
    auto res = conn.ExecParams(
        "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE n.nspname = $1 AND c.relname LIKE $2 AND c.relkind IN ('r', 'p') "
        "AND NOT c.relispartition ORDER BY c.relname",
        params);
    if (!res) return std::unexpected(res.error());
    for (int i = 0; i < PQntuples(res->get()); ++i) {
      pg::QualifiedName t{s.pattern->schema, std::string(*pg::GetValue(res->get(), i, 0))};
      if (seen.contains(t.ToString())) continue;
      auto shape = WatermillShapeProblem(conn, t);
      if (!shape) return std::unexpected(shape.error());
      // Tables of other shapes (the offsets tables first of all) are simply not ours.
      if (!shape->empty()) continue;
      if (auto st = add(t, false); !st) return std::unexpected(st.error());
    }
  }
  return out;
}

Result<std::map<std::string, outbox::TablePosition>> ReadWatermillPositions(
    pg::Connection& conn, const std::vector<OutboxTable>& tables, const std::string& group) {
  std::map<std::string, outbox::TablePosition> out;
  for (const OutboxTable& t : tables) {
    auto p = ReadPosition(conn, t, group);
    if (!p) return std::unexpected(p.error());
    if (*p) out.emplace(t.name.ToString(), **p);
  }
  return out;
}

std::string OffsetsTableDdl(const pg::QualifiedName& offsets) {
  return marker::WatermillProgress::CreateOffsetsSql(offsets);
}

std::string CreateWatermillPublicationSql(std::string_view publication,
                                          const std::vector<OutboxTable>& tables) {
  std::vector<std::string> names;
  for (const OutboxTable& t : tables) names.push_back(t.name.Quoted());
  return fmt::format(
      "CREATE PUBLICATION {}{}{} WITH (publish = 'insert', publish_via_partition_root = true)",
      pg::QuoteIdent(publication), names.empty() ? "" : " FOR TABLE ", fmt::join(names, ", "));
}

WatermillTables::WatermillTables(WatermillSettings settings, WatermillOptions options,
                                 Publisher* publisher, tracking::AckTracker* tracker,
                                 RelayStats* stats, StopSignal* stop,
                                 marker::WatermillProgress* progress)
    : settings_(std::move(settings)),
      options_(std::move(options)),
      publisher_(publisher),
      tracker_(tracker),
      stats_(stats),
      stop_(stop),
      progress_(progress) {}

WatermillTables::~WatermillTables() { StopDiscovery(); }

Status WatermillTables::Resolve(pg::Connection& conn) {
  auto resolved = ResolveWatermillTables(conn, settings_);
  if (!resolved) return std::unexpected(resolved.error());
  for (const std::string& why : resolved->skipped) {
    spdlog::warn("watermill table not followed: {}", why);
  }
  if (resolved->tables.empty() && !settings_.pattern) {
    return Fail(ErrorCode::kInvalidArgument,
                "invalid setting --watermill-tables (OUTBOX_WATERMILL_TABLES): no table to "
                "publish");
  }
  for (const OutboxTable& t : resolved->tables) {
    bool known = std::any_of(tables_.begin(), tables_.end(), [&](const OutboxTable& k) {
      return k.name.ToString() == t.name.ToString();
    });
    if (!known) {
      spdlog::info("watermill table {}: {}, progress in {} (consumer group '{}')",
                   t.name.ToString(),
                   t.kind == outbox::TableKind::kForwarder
                       ? fmt::format("forwarder envelopes (topic from each row)")
                       : fmt::format("topic {}", t.topic),
                   t.offsets.ToString(), settings_.consumer_group);
    }
  }
  tables_ = std::move(resolved->tables);
  return Ok();
}

Status WatermillTables::EnsureOffsetsTables(pg::Connection& conn) {
  if (!options_.mark) return Ok();
  for (const OutboxTable& t : tables_) {
    std::optional<std::string> params[] = {t.offsets.Quoted()};
    auto found = conn.ExecParams("SELECT to_regclass($1) IS NOT NULL", params);
    if (!found) return std::unexpected(found.error());
    if (pg::GetValue(found->get(), 0, 0) == std::optional<std::string_view>("t")) continue;
    std::string ddl = OffsetsTableDdl(t.offsets);
    if (auto created = conn.Exec(ddl); !created) {
      // Two sessions running CREATE TABLE IF NOT EXISTS at once (a polling
      // subscriber with InitializeSchema starting beside the relay): the
      // loser fails on pg_type's unique index. The table is there: go on.
      auto again = conn.ExecParams("SELECT to_regclass($1) IS NOT NULL", params);
      if (again && pg::GetValue(again->get(), 0, 0) == std::optional<std::string_view>("t")) {
        spdlog::info("{} was created meanwhile by another session", t.offsets.ToString());
        continue;
      }
      Error e = created.error();
      e.message += fmt::format(
          "\nThe relay keeps the consumer group's position where watermill-sql's subscriber "
          "keeps it; create the table as a role that may:\n  {};\nand GRANT SELECT, INSERT, "
          "UPDATE ON {} TO <the relay's role>;",
          ddl, t.offsets.Quoted());
      return std::unexpected(std::move(e));
    }
    spdlog::info("created {} (watermill-sql's offsets table)", t.offsets.ToString());
  }
  return Ok();
}

Status WatermillTables::EnsurePublication(pg::Connection& conn) {
  std::optional<std::string> name[] = {options_.publication};
  auto pub = conn.ExecParams(
      "SELECT puballtables, pubinsert, pubupdate, pubdelete, pubtruncate "
      "FROM pg_publication WHERE pubname = $1",
      name);
  if (!pub) return std::unexpected(pub.error());
  auto refuse = [&](std::string what, std::string fix) -> Status {
    return Fail(ErrorCode::kInvalidArgument,
                "invalid setting --publication (OUTBOX_PUBLICATION): publication {} {}. The "
                "relay cannot publish it exactly and does not start. Fix: {}",
                options_.publication, what, fix);
  };
  if (PQntuples(pub->get()) == 0) {
    std::string sql = CreateWatermillPublicationSql(options_.publication, tables_);
    if (auto created = conn.Exec(sql); !created) {
      Error e = created.error();
      if (e.code == ErrorCode::kPermission) {
        e.message += fmt::format(
            "\nThe relay's role may not create the publication. Run as the tables' owner or a "
            "superuser:\n  {};",
            sql);
      }
      return std::unexpected(std::move(e));
    }
    spdlog::info("created publication {}: {}", options_.publication, sql);
    return Ok();
  }
  auto is_true = [&](int col) {
    return pg::GetValue(pub->get(), 0, col) == std::optional<std::string_view>("t");
  };
  const std::string p = pg::QuoteIdent(options_.publication);
  if (is_true(0)) {
    return refuse(
        "is FOR ALL TABLES: every table's changes are streamed to the relay, its own "
        "commit index outbox_relay.commits among them",
        fmt::format("give the relay a publication of its own: {};",
                    CreateWatermillPublicationSql("outbox_relay_own", tables_)));
  }
  if (!is_true(1)) {
    return refuse("does not publish inserts: no row would arrive",
                  fmt::format("ALTER PUBLICATION {} SET (publish = 'insert');", p));
  }
  if (is_true(2) || is_true(3) || is_true(4)) {
    spdlog::warn(
        "publication {} also publishes update/delete/truncate: the relay ignores them "
        "(fix: ALTER PUBLICATION {} SET (publish = 'insert');)",
        options_.publication, p);
  }
  std::vector<std::string> needed;
  for (const NeededColumn& c : NeededColumns()) needed.emplace_back(c.name);
  std::vector<OutboxTable> followed;
  for (const OutboxTable& t : tables_) {
    auto info = pg::QueryPublication(conn, options_.publication, t.name);
    if (!info) return std::unexpected(info.error());
    auto table_info = pg::QueryTable(conn, t.name);
    if (!table_info) return std::unexpected(table_info.error());
    if (!info->includes_table) {
      if (auto st = Join(conn, t); !st) {
        if (st.error().code != ErrorCode::kTransient) return st;
        // Not followed for now; the discovery asks again.
        spdlog::warn("{}", st.error().message);
        continue;
      }
      followed.push_back(t);
      continue;
    }
    followed.push_back(t);
    for (const pg::PublicationProblem& problem :
         pg::Problems(*info, *table_info, options_.publication, t.name, needed)) {
      // Other tables are expected here (the other Watermill tables), and
      // the shapes checked above were checked once.
      if (!problem.refuse || info->all_tables || !info->insert) continue;
      return refuse(problem.what, problem.fix);
    }
  }
  tables_ = std::move(followed);
  return Ok();
}

Status WatermillTables::Join(pg::Connection& conn, const OutboxTable& table) {
  const std::string t = table.name.Quoted();
  spdlog::info("table {} joins publication {} (rows before it are published from a snapshot)",
               table.name.ToString(), options_.publication);
  auto rollback = [&](Error e) -> Status {
    (void)conn.Exec("ROLLBACK");
    return std::unexpected(std::move(e));
  };
  if (auto st = conn.Exec("BEGIN"); !st) return std::unexpected(st.error());
  if (auto st = conn.Exec(
          fmt::format("SET LOCAL lock_timeout = '{}ms'", options_.join_lock_timeout.count()));
      !st) {
    return rollback(st.error());
  }
  // Waits for every transaction that inserted into the table, and holds new
  // inserts back until the commit (the class comment says why).
  std::string alter =
      fmt::format("ALTER PUBLICATION {} ADD TABLE {}", pg::QuoteIdent(options_.publication), t);
  auto owner_hint = [&](Error& e) {
    if (e.code != ErrorCode::kPermission) return;
    e.message += fmt::format(
        "\nAdding a table to the publication needs the table's owner (or a superuser). Run, as "
        "the owner, the relay's own join (the snapshot tells the relay which rows to publish "
        "from the table, as the stream will not send them):\n  BEGIN; LOCK TABLE {t} IN SHARE "
        "MODE; {alter}; INSERT INTO outbox_relay.state (slot_name, key, value) VALUES ({slot}, "
        "{key}, pg_current_snapshot()::text) ON CONFLICT (slot_name, key) DO UPDATE SET value = "
        "excluded.value; COMMIT;",
        fmt::arg("t", t), fmt::arg("alter", alter),
        fmt::arg("slot", pg::QuoteLiteral(options_.slot)),
        fmt::arg("key", pg::QuoteLiteral(std::string(kCatchUpKeyPrefix) + table.name.ToString())));
  };
  if (auto st = conn.Exec(fmt::format("LOCK TABLE {} IN SHARE MODE", t)); !st) {
    Error e = st.error();
    owner_hint(e);
    if (e.message.find("lock timeout") != std::string::npos) {
      e.code = ErrorCode::kTransient;
      e.message = fmt::format(
          "table {} cannot join publication {} yet: a transaction holding it open kept the "
          "join's lock waiting past {} ms (retried)",
          table.name.ToString(), options_.publication, options_.join_lock_timeout.count());
    }
    return rollback(std::move(e));
  }
  if (auto st = conn.Exec(alter); !st) {
    Error e = st.error();
    owner_hint(e);
    return rollback(std::move(e));
  }
  std::optional<std::string> params[] = {options_.slot,
                                         std::string(kCatchUpKeyPrefix) + table.name.ToString()};
  if (auto st = conn.ExecParams(
          "INSERT INTO outbox_relay.state (slot_name, key, value) "
          "VALUES ($1, $2, pg_current_snapshot()::text) ON CONFLICT (slot_name, key) DO UPDATE "
          "SET value = excluded.value, updated_at = now()",
          params);
      !st) {
    return rollback(st.error());
  }
  if (auto st = conn.Exec("COMMIT"); !st) return rollback(st.error());
  return Ok();
}

Status WatermillTables::Prepare(pg::Connection& conn) {
  if (auto st = Resolve(conn); !st) return st;
  if (auto st = EnsureOffsetsTables(conn); !st) return st;
  if (auto st = EnsurePublication(conn); !st) return st;
  UpdateProgressTables();
  Retire({}, {});
  return Ok();
}

void WatermillTables::UpdateProgressTables() {
  if (progress_ == nullptr) return;
  std::vector<marker::WatermillProgressTable> tables;
  for (const OutboxTable& t : tables_) tables.push_back(ProgressTableOf(t));
  progress_->SetTables(std::move(tables));
}

Status WatermillTables::WaitDelivered() {
  while (!tracker_->WaitEmpty(milliseconds(1000))) {
    stats_->Beat();
    if (auto failure = tracker_->failure())
      return Fail(ErrorCode::kFatal, "backfill: {}", *failure);
    if (stop_->requested()) return Ok();
    if (auto st = publisher_->DeadLetterRefused(nullptr); !st) return st;
    spdlog::info("backfill: waiting for {} rows in flight", tracker_->rows_in_flight());
  }
  return Ok();
}

namespace {

// The rows the backfill publishes ($1 the snapshot, $2 and $3 the group's
// position): visible in the snapshot and after the position, which means
// "processed" to watermill-sql's subscriber.
constexpr const char* kUnprocessedRows =
    "pg_visible_in_snapshot(transaction_id, $1::pg_snapshot) "
    "AND (transaction_id, \"offset\") > ($2::xid8, $3::bigint)";

}  // namespace

Result<std::array<std::optional<std::string>, 3>> WatermillTables::UnprocessedParams(
    pg::Connection& conn, const OutboxTable& table, const std::string& snapshot) {
  auto position = ReadPosition(conn, table, settings_.consumer_group);
  if (!position) return std::unexpected(position.error());
  // Without a position, every row.
  outbox::TablePosition after = position->value_or(outbox::TablePosition{0, INT64_MIN});
  return std::array<std::optional<std::string>, 3>{snapshot, std::to_string(after.transaction_id),
                                                   std::to_string(after.offset)};
}

std::optional<uint64_t> WatermillTables::CountUnprocessed(pg::Connection& conn,
                                                          const std::vector<OutboxTable>& tables,
                                                          const std::string& snapshot) {
  uint64_t total = 0;
  for (const OutboxTable& table : tables) {
    auto n = [&]() -> Result<int64_t> {
      auto params = UnprocessedParams(conn, table, snapshot);
      if (!params) return std::unexpected(params.error());
      auto counted = conn.ExecParams(
          fmt::format("SELECT count(*) FROM {} WHERE {}", table.name.Quoted(), kUnprocessedRows),
          *params);
      if (!counted) return std::unexpected(counted.error());
      return pg::Rows(counted->get()).Int(0, 0);
    }();
    if (!n) {
      spdlog::warn("backfill: counting the rows of {} to publish: {}; going on without a total",
                   table.name.ToString(), n.error().message);
      return std::nullopt;
    }
    total += static_cast<uint64_t>(std::max<int64_t>(*n, 0));
  }
  return total;
}

Status WatermillTables::PublishTable(pg::Connection& conn, const OutboxTable& table,
                                     const std::string& snapshot, uint64_t bound_xid,
                                     uint64_t* rows, ProgressReport* progress) {
  auto unprocessed = UnprocessedParams(conn, table, snapshot);
  if (!unprocessed) return std::unexpected(unprocessed.error());
  auto& params = *unprocessed;
  std::string sql =
      fmt::format("SELECT * FROM {} WHERE {} ORDER BY transaction_id, \"offset\" LIMIT {}",
                  table.name.Quoted(), kUnprocessedRows, options_.backfill_batch);
  pgoutput::TupleData tuple;
  while (!stop_->requested()) {
    stats_->Beat();
    auto res = conn.ExecParams(sql, params);
    if (!res) return std::unexpected(res.error());
    PGresult* r = res->get();
    const int n = PQntuples(r);
    if (n == 0) break;
    auto columns = outbox::ColumnMap::Resolve(pg::RelationOf(r), WatermillColumnNames());
    if (!columns) return std::unexpected(columns.error());
    columns->kind = table.kind;
    columns->table = table.name.ToString();
    columns->topic = table.topic;
    tracking::Transaction* tx = nullptr;
    std::string_view tx_id;
    int produced = 0;
    for (int i = 0; i < n; ++i) {
      pg::TupleOf(r, i, &tuple);
      std::string_view row_tx = *pg::GetValue(r, i, columns->transaction_id);
      if (tx == nullptr || row_tx != tx_id) {
        // One tracker transaction per writing transaction; no LSN, so it
        // never moves the slot.
        if (tx != nullptr) tracker_->Commit(tx, kInvalidLsn);
        tx = tracker_->Begin(kInvalidLsn, PgTimestamp{}, 0);
        tx_id = row_tx;
      }
      while (publisher_->InFlightFull() && !tracker_->failure() && !stop_->requested()) {
        stats_->Beat();
        if (auto st = publisher_->DeadLetterRefused(nullptr); !st) {
          tracker_->Commit(tx, kInvalidLsn);
          return st;
        }
        tracker_->WaitForProgress(milliseconds(2));
      }
      if (stop_->requested()) break;
      if (auto st = publisher_->MapAndProduce(*columns, tuple, tx, nullptr); !st) {
        tracker_->Commit(tx, kInvalidLsn);
        return st;
      }
      ++produced;
      ++*rows;
      stats_->backfilled.fetch_add(1, std::memory_order_relaxed);
    }
    if (tx != nullptr) tracker_->Commit(tx, kInvalidLsn);
    if (progress != nullptr) progress->Update(*rows);  // once a page
    if (produced < n) break;                           // stopping: the rest comes next time
    // The page is delivered before the position moves onto it.
    if (auto st = WaitDelivered(); !st) return st;
    if (stop_->requested()) break;
    marker::WatermillPosition last{ParseU64(*pg::GetValue(r, n - 1, columns->transaction_id)), 0};
    auto last_offset = *pg::GetValue(r, n - 1, columns->offset);
    std::from_chars(last_offset.data(), last_offset.data() + last_offset.size(), last.offset);
    if (options_.mark && progress_ != nullptr) {
      auto moved = marker::WatermillProgress::AdvanceTo(conn, ProgressTableOf(table),
                                                        settings_.consumer_group, bound_xid, last);
      if (!moved) return std::unexpected(moved.error());
    }
    params[1] = std::to_string(last.transaction_id);
    params[2] = std::to_string(last.offset);
    if (n < options_.backfill_batch) break;
  }
  return Ok();
}

Status WatermillTables::Backfill(pg::Connection& conn, const std::string& snapshot) {
  if (progress_ != nullptr) progress_->SetStreaming(false);
  std::optional<std::string> params[] = {snapshot};
  auto xmin = conn.ExecParams("SELECT pg_snapshot_xmin($1::pg_snapshot)::text", params);
  if (!xmin) return std::unexpected(xmin.error());
  const uint64_t bound = ParseU64(pg::GetValue(xmin->get(), 0, 0).value_or("0"));
  auto started = std::chrono::steady_clock::now();
  spdlog::info(
      "backfill: publishing the rows of {} tables that consumer group '{}' has not processed, "
      "committed before the slot (snapshot {})",
      tables_.size(), settings_.consumer_group, snapshot);
  (void)conn.Exec("SET jit = off");
  // The total, for the progress and outbox_relay_backfill_rows_estimated.
  std::optional<uint64_t> total = CountUnprocessed(conn, tables_, snapshot);
  if (total) {
    stats_->backfill_estimated.store(*total, std::memory_order_relaxed);
    spdlog::info("backfill: {} rows to publish", *total);
  }
  ProgressReport progress("backfill", total, /*estimated=*/false);
  uint64_t rows = 0;
  for (const OutboxTable& t : tables_) {
    if (auto st = PublishTable(conn, t, snapshot, bound, &rows, &progress); !st) return st;
    if (stop_->requested()) return Ok();  // resumes from the stored snapshot
  }
  progress.Finish(rows);
  // The slot's snapshot covers every table joined before it.
  std::optional<std::string> slot[] = {options_.slot, std::string(kCatchUpKeyPrefix) + "%"};
  if (auto st = conn.ExecParams(
          "DELETE FROM outbox_relay.state WHERE slot_name = $1 AND key LIKE $2", slot);
      !st) {
    return std::unexpected(st.error());
  }
  auto secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  spdlog::info("backfill: {} rows published in {:.1f} s", rows, secs);
  return Ok();
}

Status WatermillTables::CatchUp(pg::Connection& conn) {
  std::optional<std::string> params[] = {options_.slot, std::string(kCatchUpKeyPrefix) + "%"};
  auto pending = conn.ExecParams(
      "SELECT key, value, pg_snapshot_xmin(value::pg_snapshot)::text FROM outbox_relay.state "
      "WHERE slot_name = $1 AND key LIKE $2 ORDER BY updated_at",
      params);
  if (!pending) return std::unexpected(pending.error());
  for (int i = 0; i < PQntuples(pending->get()); ++i) {
    std::string key(*pg::GetValue(pending->get(), i, 0));
    std::string snapshot(*pg::GetValue(pending->get(), i, 1));
    uint64_t bound = ParseU64(*pg::GetValue(pending->get(), i, 2));
    std::string name = key.substr(kCatchUpKeyPrefix.size());
    auto table = std::find_if(tables_.begin(), tables_.end(),
                              [&](const OutboxTable& t) { return t.name.ToString() == name; });
    if (table != tables_.end()) {
      if (progress_ != nullptr) progress_->SetStreaming(false);
      uint64_t rows = 0;
      spdlog::info(
          "table {} joined the publication: publishing its rows written before (snapshot "
          "{})",
          name, snapshot);
      ProgressReport progress(fmt::format("catch-up of {}", name),
                              CountUnprocessed(conn, {*table}, snapshot), /*estimated=*/false);
      if (auto st = PublishTable(conn, *table, snapshot, bound, &rows, &progress); !st) return st;
      if (stop_->requested()) return Ok();  // resumes from the stored snapshot
      progress.Finish(rows);
      spdlog::info("table {}: {} rows written before it joined published", name, rows);
    } else {
      spdlog::warn(
          "table {} joined the publication but is no longer followed: its rows written "
          "before are not published",
          name);
    }
    if (auto st = pg::DeleteState(conn, options_.slot, key); !st) return st;
  }
  return Ok();
}

std::vector<OutboxTable> WatermillTables::routed_tables() const {
  std::vector<OutboxTable> out = tables_;
  out.insert(out.end(), retired_.begin(), retired_.end());
  return out;
}

bool WatermillTables::OnUnrouted(std::string_view schema, std::string_view name,
                                 const OutboxTable* previous) {
  if (previous == nullptr && !settings_.Selects(schema, name)) {
    return false;  // another table in a shared publication
  }
  pg::QualifiedName table{std::string(schema), std::string(name)};
  std::string key =
      fmt::format("{}|{}", previous != nullptr ? previous->name.ToString() : "", table.ToString());
  if (!unrouted_seen_.insert(std::move(key)).second) return false;
  if (previous == nullptr) unrouted_names_.push_back(std::move(table));
  RequestEnd();
  return true;
}

void WatermillTables::Retire(const std::vector<OutboxTable>& before,
                             const std::vector<OutboxTable>& resolved) {
  auto in = [](const std::vector<OutboxTable>& list, const pg::QualifiedName& name) {
    return std::any_of(list.begin(), list.end(),
                       [&](const OutboxTable& t) { return t.name.ToString() == name.ToString(); });
  };
  auto followed = [&](const pg::QualifiedName& name) { return in(tables_, name); };
  auto retired = [&](const pg::QualifiedName& name) {
    return std::any_of(retired_.begin(), retired_.end(),
                       [&](const OutboxTable& t) { return t.name.ToString() == name.ToString(); });
  };
  // Followed again (recreated, or its shape restored): not retired any more.
  std::erase_if(retired_, [&](const OutboxTable& t) { return followed(t.name); });
  for (const OutboxTable& t : before) {
    // Still there and fitting, only waiting to join again: not retired.
    if (followed(t.name) || retired(t.name) || in(resolved, t.name)) continue;
    spdlog::warn(
        "watermill table {} is no longer followed (dropped, renamed, or without watermill-sql's "
        "columns now): no position is written for it; the rows written to it before are still "
        "published",
        t.name.ToString());
    retired_.push_back(t);
  }
  for (const pg::QualifiedName& name : unrouted_names_) {
    if (followed(name) || retired(name)) continue;
    OutboxTable t;
    t.name = name;
    t.kind =
        settings_.IsForwarder(name) ? outbox::TableKind::kForwarder : outbox::TableKind::kWatermill;
    std::optional<std::string> topic;
    if (auto it = settings_.topics.find(name.ToString()); it != settings_.topics.end()) {
      topic = it->second;
    } else {
      topic = outbox::WatermillTopicOfTable(name.name);
    }
    if ((!topic || !outbox::IsKafkaTopicName(*topic)) && t.kind == outbox::TableKind::kWatermill) {
      spdlog::warn(
          "the stream carries rows of table {}, which the settings select but which cannot be "
          "followed now, and its topic cannot be told from its name: they are not published "
          "(map it with --watermill-topic-map)",
          name.ToString());
      continue;
    }
    t.topic = topic.value_or("");
    spdlog::warn(
        "the stream carries rows of table {}, which the settings select but which cannot be "
        "followed now (dropped or renamed since?): they are published, no position is written",
        name.ToString());
    retired_.push_back(std::move(t));
  }
  unrouted_names_.clear();
  MutexLock lock(&discovery_mu_);
  followed_names_.clear();
  for (const OutboxTable& t : tables_) followed_names_.insert(t.name.ToString());
}

Status WatermillTables::BeforeStream() {
  auto conn = pg::Connection::Open(options_.database_url, pg::Connection::Mode::kNormal);
  if (!conn) return std::unexpected(conn.error());
  // One instance at a time joins tables and runs their catch-ups: the same
  // lock as the slot's setup.
  auto locked = pg::TrySlotSetupLock(*conn, options_.slot);
  if (!locked) return std::unexpected(locked.error());
  if (!*locked) {
    return Fail(ErrorCode::kSlotInUse, "slot {} is being set up by another instance",
                options_.slot);
  }
  const std::vector<OutboxTable> before = tables_;
  if (auto st = Resolve(*conn); !st) {
    if (st.error().code == ErrorCode::kInvalidArgument && !tracker_->empty()) {
      // A listed table is gone or changed: what was read before goes out
      // before the relay stops.
      spdlog::info("watermill tables: delivering and marking what was read before stopping");
      (void)WaitDelivered();
    }
    return st;
  }
  const std::vector<OutboxTable> resolved = tables_;  // before joins that must wait
  if (auto st = EnsureOffsetsTables(*conn); !st) return st;
  if (auto st = EnsurePublication(*conn); !st) return st;
  Retire(before, resolved);
  if (auto st = CatchUp(*conn); !st) return st;
  if (stop_->requested()) return Ok();
  UpdateProgressTables();
  auto positions = ReadWatermillPositions(*conn, tables_, settings_.consumer_group);
  if (!positions) return std::unexpected(positions.error());
  positions_ = std::move(*positions);
  end_requested_.store(false);
  return Ok();
}

void WatermillTables::StartDiscovery() {
  if (discovery_.joinable()) return;
  discovery_ = std::thread([this] { DiscoveryLoop(); });
}

void WatermillTables::StopDiscovery() {
  discovery_stop_.Set();
  if (discovery_.joinable()) discovery_.join();
}

void WatermillTables::DiscoveryLoop() {
  // Every interval: the tables the settings select now (new ones matching
  // the pattern, and listed ones whose join had to wait), against the
  // publication. Any missing one ends the session between transactions; the
  // supervisor lets it join before the next. Tables left out for good (no
  // topic, another shape) are not among the resolved ones.
  std::optional<pg::Connection> conn;
  while (true) {
    if (discovery_stop_.SleepFor(options_.discover_interval)) return;
    if (end_requested_.load()) continue;
    if (!conn) {
      auto c = pg::Connection::Open(options_.database_url, pg::Connection::Mode::kNormal,
                                    "outbox-relay-discovery");
      if (!c) continue;
      conn.emplace(std::move(*c));
    }
    auto resolved = ResolveWatermillTables(*conn, settings_);
    if (!resolved && resolved.error().code == ErrorCode::kInvalidArgument) {
      // A listed table is gone or changed: the supervisor stops the relay
      // (BeforeStream says why), after what was read is delivered.
      spdlog::warn("watermill tables: {}: the stream ends", resolved.error().message);
      end_requested_.store(true);
      continue;
    }
    std::optional<std::string> params[] = {options_.publication};
    auto published = conn->ExecParams(
        "SELECT schemaname || '.' || tablename FROM pg_publication_tables WHERE pubname = $1",
        params);
    if (!resolved || !published) {
      conn.reset();
      continue;
    }
    std::vector<std::string> gone;
    {
      MutexLock lock(&discovery_mu_);
      for (const std::string& name : followed_names_) {
        if (std::none_of(resolved->tables.begin(), resolved->tables.end(),
                         [&](const OutboxTable& t) { return t.name.ToString() == name; })) {
          gone.push_back(name);
        }
      }
    }
    if (!gone.empty()) {
      spdlog::info(
          "watermill table(s) {} gone (dropped, renamed) or without watermill-sql's columns now: "
          "the stream restarts between transactions to follow the tables as they are",
          fmt::join(gone, ", "));
      end_requested_.store(true);
      continue;
    }
    std::set<std::string> in_publication;
    for (int i = 0; i < PQntuples(published->get()); ++i) {
      in_publication.emplace(*pg::GetValue(published->get(), i, 0));
    }
    std::vector<std::string> missing;
    for (const OutboxTable& t : resolved->tables) {
      if (!in_publication.contains(t.name.ToString())) missing.push_back(t.name.ToString());
    }
    if (!missing.empty()) {
      spdlog::info(
          "watermill table(s) {} not in publication {} yet: the stream restarts between "
          "transactions to let them join",
          fmt::join(missing, ", "), options_.publication);
      end_requested_.store(true);
    }
  }
}

}  // namespace outbox_relay::pipeline
