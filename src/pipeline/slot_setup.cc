#include "outbox_relay/pipeline/slot_setup.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <string>
#include <thread>
#include <utility>

#include "outbox_relay/core/failpoint.h"
#include "outbox_relay/pg/relay_schema.h"
#include "outbox_relay/pg/replication.h"
#include "outbox_relay/pg/rows.h"
#include "outbox_relay/pipeline/progress_report.h"

namespace outbox_relay::pipeline {

namespace {

constexpr const char* kSnapshotKey = pg::kStateBackfillSnapshot;
constexpr const char* kCreatedKey = pg::kStateSlotCreated;
constexpr const char* kCreatingKey = pg::kStateSlotCreating;

}  // namespace

SlotSetup::SlotSetup(SlotSetupOptions options, Publisher* publisher, tracking::AckTracker* tracker,
                     RelayStats* stats, StopSignal* stop)
    : options_(std::move(options)),
      publisher_(publisher),
      tracker_(tracker),
      stats_(stats),
      stop_(stop) {}

Status SlotSetup::EnsureFailover(const pg::SlotInfo& slot) {
  // With --failover-slot, a slot made before the flag was set gets it now.
  if (!options_.failover_slot || !slot.exists || slot.failover.value_or(true)) return Ok();
  auto repl = pg::Connection::Open(
      options_.replication_database_url.empty() ? options_.database_url
                                                : options_.replication_database_url,
      pg::Connection::Mode::kReplication, "outbox-relay", options_.network);
  if (!repl) return std::unexpected(repl.error());
  if (auto st = pg::AlterSlotFailover(*repl, options_.slot, true); !st) return st;
  spdlog::info(
      "slot {}: failover = true (--failover-slot): standbys with sync_replication_slots = on "
      "keep a copy",
      options_.slot);
  return Ok();
}

void SlotSetup::CountLoss() {
  if (!std::exchange(loss_counted_, true)) stats_->slot_lost.fetch_add(1);
}

Status SlotSetup::EnsureFinished() {
  auto conn = pg::Connection::Open(options_.database_url, pg::Connection::Mode::kNormal,
                                   "outbox-relay", options_.network);
  if (!conn) return std::unexpected(conn.error());
  // The creating key is written before the slot is created and deleted once
  // the snapshot is stored; the snapshot key stays until the backfill ends.
  // From the slot's creation to the backfill's end one of them is there.
  for (const char* key : {kCreatingKey, kSnapshotKey}) {
    auto value = pg::ReadState(*conn, options_.slot, key);
    if (!value) return std::unexpected(value.error());
    if (value->has_value()) {
      return Fail(ErrorCode::kSlotInUse,
                  "slot {} is being set up ({} is stored: its backfill has not ended); a stream "
                  "now would publish newer rows before the backfill's older ones",
                  options_.slot, key);
    }
  }
  return Ok();
}

Status SlotSetup::Run() {
  auto conn = pg::Connection::Open(options_.database_url, pg::Connection::Mode::kNormal,
                                   "outbox-relay", options_.network);
  if (!conn) return std::unexpected(conn.error());
  auto slot = pg::QuerySlot(*conn, options_.slot);
  if (!slot) return std::unexpected(slot.error());
  if (slot->exists && !slot->database.empty() && slot->database != conn->database()) {
    // Slot names are unique per cluster, not per database: waiting for this
    // one as a standby would wait for ever, publishing nothing.
    return Fail(ErrorCode::kInvalidArgument,
                "invalid setting --slot (OUTBOX_SLOT): replication slot {} belongs to database "
                "{}, not to {}: slot names are shared by all databases of a cluster, so the "
                "relay of each database needs its own (e.g. --slot outbox_relay_{})",
                options_.slot, slot->database, conn->database(), conn->database());
  }
  auto created_before = pg::ReadState(*conn, options_.slot, kCreatedKey);
  if (!created_before) return std::unexpected(created_before.error());

  // One instance at a time sets the slot up: creates it, stores its snapshot
  // and runs the backfill. A hot standby started together with the active
  // instance would otherwise run the same backfill beside it (every backlog
  // row published twice). The lock is a session-level advisory lock on
  // `conn`: held until this function returns, released too when the
  // instance dies, so a successor resumes the backfill from the stored
  // snapshot. Everything below reads the state under the lock.
  auto locked = pg::TrySlotSetupLock(*conn, options_.slot);
  if (!locked) return std::unexpected(locked.error());
  if (!*locked) {
    return Fail(ErrorCode::kSlotInUse,
                "slot {} is being set up by another instance (created, or backfilled)",
                options_.slot);
  }
  auto creating = pg::ReadState(*conn, options_.slot, kCreatingKey);
  if (!creating) return std::unexpected(creating.error());

  // A kill between CREATE_REPLICATION_SLOT and storing the slot's snapshot
  // leaves a slot that no stored snapshot matches: used as it is, the unacked
  // rows committed before it would never be published (the slot does not send
  // them, and there is no snapshot to backfill them from). Such a slot never
  // streamed (streaming starts after setup), so drop it and create it again.
  // We hold the setup lock, so its creator is gone.
  bool unfinished = slot->exists && creating->has_value() && slot->wal_status != "lost";
  if (unfinished) {
    spdlog::warn(
        "replication slot {} was created by an instance that stopped before it stored the "
        "slot's snapshot: dropping it and creating it again, so that the backfill covers every "
        "row committed before it",
        options_.slot);
    std::optional<std::string> params[] = {options_.slot};
    auto dropped = conn->ExecParams("SELECT pg_drop_replication_slot($1)", params);
    if (!dropped) return std::unexpected(dropped.error());
    slot->exists = false;
  }

  bool invalidated = slot->exists && slot->wal_status == "lost";
  // (A slot we just dropped as unfinished is not lost: if it was being
  // recreated after a loss, that loss was reported then.)
  bool lost = !unfinished && (invalidated || (!slot->exists && created_before->has_value()));
  if (slot->exists && slot->plugin != "pgoutput") {
    return Fail(ErrorCode::kInvalidArgument,
                "invalid setting --slot (OUTBOX_SLOT): slot {} uses plugin {}, not pgoutput",
                options_.slot, slot->plugin);
  }
  if (lost) {
    std::string why = invalidated ? pg::DescribeInvalidation(*slot) : "is missing (dropped?)";
    if (options_.on_slot_lost != OnSlotLost::kReconcile) {
      return Fail(ErrorCode::kSlotLost,
                  "replication slot {} {}. Rows committed while it was gone are not lost (they "
                  "are still unacked in {}); restart with OUTBOX_ON_SLOT_LOST=reconcile to "
                  "recreate the slot and publish them",
                  options_.slot, why, options_.table.ToString());
    }
    spdlog::error("replication slot {} {}: recreating it and backfilling the unacked rows",
                  options_.slot, why);
    CountLoss();
    if (invalidated) {
      std::optional<std::string> params[] = {options_.slot};
      auto dropped = conn->ExecParams("SELECT pg_drop_replication_slot($1)", params);
      if (!dropped) return std::unexpected(dropped.error());
    }
  }

  if (!slot->exists || invalidated) {
    // No statement timeout here: the slot's creation waits for the
    // transactions running at that moment to end, however long they take.
    auto repl = pg::Connection::Open(
        options_.replication_database_url.empty() ? options_.database_url
                                                  : options_.replication_database_url,
        pg::Connection::Mode::kReplication, "outbox-relay", options_.network);
    if (!repl) return std::unexpected(repl.error());
    bool backfill = options_.backfill && options_.mark;
    if (backfill) {
      if (auto st = pg::WriteState(*conn, options_.slot, kCreatingKey, "creating"); !st) return st;
    }
    auto created =
        pg::CreateSlot(*repl, options_.slot, /*export_snapshot=*/backfill, options_.failover_slot);
    if (!created) {
      // Another instance may have won the race to create it: then it is the
      // active one and we are its standby.
      auto again = pg::QuerySlot(*conn, options_.slot);
      if (again && again->exists) {
        return Fail(ErrorCode::kSlotInUse, "slot {} was just created by another instance",
                    options_.slot);
      }
      return std::unexpected(created.error());
    }
    spdlog::info("created replication slot {} at {}", options_.slot, created->consistent_point);
    if (backfill) {
      // Import the exported snapshot and keep it in a form that survives us.
      std::string sql = fmt::format(
          "BEGIN ISOLATION LEVEL REPEATABLE READ; SET TRANSACTION SNAPSHOT {}; "
          "SELECT pg_current_snapshot()::text",
          pg::QuoteLiteral(created->snapshot_name));
      auto snap = conn->Exec(sql);
      if (!snap) return std::unexpected(snap.error());
      std::string printed(*pg::GetValue(snap->get(), 0, 0));
      if (auto c = conn->Exec("COMMIT"); !c) return std::unexpected(c.error());
      std::string snapshot = pg::PortableSnapshot(printed);
      if (snapshot != printed) {
        spdlog::info("the slot's snapshot {} has xmin above xmax: kept as {}, which sees the same",
                     printed, snapshot);
      }
      if (auto st = pg::WriteState(*conn, options_.slot, kSnapshotKey, snapshot); !st) return st;
      spdlog::info("stored the slot's snapshot {} for the backfill", snapshot);
    } else if (!options_.mark) {
      spdlog::warn("--mark=false: no backfill of rows committed before the slot");
    }
    if (auto st =
            pg::WriteState(*conn, options_.slot, kCreatedKey, created->consistent_point.ToString());
        !st) {
      return st;
    }
    // The snapshot is stored: from here a restart resumes the backfill.
    if (auto st = pg::DeleteState(*conn, options_.slot, kCreatingKey); !st) return st;
    // The exported snapshot lives until the next command on `repl`; it is
    // stored now, so the connection can go.
    slot = pg::QuerySlot(*conn, options_.slot);
    if (!slot) return std::unexpected(slot.error());
  }

  if (auto st = EnsureFailover(*slot); !st) return st;
  if (!tracker_->ResetConfirmed(slot->confirmed_flush_lsn)) {
    return Fail(ErrorCode::kFatal, "internal: slot setup with rows still in flight");
  }
  spdlog::info("slot {}: confirmed_flush_lsn {}, wal_status {}", options_.slot,
               slot->confirmed_flush_lsn, slot->wal_status);

  auto snapshot = pg::ReadState(*conn, options_.slot, kSnapshotKey);
  if (!snapshot) return std::unexpected(snapshot.error());
  if (snapshot->has_value()) {
    // Stored by an older build without the correction.
    **snapshot = pg::PortableSnapshot(**snapshot);
    if (options_.before_backfill) {
      if (auto st = options_.before_backfill(); !st) return st;
    }
    publisher_->SetBackfill(**snapshot);
    if constexpr (failpoint::kCompiledIn) {
      if (auto secs = failpoint::Active("stall-backfill"); secs && !stalled_backfill_) {
        stalled_backfill_ = true;
        spdlog::warn("TEST FAULT stall-backfill: {} s before the backfill's first row", *secs);
        std::this_thread::sleep_for(std::chrono::seconds(std::stoi(std::string(*secs))));
      }
    }
    if (auto st = options_.backfill_rows ? options_.backfill_rows(*conn, **snapshot)
                                         : Backfill(*conn, **snapshot);
        !st) {
      return st;
    }
    if (stop_->requested()) return Ok();  // resumes from the stored snapshot next time
    if (auto st = pg::DeleteState(*conn, options_.slot, kSnapshotKey); !st) return st;
    publisher_->SetBackfill(std::nullopt);
  }
  return Ok();
}

Status SlotSetup::Backfill(pg::Connection& conn, const std::string& snapshot) {
  const auto& c = options_.columns;
  const std::string xid = pg::QuoteIdent(c.transaction_id);
  const std::string off = pg::QuoteIdent(c.offset);
  // Keyset pagination in (transaction_id, offset) order: bounded memory and
  // an index scan on the primary key. xid order is not commit order; for rows
  // older than the slot there is nothing better to go by.
  std::string sql = fmt::format(
      "SELECT * FROM {table} WHERE {acked} IS NULL "
      "AND pg_visible_in_snapshot({xid}, $1::pg_snapshot) "
      "AND ({xid}, {off}) > ($2::xid8, $3::bigint) ORDER BY {xid}, {off} LIMIT {limit}",
      fmt::arg("table", options_.table.Quoted()), fmt::arg("limit", options_.backfill_batch),
      fmt::arg("acked", pg::QuoteIdent(options_.acked_column)), fmt::arg("xid", xid),
      fmt::arg("off", off));
  std::optional<std::string> params[] = {snapshot, std::string("0"), std::string("-1")};
  uint64_t rows = 0;
  uint64_t transactions = 0;
  auto started = std::chrono::steady_clock::now();
  spdlog::info("backfill: publishing unacked rows committed before the slot (snapshot {})",
               snapshot);
  // Short keyset queries: JIT compilation would cost more than it saves.
  (void)conn.Exec("SET jit = off");
  // The total, for the progress and outbox_relay_backfill_rows_estimated: the
  // partial index on unacked rows (check recommends it) makes it cheap. Rows
  // marked meanwhile by a previous instance's run make it an upper bound.
  std::optional<uint64_t> total;
  {
    std::string count_sql = fmt::format(
        "SELECT count(*) FROM {table} WHERE {acked} IS NULL "
        "AND pg_visible_in_snapshot({xid}, $1::pg_snapshot)",
        fmt::arg("table", options_.table.Quoted()),
        fmt::arg("acked", pg::QuoteIdent(options_.acked_column)), fmt::arg("xid", xid));
    std::optional<std::string> count_params[] = {snapshot};
    Result<int64_t> n = std::unexpected(Error{});
    if (auto counted = conn.ExecParams(count_sql, count_params); counted) {
      n = pg::Rows(counted->get()).Int(0, 0);
    } else {
      n = std::unexpected(counted.error());
    }
    if (n) {
      total = static_cast<uint64_t>(std::max<int64_t>(*n, 0));
      stats_->backfill_estimated.store(*total, std::memory_order_relaxed);
      spdlog::info("backfill: {} unacked rows to publish", *total);
    } else {
      spdlog::warn("backfill: counting the rows to publish: {}; going on without a total",
                   n.error().message);
    }
  }
  ProgressReport progress("backfill", total, /*estimated=*/false);
  pgoutput::TupleData tuple;
  while (!stop_->requested()) {
    stats_->Beat();
    auto res = conn.ExecParams(sql, params);
    if (!res) return std::unexpected(res.error());
    PGresult* r = res->get();
    int n = PQntuples(r);
    if (n == 0) break;
    auto columns = outbox::ColumnMap::Resolve(pg::RelationOf(r), c);
    if (!columns) return std::unexpected(columns.error());
    tracking::Transaction* tx = nullptr;
    std::string_view tx_id;
    for (int i = 0; i < n; ++i) {
      pg::TupleOf(r, i, &tuple);
      std::string_view row_tx = *pg::GetValue(r, i, columns->transaction_id);
      if (tx == nullptr || row_tx != tx_id) {
        // One tracker transaction per writing transaction, so marking works
        // as in streaming; no commit LSN, so it never moves the slot.
        if (tx != nullptr) tracker_->Commit(tx, kInvalidLsn);
        tx = tracker_->Begin(kInvalidLsn, PgTimestamp{}, 0);
        tx_id = row_tx;
        ++transactions;
      }
      while (publisher_->Backpressured() && !tracker_->failure() && !stop_->requested()) {
        stats_->Beat();
        Status st = publisher_->DeadLetterRefused(nullptr);
        if (st) st = publisher_->Tick();  // exactly-once: a commit in progress ends
        if (!st) {
          tracker_->Commit(tx, kInvalidLsn);  // what it produced is exact (marked by key)
          return st;
        }
        tracker_->WaitForProgress(std::chrono::milliseconds(2));
      }
      if (stop_->requested()) break;  // resumes from the stored snapshot next time
      Status produced = publisher_->MapAndProduce(*columns, tuple, tx, nullptr);
      if (produced) produced = publisher_->Tick();  // exactly-once: commit when due
      if (auto st = produced; !st) {
        // The rows produced so far are marked (by key) once Kafka has them;
        // the rest comes again from the stored snapshot.
        tracker_->Commit(tx, kInvalidLsn);
        return st;
      }
      ++rows;
      stats_->backfilled.fetch_add(1, std::memory_order_relaxed);
    }
    progress.Update(rows);  // per page: the clock is read once a page
    if (tx != nullptr) tracker_->Commit(tx, kInvalidLsn);
    params[1] = std::string(*pg::GetValue(r, n - 1, columns->transaction_id));
    params[2] = std::string(*pg::GetValue(r, n - 1, columns->offset));
    if (n < options_.backfill_batch) break;
  }
  // Exactly-once: the last rows' Kafka transaction commits now.
  if (auto st = publisher_->FinishTransaction(std::chrono::milliseconds(60000), nullptr); !st) {
    return st;
  }
  // Everything published and marked before the stream starts: the backfilled
  // rows committed before anything the slot will send.
  while (!tracker_->WaitEmpty(std::chrono::milliseconds(1000))) {
    stats_->Beat();
    if (auto failure = tracker_->failure())
      return Fail(ErrorCode::kFatal, "backfill: {}", *failure);
    if (stop_->requested()) break;
    if (auto st = publisher_->DeadLetterRefused(nullptr); !st) return st;
    spdlog::info("backfill: waiting for {} rows in flight", tracker_->rows_in_flight());
  }
  progress.Finish(rows);
  auto secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  spdlog::info("backfill: {} rows in {} transactions published in {:.1f} s", rows, transactions,
               secs);
  return Ok();
}

}  // namespace outbox_relay::pipeline
