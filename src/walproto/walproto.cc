// The CopyBoth sub-protocol of streaming replication: one message per CopyData.
//
//   server_message := xlogdata | keepalive
//   xlogdata       := 'w' <dataStart>:Int64 <walEnd>:Int64 <sendTime>:Int64 Byte{rest}
//   keepalive      := 'k' <walEnd>:Int64 <sendTime>:Int64 <replyRequested>:Byte1(0|1)
//   status_update  := 'r' <write>:Int64 <flush>:Int64 <apply>:Int64 <sendTime>:Int64
//                     <replyRequested>:Byte1(0|1)
//
// XLogData's payload is everything after its header (a pgoutput message, decoded elsewhere).
// The fixed-size messages must be exactly their size: trailing bytes mean the framing is off,
// and a relay that keeps going on misframed data could confirm a wrong LSN. For the same
// reason replyRequested must be 0 or 1, the only values PostgreSQL sends.
//
// Errors are kProtocol with "<message>: <field> at byte <offset>: <what>".
#include "outbox_relay/walproto/walproto.h"

#include "outbox_relay/core/bytes.h"

namespace outbox_relay::walproto {

namespace {

std::string DescribeByte(uint8_t b) {
  if (b >= 0x20 && b < 0x7f) return fmt::format("'{}' (0x{:02X})", static_cast<char>(b), b);
  return fmt::format("0x{:02X}", b);
}

std::unexpected<Error> InContext(std::string_view message, const Error& e) {
  return Fail(ErrorCode::kProtocol, "{}: {}", message, e.message);
}

Result<Lsn> ReadLsn(ByteReader& r, std::string_view field) {
  auto v = r.U64(field);
  if (!v) return std::unexpected(std::move(v.error()));
  return Lsn(*v);
}

Result<bool> ReadReplyRequested(ByteReader& r) {
  size_t at = r.offset();
  auto v = r.U8("replyRequested");
  if (!v) return std::unexpected(std::move(v.error()));
  if (*v > 1) {
    return Fail(ErrorCode::kProtocol, "replyRequested at byte {}: must be 0 or 1, got {}", at, *v);
  }
  return *v == 1;
}

Status ExpectEnd(const ByteReader& r) {
  if (r.empty()) return Ok();
  return Fail(ErrorCode::kProtocol, "end of message at byte {}: {} trailing bytes", r.offset(),
              r.remaining());
}

Result<XLogData> DecodeXLogData(ByteReader& r) {
  XLogData m;
  auto start = ReadLsn(r, "dataStart");
  if (!start) return std::unexpected(std::move(start.error()));
  auto end = ReadLsn(r, "walEnd");
  if (!end) return std::unexpected(std::move(end.error()));
  auto time = r.I64("sendTime");
  if (!time) return std::unexpected(std::move(time.error()));
  m.wal_start = *start;
  m.wal_end = *end;
  m.send_time.micros = *time;
  m.data = r.Rest();
  return m;
}

Result<PrimaryKeepalive> DecodeKeepalive(ByteReader& r) {
  PrimaryKeepalive m;
  auto end = ReadLsn(r, "walEnd");
  if (!end) return std::unexpected(std::move(end.error()));
  auto time = r.I64("sendTime");
  if (!time) return std::unexpected(std::move(time.error()));
  auto reply = ReadReplyRequested(r);
  if (!reply) return std::unexpected(std::move(reply.error()));
  if (auto s = ExpectEnd(r); !s) return std::unexpected(std::move(s.error()));
  m.wal_end = *end;
  m.send_time.micros = *time;
  m.reply_requested = *reply;
  return m;
}

}  // namespace

Result<ServerMessage> DecodeServerMessage(std::string_view data) {
  ByteReader r(data);
  auto type = r.U8("message type");
  if (!type) return std::unexpected(std::move(type.error()));
  switch (*type) {
    case 'w': {
      auto m = DecodeXLogData(r);
      if (!m) return InContext("XLogData", m.error());
      return ServerMessage(*m);
    }
    case 'k': {
      auto m = DecodeKeepalive(r);
      if (!m) return InContext("PrimaryKeepalive", m.error());
      return ServerMessage(*m);
    }
    default:
      return Fail(ErrorCode::kProtocol,
                  "message type at byte 0: unknown replication message {} (expected 'w' or 'k')",
                  DescribeByte(*type));
  }
}

Result<StandbyStatusUpdate> DecodeStandbyStatusUpdate(std::string_view data) {
  ByteReader r(data);
  auto type = r.U8("message type");
  if (!type) return InContext("StandbyStatusUpdate", type.error());
  if (*type != 'r') {
    return Fail(ErrorCode::kProtocol,
                "StandbyStatusUpdate: message type at byte 0: expected 'r', got {}",
                DescribeByte(*type));
  }
  StandbyStatusUpdate m;
  for (auto [field, lsn] : {std::pair<std::string_view, Lsn*>{"write", &m.write},
                            {"flush", &m.flush},
                            {"apply", &m.apply}}) {
    auto v = ReadLsn(r, field);
    if (!v) return InContext("StandbyStatusUpdate", v.error());
    *lsn = *v;
  }
  auto time = r.I64("sendTime");
  if (!time) return InContext("StandbyStatusUpdate", time.error());
  m.send_time.micros = *time;
  auto reply = ReadReplyRequested(r);
  if (!reply) return InContext("StandbyStatusUpdate", reply.error());
  m.reply_requested = *reply;
  if (auto s = ExpectEnd(r); !s) return InContext("StandbyStatusUpdate", s.error());
  return m;
}

std::string Encode(const XLogData& m) {
  std::string out;
  out.reserve(1 + 3 * 8 + m.data.size());
  ByteWriter w(&out);
  w.U8('w');
  w.U64(m.wal_start.value());
  w.U64(m.wal_end.value());
  w.I64(m.send_time.micros);
  w.Bytes(m.data);
  return out;
}

std::string Encode(const PrimaryKeepalive& m) {
  std::string out;
  ByteWriter w(&out);
  w.U8('k');
  w.U64(m.wal_end.value());
  w.I64(m.send_time.micros);
  w.U8(m.reply_requested ? 1 : 0);
  return out;
}

std::string Encode(const StandbyStatusUpdate& m) {
  std::string out;
  ByteWriter w(&out);
  w.U8('r');
  w.U64(m.write.value());
  w.U64(m.flush.value());
  w.U64(m.apply.value());
  w.I64(m.send_time.micros);
  w.U8(m.reply_requested ? 1 : 0);
  return out;
}

}  // namespace outbox_relay::walproto
