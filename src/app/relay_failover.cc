// Following a promotion (see include/outbox_relay/app/failover.h).
#include <spdlog/spdlog.h>

#include <thread>

#include "outbox_relay/app/failover.h"
#include "outbox_relay/app/relay.h"
#include "outbox_relay/core/wal_history.h"
#include "outbox_relay/pg/replication.h"
#include "outbox_relay/pg/rows.h"

namespace outbox_relay::app {

namespace {

constexpr const char* kFailoverHelp =
    "on 14 to 16 a promoted standby has no copy of the slot; the relay recreates it and "
    "backfills the unacked rows (--on-slot-lost=reconcile)";

}  // namespace

Status ValidateFailoverSlot(const RelayConfig& config, pg::Connection& conn) {
  if (!config.failover_slot) return Ok();
  if (conn.server_version() < 170000) {
    return Fail(ErrorCode::kInvalidArgument,
                "invalid setting --failover-slot (OUTBOX_FAILOVER_SLOT): failover slots need "
                "PostgreSQL 17 or newer, the server is {}.{}; {}",
                conn.server_version() / 10000, conn.server_version() % 10000, kFailoverHelp);
  }
  auto res = conn.Exec("SELECT current_setting('synchronized_standby_slots')");
  if (!res) return std::unexpected(res.error());
  auto standby_slots = pg::Rows(res->get()).Text(0, 0);
  if (!standby_slots) return std::unexpected(standby_slots.error());
  if (standby_slots->empty()) {
    spdlog::warn(
        "--failover-slot: synchronized_standby_slots is empty on the primary, so the relay may "
        "publish transactions a standby has not received yet; after a failover to that standby "
        "they are gone from the database but not from Kafka. Set it to the standby's physical "
        "slot (outbox-relay check --standby-url says which)");
  }
  return Ok();
}

namespace {

// Where the timeline `previous` ends in the history of the server's, as far
// as both hold the same WAL (0 when the history cannot be read: nothing of
// the old timeline is marked then).
Lsn SharedBelow(pg::Connection& repl, const pg::SystemIdentity& identity, uint32_t previous) {
  Lsn shared_below(0);
  if (auto history = pg::ServerWalHistory(repl, identity); history) {
    for (const TimelineFork& fork : history->ancestors) {
      if (fork.timeline == previous) shared_below = fork.end;
    }
  } else {
    spdlog::warn("TIMELINE_HISTORY {}: {}; no transaction in flight is marked on it",
                 identity.timeline, history.error().message);
  }
  return shared_below;
}

}  // namespace

bool Relay::FollowPromotionAtStop() {
  if (timeline_ == 0) return false;
  auto repl = OpenReplication();
  if (!repl) {
    spdlog::warn("stopping: cannot read where the timelines part: {}", repl.error().message);
    return false;
  }
  auto identity = pg::IdentifySystem(*repl);
  if (!identity || identity->timeline == timeline_) return false;
  spdlog::warn(
      "stopping: the server writes timeline {}, the delivered transactions were read on "
      "timeline {} (a standby was promoted): those the two share are marked there, the others "
      "are sent again after the restart",
      identity->timeline, timeline_);
  marker_->FollowTimeline(identity->timeline, SharedBelow(*repl, *identity, timeline_));
  return true;
}

Status Relay::FollowPromotion(const pg::SystemIdentity& identity, pg::Connection& repl) {
  const uint32_t previous = timeline_;
  if (previous == 0 || previous == identity.timeline) {
    timeline_ = identity.timeline;
    if (marker_) marker_->ExpectTimeline(timeline_);
    return Ok();
  }
  spdlog::warn(
      "the server writes timeline {}, the relay streamed timeline {} before: a standby was "
      "promoted. Resuming from this server's copy of slot {}, not from {} (confirmed on the old "
      "primary)",
      identity.timeline, previous, config_.slot, tracker_->confirmed());
  // The transactions in flight that end where the two timelines still share
  // their WAL are the same transactions here and are marked here (the
  // marker reconnects by itself). Never the others: the promoted server
  // hands out again the transaction ids the old primary used past that
  // point, so such a transaction names, by (xid, offset), another row here,
  // and marking it would lose that row. The marker gives them back as
  // unmarkable, and the pipeline restarts: whatever of them this server has
  // comes again, from the slot or the backfill of a slot made anew.
  if (marker_) marker_->FollowTimeline(identity.timeline, SharedBelow(repl, identity, previous));
  Drain(std::chrono::seconds(30));
  if (!tracker_->empty()) {
    if (auto st = RestartPipeline("a standby was promoted"); !st) return st;
  }
  auto admin = pg::Connection::Open(config_.database_url, pg::Connection::Mode::kNormal,
                                    "outbox-relay", config_.pg_network);
  if (!admin) return std::unexpected(admin.error());
  auto slot = pg::QuerySlot(*admin, config_.slot);
  if (!slot) return std::unexpected(slot.error());
  timeline_ = identity.timeline;
  if (marker_) marker_->ExpectTimeline(timeline_);
  if (!slot->exists) {
    // START_REPLICATION reports it as lost; --on-slot-lost decides (SlotSetup).
    // Should another instance create it first, the stream starts where that
    // slot says: a position of the old timeline means nothing here (rows this
    // server wrote below it would be skipped).
    (void)tracker_->ResetConfirmed(kInvalidLsn);
    spdlog::error("slot {} does not exist on the promoted server: {}", config_.slot,
                  "it was not a failover slot synced to this standby (--failover-slot, "
                  "sync_replication_slots)");
    return Ok();
  }
  (void)tracker_->ResetConfirmed(slot->confirmed_flush_lsn);
  spdlog::info("slot {} on the promoted server: confirmed_flush_lsn {}{}", config_.slot,
               slot->confirmed_flush_lsn, slot->synced ? " (synced from the old primary)" : "");
  return Ok();
}

}  // namespace outbox_relay::app
