// Slot lifecycle: first start, snapshot backfill, and recovery from a lost slot.
//
// A logical slot only streams transactions that commit after its consistent
// point. Rows committed before it (the polling forwarder's backlog at
// migration, or everything unacked when a slot was lost) are found with the
// slot's exported snapshot: CREATE_REPLICATION_SLOT ... (SNAPSHOT 'export')
// gives a snapshot that sees exactly the transactions committed before the
// consistent point. We import it once, store `pg_current_snapshot()` in
// outbox_relay.state, and publish
//   offset_acked IS NULL AND pg_visible_in_snapshot(transaction_id, <stored>)
// before streaming. The two sets are disjoint and together are every row.
// Because the snapshot is stored, a crash mid-backfill resumes from it, and
// rows already published and marked drop out by `offset_acked IS NULL`.
#include <spdlog/spdlog.h>

#include <thread>
#include <utility>

#include "outbox_relay/app/failover.h"
#include "outbox_relay/app/relay.h"
#include "outbox_relay/app/replay.h"
#include "outbox_relay/pg/relay_schema.h"

namespace outbox_relay::app {

namespace {

constexpr const char* kSnapshotKey = pg::kStateBackfillSnapshot;
constexpr const char* kCreatedKey = pg::kStateSlotCreated;
constexpr const char* kCreatingKey = pg::kStateSlotCreating;

Result<std::optional<std::string>> ReadState(pg::Connection& conn, const std::string& slot,
                                             const char* key) {
  std::optional<std::string> params[] = {slot, std::string(key)};
  auto res = conn.ExecParams(
      "SELECT value FROM outbox_relay.state WHERE slot_name = $1 AND key = $2", params);
  if (!res) return std::unexpected(res.error());
  if (PQntuples(res->get()) == 0) return std::optional<std::string>();
  return std::optional<std::string>(std::string(*pg::GetValue(res->get(), 0, 0)));
}

Status WriteState(pg::Connection& conn, const std::string& slot, const char* key,
                  const std::string& value) {
  std::optional<std::string> params[] = {slot, std::string(key), value};
  auto res = conn.ExecParams(
      "INSERT INTO outbox_relay.state (slot_name, key, value) VALUES ($1, $2, $3) "
      "ON CONFLICT (slot_name, key) DO UPDATE SET value = EXCLUDED.value, updated_at = NOW()",
      params);
  if (!res) return std::unexpected(res.error());
  return Ok();
}

Status DeleteState(pg::Connection& conn, const std::string& slot, const char* key) {
  std::optional<std::string> params[] = {slot, std::string(key)};
  auto res =
      conn.ExecParams("DELETE FROM outbox_relay.state WHERE slot_name = $1 AND key = $2", params);
  if (!res) return std::unexpected(res.error());
  return Ok();
}

// A session-level advisory lock per slot, held by the instance that creates
// the slot until its snapshot is stored (released when the session ends, so
// also when the instance dies).
Result<bool> TryCreationLock(pg::Connection& conn, const std::string& slot) {
  std::optional<std::string> params[] = {slot};
  auto res = conn.ExecParams(
      "SELECT pg_try_advisory_lock(hashtext('outbox_relay.slot_creation'), hashtext($1))", params);
  if (!res) return std::unexpected(res.error());
  return *pg::GetValue(res->get(), 0, 0) == "t";
}

}  // namespace

Status Relay::SetupSlot(const std::atomic<bool>& stop) {
  auto conn = pg::Connection::Open(config_.database_url, pg::Connection::Mode::kNormal);
  if (!conn) return std::unexpected(conn.error());
  auto slot = pg::QuerySlot(*conn, config_.slot);
  if (!slot) return std::unexpected(slot.error());
  auto created_before = ReadState(*conn, config_.slot, kCreatedKey);
  if (!created_before) return std::unexpected(created_before.error());

  auto creating = ReadState(*conn, config_.slot, kCreatingKey);
  if (!creating) return std::unexpected(creating.error());

  // A kill between CREATE_REPLICATION_SLOT and storing the slot's snapshot
  // leaves a slot that no stored snapshot matches: used as it is, the unacked
  // rows committed before it would never be published (the slot does not send
  // them, and there is no snapshot to backfill them from). Such a slot never
  // streamed (streaming starts after setup), so drop it and create it again.
  // The creator holds an advisory lock until the snapshot is stored: if we
  // cannot take it, the creator is alive and we are its standby.
  bool unfinished = slot->exists && creating->has_value() && slot->wal_status != "lost";
  if (unfinished) {
    auto locked = TryCreationLock(*conn, config_.slot);
    if (!locked) return std::unexpected(locked.error());
    if (!*locked) {
      return Fail(ErrorCode::kSlotInUse, "slot {} is being created by another instance",
                  config_.slot);
    }
    spdlog::warn(
        "replication slot {} was created by an instance that stopped before it stored the "
        "slot's snapshot: dropping it and creating it again, so that the backfill covers every "
        "row committed before it",
        config_.slot);
    std::optional<std::string> params[] = {config_.slot};
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
                config_.slot, slot->plugin);
  }
  if (lost) {
    std::string why = invalidated ? pg::DescribeInvalidation(*slot) : "is missing (dropped?)";
    if (config_.on_slot_lost != "reconcile") {
      return Fail(ErrorCode::kSlotLost,
                  "replication slot {} {}. Rows committed while it was gone are not lost (they "
                  "are still unacked in {}); restart with OUTBOX_ON_SLOT_LOST=reconcile to "
                  "recreate the slot and publish them",
                  config_.slot, why, config_.table_name.ToString());
    }
    spdlog::error("replication slot {} {}: recreating it and backfilling the unacked rows",
                  config_.slot, why);
    if (!std::exchange(slot_loss_counted_, true)) stats_.slot_lost.fetch_add(1);
    if (invalidated) {
      std::optional<std::string> params[] = {config_.slot};
      auto dropped = conn->ExecParams("SELECT pg_drop_replication_slot($1)", params);
      if (!dropped) return std::unexpected(dropped.error());
    }
  }

