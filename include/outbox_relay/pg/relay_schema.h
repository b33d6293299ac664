// The relay's own tables, in schema outbox_relay:
//   commits  — the commit-LSN index: one row per published transaction
//              (slot, commit LSN, end LSN, xid8s, commit time, rows); what
//              `replay --from-lsn` reads (DESIGN §6).
//   state    — key/value state per slot (the stored backfill snapshot).
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "outbox_relay/core/result.h"
#include "outbox_relay/pg/connection.h"

namespace outbox_relay::pg {

inline constexpr const char* kRelaySchemaDdl = R"sql(
CREATE SCHEMA IF NOT EXISTS outbox_relay;
CREATE TABLE IF NOT EXISTS outbox_relay.commits (
    slot_name       TEXT        NOT NULL,
    commit_lsn      PG_LSN      NOT NULL,
    end_lsn         PG_LSN      NOT NULL,
    transaction_ids XID8[]      NOT NULL,
    commit_time     TIMESTAMPTZ NOT NULL,
    row_count       INTEGER     NOT NULL,
    recorded_at     TIMESTAMPTZ NOT NULL DEFAULT NOW(),
    PRIMARY KEY (slot_name, commit_lsn)
);
CREATE INDEX IF NOT EXISTS commits_commit_time ON outbox_relay.commits (slot_name, commit_time);
CREATE TABLE IF NOT EXISTS outbox_relay.state (
    slot_name  TEXT        NOT NULL,
    key        TEXT        NOT NULL,
    value      TEXT        NOT NULL,
    updated_at TIMESTAMPTZ NOT NULL DEFAULT NOW(),
    PRIMARY KEY (slot_name, key)
);
)sql";

// Keys of outbox_relay.state.
inline constexpr const char* kStateSlotCreated = "slot_created";  // LSN the slot was created at
inline constexpr const char* kStateBackfillSnapshot = "backfill_snapshot";  // pending backfill
// Present from just before CREATE_REPLICATION_SLOT until the slot's snapshot
// is stored: a slot found with it was created by an instance that died before
// storing its snapshot (the rows committed before that slot would be missed).
inline constexpr const char* kStateSlotCreating = "slot_creating";

// The slot's snapshot as pg_snapshot text that the server's pg_snapshot input
// accepts. A snapshot imported from CREATE_REPLICATION_SLOT can have xmin
// above xmax (seen on PostgreSQL 14 under load: "14533:14532:"), which
// pg_current_snapshot() prints but ::pg_snapshot refuses. PostgreSQL reads a
// snapshot by xmin first (every xid below xmin is finished: visible when
// committed), so raising xmax to xmin keeps what it sees. Other text is
// returned unchanged.
std::string PortableSnapshot(std::string_view snapshot);

// Creates the schema and tables when missing (idempotent). Without the
// privilege: kPermission with the SQL to run.
Status EnsureRelaySchema(Connection& conn);

// outbox_relay.state: one value per (slot, key); nullopt when absent.
Result<std::optional<std::string>> ReadState(Connection& conn, std::string_view slot,
                                             std::string_view key);
Status WriteState(Connection& conn, std::string_view slot, std::string_view key,
                  std::string_view value);
Status DeleteState(Connection& conn, std::string_view slot, std::string_view key);

// A session-level advisory lock per slot, held by the instance that sets the
// slot up (creation, stored snapshot, backfill) until it is done: released
// when `conn`'s session ends, so also when the instance dies. False: another
// session holds it.
Result<bool> TrySlotSetupLock(Connection& conn, std::string_view slot);

}  // namespace outbox_relay::pg
