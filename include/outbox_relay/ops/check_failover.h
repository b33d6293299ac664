// `outbox-relay check`: the failover part (PostgreSQL 17 failover slots).
//
// Run when --failover-slot is set, when --standby-url names a standby, or when
// the slot already is a failover slot. On the primary: the server can have
// failover slots (17+), the slot has failover = true, synchronized_standby_slots
// names the standby's physical slot and that slot exists and is in use. On the
// standby (--standby-url): it is a standby of this primary, with
// sync_replication_slots = on, hot_standby_feedback = on, primary_slot_name,
// a dbname in primary_conninfo and wal_level = logical, and it holds a synced,
// persistent copy of the relay's slot. Nothing of either URL is printed (a URL
// may hold a password); the standby is called "standby".
#pragma once

#include <vector>

#include "outbox_relay/ops/check.h"
#include "outbox_relay/pg/connection.h"

namespace outbox_relay::ops {

// `primary` is check's connection to DATABASE_URL.
std::vector<CheckResult> CheckFailover(pg::Connection& primary, const CheckConfig& config);

}  // namespace outbox_relay::ops
