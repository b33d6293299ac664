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

class Checker : CheckList {
 public:
  Checker(const CheckConfig& config, pipeline::StepLine* steps)
      : c_(config), r_(config.relay), steps_(steps) {}

  std::vector<CheckResult> Run() {
    Step("PostgreSQL");
    Database();
    sample_.known = conn_ != nullptr && !table_oid_.empty() && all_columns_ok_;
    if (r_.delivery == app::DeliveryMode::kExactlyOnce) {
      Step("PostgreSQL, a replication connection (the transactional.id)");
      sample_.transactional_id = TransactionalId();
    }
    Step(fmt::format("Kafka at {} (up to {:.1f} s a request)", r_.kafka_brokers,
                     static_cast<double>(c_.kafka_timeout_ms) / 1000));
    for (CheckResult& r : CheckKafka(c_, sample_)) out_.push_back(std::move(r));
    return std::move(out_);
  }

 private:
  void Step(std::string step) {
    if (steps_ != nullptr) steps_->Begin(std::move(step));
  }

  // Exactly-once: the transactional.id run uses ("" when it cannot be derived).
  std::string TransactionalId() {
    if (!r_.transactional_id.empty()) return r_.transactional_id;
    auto repl = pg::Connection::Open(r_.database_url, pg::Connection::Mode::kReplication,
                                     "outbox-relay-check");
    if (!repl) return "";
    auto identity = pg::IdentifySystem(*repl);
    if (!identity) return "";
    return pipeline::DefaultTransactionalId(identity->system_id, repl->database(), r_.slot);
  }

  // --- PostgreSQL -------------------------------------------------------------

  void Database() {
    auto conn =
        pg::Connection::Open(r_.database_url, pg::Connection::Mode::kNormal, "outbox-relay-check");
    if (!conn) {
      Failed("postgres connection", conn.error().message,
             "check --database-url (DATABASE_URL), that the server runs and that pg_hba.conf "
             "admits this host and role");
      return;
    }
    conn_ = &*conn;
    auto res = conn_->Exec(
        "SELECT current_setting('server_version_num')::int, current_setting('server_version'), "
        "current_setting('wal_level'), current_setting('max_replication_slots')::int, "
        "(SELECT count(*) FROM pg_replication_slots), current_setting('max_wal_senders')::int, "
        "(SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'walsender'), "
        "current_setting('max_slot_wal_keep_size'), current_database(), current_user, "
        "r.rolsuper, r.rolreplication, has_database_privilege(current_database(), 'CREATE') "
        "FROM pg_roles r WHERE r.rolname = current_user");
    if (!res) {
      Failed("postgres settings", res.error().message, "");
      return;
    }
    // One row of settings and attributes, none of them NULL.
    pg::Rows s(res->get());
    auto version_num = s.Int(0, 0);
    auto version = s.Text(0, 1);
    auto wal_level = s.Text(0, 2);
    auto max_slots = s.Int(0, 3);
    auto slots = s.Int(0, 4);
    auto max_senders = s.Int(0, 5);
    auto senders = s.Int(0, 6);
    auto keep_size = s.Text(0, 7);
    auto database = s.Text(0, 8);
    auto role = s.Text(0, 9);
    auto superuser = s.Bool(0, 10);
    auto replication = s.Bool(0, 11);
    auto can_create = s.Bool(0, 12);
    if (const Error* e =
            pg::FirstError(version_num, version, wal_level, max_slots, slots, max_senders, senders,
                           keep_size, database, role, superuser, replication, can_create)) {
      Failed("postgres settings", e->message, "");
      return;
    }
    version_num_ = *version_num;
    database_ = std::string(*database);
    role_ = std::string(*role);
    superuser_ = *superuser;
    can_create_in_db_ = *can_create;
    Ok("postgres connection", fmt::format("database {} as role {}", database_, role_));

    if (auto slot = QuerySlotReport(*conn_, r_.slot); slot) {
      slot_ = std::move(*slot);
      slot_known_ = true;
    } else {
      Failed("slot " + r_.slot, slot.error().message, "");
    }

    Version(*version);
    WalLevel(*wal_level);
    Capacity("max_replication_slots", *max_slots, *slots, slot_.exists, "replication slots in use",
             "drop an unused slot (SELECT slot_name, active FROM pg_replication_slots;) or "
             "raise it: ALTER SYSTEM SET max_replication_slots = 10; and restart PostgreSQL");
    Capacity("max_wal_senders", *max_senders, *senders, false, "WAL senders running",
             "raise it: ALTER SYSTEM SET max_wal_senders = 10; and restart PostgreSQL");
    std::string keep(*keep_size);
    Ok("max_slot_wal_keep_size",
       keep == "-1" ? "-1 (unlimited): a stopped relay's slot retains WAL until the disk fills; "
                      "a limit makes PostgreSQL invalidate the slot instead, which run recovers "
                      "from by backfill (--on-slot-lost=reconcile)"
                    : keep +
                          ": a slot retaining more is invalidated; run recovers by backfill "
                          "(--on-slot-lost=reconcile)");
    Role(*replication);
    if (r_.watermill) {
      for (CheckResult& r : CheckWatermillTables(*conn_, r_)) out_.push_back(std::move(r));
    } else if (Table()) {
      Columns();
      Indexes();
      Privileges();
      Publication();
    }
    Slot();
    if (r_.failover_slot || !c_.standby_url.empty() || slot_.failover.value_or(false)) {
      if (!c_.standby_url.empty()) Step("the standby (--standby-url)");
      for (CheckResult& r : CheckFailover(*conn_, c_)) out_.push_back(std::move(r));
    }
    if (r_.delivery == app::DeliveryMode::kExactlyOnce) Standbys();
    RelaySchema();
    SampleTopics();
  }

