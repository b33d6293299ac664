#include "outbox_relay/ops/check.h"

#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cctype>
#include <cstdio>
#include <map>
#include <set>

#include "outbox_relay/app/commands.h"
#include "outbox_relay/app/logging.h"
#include "outbox_relay/ops/check_failover.h"
#include "outbox_relay/ops/commands.h"
#include "outbox_relay/ops/slot_command.h"
#include "outbox_relay/outbox/record.h"
#include "outbox_relay/pg/commit_index.h"
#include "outbox_relay/pg/connection.h"
#include "outbox_relay/pg/publication.h"
#include "outbox_relay/pg/replication.h"
#include "outbox_relay/pg/rows.h"
#include "outbox_relay/pipeline/kafka_progress.h"

namespace outbox_relay::ops {

const char* CheckStatusName(CheckStatus status) {
  switch (status) {
    case CheckStatus::kOk:
      return "OK";
    case CheckStatus::kWarn:
      return "WARN";
    case CheckStatus::kFail:
      return "FAIL";
  }
  return "FAIL";
}

namespace {

struct Column {
  int attnum = 0;
  std::string type;     // format_type()
  std::string typname;  // pg_type.typname
  char category = 'X';  // pg_type.typcategory
  bool not_null = false;
};

// The checks are functions of what the first queries found (Server, the
// table), each adding its lines to `out`; none keeps state of its own.
class Results : public CheckList {
 public:
  using CheckList::Failed;
  using CheckList::Ok;
  using CheckList::Warn;
  void Append(std::vector<CheckResult> more) {
    for (CheckResult& r : more) out_.push_back(std::move(r));
  }
  std::vector<CheckResult> Take() { return std::move(out_); }
};

// The server and role as the first query found them.
struct Server {
  pg::Connection& conn;
  const CheckConfig& c;
  const app::RelayConfig& r;
  int64_t version_num = 0;
  std::string database;
  std::string role;
  bool superuser = false;
  bool can_create_in_db = false;
  std::optional<SlotReport> slot;  // nullopt: it could not be read (reported)
};

// The outbox table as found.
struct TableFound {
  std::string oid;
  std::string owner;
  bool owns = false;  // the role is, or is a member of, its owner
  std::map<std::string, Column> columns;
};

void Step(pipeline::StepLine* steps, std::string step) {
  if (steps != nullptr) steps->Begin(std::move(step));
}

// Exactly-once: the transactional.id run uses ("" when it cannot be derived).
std::string TransactionalId(const app::RelayConfig& r) {
  if (!r.transactional_id.empty()) return r.transactional_id;
  auto repl = pg::Connection::Open(r.database_url, pg::Connection::Mode::kReplication,
                                   "outbox-relay-check");
  if (!repl) return "";
  auto identity = pg::IdentifySystem(*repl);
  if (!identity) return "";
  return pipeline::DefaultTransactionalId(identity->system_id, repl->database(), r.slot);
}

// Exactly-once keeps a marked row in its progress record until every
// standby has the mark (tracking::StandbyMarks): it must see where they are.
void CheckStandbys(const Server& s, Results& out) {
  auto read = pg::ReadStandbyPositions(s.conn);
  if (!read) {
    out.Warn("standby positions", read.error().message, "");
    return;
  }
  if (read->hidden > 0) {
    out.Warn("standby positions",
             fmt::format("{} physical walsenders' positions are hidden from role {}: exactly-once "
                         "lists every marked row in its progress record up to a bound, and past "
                         "it a promoted standby may publish rows whose marks it lacks again",
                         read->hidden, s.role),
             fmt::format("GRANT pg_read_all_stats TO {};", pg::QuoteIdent(s.role)));
  } else if (!read->lowest) {
    out.Ok("standby positions",
           "no physical standby or physical slot: nothing to wait for (a standby you may promote "
           "should stream through a physical slot, primary_slot_name, to be seen)");
  } else {
    out.Ok("standby positions",
           fmt::format(
               "the standbys have the WAL up to {} ({} bytes behind); marks stay in the "
               "progress record until they have them",
               *read->lowest,
               read->written > *read->lowest ? read->written.value() - read->lowest->value() : 0));
  }
}

void CheckVersion(const Server& s, std::string_view text, Results& out) {
  // The relay's CI runs 14 to 18 (scripts/postgres/versions); xid8 and
  // pg_visible_in_snapshot, which marking and backfill use, exist since 13.
  if (s.version_num >= 140000 && s.version_num < 190000) {
    out.Ok("server version", fmt::format("PostgreSQL {} (the relay is tested on 14 to 18)", text));
  } else if (s.version_num >= 190000) {
    out.Warn("server version",
             fmt::format("PostgreSQL {}: newer than the relay is tested on (14 to 18)", text),
             "run the relay's test suite against it (OUTBOX_PG_VERSION) before relying on it");
  } else {
    out.Failed("server version",
               fmt::format("PostgreSQL {}: not supported; the relay is tested on 14 to 18 (xid8 "
                           "and pg_visible_in_snapshot need 13)",
                           text),
               "upgrade to PostgreSQL 14 or newer");
  }
}

void CheckWalLevel(std::string_view level, Results& out) {
  if (level == "logical") {
    out.Ok("wal_level", "logical");
    return;
  }
  out.Failed(
      "wal_level",
      fmt::format("{}: logical decoding (and so the relay) needs wal_level = logical", level),
      "ALTER SYSTEM SET wal_level = logical; then restart PostgreSQL (a reload is not "
      "enough). Managed services: RDS/Aurora rds.logical_replication = 1, Cloud SQL "
      "cloudsql.logical_decoding = on, Azure azure.replication_support = logical");
}

void CheckCapacity(const char* name, int64_t max, int64_t used, bool ours_counted, const char* what,
                   const char* fix, Results& out) {
  if (max <= 0) {
    out.Failed(name, fmt::format("{} = 0: the relay needs one", name), fix);
  } else if (used >= max && !ours_counted) {
    out.Failed(name, fmt::format("{} = {}, all {} {}", name, max, used, what), fix);
  } else {
    out.Ok(name, fmt::format("{} = {}, {} {}{}", name, max, used, what,
                             ours_counted ? " (this relay's slot among them)" : ""));
  }
}

void CheckRole(const Server& s, bool replication, Results& out) {
  if (s.superuser) {
    out.Ok("role", fmt::format("{} is a superuser", s.role));
  } else if (replication) {
    out.Ok("role", fmt::format("{} has the REPLICATION attribute", s.role));
  } else {
    out.Failed("role",
               fmt::format("{} has neither REPLICATION nor superuser: it cannot open a replication "
                           "connection or create the slot",
                           s.role),
               fmt::format("as a superuser: ALTER ROLE {} REPLICATION; (RDS: GRANT rds_replication "
                           "TO {};)",
                           pg::QuoteIdent(s.role), pg::QuoteIdent(s.role)));
  }
}

// The table and its columns; nullopt (reported) when it cannot be read.
std::optional<TableFound> CheckTable(const Server& s, Results& out) {
  TableFound t;
  std::optional<std::string> params[] = {s.r.table_name.Quoted()};
  auto res = s.conn.ExecParams(
      "SELECT c.oid, c.relkind, pg_get_userbyid(c.relowner), "
      "pg_has_role(current_user, c.relowner, 'USAGE') "
      "FROM pg_class c WHERE c.oid = to_regclass($1)",
      params);
  if (!res) {
    out.Failed("outbox table", res.error().message, "");
    return std::nullopt;
  }
  if (pg::Rows(res->get()).size() == 0) {
    out.Failed("outbox table", fmt::format("{} does not exist", s.r.table_name.ToString()),
               "create it (sql/outbox.sql has the seed's DDL) or point --table (OUTBOX_TABLE) at "
               "the right one");
    return std::nullopt;
  }
  pg::Rows table(res->get());
  auto table_oid = table.Text(0, 0);
  auto kind = table.Text(0, 1);
  auto owner = table.Text(0, 2);
  auto owns = table.Bool(0, 3);
  if (const Error* e = pg::FirstError(table_oid, kind, owner, owns)) {
    out.Failed("outbox table", e->message, "");
    return std::nullopt;
  }
  t.oid = std::string(*table_oid);
  t.owner = std::string(*owner);
  t.owns = *owns;
  if (*kind == "p") {
    out.Ok("outbox table",
           fmt::format("{} exists, partitioned (owner {})", s.r.table_name.ToString(), t.owner));
  } else if (*kind != "r") {
    out.Failed("outbox table",
               fmt::format("{} exists but is not a table (relkind {}): run refuses it",
                           s.r.table_name.ToString(), *kind),
               "logical replication publishes plain and partitioned tables only: point --table "
               "(OUTBOX_TABLE) at one");
  } else {
    out.Ok("outbox table", fmt::format("{} exists (owner {})", s.r.table_name.ToString(), t.owner));
  }
  std::optional<std::string> oid[] = {t.oid};
  auto cols = s.conn.ExecParams(
      "SELECT a.attname, a.attnum, format_type(a.atttypid, a.atttypmod), t.typname, "
      "t.typcategory, a.attnotnull FROM pg_attribute a JOIN pg_type t ON t.oid = a.atttypid "
      "WHERE a.attrelid = $1::oid AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum",
      oid);
  if (!cols) {
    out.Failed("outbox columns", cols.error().message, "");
    return std::nullopt;
  }
  pg::Rows rows(cols->get());
  for (int i = 0; i < rows.size(); ++i) {
    auto name = rows.Text(i, 0);
    auto attnum = rows.Int(i, 1);
    auto type = rows.Text(i, 2);
    auto typname = rows.Text(i, 3);
    auto category = rows.Text(i, 4);
    auto not_null = rows.Bool(i, 5);
    if (const Error* e = pg::FirstError(name, attnum, type, typname, category, not_null)) {
      out.Failed("outbox columns", e->message, "");
      return std::nullopt;
    }
    Column col;
    col.attnum = static_cast<int>(*attnum);
    col.type = std::string(*type);
    col.typname = std::string(*typname);
    col.category = category->empty() ? 'X' : category->front();
    col.not_null = *not_null;
    t.columns.emplace(std::string(*name), col);
  }
  return t;
}

std::string ColumnList(const TableFound& t) {
  std::string out;
  for (const auto& [name, col] : t.columns) {
    if (!out.empty()) out += ", ";
    out += name;
  }
  return out;
}

// Returns the column when it exists; otherwise a FAIL line naming the flag.
const Column* RequireColumn(const Server& s, const TableFound& t, const std::string& name,
                            const char* flag, const char* env, const char* role, bool* ok,
                            Results& out) {
  auto it = t.columns.find(name);
  if (it != t.columns.end()) return &it->second;
  out.Failed(fmt::format("column {}", name),
             fmt::format("{} has no column '{}' ({}); its columns: {}", s.r.table_name.ToString(),
                         name, role, ColumnList(t)),
             fmt::format("set {} ({}) to the column's name", flag, env));
  *ok = false;
  return nullptr;
}

void IntegerColumn(const Server& s, const std::string& name, const Column& col, const char* role,
                   bool* ok, Results& out) {
  std::string what = fmt::format("column {}", name);
  if (col.typname == "int8") {
    out.Ok(what, fmt::format("{} ({})", col.type, role));
  } else if (col.typname == "int4" || col.typname == "int2") {
    out.Warn(what,
             fmt::format("{} ({}): works, but a BIGSERIAL offset outgrows it", col.type, role),
             fmt::format("ALTER TABLE {} ALTER COLUMN {} TYPE bigint;", s.r.table_name.Quoted(),
                         pg::QuoteIdent(name)));
  } else {
    out.Failed(what, fmt::format("{} ({}): must be an integer (bigint)", col.type, role),
               "use the seed's schema (sql/outbox.sql) or point the column flag elsewhere");
    *ok = false;
  }
}

// Whether every column the relay needs is there and of a type it reads.
bool CheckColumns(const Server& s, const TableFound& t, Results& out) {
  bool ok = true;
  const auto& n = s.r.columns;
  if (const Column* col =
          RequireColumn(s, t, n.uuid, "--column-uuid", "OUTBOX_COLUMN_UUID", "uuid", &ok, out)) {
    if (col->category == 'S' || col->typname == "uuid") {
      out.Ok("column " + n.uuid, col->type + " (message UUID)");
    } else {
      out.Failed("column " + n.uuid, col->type + " (message UUID): must be text-like or uuid",
                 "use varchar(36)/text as in the seed's schema");
      ok = false;
    }
  }
  if (const Column* col = RequireColumn(s, t, n.payload, "--column-payload",
                                        "OUTBOX_COLUMN_PAYLOAD", "payload", &ok, out)) {
    if (col->typname == "json" || col->typname == "jsonb" || col->category == 'S') {
      out.Ok("column " + n.payload,
             col->type + (col->typname == "jsonb"
                              ? " (Kafka value: jsonb's normalized text, not the bytes written)"
                              : " (Kafka value, verbatim)"));
    } else if (col->typname == "bytea") {
      out.Failed("column " + n.payload,
                 "bytea: pgoutput sends columns in text form, so Kafka would get the hex escape "
                 "'\\x7b22…', not the payload bytes",
                 "store the payload as json (the seed's schema), jsonb or text");
      ok = false;
    } else {
      out.Warn("column " + n.payload,
               fmt::format("{}: published as the type's text form", col->type),
               "store the payload as json (the seed's schema), jsonb or text");
    }
  }
  if (const Column* col = RequireColumn(s, t, n.metadata, "--column-metadata",
                                        "OUTBOX_COLUMN_METADATA", "metadata", &ok, out)) {
    if (col->typname == "json" || col->typname == "jsonb" || col->category == 'S') {
      out.Ok("column " + n.metadata, col->type + " (metadata: a JSON object of strings)");
    } else {
      out.Failed("column " + n.metadata,
                 col->type + " (metadata): must hold a JSON object (json, jsonb or text)",
                 "use json as in the seed's schema");
      ok = false;
    }
  }
  if (const Column* col =
          RequireColumn(s, t, n.transaction_id, "--column-transaction-id",
                        "OUTBOX_COLUMN_TRANSACTION_ID", "transaction id", &ok, out)) {
    if (col->typname == "xid8") {
      out.Ok("column " + n.transaction_id, "xid8 (writing transaction; marking and backfill)");
    } else {
      out.Failed("column " + n.transaction_id,
                 col->type +
                     ": must be xid8 (marking by transaction and the snapshot backfill "
                     "compare it with pg_current_xact_id() and pg_snapshot)",
                 fmt::format("{} xid8 NOT NULL DEFAULT pg_current_xact_id(), as in the seed's "
                             "schema",
                             pg::QuoteIdent(n.transaction_id)));
      ok = false;
    }
  }
  if (const Column* col = RequireColumn(s, t, n.offset, "--column-offset", "OUTBOX_COLUMN_OFFSET",
                                        "offset", &ok, out)) {
    IntegerColumn(s, n.offset, *col, "row sequence", &ok, out);
  }
  if (s.r.mark) {
    if (const Column* col = RequireColumn(s, t, s.r.acked_column, "--column-acked",
                                          "OUTBOX_COLUMN_ACKED", "acked", &ok, out)) {
      if (col->not_null) {
        out.Failed("column " + s.r.acked_column,
                   "NOT NULL: it must be NULL until the row is published",
                   fmt::format("ALTER TABLE {} ALTER COLUMN {} DROP NOT NULL;",
                               s.r.table_name.Quoted(), pg::QuoteIdent(s.r.acked_column)));
      } else {
        IntegerColumn(s, s.r.acked_column, *col, "NULL until published", &ok, out);
      }
    }
  }
  if (!t.columns.contains("created_at")) {
    out.Warn("column created_at", "missing: cleanup deletes acked rows by their creation time",
             "add created_at timestamptz NOT NULL DEFAULT NOW() (the seed's schema), or pass "
             "--column-created-at to cleanup");
  }
  return ok;
}

void CheckIndexes(const Server& s, const TableFound& t, Results& out) {
  auto xid = t.columns.find(s.r.columns.transaction_id);
  std::optional<std::string> params[] = {t.oid};
  auto res = s.conn.ExecParams(
      "SELECT i.indexrelid::regclass::text, i.indkey[0], i.indisvalid, "
      "pg_get_expr(i.indpred, i.indrelid), pg_get_indexdef(i.indexrelid) "
      "FROM pg_index i WHERE i.indrelid = $1::oid",
      params);
  if (!res) {
    out.Failed("indexes", res.error().message, "");
    return;
  }
  std::string marking_index;
  std::string acked_index;
  std::string acked_norm = "(" + s.r.acked_column + " is null)";
  pg::Rows rows(res->get());
  for (int i = 0; i < rows.size(); ++i) {
    auto index = rows.Text(i, 0);
    auto first_key = rows.Int(i, 1);
    auto valid = rows.Bool(i, 2);
    if (const Error* e = pg::FirstError(index, first_key, valid)) {
      out.Failed("indexes", e->message, "");
      return;
    }
    if (!*valid) continue;
    if (xid != t.columns.end() && *first_key == xid->second.attnum && marking_index.empty()) {
      marking_index = std::string(*index);
    }
    // pg_get_expr of indpred: NULL for an index that is not partial.
    std::string pred;
    for (char ch : rows.Value(i, 3).value_or("")) {
      if (ch != '"') pred += static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
    }
    if (pred == acked_norm || pred == "(" + acked_norm + ")") acked_index = std::string(*index);
  }
  if (xid != t.columns.end()) {
    if (!marking_index.empty()) {
      out.Ok("marking index",
             fmt::format("{} leads with {}: UPDATE … WHERE {} = ANY($1) is an "
                         "index scan",
                         marking_index, s.r.columns.transaction_id, s.r.columns.transaction_id));
    } else {
      out.Warn("marking index",
               fmt::format("no index leads with {}: every marking UPDATE scans the table",
                           s.r.columns.transaction_id),
               fmt::format("the seed's PRIMARY KEY ({}, {}), or CREATE INDEX CONCURRENTLY ON {} "
                           "({});",
                           pg::QuoteIdent(s.r.columns.transaction_id),
                           pg::QuoteIdent(s.r.columns.offset), s.r.table_name.Quoted(),
                           pg::QuoteIdent(s.r.columns.transaction_id)));
    }
  }
  if (s.r.mark && t.columns.contains(s.r.acked_column)) {
    if (!acked_index.empty()) {
      out.Ok("unacked index",
             fmt::format("{} (partial, {} IS NULL)", acked_index, s.r.acked_column));
    } else {
      out.Warn(
          "unacked index",
          fmt::format("no partial index on {} IS NULL: the backfill, the unacked-rows "
                      "metric and the seed's runbook queries scan the whole table",
                      s.r.acked_column),
          fmt::format("CREATE INDEX CONCURRENTLY idx_outbox_acked ON {} ({}) WHERE {} IS NULL;",
                      s.r.table_name.Quoted(), pg::QuoteIdent(s.r.acked_column),
                      pg::QuoteIdent(s.r.acked_column)));
    }
  }
}

void CheckPrivileges(const Server& s, const TableFound& t, Results& out) {
  std::optional<std::string> params[] = {t.oid};
  auto res = s.conn.ExecParams(
      "SELECT has_table_privilege($1::oid, 'SELECT'), has_table_privilege($1::oid, 'UPDATE')",
      params);
  if (!res) {
    out.Failed("table privileges", res.error().message, "");
    return;
  }
  pg::Rows rows(res->get());
  auto may_select = rows.Bool(0, 0);
  auto may_update = rows.Bool(0, 1);
  if (const Error* e = pg::FirstError(may_select, may_update)) {
    out.Failed("table privileges", e->message, "");
    return;
  }
  std::vector<std::string> missing;
  if (!*may_select) missing.push_back("SELECT");
  if (s.r.mark && !*may_update) missing.push_back("UPDATE");
  if (missing.empty()) {
    out.Ok("table privileges", s.r.mark ? "SELECT (backfill, replay) and UPDATE (marking)"
                                        : "SELECT (backfill, replay)");
  } else {
    std::string list = fmt::format("{}", fmt::join(missing, ", "));
    out.Failed("table privileges",
               fmt::format("{} lacks {} on {}", s.role, list, s.r.table_name.ToString()),
               fmt::format("GRANT {} ON {} TO {};", list, s.r.table_name.Quoted(),
                           pg::QuoteIdent(s.role)));
  }
}

void CheckPublication(const Server& s, const TableFound& t, Results& out) {
  const std::string name = "publication " + s.r.publication;
  const std::string create_sql = pg::CreatePublicationSql(s.r.publication, s.r.table_name) + ";";
  auto pub = pg::QueryPublication(s.conn, s.r.publication, s.r.table_name);
  if (!pub) {
    out.Failed(name, pub.error().message, "");
    return;
  }
  if (!pub->exists) {
    if (s.superuser || (t.owns && s.can_create_in_db)) {
      out.Ok(name, fmt::format("does not exist; run creates it: {}", create_sql));
    } else {
      out.Failed(name,
                 fmt::format("does not exist, and {} cannot create it (it needs CREATE on the "
                             "database and to own {})",
                             s.role, s.r.table_name.ToString()),
                 fmt::format("as the table owner ({}) or a superuser: {}", t.owner, create_sql));
    }
    return;
  }
  auto table = pg::QueryTable(s.conn, s.r.table_name);
  if (!table) {
    out.Failed(name, table.error().message, "");
    return;
  }
  // The same judgement `run` makes at start: what it refuses fails here.
  auto problems = pg::Problems(*pub, *table, s.r.publication, s.r.table_name,
                               {s.r.columns.uuid, s.r.columns.payload, s.r.columns.metadata,
                                s.r.columns.transaction_id, s.r.columns.offset});
  for (const pg::PublicationProblem& problem : problems) {
    if (problem.refuse) {
      out.Failed(name, problem.what + " (run refuses it)", problem.fix);
    } else {
      out.Warn(name, problem.what, problem.fix);
    }
  }
  if (problems.empty()) {
    out.Ok(name, fmt::format("FOR TABLE {}, publish = insert{}", s.r.table_name.ToString(),
                             table->partitioned() ? ", publish_via_partition_root" : ""));
  }
}

void CheckSlot(const Server& s, Results& out) {
  if (!s.slot) return;  // reported already
  const SlotReport& slot = *s.slot;
  const std::string name = "slot " + s.r.slot;
  const bool reconcile = s.r.on_slot_lost == pipeline::OnSlotLost::kReconcile;
  const std::string recovery =
      reconcile ? "run (--on-slot-lost=reconcile) drops/recreates the slot and backfills every "
                  "unacked row from the table (rows published but not yet marked are sent "
                  "again: at least once)"
                : "run (--on-slot-lost=fail) exits with an error until the slot is recreated";
  if (!slot.exists) {
    if (const SlotStateRow* created = slot.FindState(kSlotCreatedStateKey)) {
      out.Warn(name,
               fmt::format("missing, but the relay created it at {} (outbox_relay.state): {}",
                           created->value, recovery),
               reconcile ? "nothing to do: run recovers; find out who dropped it"
                         : "run once with --on-slot-lost=reconcile");
    } else {
      out.Ok(name, fmt::format("does not exist; run creates it{}",
                               s.r.backfill && s.r.mark
                                   ? " and first publishes the unacked rows committed before it"
                                   : ""));
    }
    return;
  }
  if (slot.plugin != "pgoutput") {
    out.Failed(name, fmt::format("uses plugin {}, not pgoutput", slot.plugin),
               "choose another --slot (OUTBOX_SLOT), or drop this one if nothing else uses it");
    return;
  }
  if (slot.database != s.database) {
    out.Failed(name, fmt::format("belongs to database {}, not {}", slot.database, s.database),
               "choose another --slot (OUTBOX_SLOT): logical slots are per database");
    return;
  }
  std::string retained =
      slot.retained_bytes ? PrettyBytes(*slot.retained_bytes) : std::string("unknown");
  if (slot.wal_status == "lost") {
    std::string why = slot.invalidation_reason.value_or("").empty()
                          ? "the WAL it needed is gone (max_slot_wal_keep_size)"
                          : "invalidation_reason = " + *slot.invalidation_reason;
    out.Failed(name, fmt::format("invalidated (wal_status = lost): {}; {}", why, recovery),
               reconcile ? "nothing is lost: start run and it recovers; raise "
                           "max_slot_wal_keep_size to make this rarer"
                         : "run once with --on-slot-lost=reconcile, or `outbox-relay slot drop "
                           "--confirm` and start run");
    return;
  }
  if (slot.wal_status == "unreserved") {
    out.Warn(
        name,
        fmt::format("wal_status = unreserved: it retains {} of WAL, more than max_wal_size; it "
                    "is invalidated at the next checkpoint beyond max_slot_wal_keep_size",
                    retained),
        "start the relay so it catches up, or raise max_slot_wal_keep_size");
    return;
  }
  std::string detail = fmt::format(
      "pgoutput, confirmed_flush_lsn {}, retains {} of WAL "
      "(wal_status {})",
      slot.confirmed_flush_lsn.value_or("-"), retained, slot.wal_status);
  if (slot.active) {
    detail += fmt::format(
        "; active, held by pid {}{}: another instance streams, this one "
        "would wait as its hot standby",
        slot.active_pid.value_or(0), slot.holder.empty() ? "" : " (" + slot.holder + ")");
  } else {
    detail += "; inactive";
  }
  out.Ok(name, detail);
}

// What run does with the schema version it finds (pg::EnsureRelaySchema).
std::string VersionNote(const pg::RelaySchemaFound& found) {
  if (!found.recorded) {
    return fmt::format("version {}, not recorded yet (run records it)", found.version);
  }
  if (found.version > pg::kRelaySchemaVersion) {
    return fmt::format("version {}, newer than this relay's {} and readable by it", found.version,
                       pg::kRelaySchemaVersion);
  }
  if (found.version < pg::kRelaySchemaVersion) {
    return fmt::format("version {} (run migrates it to {})", found.version,
                       pg::kRelaySchemaVersion);
  }
  return fmt::format("version {}", found.version);
}

void CheckRelaySchema(const Server& s, Results& out) {
  auto found_tables = pg::ReadRelayTables(s.conn);
  if (!found_tables) {
    out.Failed("schema outbox_relay", found_tables.error().message, "");
    return;
  }
  const pg::RelayTables& t = *found_tables;
  if (!t.usage) {
    out.Failed("schema outbox_relay",
               fmt::format("exists, but {} has no USAGE on it: the relay cannot record its state "
                           "or the commit index",
                           s.role),
               fmt::format("GRANT USAGE, CREATE ON SCHEMA outbox_relay TO {0}; GRANT SELECT, "
                           "INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA outbox_relay TO {0};",
                           pg::QuoteIdent(s.role)));
    return;
  }
  if (t.tables) {
    if (t.writable) {
      // The relay refuses a newer schema that does not declare itself
      // readable by this release (pg/relay_schema.h): so does check.
      auto found = pg::ReadRelaySchema(s.conn);
      if (!found) {
        out.Failed("schema outbox_relay", found.error().message, "");
      } else if (auto st = pg::CheckRelaySchema(*found); !st) {
        out.Failed("schema outbox_relay", st.error().message,
                   fmt::format("a release of relay schema version {} or newer (docs/upgrading.md)",
                               found->readable_by));
      } else {
        out.Ok("schema outbox_relay",
               fmt::format("commits (the replay index) and state exist and are writable; {}",
                           VersionNote(*found)));
      }
    } else {
      out.Failed("schema outbox_relay",
                 fmt::format("{} cannot write outbox_relay.commits / outbox_relay.state", s.role),
                 fmt::format("GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA "
                             "outbox_relay TO {};",
                             pg::QuoteIdent(s.role)));
    }
    return;
  }
  bool creatable = s.superuser;
  if (!creatable && t.schema) {
    auto priv = s.conn.Exec("SELECT has_schema_privilege('outbox_relay', 'CREATE')");
    if (priv) {  // a failed query leaves it not creatable, reported below
      auto may_create = pg::Rows(priv->get()).Bool(0, 0);
      if (!may_create) {
        out.Failed("schema outbox_relay", may_create.error().message, "");
        return;
      }
      creatable = *may_create;
    }
  } else if (!creatable) {
    creatable = s.can_create_in_db;
  }
  if (creatable) {
    out.Ok("schema outbox_relay", t.schema ? "exists; run creates its tables"
                                           : "does not exist; run creates it and its tables");
  } else {
    out.Failed("schema outbox_relay",
               fmt::format("{} the relay's tables, and {} may not create them",
                           t.schema ? "exists without" : "missing, with", s.role),
               fmt::format("as a superuser: CREATE SCHEMA IF NOT EXISTS outbox_relay AUTHORIZATION "
                           "{};",
                           pg::QuoteIdent(s.role)));
  }
}

// Topics of the event types in the newest rows (by the primary key), for
// the Kafka checks.
TopicSample SampleTopics(const Server& s, Results& out) {
  TopicSample sample;
  if (s.c.sample_rows <= 0) return sample;
  auto tmpl = outbox::TopicTemplate::Compile(s.r.mapper.topic_template);
  if (!tmpl) return sample;  // Validate reported it
  std::string sql = fmt::format(
      "SELECT {meta} FROM {table} ORDER BY {xid} DESC, {off} DESC LIMIT {n}",
      fmt::arg("meta", pg::QuoteIdent(s.r.columns.metadata)),
      fmt::arg("table", s.r.table_name.Quoted()),
      fmt::arg("xid", pg::QuoteIdent(s.r.columns.transaction_id)),
      fmt::arg("off", pg::QuoteIdent(s.r.columns.offset)), fmt::arg("n", s.c.sample_rows));
  auto res = s.conn.Exec(sql);
  if (!res) {
    out.Warn("recent rows", res.error().message, "");
    return sample;
  }
  outbox::Metadata metadata;
  std::string topic;
  pg::Rows rows(res->get());
  sample.rows = rows.size();
  for (int i = 0; i < sample.rows; ++i) {
    // A NULL metadata is no metadata, as in a streamed row (the template judges it).
    Status st = metadata.Parse(rows.Value(i, 0));
    if (st) st = tmpl->Render(metadata, &topic);
    if (!st) {
      if (sample.poison == 0) sample.first_poison = st.error().message;
      ++sample.poison;
      continue;
    }
    auto& entry = sample.topics[topic];
    ++entry.first;
    entry.second.insert(std::string(metadata.Get("Event-Type").value_or("")));
  }
  return sample;
}

// The PostgreSQL checks, in order, and the topics of the newest rows for the
// Kafka checks (sample.known: the table was read with every column).
TopicSample CheckPostgres(const CheckConfig& c, pipeline::StepLine* steps, Results& out) {
  const app::RelayConfig& r = c.relay;
  auto conn =
      pg::Connection::Open(r.database_url, pg::Connection::Mode::kNormal, "outbox-relay-check");
  if (!conn) {
    out.Failed("postgres connection", conn.error().message,
               "check --database-url (DATABASE_URL), that the server runs and that pg_hba.conf "
               "admits this host and role");
    return {};
  }
  auto res = conn->Exec(
      "SELECT current_setting('server_version_num')::int, current_setting('server_version'), "
      "current_setting('wal_level'), current_setting('max_replication_slots')::int, "
      "(SELECT count(*) FROM pg_replication_slots), current_setting('max_wal_senders')::int, "
      "(SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'walsender'), "
      "current_setting('max_slot_wal_keep_size'), current_database(), current_user, "
      "r.rolsuper, r.rolreplication, has_database_privilege(current_database(), 'CREATE') "
      "FROM pg_roles r WHERE r.rolname = current_user");
  if (!res) {
    out.Failed("postgres settings", res.error().message, "");
    return {};
  }
  // One row of settings and attributes, none of them NULL.
  pg::Rows row(res->get());
  auto version_num = row.Int(0, 0);
  auto version = row.Text(0, 1);
  auto wal_level = row.Text(0, 2);
  auto max_slots = row.Int(0, 3);
  auto slots = row.Int(0, 4);
  auto max_senders = row.Int(0, 5);
  auto senders = row.Int(0, 6);
  auto keep_size = row.Text(0, 7);
  auto database = row.Text(0, 8);
  auto role = row.Text(0, 9);
  auto superuser = row.Bool(0, 10);
  auto replication = row.Bool(0, 11);
  auto can_create = row.Bool(0, 12);
  if (const Error* e =
          pg::FirstError(version_num, version, wal_level, max_slots, slots, max_senders, senders,
                         keep_size, database, role, superuser, replication, can_create)) {
    out.Failed("postgres settings", e->message, "");
    return {};
  }
  Server s{*conn, c, r};
  s.version_num = *version_num;
  s.database = std::string(*database);
  s.role = std::string(*role);
  s.superuser = *superuser;
  s.can_create_in_db = *can_create;
  out.Ok("postgres connection", fmt::format("database {} as role {}", s.database, s.role));

  if (auto slot = QuerySlotReport(s.conn, r.slot); slot) {
    s.slot = std::move(*slot);
  } else {
    out.Failed("slot " + r.slot, slot.error().message, "");
  }
  const bool slot_exists = s.slot && s.slot->exists;

  CheckVersion(s, *version, out);
  CheckWalLevel(*wal_level, out);
  CheckCapacity("max_replication_slots", *max_slots, *slots, slot_exists,
                "replication slots in use",
                "drop an unused slot (SELECT slot_name, active FROM pg_replication_slots;) or "
                "raise it: ALTER SYSTEM SET max_replication_slots = 10; and restart PostgreSQL",
                out);
  CheckCapacity("max_wal_senders", *max_senders, *senders, false, "WAL senders running",
                "raise it: ALTER SYSTEM SET max_wal_senders = 10; and restart PostgreSQL", out);
  std::string keep(*keep_size);
  out.Ok("max_slot_wal_keep_size",
         keep == "-1" ? "-1 (unlimited): a stopped relay's slot retains WAL until the disk fills; "
                        "a limit makes PostgreSQL invalidate the slot instead, which run recovers "
                        "from by backfill (--on-slot-lost=reconcile)"
                      : keep +
                            ": a slot retaining more is invalidated; run recovers by backfill "
                            "(--on-slot-lost=reconcile)");
  CheckRole(s, *replication, out);
  std::optional<TableFound> table;
  bool columns_ok = false;
  if (r.watermill) {
    out.Append(CheckWatermillTables(s.conn, r));
  } else if ((table = CheckTable(s, out))) {
    columns_ok = CheckColumns(s, *table, out);
    CheckIndexes(s, *table, out);
    CheckPrivileges(s, *table, out);
    CheckPublication(s, *table, out);
  }
  CheckSlot(s, out);
  if (r.failover_slot || !c.standby_url.empty() || (s.slot && s.slot->failover.value_or(false))) {
    if (!c.standby_url.empty()) Step(steps, "the standby (--standby-url)");
    out.Append(CheckFailover(s.conn, c));
  }
  if (r.delivery == app::DeliveryMode::kExactlyOnce) CheckStandbys(s, out);
  CheckRelaySchema(s, out);
  if (!table || !columns_ok) return {};
  TopicSample sample = SampleTopics(s, out);
  sample.known = true;
  return sample;
}

}  // namespace

void AddCheckFlags(CLI::App& app, CheckConfig& c) {
  app::AddRunFlags(app, c.relay);
  app::AddLogFlags(app, c.relay.log);
  AddOutputOption(app, &c.output);
  app::AddIntOption(app, "--kafka-timeout-ms", "OUTBOX_CHECK_KAFKA_TIMEOUT_MS", &c.kafka_timeout_ms,
                    100, 600'000, "How long to wait for a broker to answer the metadata request");
  app.add_option("--standby-url", c.standby_url,
                 "A physical standby of DATABASE_URL's server (connection string or URI): "
                 "check that it keeps a synced copy of the failover slot (PostgreSQL 17+, "
                 "--failover-slot)")
      ->envname("OUTBOX_STANDBY_URL");
  app::AddIntOption(app, "--sample-rows", "OUTBOX_CHECK_SAMPLE_ROWS", &c.sample_rows, 0, 1'000'000,
                    "Newest rows whose event types' topics are checked (0: none)");
}

std::vector<CheckResult> RunChecks(const CheckConfig& config, pipeline::StepLine* steps) {
  const app::RelayConfig& r = config.relay;
  Results out;
  Step(steps, "PostgreSQL");
  TopicSample sample = CheckPostgres(config, steps, out);
  if (r.delivery == app::DeliveryMode::kExactlyOnce) {
    Step(steps, "PostgreSQL, a replication connection (the transactional.id)");
    sample.transactional_id = TransactionalId(r);
  }
  Step(steps, fmt::format("Kafka at {} (up to {:.1f} s a request)", r.kafka_brokers,
                          static_cast<double>(config.kafka_timeout_ms) / 1000));
  out.Append(CheckKafka(config, sample));
  return out.Take();
}

std::string FormatChecksText(const std::vector<CheckResult>& results) {
  std::string out;
  int counts[3] = {0, 0, 0};
  for (const CheckResult& r : results) {
    ++counts[static_cast<int>(r.status)];
    fmt::format_to(std::back_inserter(out), "{:<5} {}: {}\n", CheckStatusName(r.status), r.name,
                   r.detail);
    if (r.status != CheckStatus::kOk && !r.fix.empty()) {
      fmt::format_to(std::back_inserter(out), "      fix: {}\n", r.fix);
    }
  }
  fmt::format_to(std::back_inserter(out), "check: {} FAIL, {} WARN, {} OK\n", counts[2], counts[1],
                 counts[0]);
  return out;
}

std::string FormatChecksJson(const std::vector<CheckResult>& results) {
  int counts[3] = {0, 0, 0};
  std::string checks;
  for (const CheckResult& r : results) {
    ++counts[static_cast<int>(r.status)];
    if (!checks.empty()) checks += ",";
    fmt::format_to(std::back_inserter(checks), "{{\"status\":{},\"check\":{},\"detail\":{}",
                   JsonQuote(CheckStatusName(r.status)), JsonQuote(r.name), JsonQuote(r.detail));
    if (!r.fix.empty()) fmt::format_to(std::back_inserter(checks), ",\"fix\":{}", JsonQuote(r.fix));
    checks += "}";
  }
  return fmt::format("{{\"ok\":{},\"fail\":{},\"warn\":{},\"checks\":[{}]}}\n",
                     counts[2] == 0 ? "true" : "false", counts[2], counts[1], checks);
}

int CheckCommand(CheckConfig& c) {
  app::SetupLogging(c.relay.log);
  if (auto st = Validate(c.relay); !st) {
    spdlog::error("{}", st.error().message);
    return app::kExitConfig;
  }
  std::vector<CheckResult> results;
  {
    // On a terminal, what it waits for while it waits (a server that does
    // not answer holds a step up to its timeout); erased before the results.
    pipeline::StepLine steps("check");
    results = RunChecks(c, c.output == OutputFormat::kText ? &steps : nullptr);
  }
  std::string text =
      c.output == OutputFormat::kJson ? FormatChecksJson(results) : FormatChecksText(results);
  std::fwrite(text.data(), 1, text.size(), stdout);
  std::fflush(stdout);
  bool failed = std::any_of(results.begin(), results.end(),
                            [](const CheckResult& r) { return r.status == CheckStatus::kFail; });
  return failed ? app::kExitFailure : app::kExitOk;
}

}  // namespace outbox_relay::ops
