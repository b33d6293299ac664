// Failover: what the relay does when the primary it reads from is replaced by
// a promoted physical standby.
//
// PostgreSQL 14 to 16 keep logical slots on the primary only: after a
// promotion the slot is missing, the relay treats it as lost and (with
// --on-slot-lost=reconcile) recreates it and backfills every unacked row
// (pipeline::SlotSetup). PostgreSQL 17 can keep a copy: a slot created with
// `failover = true` is synced to standbys running with
// sync_replication_slots = on, and the primary's synchronized_standby_slots
// holds logical walsenders back until that standby has the WAL, so the relay
// never publishes a transaction the promoted standby does not have.
//
// With DATABASE_URL naming both servers and target_session_attrs=read-write,
// every connection of the relay (replication, marker, sampler) finds the new
// primary by itself. The relay then resumes from the new primary's copy of the
// slot, never from the position it confirmed on the old primary: that copy is
// synced only up to what the standby had replayed, and beyond the promotion
// point the two servers' WAL positions name different data (a restart at the
// old position could skip the new primary's first transactions). Between the
// synced position and ours lie transactions already published: they come
// again (counted duplicates), and their rows are marked again on the new
// primary where the old primary's marking had not reached it.
#pragma once

#include "outbox_relay/app/config.h"
#include "outbox_relay/core/result.h"
#include "outbox_relay/pg/connection.h"
#include "outbox_relay/pg/replication.h"

namespace outbox_relay::app {

// --failover-slot on a server that cannot have failover slots (before 17) is
// a bad setting: kInvalidArgument naming it. On 17+ it logs what is missing on
// the primary (synchronized_standby_slots), since without it a failover can
// lose what the relay already published (phantoms).
Status ValidateFailoverSlot(const RelayConfig& config, pg::Connection& conn);

}  // namespace outbox_relay::app
