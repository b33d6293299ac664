// SlotSetup: the slot's lifecycle before streaming — first start, snapshot
// backfill, and recovery from a lost slot (DESIGN §6).
//
// A logical slot only streams transactions that commit after its consistent
// point. Rows committed before it (the polling forwarder's backlog at
// migration, or everything unacked when a slot was lost) are found with the
// slot's exported snapshot: CREATE_REPLICATION_SLOT ... (SNAPSHOT 'export')
// gives a snapshot that sees exactly the transactions committed before the
// consistent point. It is imported once, `pg_current_snapshot()` is stored in
// outbox_relay.state, and
//   offset_acked IS NULL AND pg_visible_in_snapshot(transaction_id, <stored>)
// is published before streaming. The two sets are disjoint and together are
// every row. Because the snapshot is stored, a crash mid-backfill resumes
// from it, and rows already published and marked drop out by
// `offset_acked IS NULL`.
//
// One instance at a time sets a slot up: a per-slot advisory lock is held
// from the first look at the slot to the end of the backfill (kSlotInUse for
// the others: they are standbys). A kill between creating the slot and
// storing its snapshot leaves a `slot_creating` state row; the next setup
// drops that slot (it never streamed) and creates it again.
//
// Thread: the loop thread; backfilled rows go through the Publisher.
#pragma once

#include <functional>
#include <string>

#include "outbox_relay/core/result.h"
#include "outbox_relay/outbox/record.h"
#include "outbox_relay/pg/connection.h"
#include "outbox_relay/pg/replication.h"
#include "outbox_relay/pipeline/publisher.h"
#include "outbox_relay/pipeline/stats.h"
#include "outbox_relay/pipeline/stop.h"
#include "outbox_relay/tracking/ack_tracker.h"

namespace outbox_relay::pipeline {

// What becomes of a slot found missing or invalidated.
enum class OnSlotLost {
  kReconcile,  // recreate it and backfill the unacked rows
  kFail,       // stop with an error that says how to recover
};

struct SlotSetupOptions {
  std::string database_url;
  std::string replication_database_url;  // CREATE_REPLICATION_SLOT ("": database_url)
  pg::NetworkOptions network;            // timeouts (no statement timeout on replication)
  std::string slot;
  pg::QualifiedName table;
  outbox::ColumnNames columns;
  std::string acked_column = "offset_acked";
  bool mark = true;
  bool backfill = true;
  OnSlotLost on_slot_lost = OnSlotLost::kReconcile;
  int64_t backfill_batch = 5000;  // rows per keyset query
  bool failover_slot = false;     // create (or alter) the slot with failover = true (17+)
  // When set, the backfill of the stored snapshot (watermill mode:
  // WatermillTables::Backfill) instead of the seed table's.
  std::function<Status(pg::Connection&, const std::string& snapshot)> backfill_rows;
  // Called once the backfill is this instance's (the setup lock held), before
  // its first row: exactly-once initialises its transactions here, not while
  // it may still be another instance's standby.
  std::function<Status()> before_backfill;
};

class SlotSetup {
 public:
  SlotSetup(SlotSetupOptions options, Publisher* publisher, tracking::AckTracker* tracker,
            RelayStats* stats, StopSignal* stop);

  // Makes the slot ready to stream from: checks it, creates or recreates it,
  // and runs a pending backfill to its end (everything published and marked).
  // kSlotInUse: another instance is doing so. Ok with a stop request pending:
  // the backfill resumes from the stored snapshot next time.
  Status Run();

  // Called by a stream once START_REPLICATION has given it the slot (no other
  // instance can stream it then): Ok if the slot's setup is finished;
  // kSlotInUse while another instance still sets it up (the slot exists from
  // CREATE_REPLICATION_SLOT on, but until its backfill ends a stream would
  // publish newer rows before the backfill's older ones), or an instance died
  // doing so (Run resumes it). The caller drops the slot and runs Run next.
  Status EnsureFinished();

  // Counts a slot loss in the stats, once per loss (both the stream and the
  // setup see it, and the setup may be retried).
  void CountLoss();
  // The loss was recovered from: the next one counts again.
  void Recovered() { loss_counted_ = false; }

 private:
  Status Backfill(pg::Connection& conn, const std::string& snapshot);
  Status EnsureFailover(const pg::SlotInfo& slot);

  const SlotSetupOptions options_;
  Publisher* const publisher_;
  tracking::AckTracker* const tracker_;
  RelayStats* const stats_;
  StopSignal* const stop_;
  bool loss_counted_ = false;
  bool stalled_backfill_ = false;  // the stall-backfill test fault, once
};

}  // namespace outbox_relay::pipeline
