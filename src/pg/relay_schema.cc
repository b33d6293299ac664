#include "outbox_relay/pg/relay_schema.h"

namespace outbox_relay::pg {

Status EnsureRelaySchema(Connection& conn) {
  // Everything there already: no DDL at all. Even CREATE SCHEMA IF NOT EXISTS
  // needs CREATE on the database, which a least-privilege relay role (given
  // the schema by an administrator) does not have.
  auto present = conn.Exec(
      "SELECT to_regclass('outbox_relay.commits') IS NOT NULL"
      " AND to_regclass('outbox_relay.commits_commit_time') IS NOT NULL"
      " AND to_regclass('outbox_relay.state') IS NOT NULL");
  if (present && GetValue(present->get(), 0, 0) == std::optional<std::string_view>("t")) {
    return Ok();
  }
  // Concurrent first starts (active + standby) would race on CREATE ... IF
  // NOT EXISTS; a transaction-level advisory lock serialises them.
  std::string sql =
      std::string("BEGIN; SELECT pg_advisory_xact_lock(hashtext('outbox_relay_schema'));") +
      kRelaySchemaDdl + "COMMIT;";
  auto res = conn.Exec(sql);
  if (!res) {
    conn.Exec("ROLLBACK").value_or(nullptr);
    Error e = res.error();
    if (e.code == ErrorCode::kPermission) {
      e.message += fmt::format(
          "\nThe relay keeps its commit index in schema outbox_relay. Create it as a "
          "superuser or the database owner:\n{}\nGRANT USAGE ON SCHEMA outbox_relay TO {};\n"
          "GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA outbox_relay TO {};",
          kRelaySchemaDdl, QuoteIdent(conn.user()), QuoteIdent(conn.user()));
    }
    return std::unexpected(std::move(e));
  }
  return Ok();
}

}  // namespace outbox_relay::pg
