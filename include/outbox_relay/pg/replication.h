// The logical replication stream (CopyBoth) and the slot/publication it reads.
//
// ReplicationStream never blocks on the socket: `TryRead` returns what libpq
// already has or nothing, `Wait` polls with a timeout. The caller decides when
// to read, which is how backpressure works: when the pipeline is full the
// relay stops calling `TryRead` (TCP then pushes back on the walsender) but
// keeps calling `SendStatus`, so the walsender's wal_sender_timeout never
// fires while we hold back.
#pragma once

#include <chrono>
#include <optional>
#include <string>
#include <string_view>

#include "outbox_relay/core/lsn.h"
#include "outbox_relay/core/result.h"
#include "outbox_relay/core/wal_history.h"
#include "outbox_relay/pg/connection.h"
#include "outbox_relay/walproto/walproto.h"

namespace outbox_relay::pg {

// A row of pg_replication_slots. Its columns differ by server version: 14 and
// 15 have wal_status (an invalidated slot shows "lost"); 16 adds `conflicting`
// (invalidated by a conflict with recovery on a standby) and reports every
// invalidation as wal_status "lost"; 17 adds `invalidation_reason`
// (wal_removed, rows_removed, wal_level_insufficient; 18 also idle_timeout),
// `failover` and `synced`. What a server does not have stays empty.
struct SlotInfo {
  bool exists = false;
  std::string plugin;
  std::string database;
  bool active = false;
  std::optional<int> active_pid;
  Lsn restart_lsn;
  Lsn confirmed_flush_lsn;
  std::string wal_status;                 // reserved, extended, unreserved, lost
  std::optional<int64_t> retained_bytes;  // pg_current_wal_lsn() - restart_lsn
  std::string invalidation_reason;        // 17+: why it was invalidated ("" if it was not)
  std::optional<bool> failover;           // 17+: created or altered with failover = true
  bool synced = false;                    // 17+: synced from a primary (a promoted standby's)
};

// Reads pg_replication_slots for `slot`.
Result<SlotInfo> QuerySlot(Connection& conn, std::string_view slot);

// "was invalidated (...)": why the slot is lost, in the words an operator can act on
// (invalidation_reason on 17+, wal_status before).
std::string DescribeInvalidation(const SlotInfo& slot);

// Where the physical standbys of a primary are (tracking::StandbyMarks):
// every walsender that is not a logical slot's reports what its standby has
// flushed, and every physical slot keeps the WAL its standby still needs.
struct StandbyPositions {
  Lsn written;                // pg_current_wal_insert_lsn() at the read
  std::optional<Lsn> lowest;  // the lowest of those positions; nullopt: no standby
  int hidden = 0;    // walsenders whose position this role cannot read (no pg_read_all_stats)
  int starting = 0;  // walsenders that have not reported a position yet (not a base backup's)
};
Result<StandbyPositions> ReadStandbyPositions(Connection& conn);

// IDENTIFY_SYSTEM on a replication connection: the cluster and the timeline
// it writes. A promoted standby writes a new timeline: positions a client
// confirmed on the old primary beyond the fork point mean nothing there.
struct SystemIdentity {
  std::string system_id;
  uint32_t timeline = 0;
  Lsn xlogpos;
};
Result<SystemIdentity> IdentifySystem(Connection& replication_conn);

// The server's WAL history now (core/wal_history.h): IDENTIFY_SYSTEM's
// timeline and, past the first, TIMELINE_HISTORY's file of it. `identity`:
// what IdentifySystem answered on this connection.
Result<WalHistory> ServerWalHistory(Connection& replication_conn, const SystemIdentity& identity);

struct CreatedSlot {
  Lsn consistent_point;
  std::string snapshot_name;  // set when created with an exported snapshot
};

// CREATE_REPLICATION_SLOT ... LOGICAL pgoutput on a replication connection.
// With `export_snapshot`, the snapshot stays valid until the next command on
// this connection. The option syntax depends on the server: 15+ takes
// `(SNAPSHOT 'export')`, 14 only the older `EXPORT_SNAPSHOT` keyword (and
// rejects the parenthesised list as a syntax error). `failover` (17+ only:
// kInvalidArgument before) makes it a failover slot, synced to standbys that
// run with sync_replication_slots = on.
Result<CreatedSlot> CreateSlot(Connection& replication_conn, std::string_view slot,
                               bool export_snapshot, bool failover = false);

// ALTER_REPLICATION_SLOT slot (FAILOVER true|false) on a replication
// connection (17+). The slot must not be in use.
Status AlterSlotFailover(Connection& replication_conn, std::string_view slot, bool failover);

// Wakes a thread in ReplicationStream::Wait from any other thread (an
// eventfd): the marker rings it when it has marked transactions, so the slot's
// new position goes out at once instead of at the loop's next wake-up.
class Doorbell {
 public:
  Doorbell();
  ~Doorbell();
  Doorbell(const Doorbell&) = delete;
  Doorbell& operator=(const Doorbell&) = delete;
  void Ring() const;
  // Readable while rung; -1 if the eventfd could not be made (then it never
  // rings, and Wait returns at its timeout as without one).
  int fd() const { return fd_; }
  // Unrings it (after a Wait it ended).
  void Clear() const;

 private:
  int fd_;
};

class ReplicationStream {
 public:
  // START_REPLICATION SLOT slot LOGICAL start (proto_version '1', publication_names ...).
  // `start` should be 0/0 (the slot's confirmed position) or the position the
  // relay has confirmed itself; never a merely received one.
  static Result<ReplicationStream> Start(Connection conn, std::string_view slot,
                                         std::string_view publication, Lsn start);

  ReplicationStream(ReplicationStream&&) = default;
  ReplicationStream& operator=(ReplicationStream&&) = default;

  // The next CopyData message if libpq has one, without blocking. The view is
  // valid until the next TryRead. Errors: the server ended the stream or the
  // connection broke.
  Result<std::optional<std::string_view>> TryRead();
  // Waits for the socket (readable, or writable while output is pending), or
  // for the doorbell, if one is set, to ring.
  Status Wait(std::chrono::milliseconds timeout, bool want_read = true);
  // Not owned; outlives the stream (nullptr: none).
  void set_doorbell(const Doorbell* doorbell) { doorbell_ = doorbell; }
  Status SendStatus(const walproto::StandbyStatusUpdate& update);
  // Bytes the kernel has received on the connection (TCP_INFO), read or
  // not: a slow stream (a large row on a thin link) is not a silent one.
  // nullopt where the socket cannot tell.
  std::optional<uint64_t> BytesReceived() const;
  // The walsender's process id (pg_stat_replication.pid, the slot's active_pid).
  int backend_pid() const { return PQbackendPID(conn_.get()); }
  // Sends CopyDone and consumes the rest of the stream (bounded by `timeout`).
  Status Finish(std::chrono::milliseconds timeout);

 private:
  explicit ReplicationStream(Connection conn) : conn_(std::move(conn)) {}
  Status FlushOutput();
  Error StreamEnded();

  Connection conn_;
  PqMemory current_;  // the buffer the last TryRead returned
  const Doorbell* doorbell_ = nullptr;
};

}  // namespace outbox_relay::pg