  if (!slot->exists || invalidated) {
    auto repl = pg::Connection::Open(config_.database_url, pg::Connection::Mode::kReplication);
    if (!repl) return std::unexpected(repl.error());
    bool backfill = config_.backfill && config_.mark;
    if (backfill) {
      // Held on `conn` until it closes (after the snapshot is stored).
      auto locked = TryCreationLock(*conn, config_.slot);
      if (!locked) return std::unexpected(locked.error());
      if (!*locked) {
        return Fail(ErrorCode::kSlotInUse, "slot {} is being created by another instance",
                    config_.slot);
      }
      if (auto st = WriteState(*conn, config_.slot, kCreatingKey, "creating"); !st) return st;
    }
    auto created =
        pg::CreateSlot(*repl, config_.slot, /*export_snapshot=*/backfill, config_.failover_slot);
    if (!created) {
      // Another instance may have won the race to create it: then it is the
      // active one and we are its standby.
      auto again = pg::QuerySlot(*conn, config_.slot);
      if (again && again->exists) {
        return Fail(ErrorCode::kSlotInUse, "slot {} was just created by another instance",
                    config_.slot);
      }
      return std::unexpected(created.error());
    }
    spdlog::info("created replication slot {} at {}", config_.slot, created->consistent_point);
    if (backfill) {
      // Import the exported snapshot and keep it in a form that survives us.
      std::string sql = fmt::format(
          "BEGIN ISOLATION LEVEL REPEATABLE READ; SET TRANSACTION SNAPSHOT {}; "
          "SELECT pg_current_snapshot()::text",
          pg::QuoteLiteral(created->snapshot_name));
      auto snap = conn->Exec(sql);
      if (!snap) return std::unexpected(snap.error());
      std::string snapshot(*pg::GetValue(snap->get(), 0, 0));
      if (auto c = conn->Exec("COMMIT"); !c) return std::unexpected(c.error());
      if (auto st = WriteState(*conn, config_.slot, kSnapshotKey, snapshot); !st) return st;
      spdlog::info("stored the slot's snapshot {} for the backfill", snapshot);
    } else if (!config_.mark) {
      spdlog::warn("--mark=false: no backfill of rows committed before the slot");
    }
    if (auto st =
            WriteState(*conn, config_.slot, kCreatedKey, created->consistent_point.ToString());
        !st) {
      return st;
    }
    // The snapshot is stored: from here a restart resumes the backfill.
    if (auto st = DeleteState(*conn, config_.slot, kCreatingKey); !st) return st;
    // The exported snapshot lives until the next command on `repl`; it is
    // stored now, so the connection can go.
    slot = pg::QuerySlot(*conn, config_.slot);
    if (!slot) return std::unexpected(slot.error());
  }

  if (auto st = EnsureSlotFailover(config_, *slot); !st) return st;
  if (!tracker_->ResetConfirmed(slot->confirmed_flush_lsn)) {
    return Fail(ErrorCode::kFatal, "internal: slot setup with rows still in flight");
  }
  spdlog::info("slot {}: confirmed_flush_lsn {}, wal_status {}", config_.slot,
               slot->confirmed_flush_lsn, slot->wal_status);

