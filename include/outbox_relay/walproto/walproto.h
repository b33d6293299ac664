// The CopyBoth sub-protocol of streaming replication.
//
// Server -> client (CopyData):
//   'w' XLogData:          Int64 dataStart, Int64 walEnd, Int64 sendTime, Byte[n] data
//   'k' PrimaryKeepalive:  Int64 walEnd, Int64 sendTime, Byte1 replyRequested
// Client -> server (CopyData):
//   'r' StandbyStatusUpdate: Int64 write, Int64 flush, Int64 apply, Int64 sendTime,
//                            Byte1 replyRequested
// Times are microseconds since 2000-01-01 UTC.
#pragma once

#include <string>
#include <string_view>
#include <variant>

#include "outbox_relay/core/lsn.h"
#include "outbox_relay/core/pg_time.h"
#include "outbox_relay/core/result.h"

namespace outbox_relay::walproto {

struct XLogData {
  Lsn wal_start;
  Lsn wal_end;
  PgTimestamp send_time;
  std::string_view data;  // points into the decoded buffer
};

struct PrimaryKeepalive {
  Lsn wal_end;
  PgTimestamp send_time;
  bool reply_requested = false;
};

struct StandbyStatusUpdate {
  Lsn write;
  Lsn flush;
  Lsn apply;
  PgTimestamp send_time;
  bool reply_requested = false;
};

using ServerMessage = std::variant<XLogData, PrimaryKeepalive>;

Result<ServerMessage> DecodeServerMessage(std::string_view data);
Result<StandbyStatusUpdate> DecodeStandbyStatusUpdate(std::string_view data);

std::string Encode(const XLogData& m);
std::string Encode(const PrimaryKeepalive& m);
std::string Encode(const StandbyStatusUpdate& m);

}  // namespace outbox_relay::walproto
