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
#include "outbox_relay/pg/connection.h"
#include "outbox_relay/walproto/walproto.h"

namespace outbox_relay::pg {

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
};

// Reads pg_replication_slots for `slot`.
Result<SlotInfo> QuerySlot(Connection& conn, std::string_view slot);

struct CreatedSlot {
  Lsn consistent_point;
  std::string snapshot_name;  // set when created with an exported snapshot
};

// CREATE_REPLICATION_SLOT ... LOGICAL pgoutput on a replication connection.
// With `export_snapshot`, the snapshot stays valid until the next command on
// this connection.
Result<CreatedSlot> CreateSlot(Connection& replication_conn, std::string_view slot,
                               bool export_snapshot);

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
  // Waits for the socket (readable, or writable while output is pending).
  Status Wait(std::chrono::milliseconds timeout, bool want_read = true);
  Status SendStatus(const walproto::StandbyStatusUpdate& update);
  // Sends CopyDone and consumes the rest of the stream (bounded by `timeout`).
  Status Finish(std::chrono::milliseconds timeout);

 private:
  explicit ReplicationStream(Connection conn) : conn_(std::move(conn)) {}
  Status FlushOutput();
  Error StreamEnded();

  Connection conn_;
  PqMemory current_;  // the buffer the last TryRead returned
};

}  // namespace outbox_relay::pg
