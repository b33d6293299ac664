#include "outbox_relay/pg/relay_schema.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <charconv>

#include "outbox_relay/core/version.h"
#include "outbox_relay/pg/rows.h"

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

namespace {

// Version 0 of the relay schema is none; version v > 0 is made by step v - 1.
int ReadableBy(int version) {
  return version >= 1 && version <= kRelaySchemaVersion ? kRelaySchemaSteps[version - 1].readable_by
                                                        : version;
}

constexpr std::string_view kVersionTableDdl = R"sql(
CREATE TABLE IF NOT EXISTS outbox_relay.schema_version (
    version     INTEGER     PRIMARY KEY,
    readable_by INTEGER     NOT NULL CHECK (readable_by BETWEEN 1 AND version),
    relay       TEXT        NOT NULL,
    applied_by  TEXT        NOT NULL DEFAULT current_user,
    applied_at  TIMESTAMPTZ NOT NULL DEFAULT NOW()
);
)sql";

// The one-line form of the SQL an operator runs, with the grants a
// least-privilege role needs on what it creates.
std::string ForAnAdministrator(std::string_view ddl, const std::string& role) {
  return fmt::format(
      "{}GRANT USAGE ON SCHEMA outbox_relay TO {};\n"
      "GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA outbox_relay TO {};",
      ddl, QuoteIdent(role), QuoteIdent(role));
}

std::string Described(const RelaySchemaFound& f) {
  if (f.version == 0) return "no relay schema";
  if (!f.recorded)
    return fmt::format("version {} (0.1.0's tables, no version recorded)", f.version);
  return fmt::format("version {} (readable by relays of schema version {} or newer; applied {})",
                     f.version, f.readable_by, f.applied);
}

}  // namespace

std::string RelaySchemaDdl(int from) {
  std::string sql;
  if (from <= 0) sql += "CREATE SCHEMA IF NOT EXISTS outbox_relay;";
  sql += kVersionTableDdl;
  for (int v = std::max(from, 0) + 1; v <= kRelaySchemaVersion; ++v) {
    sql += kRelaySchemaSteps[v - 1].ddl;
  }
  // Each version a relay of this release knows is recorded (the rows already
  // there are kept: when that version was applied, and by whom).
  for (int v = std::max(from, 1); v <= kRelaySchemaVersion; ++v) {
    sql += fmt::format(
        "INSERT INTO outbox_relay.schema_version (version, readable_by, relay) VALUES ({}, {}, "
        "'outbox-relay {}') ON CONFLICT (version) DO NOTHING;\n",
        v, ReadableBy(v), RelayVersion());
  }
  return sql;
}

Result<RelaySchemaFound> ReadRelaySchema(Connection& conn) {
  auto present = conn.Exec(
      "SELECT to_regclass('outbox_relay.schema_version') IS NOT NULL,"
      " to_regclass('outbox_relay.commits') IS NOT NULL"
      " AND to_regclass('outbox_relay.commits_commit_time') IS NOT NULL"
      " AND to_regclass('outbox_relay.state') IS NOT NULL");
  if (!present) return std::unexpected(present.error());
  Rows p(present->get());
  auto version_table = p.Bool(0, 0);
  auto layout_1 = p.Bool(0, 1);
  if (const Error* e = FirstError(version_table, layout_1)) return std::unexpected(*e);
  RelaySchemaFound found;
  // Tables without a version table are 0.1.0's, which are version 1.
  found.version = *layout_1 ? 1 : 0;
  if (!*version_table) return found;
  auto res = conn.Exec(
      "SELECT version, readable_by, 'at ' || applied_at::text || ' by ' || applied_by || ' ("
      "' || relay || ')' FROM outbox_relay.schema_version ORDER BY version DESC LIMIT 1");
  if (!res) {
    Error e = res.error();
    if (e.code == ErrorCode::kPermission) {
      e.message += fmt::format(
          "\nThe relay reads the version of its schema there: GRANT SELECT ON "
          "outbox_relay.schema_version TO {};",
          QuoteIdent(conn.user()));
    }
    return std::unexpected(std::move(e));
  }
  Rows r(res->get());
  if (r.size() == 0) return found;  // an empty table records nothing
  auto version = r.Int(0, 0);
  auto readable_by = r.Int(0, 1);
  auto applied = r.Text(0, 2);
  if (const Error* e = FirstError(version, readable_by, applied)) return std::unexpected(*e);
  found.version = static_cast<int>(*version);
  found.readable_by = static_cast<int>(*readable_by);
  found.recorded = true;
  found.applied = std::string(*applied);
  return found;
}