  // Exactly-once keeps a marked row in its progress record until every
  // standby has the mark (tracking::StandbyMarks): it must see where they are.
  void Standbys() {
    auto read = pg::ReadStandbyPositions(*conn_);
    if (!read) {
      Warn("standby positions", read.error().message, "");
      return;
    }
    if (read->hidden > 0) {
      Warn("standby positions",
           fmt::format("{} physical walsenders' positions are hidden from role {}: exactly-once "
                       "lists every marked row in its progress record up to a bound, and past "
                       "it a promoted standby may publish rows whose marks it lacks again",
                       read->hidden, role_),
           fmt::format("GRANT pg_read_all_stats TO {};", pg::QuoteIdent(role_)));
    } else if (!read->lowest) {
      Ok("standby positions",
         "no physical standby or physical slot: nothing to wait for (a standby you may promote "
         "should stream through a physical slot, primary_slot_name, to be seen)");
    } else {
      Ok("standby positions",
         fmt::format(
             "the standbys have the WAL up to {} ({} bytes behind); marks stay in the "
             "progress record until they have them",
             *read->lowest,
             read->written > *read->lowest ? read->written.value() - read->lowest->value() : 0));
    }
  }

  void Version(std::string_view text) {
    // The relay's CI runs 14 to 18 (scripts/postgres/versions); xid8 and
    // pg_visible_in_snapshot, which marking and backfill use, exist since 13.
    if (version_num_ >= 140000 && version_num_ < 190000) {
      Ok("server version", fmt::format("PostgreSQL {} (the relay is tested on 14 to 18)", text));
    } else if (version_num_ >= 190000) {
      Warn("server version",
           fmt::format("PostgreSQL {}: newer than the relay is tested on (14 to 18)", text),
           "run the relay's test suite against it (OUTBOX_PG_VERSION) before relying on it");
    } else {
      Failed("server version",
             fmt::format("PostgreSQL {}: not supported; the relay is tested on 14 to 18 (xid8 "
                         "and pg_visible_in_snapshot need 13)",
                         text),
             "upgrade to PostgreSQL 14 or newer");
    }
  }

  void WalLevel(std::string_view level) {
    if (level == "logical") {
      Ok("wal_level", "logical");
      return;
    }
    Failed("wal_level",
           fmt::format("{}: logical decoding (and so the relay) needs wal_level = logical", level),
           "ALTER SYSTEM SET wal_level = logical; then restart PostgreSQL (a reload is not "
           "enough). Managed services: RDS/Aurora rds.logical_replication = 1, Cloud SQL "
           "cloudsql.logical_decoding = on, Azure azure.replication_support = logical");
  }

