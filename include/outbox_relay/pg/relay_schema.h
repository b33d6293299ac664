// The relay's own tables, in schema outbox_relay:
//   commits  — the commit-LSN index: one row per published transaction
//              (slot, commit LSN, end LSN, xid8s, commit time, rows); what
//              `replay --from-lsn` reads (DESIGN §6).
//   state    — key/value state per slot (the stored backfill snapshot).
#pragma once

#include <iterator>
#include <optional>
#include <string>
#include <string_view>

#include "outbox_relay/core/result.h"
#include "outbox_relay/pg/connection.h"

namespace outbox_relay::pg {

// The relay schema's version: the layout of these tables and what their rows
// mean (the state keys below, the commit index's rows). Recorded in
//   schema_version — one row per version applied: version, readable_by (the
//                    oldest schema version a relay may know and still run
//                    against this one), when and by whom.
// A relay runs against the newest recorded version V if it knows V, or if V's
// readable_by is at most the version it knows (V declares itself compatible);
// otherwise it refuses to start naming both (kInvalidArgument: exit 2),
// before it touches the slot. An older version is migrated forward at start
// (RelaySchemaDdl), under the advisory lock every release took, in one
// transaction. Each step is idempotent and, while the relay of the release
// before may still run beside it (a rolling upgrade, a rollback), additive;
// a destructive change comes a release later, with readable_by raised
// (docs/upgrading.md). Version 1 is the layout 0.1.0 created, which had no
// version table: tables without one are version 1.
inline constexpr int kRelaySchemaVersion = 1;

// The forward steps: step i makes version i + 1.
struct RelaySchemaStep {
  int readable_by;       // the oldest schema version that can run against the result
  std::string_view ddl;  // idempotent
};
inline constexpr RelaySchemaStep kRelaySchemaSteps[] = {
    // 1: the commit index and the state table, as 0.1.0 created them.
    {1, R"sql(
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
)sql"},
};
static_assert(std::size(kRelaySchemaSteps) == kRelaySchemaVersion);

// The SQL that brings a schema of version `from` (0: none) to
// kRelaySchemaVersion and records it: what a relay runs at start, and what it
// prints for an administrator when its role may not. RelaySchemaDdl() is the
// whole schema of a new database.
std::string RelaySchemaDdl(int from = 0);

// The newest version recorded in a database.
struct RelaySchemaFound {
  int version = 0;        // 0: no relay schema
  bool recorded = false;  // false: tables without schema_version (0.1.0's), or none
  int readable_by = 0;    // of `version`, when recorded
  std::string applied;    // "at <time> by <role>", when recorded
};
Result<RelaySchemaFound> ReadRelaySchema(Connection& conn);

// Whether a relay that knows schema version `known` may run against `found`:
// kInvalidArgument naming both versions when it may not.
Status CheckRelaySchema(const RelaySchemaFound& found, int known = kRelaySchemaVersion);

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

// Checks the recorded version (CheckRelaySchema) and creates or migrates the
// schema when it is older than this relay's (idempotent; no statement at all
// when it is current). Without the privilege: kPermission with the SQL to
// run, unless only the record is missing on a layout that is current (0.1.0's
// tables): then a warning with that SQL, and the relay runs.
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