Status CheckRelaySchema(const RelaySchemaFound& found, int known) {
  if (found.version <= known || (found.recorded && found.readable_by <= known)) return Ok();
  return Fail(ErrorCode::kInvalidArgument,
              "the relay schema outbox_relay is of version {}, which relays of schema version "
              "{} or newer can run against; this relay (outbox-relay {}) knows schema version "
              "{} and leaves it alone: nothing is read from the slot, published, marked or "
              "deleted. Run a release of schema version {} or newer (CHANGELOG.md), or restore "
              "the schema that release's notes name (docs/upgrading.md)",
              found.version, found.readable_by, RelayVersion(), known, found.readable_by);
}

Status EnsureRelaySchema(Connection& conn) {
  auto found = ReadRelaySchema(conn);
  if (!found) return std::unexpected(found.error());
  if (auto st = CheckRelaySchema(*found); !st) return st;
  if (found->version > kRelaySchemaVersion) {
    spdlog::info(
        "relay schema: {}, newer than this relay's version {}: it runs, as that "
        "version allows",
        Described(*found), kRelaySchemaVersion);
    return Ok();
  }
  // Current and recorded: no DDL at all. Even CREATE SCHEMA IF NOT EXISTS
  // needs CREATE on the database, which a least-privilege relay role (given
  // the schema by an administrator) does not have.
  if (found->recorded && found->version == kRelaySchemaVersion) return Ok();

  // Concurrent starts (active + standby, or two releases during a rolling
  // upgrade) would race on the DDL: the transaction-level advisory lock every
  // release took serialises them, and the version is read again under it.
  auto rollback = [&conn] { (void)conn.Exec("ROLLBACK"); };
  if (auto begin =
          conn.Exec("BEGIN; SELECT pg_advisory_xact_lock(hashtext('outbox_relay_schema'))");
      !begin) {
    rollback();
    return std::unexpected(begin.error());
  }
  auto now = ReadRelaySchema(conn);
  if (!now) {
    rollback();
    return std::unexpected(now.error());
  }
  if (auto st = CheckRelaySchema(*now); !st) {
    rollback();
    return st;
  }
  if (now->version > kRelaySchemaVersion ||
      (now->recorded && now->version == kRelaySchemaVersion)) {
    rollback();
    return Ok();  // another instance migrated it meanwhile
  }
  const std::string ddl = RelaySchemaDdl(now->version);
  if (auto res = conn.Exec(ddl); !res) {
    rollback();
    Error e = res.error();
    if (e.code != ErrorCode::kPermission) return std::unexpected(std::move(e));
    if (now->version == kRelaySchemaVersion) {
      // 0.1.0's tables are this version's layout: only the record is
      // missing, and nothing the relay needs.
      spdlog::warn(
          "relay schema: {}; {} may not record it (this release needs no other change). To "
          "record it, run as the schema's owner:\n{}",
          Described(*now), conn.user(), ForAnAdministrator(ddl, conn.user()));
      return Ok();
    }
    e.message += fmt::format(
        "\nThe relay keeps its commit index and state in schema outbox_relay ({}; this relay "
        "needs version {}). Run as a superuser or the database owner:\n{}",
        Described(*now), kRelaySchemaVersion, ForAnAdministrator(ddl, conn.user()));
    return std::unexpected(std::move(e));
  }
  if (auto commit = conn.Exec("COMMIT"); !commit) {
    rollback();
    return std::unexpected(commit.error());
  }
  spdlog::info("relay schema: {} -> version {}", Described(*now), kRelaySchemaVersion);
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
