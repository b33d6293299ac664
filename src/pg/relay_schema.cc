#include "outbox_relay/pg/relay_schema.h"

#include <charconv>

namespace outbox_relay::pg {

namespace {
bool ParseXid(std::string_view s, uint64_t* out) {
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), *out);
  return ec == std::errc() && end == s.data() + s.size() && !s.empty();
}
}  // namespace

std::string PortableSnapshot(std::string_view snapshot) {
  // xmin:xmax:xip,xip,...
  size_t first = snapshot.find(':');
  size_t second = first == std::string_view::npos ? first : snapshot.find(':', first + 1);
  if (second == std::string_view::npos) return std::string(snapshot);
  uint64_t xmin = 0;
  uint64_t xmax = 0;
  if (!ParseXid(snapshot.substr(0, first), &xmin) ||
      !ParseXid(snapshot.substr(first + 1, second - first - 1), &xmax) || xmin <= xmax) {
    return std::string(snapshot);
  }
  // Every listed xid lies in [xmin, xmax): with xmin above xmax the list is
  // empty in anything the server wrote.
  return fmt::format("{}:{}:", xmin, xmin);
}

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

Result<std::optional<std::string>> ReadState(Connection& conn, std::string_view slot,
                                             std::string_view key) {
  std::optional<std::string> params[] = {std::string(slot), std::string(key)};
  auto res = conn.ExecParams(
      "SELECT value FROM outbox_relay.state WHERE slot_name = $1 AND key = $2", params);
  if (!res) return std::unexpected(res.error());
  if (PQntuples(res->get()) == 0) return std::optional<std::string>();
  return std::optional<std::string>(std::string(GetValue(res->get(), 0, 0).value_or("")));
}

Status WriteState(Connection& conn, std::string_view slot, std::string_view key,
                  std::string_view value) {
  std::optional<std::string> params[] = {std::string(slot), std::string(key), std::string(value)};
  auto res = conn.ExecParams(
      "INSERT INTO outbox_relay.state (slot_name, key, value) VALUES ($1, $2, $3) "
      "ON CONFLICT (slot_name, key) DO UPDATE SET value = EXCLUDED.value, updated_at = NOW()",
      params);
  if (!res) return std::unexpected(res.error());
  return Ok();
}

Status DeleteState(Connection& conn, std::string_view slot, std::string_view key) {
  std::optional<std::string> params[] = {std::string(slot), std::string(key)};
  auto res =
      conn.ExecParams("DELETE FROM outbox_relay.state WHERE slot_name = $1 AND key = $2", params);
  if (!res) return std::unexpected(res.error());
  return Ok();
}

Result<bool> TrySlotSetupLock(Connection& conn, std::string_view slot) {
  // The key is the one every version of the relay took, so that one being
  // rolled out and one of the old version exclude each other too.
  std::optional<std::string> params[] = {std::string(slot)};
  auto res = conn.ExecParams(
      "SELECT pg_try_advisory_lock(hashtext('outbox_relay.slot_creation'), hashtext($1))", params);
  if (!res) return std::unexpected(res.error());
  return GetValue(res->get(), 0, 0) == std::optional<std::string_view>("t");
}

}  // namespace outbox_relay::pg