  void Capacity(const char* name, int64_t max, int64_t used, bool ours_counted, const char* what,
                const char* fix) {
    if (max <= 0) {
      Failed(name, fmt::format("{} = 0: the relay needs one", name), fix);
    } else if (used >= max && !ours_counted) {
      Failed(name, fmt::format("{} = {}, all {} {}", name, max, used, what), fix);
    } else {
      Ok(name, fmt::format("{} = {}, {} {}{}", name, max, used, what,
                           ours_counted ? " (this relay's slot among them)" : ""));
    }
  }

  void Role(bool replication) {
    if (superuser_) {
      Ok("role", fmt::format("{} is a superuser", role_));
    } else if (replication) {
      Ok("role", fmt::format("{} has the REPLICATION attribute", role_));
    } else {
      Failed("role",
             fmt::format("{} has neither REPLICATION nor superuser: it cannot open a replication "
                         "connection or create the slot",
                         role_),
             fmt::format("as a superuser: ALTER ROLE {} REPLICATION; (RDS: GRANT rds_replication "
                         "TO {};)",
                         pg::QuoteIdent(role_), pg::QuoteIdent(role_)));
    }
  }

  bool Table() {
    std::optional<std::string> params[] = {r_.table_name.Quoted()};
    auto res = conn_->ExecParams(
        "SELECT c.oid, c.relkind, pg_get_userbyid(c.relowner), "
        "pg_has_role(current_user, c.relowner, 'USAGE') "
        "FROM pg_class c WHERE c.oid = to_regclass($1)",
        params);
    if (!res) {
      Failed("outbox table", res.error().message, "");
      return false;
    }
    if (pg::Rows(res->get()).size() == 0) {
      Failed("outbox table", fmt::format("{} does not exist", r_.table_name.ToString()),
             "create it (sql/outbox.sql has the seed's DDL) or point --table (OUTBOX_TABLE) at "
             "the right one");
      return false;
    }
    pg::Rows table(res->get());
    auto table_oid = table.Text(0, 0);
    auto kind = table.Text(0, 1);
    auto owner = table.Text(0, 2);
    auto owns = table.Bool(0, 3);
    if (const Error* e = pg::FirstError(table_oid, kind, owner, owns)) {
      Failed("outbox table", e->message, "");
      return false;
    }
    table_oid_ = std::string(*table_oid);
    table_owner_ = std::string(*owner);
    owns_table_ = *owns;
    if (*kind == "p") {
      Ok("outbox table",
         fmt::format("{} exists, partitioned (owner {})", r_.table_name.ToString(), table_owner_));
    } else if (*kind != "r") {
      Failed("outbox table",
             fmt::format("{} exists but is not a table (relkind {}): run refuses it",
                         r_.table_name.ToString(), *kind),
             "logical replication publishes plain and partitioned tables only: point --table "
             "(OUTBOX_TABLE) at one");
    } else {
      Ok("outbox table",
         fmt::format("{} exists (owner {})", r_.table_name.ToString(), table_owner_));
    }
    std::optional<std::string> oid[] = {table_oid_};
    auto cols = conn_->ExecParams(
        "SELECT a.attname, a.attnum, format_type(a.atttypid, a.atttypmod), t.typname, "
        "t.typcategory, a.attnotnull FROM pg_attribute a JOIN pg_type t ON t.oid = a.atttypid "
        "WHERE a.attrelid = $1::oid AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum",
        oid);
    if (!cols) {
      Failed("outbox columns", cols.error().message, "");
      return false;
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
        Failed("outbox columns", e->message, "");
        return false;
      }
      Column col;
      col.attnum = static_cast<int>(*attnum);
      col.type = std::string(*type);
      col.typname = std::string(*typname);
      col.category = category->empty() ? 'X' : category->front();
      col.not_null = *not_null;
      columns_.emplace(std::string(*name), col);
    }
    return true;
  }

  std::string ColumnList() const {
    std::string out;
    for (const auto& [name, col] : columns_) {
      if (!out.empty()) out += ", ";
      out += name;
    }
    return out;
  }

  // Returns the column when it exists; otherwise a FAIL line naming the flag.
  const Column* RequireColumn(const std::string& name, const char* flag, const char* env,
                              const char* role) {
    auto it = columns_.find(name);
    if (it != columns_.end()) return &it->second;
    Failed(fmt::format("column {}", name),
           fmt::format("{} has no column '{}' ({}); its columns: {}", r_.table_name.ToString(),
                       name, role, ColumnList()),
           fmt::format("set {} ({}) to the column's name", flag, env));
    all_columns_ok_ = false;
    return nullptr;
  }

  void IntegerColumn(const std::string& name, const Column& col, const char* role) {
    std::string what = fmt::format("column {}", name);
    if (col.typname == "int8") {
      Ok(what, fmt::format("{} ({})", col.type, role));
    } else if (col.typname == "int4" || col.typname == "int2") {
      Warn(what, fmt::format("{} ({}): works, but a BIGSERIAL offset outgrows it", col.type, role),
           fmt::format("ALTER TABLE {} ALTER COLUMN {} TYPE bigint;", r_.table_name.Quoted(),
                       pg::QuoteIdent(name)));
    } else {
      Failed(what, fmt::format("{} ({}): must be an integer (bigint)", col.type, role),
             "use the seed's schema (sql/outbox.sql) or point the column flag elsewhere");
      all_columns_ok_ = false;
    }
  }

  void Columns() {
    const auto& n = r_.columns;
    if (const Column* col = RequireColumn(n.uuid, "--column-uuid", "OUTBOX_COLUMN_UUID", "uuid")) {
      if (col->category == 'S' || col->typname == "uuid") {
        Ok("column " + n.uuid, col->type + " (message UUID)");
      } else {
        Failed("column " + n.uuid, col->type + " (message UUID): must be text-like or uuid",
               "use varchar(36)/text as in the seed's schema");
        all_columns_ok_ = false;
      }
    }
    if (const Column* col =
            RequireColumn(n.payload, "--column-payload", "OUTBOX_COLUMN_PAYLOAD", "payload")) {
      if (col->typname == "json" || col->typname == "jsonb" || col->category == 'S') {
        Ok("column " + n.payload,
           col->type + (col->typname == "jsonb"
                            ? " (Kafka value: jsonb's normalized text, not the bytes written)"
                            : " (Kafka value, verbatim)"));
      } else if (col->typname == "bytea") {
        Failed("column " + n.payload,
               "bytea: pgoutput sends columns in text form, so Kafka would get the hex escape "
               "'\\x7b22…', not the payload bytes",
               "store the payload as json (the seed's schema), jsonb or text");
        all_columns_ok_ = false;
      } else {
        Warn("column " + n.payload, fmt::format("{}: published as the type's text form", col->type),
             "store the payload as json (the seed's schema), jsonb or text");
      }
    }
    if (const Column* col =
            RequireColumn(n.metadata, "--column-metadata", "OUTBOX_COLUMN_METADATA", "metadata")) {
      if (col->typname == "json" || col->typname == "jsonb" || col->category == 'S') {
        Ok("column " + n.metadata, col->type + " (metadata: a JSON object of strings)");
      } else {
        Failed("column " + n.metadata,
               col->type + " (metadata): must hold a JSON object (json, jsonb or text)",
               "use json as in the seed's schema");
        all_columns_ok_ = false;
      }
    }
    if (const Column* col = RequireColumn(n.transaction_id, "--column-transaction-id",
                                          "OUTBOX_COLUMN_TRANSACTION_ID", "transaction id")) {
      if (col->typname == "xid8") {
        Ok("column " + n.transaction_id, "xid8 (writing transaction; marking and backfill)");
      } else {
        Failed("column " + n.transaction_id,
               col->type +
                   ": must be xid8 (marking by transaction and the snapshot backfill "
                   "compare it with pg_current_xact_id() and pg_snapshot)",
               fmt::format("{} xid8 NOT NULL DEFAULT pg_current_xact_id(), as in the seed's "
                           "schema",
                           pg::QuoteIdent(n.transaction_id)));
        all_columns_ok_ = false;
      }
    }
    if (const Column* col =
            RequireColumn(n.offset, "--column-offset", "OUTBOX_COLUMN_OFFSET", "offset")) {
      IntegerColumn(n.offset, *col, "row sequence");
    }
    if (r_.mark) {
      if (const Column* col =
              RequireColumn(r_.acked_column, "--column-acked", "OUTBOX_COLUMN_ACKED", "acked")) {
        if (col->not_null) {
          Failed("column " + r_.acked_column,
                 "NOT NULL: it must be NULL until the row is published",
                 fmt::format("ALTER TABLE {} ALTER COLUMN {} DROP NOT NULL;",
                             r_.table_name.Quoted(), pg::QuoteIdent(r_.acked_column)));
        } else {
          IntegerColumn(r_.acked_column, *col, "NULL until published");
        }
      }
    }
    if (!columns_.contains("created_at")) {
      Warn("column created_at", "missing: cleanup deletes acked rows by their creation time",
           "add created_at timestamptz NOT NULL DEFAULT NOW() (the seed's schema), or pass "
           "--column-created-at to cleanup");
    }
  }

  void Indexes() {
    auto xid = columns_.find(r_.columns.transaction_id);
    std::optional<std::string> params[] = {table_oid_};
    auto res = conn_->ExecParams(
        "SELECT i.indexrelid::regclass::text, i.indkey[0], i.indisvalid, "
        "pg_get_expr(i.indpred, i.indrelid), pg_get_indexdef(i.indexrelid) "
        "FROM pg_index i WHERE i.indrelid = $1::oid",
        params);
    if (!res) {
      Failed("indexes", res.error().message, "");
      return;
    }
    std::string marking_index;
    std::string acked_index;
    std::string acked_norm = "(" + r_.acked_column + " is null)";
    pg::Rows rows(res->get());
    for (int i = 0; i < rows.size(); ++i) {
      auto index = rows.Text(i, 0);
      auto first_key = rows.Int(i, 1);
      auto valid = rows.Bool(i, 2);
      if (const Error* e = pg::FirstError(index, first_key, valid)) {
        Failed("indexes", e->message, "");
        return;
      }
      if (!*valid) continue;
      if (xid != columns_.end() && *first_key == xid->second.attnum && marking_index.empty()) {
        marking_index = std::string(*index);
      }
      // pg_get_expr of indpred: NULL for an index that is not partial.
      std::string pred;
      for (char ch : rows.Value(i, 3).value_or("")) {
        if (ch != '"') pred += static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
      }
      if (pred == acked_norm || pred == "(" + acked_norm + ")") acked_index = std::string(*index);
    }
    if (xid != columns_.end()) {
      if (!marking_index.empty()) {
        Ok("marking index",
           fmt::format("{} leads with {}: UPDATE … WHERE {} = ANY($1) is an "
                       "index scan",
                       marking_index, r_.columns.transaction_id, r_.columns.transaction_id));
      } else {
        Warn("marking index",
             fmt::format("no index leads with {}: every marking UPDATE scans the table",
                         r_.columns.transaction_id),
             fmt::format("the seed's PRIMARY KEY ({}, {}), or CREATE INDEX CONCURRENTLY ON {} "
                         "({});",
                         pg::QuoteIdent(r_.columns.transaction_id),
                         pg::QuoteIdent(r_.columns.offset), r_.table_name.Quoted(),
                         pg::QuoteIdent(r_.columns.transaction_id)));
      }
    }
    if (r_.mark && columns_.contains(r_.acked_column)) {
      if (!acked_index.empty()) {
        Ok("unacked index", fmt::format("{} (partial, {} IS NULL)", acked_index, r_.acked_column));
      } else {
        Warn("unacked index",
             fmt::format("no partial index on {} IS NULL: the backfill, the unacked-rows "
                         "metric and the seed's runbook queries scan the whole table",
                         r_.acked_column),
             fmt::format("CREATE INDEX CONCURRENTLY idx_outbox_acked ON {} ({}) WHERE {} IS NULL;",
                         r_.table_name.Quoted(), pg::QuoteIdent(r_.acked_column),
                         pg::QuoteIdent(r_.acked_column)));
      }
    }
  }

  void Privileges() {
    std::optional<std::string> params[] = {table_oid_};
    auto res = conn_->ExecParams(
        "SELECT has_table_privilege($1::oid, 'SELECT'), has_table_privilege($1::oid, 'UPDATE')",
        params);
    if (!res) {
      Failed("table privileges", res.error().message, "");
      return;
    }
    pg::Rows rows(res->get());
    auto may_select = rows.Bool(0, 0);
    auto may_update = rows.Bool(0, 1);
    if (const Error* e = pg::FirstError(may_select, may_update)) {
      Failed("table privileges", e->message, "");
      return;
    }
    std::vector<std::string> missing;
    if (!*may_select) missing.push_back("SELECT");
    if (r_.mark && !*may_update) missing.push_back("UPDATE");
    if (missing.empty()) {
      Ok("table privileges",
         r_.mark ? "SELECT (backfill, replay) and UPDATE (marking)" : "SELECT (backfill, replay)");
    } else {
      std::string list = fmt::format("{}", fmt::join(missing, ", "));
      Failed("table privileges",
             fmt::format("{} lacks {} on {}", role_, list, r_.table_name.ToString()),
             fmt::format("GRANT {} ON {} TO {};", list, r_.table_name.Quoted(),
                         pg::QuoteIdent(role_)));
    }
  }

  void Publication() {
    const std::string name = "publication " + r_.publication;
    const std::string create_sql = pg::CreatePublicationSql(r_.publication, r_.table_name) + ";";
    auto pub = pg::QueryPublication(*conn_, r_.publication, r_.table_name);
    if (!pub) {
      Failed(name, pub.error().message, "");
      return;
    }
    if (!pub->exists) {
      if (superuser_ || (owns_table_ && can_create_in_db_)) {
        Ok(name, fmt::format("does not exist; run creates it: {}", create_sql));
      } else {
        Failed(name,
               fmt::format("does not exist, and {} cannot create it (it needs CREATE on the "
                           "database and to own {})",
                           role_, r_.table_name.ToString()),
               fmt::format("as the table owner ({}) or a superuser: {}", table_owner_, create_sql));
      }
      return;
    }
    auto table = pg::QueryTable(*conn_, r_.table_name);
    if (!table) {
      Failed(name, table.error().message, "");
      return;
    }
    // The same judgement `run` makes at start: what it refuses fails here.
    auto problems = pg::Problems(*pub, *table, r_.publication, r_.table_name,
                                 {r_.columns.uuid, r_.columns.payload, r_.columns.metadata,
                                  r_.columns.transaction_id, r_.columns.offset});
    for (const pg::PublicationProblem& problem : problems) {
      if (problem.refuse) {
        Failed(name, problem.what + " (run refuses it)", problem.fix);
      } else {
        Warn(name, problem.what, problem.fix);
      }
    }
    if (problems.empty()) {
      Ok(name, fmt::format("FOR TABLE {}, publish = insert{}", r_.table_name.ToString(),
                           table->partitioned() ? ", publish_via_partition_root" : ""));
    }
  }

  void Slot() {
    if (!slot_known_) return;  // reported already
    const std::string name = "slot " + r_.slot;
    const bool reconcile = r_.on_slot_lost == pipeline::OnSlotLost::kReconcile;
    const std::string recovery =
        reconcile ? "run (--on-slot-lost=reconcile) drops/recreates the slot and backfills every "
                    "unacked row from the table (rows published but not yet marked are sent "
                    "again: at least once)"
                  : "run (--on-slot-lost=fail) exits with an error until the slot is recreated";
    if (!slot_.exists) {
      if (const SlotStateRow* created = slot_.FindState(kSlotCreatedStateKey)) {
        Warn(name,
             fmt::format("missing, but the relay created it at {} (outbox_relay.state): {}",
                         created->value, recovery),
             reconcile ? "nothing to do: run recovers; find out who dropped it"
                       : "run once with --on-slot-lost=reconcile");
      } else {
        Ok(name, fmt::format("does not exist; run creates it{}",
                             r_.backfill && r_.mark
                                 ? " and first publishes the unacked rows committed before it"
                                 : ""));
      }
      return;
    }
    if (slot_.plugin != "pgoutput") {
      Failed(name, fmt::format("uses plugin {}, not pgoutput", slot_.plugin),
             "choose another --slot (OUTBOX_SLOT), or drop this one if nothing else uses it");
      return;
    }
    if (slot_.database != database_) {
      Failed(name, fmt::format("belongs to database {}, not {}", slot_.database, database_),
             "choose another --slot (OUTBOX_SLOT): logical slots are per database");
      return;
    }
    std::string retained =
        slot_.retained_bytes ? PrettyBytes(*slot_.retained_bytes) : std::string("unknown");
    if (slot_.wal_status == "lost") {
      std::string why = slot_.invalidation_reason.value_or("").empty()
                            ? "the WAL it needed is gone (max_slot_wal_keep_size)"
                            : "invalidation_reason = " + *slot_.invalidation_reason;
      Failed(name, fmt::format("invalidated (wal_status = lost): {}; {}", why, recovery),
             reconcile ? "nothing is lost: start run and it recovers; raise "
                         "max_slot_wal_keep_size to make this rarer"
                       : "run once with --on-slot-lost=reconcile, or `outbox-relay slot drop "
                         "--confirm` and start run");
      return;
    }
    if (slot_.wal_status == "unreserved") {
      Warn(name,
           fmt::format("wal_status = unreserved: it retains {} of WAL, more than max_wal_size; it "
                       "is invalidated at the next checkpoint beyond max_slot_wal_keep_size",
                       retained),
           "start the relay so it catches up, or raise max_slot_wal_keep_size");
      return;
    }
    std::string detail = fmt::format(
        "pgoutput, confirmed_flush_lsn {}, retains {} of WAL "
        "(wal_status {})",
        slot_.confirmed_flush_lsn.value_or("-"), retained, slot_.wal_status);
    if (slot_.active) {
      detail += fmt::format(
          "; active, held by pid {}{}: another instance streams, this one "
          "would wait as its hot standby",
          slot_.active_pid.value_or(0), slot_.holder.empty() ? "" : " (" + slot_.holder + ")");
    } else {
      detail += "; inactive";
    }
    Ok(name, detail);
  }

  // What run does with the schema version it finds (pg::EnsureRelaySchema).
  static std::string VersionNote(const pg::RelaySchemaFound& found) {
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

  void RelaySchema() {
    // to_regclass() needs USAGE on the schema; CASE keeps the order.
    auto res = conn_->Exec(
        "SELECT to_regnamespace('outbox_relay') IS NOT NULL, "
        "CASE WHEN to_regnamespace('outbox_relay') IS NULL THEN true "
        "ELSE has_schema_privilege('outbox_relay', 'USAGE') END, "
        "CASE WHEN to_regnamespace('outbox_relay') IS NULL "
        "OR NOT has_schema_privilege('outbox_relay', 'USAGE') THEN false "
        "ELSE to_regclass('outbox_relay.commits') IS NOT NULL "
        "AND to_regclass('outbox_relay.state') IS NOT NULL END");
    if (!res) {
      Failed("schema outbox_relay", res.error().message, "");
      return;
    }
    pg::Rows rows(res->get());
    auto schema = rows.Bool(0, 0);
    auto usage = rows.Bool(0, 1);
    auto tables = rows.Bool(0, 2);
    if (const Error* e = pg::FirstError(schema, usage, tables)) {
      Failed("schema outbox_relay", e->message, "");
      return;
    }
    if (!*usage) {
      Failed("schema outbox_relay",
             fmt::format("exists, but {} has no USAGE on it: the relay cannot record its state "
                         "or the commit index",
                         role_),
             fmt::format("GRANT USAGE, CREATE ON SCHEMA outbox_relay TO {0}; GRANT SELECT, "
                         "INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA outbox_relay TO {0};",
                         pg::QuoteIdent(role_)));
      return;
    }
    if (*tables) {
      auto priv = conn_->Exec(
          "SELECT has_table_privilege('outbox_relay.commits', 'SELECT, INSERT') AND "
          "has_table_privilege('outbox_relay.state', 'SELECT, INSERT, UPDATE, DELETE')");
      if (!priv) {
        Failed("schema outbox_relay", priv.error().message, "");
        return;
      }
      auto writable = pg::Rows(priv->get()).Bool(0, 0);
      if (!writable) {
        Failed("schema outbox_relay", writable.error().message, "");
      } else if (*writable) {
        // The relay refuses a newer schema that does not declare itself
        // readable by this release (pg/relay_schema.h): so does check.
        auto found = pg::ReadRelaySchema(*conn_);
        if (!found) {
          Failed("schema outbox_relay", found.error().message, "");
        } else if (auto st = pg::CheckRelaySchema(*found); !st) {
          Failed("schema outbox_relay", st.error().message,
                 fmt::format("a release of relay schema version {} or newer (docs/upgrading.md)",
                             found->readable_by));
        } else {
          Ok("schema outbox_relay",
             fmt::format("commits (the replay index) and state exist and are writable; {}",
                         VersionNote(*found)));
        }
      } else {
        Failed("schema outbox_relay",
               fmt::format("{} cannot write outbox_relay.commits / outbox_relay.state", role_),
               fmt::format("GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA "
                           "outbox_relay TO {};",
                           pg::QuoteIdent(role_)));
      }
      return;
    }
    bool creatable = superuser_;
    if (!creatable && *schema) {
      auto priv = conn_->Exec("SELECT has_schema_privilege('outbox_relay', 'CREATE')");
      if (priv) {  // a failed query leaves it not creatable, reported below
        auto may_create = pg::Rows(priv->get()).Bool(0, 0);
        if (!may_create) {
          Failed("schema outbox_relay", may_create.error().message, "");
          return;
        }
        creatable = *may_create;
      }
    } else if (!creatable) {
      creatable = can_create_in_db_;
    }
    if (creatable) {
      Ok("schema outbox_relay", *schema ? "exists; run creates its tables"
                                        : "does not exist; run creates it and its tables");
    } else {
      Failed("schema outbox_relay",
             fmt::format("{} the relay's tables, and {} may not create them",
                         *schema ? "exists without" : "missing, with", role_),
             fmt::format("as a superuser: CREATE SCHEMA IF NOT EXISTS outbox_relay AUTHORIZATION "
                         "{};",
                         pg::QuoteIdent(role_)));
    }
  }

  // Topics of the event types in the newest rows (by the primary key), for
  // the Kafka checks.
  void SampleTopics() {
    if (conn_ == nullptr || table_oid_.empty() || !all_columns_ok_ || c_.sample_rows <= 0) {
      return;
    }
    auto tmpl = outbox::TopicTemplate::Compile(r_.mapper.topic_template);
    if (!tmpl) return;  // Validate reported it
    std::string sql = fmt::format(
        "SELECT {meta} FROM {table} ORDER BY {xid} DESC, {off} DESC LIMIT {n}",
        fmt::arg("meta", pg::QuoteIdent(r_.columns.metadata)),
        fmt::arg("table", r_.table_name.Quoted()),
        fmt::arg("xid", pg::QuoteIdent(r_.columns.transaction_id)),
        fmt::arg("off", pg::QuoteIdent(r_.columns.offset)), fmt::arg("n", c_.sample_rows));
    auto res = conn_->Exec(sql);
    if (!res) {
      Warn("recent rows", res.error().message, "");
      return;
    }
    outbox::Metadata metadata;
    std::string topic;
    pg::Rows rows(res->get());
    sample_.rows = rows.size();
    for (int i = 0; i < sample_.rows; ++i) {
      // A NULL metadata is no metadata, as in a streamed row (the template judges it).
      Status st = metadata.Parse(rows.Value(i, 0));
      if (st) st = tmpl->Render(metadata, &topic);
      if (!st) {
        if (sample_.poison == 0) sample_.first_poison = st.error().message;
        ++sample_.poison;
        continue;
      }
      auto& entry = sample_.topics[topic];
      ++entry.first;
      entry.second.insert(std::string(metadata.Get("Event-Type").value_or("")));
    }
  }

  const CheckConfig& c_;
  const app::RelayConfig& r_;
  pipeline::StepLine* steps_;
  pg::Connection* conn_ = nullptr;
  int64_t version_num_ = 0;
  std::string database_;
  std::string role_;
  bool superuser_ = false;
  bool can_create_in_db_ = false;
  SlotReport slot_;
  bool slot_known_ = false;
  std::string table_oid_;
  std::string table_owner_;
  bool owns_table_ = false;
  std::map<std::string, Column> columns_;
  bool all_columns_ok_ = true;
  TopicSample sample_;  // the newest rows' topics, for the Kafka checks
};

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
  return Checker(config, steps).Run();
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