  auto snapshot = ReadState(*conn, config_.slot, kSnapshotKey);
  if (!snapshot) return std::unexpected(snapshot.error());
  if (snapshot->has_value()) {
    if (auto st = Backfill(*conn, **snapshot, stop); !st) return st;
    if (stop.load()) return Ok();  // resumes from the stored snapshot next time
    if (auto st = DeleteState(*conn, config_.slot, kSnapshotKey); !st) return st;
  }
  return Ok();
}

Status Relay::Backfill(pg::Connection& conn, const std::string& snapshot,
                       const std::atomic<bool>& stop) {
  const auto& c = config_.columns;
  const std::string xid = pg::QuoteIdent(c.transaction_id);
  const std::string off = pg::QuoteIdent(c.offset);
  // Keyset pagination in (transaction_id, offset) order: bounded memory and
  // an index scan on the primary key. xid order is not commit order; for rows
  // older than the slot there is nothing better to go by.
  std::string sql = fmt::format(
      "SELECT * FROM {table} WHERE {acked} IS NULL "
      "AND pg_visible_in_snapshot({xid}, $1::pg_snapshot) "
      "AND ({xid}, {off}) > ($2::xid8, $3::bigint) ORDER BY {xid}, {off} LIMIT 5000",
      fmt::arg("table", config_.table_name.Quoted()),
      fmt::arg("acked", pg::QuoteIdent(config_.acked_column)), fmt::arg("xid", xid),
      fmt::arg("off", off));
  std::optional<std::string> params[] = {snapshot, std::string("0"), std::string("-1")};
  uint64_t rows = 0;
  uint64_t transactions = 0;
  auto started = std::chrono::steady_clock::now();
  spdlog::info("backfill: publishing unacked rows committed before the slot (snapshot {})",
               snapshot);
  // Short keyset queries: JIT compilation would cost more than it saves.
  (void)conn.Exec("SET jit = off");
  pgoutput::TupleData tuple;
  while (!stop.load()) {
    stats_.Beat();
    auto res = conn.ExecParams(sql, params);
    if (!res) return std::unexpected(res.error());
    PGresult* r = res->get();
    int n = PQntuples(r);
    if (n == 0) break;
    auto columns = outbox::ColumnMap::Resolve(RelationFromResult(r), c);
    if (!columns) return std::unexpected(columns.error());
    tracking::Transaction* tx = nullptr;
    std::string_view tx_id;
    for (int i = 0; i < n; ++i) {
      TupleFromResult(r, i, &tuple);
      std::string_view row_tx = *pg::GetValue(r, i, columns->transaction_id);
      if (tx == nullptr || row_tx != tx_id) {
        // One tracker transaction per writing transaction, so marking works
        // as in streaming; no commit LSN, so it never moves the slot.
        if (tx != nullptr) tracker_->Commit(tx, kInvalidLsn);
        tx = tracker_->Begin(kInvalidLsn, PgTimestamp{}, 0);
        tx_id = row_tx;
        ++transactions;
      }
      while (tracker_->rows_in_flight() >= config_.max_in_flight && !tracker_->failure()) {
        stats_.Beat();
        tracker_->WaitForProgress(std::chrono::milliseconds(2));
      }
      if (auto st = MapAndProduce(*columns, tuple, tx, nullptr); !st) {
        tracker_->Abandon(tx);
        return st;
      }
      ++rows;
      stats_.backfilled.fetch_add(1, std::memory_order_relaxed);
    }
    if (tx != nullptr) tracker_->Commit(tx, kInvalidLsn);
    params[1] = std::string(*pg::GetValue(r, n - 1, columns->transaction_id));
    params[2] = std::string(*pg::GetValue(r, n - 1, columns->offset));
    if (n < 5000) break;
  }
  // Everything published and marked before the stream starts: the backfilled
  // rows committed before anything the slot will send.
  while (!tracker_->WaitEmpty(std::chrono::milliseconds(1000))) {
    stats_.Beat();
    if (auto failure = tracker_->failure())
      return Fail(ErrorCode::kFatal, "backfill: {}", *failure);
    if (stop.load()) break;
    spdlog::info("backfill: waiting for {} rows in flight", tracker_->rows_in_flight());
  }
  auto secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  spdlog::info("backfill: {} rows in {} transactions published in {:.1f} s", rows, transactions,
               secs);
  return Ok();
}

}  // namespace outbox_relay::app
