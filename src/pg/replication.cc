#include "outbox_relay/pg/replication.h"

#include <linux/tcp.h>  // struct tcp_info with tcpi_bytes_received (not in glibc's)
#include <netinet/in.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstddef>
#include <cstring>

namespace outbox_relay::pg {

namespace {

Lsn ParseLsnOrZero(std::optional<std::string_view> text) {
  if (!text) return kInvalidLsn;
  auto lsn = Lsn::Parse(*text);
  return lsn ? *lsn : kInvalidLsn;
}

}  // namespace

Result<SlotInfo> QuerySlot(Connection& conn, std::string_view slot) {
  std::optional<std::string> params[] = {std::string(slot)};
  // Columns that only newer servers have come out as NULL before.
  const bool v17 = conn.server_version() >= 170000;
  std::string sql = fmt::format(
      "SELECT plugin, database, active, active_pid, restart_lsn, confirmed_flush_lsn, "
      "wal_status, (pg_current_wal_lsn() - restart_lsn)::bigint, {} "
      "FROM pg_replication_slots WHERE slot_name = $1",
      v17 ? "invalidation_reason, failover, synced" : "NULL::text, NULL::bool, false");
  auto res = conn.ExecParams(sql, params);
  if (!res) return std::unexpected(res.error());
  SlotInfo info;
  PGresult* r = res->get();
  if (PQntuples(r) == 0) return info;
  info.exists = true;
  info.plugin = GetValue(r, 0, 0).value_or("");
  info.database = GetValue(r, 0, 1).value_or("");
  info.active = GetValue(r, 0, 2).value_or("f") == "t";
  if (auto pid = GetValue(r, 0, 3)) {
    int v = 0;
    std::from_chars(pid->data(), pid->data() + pid->size(), v);
    info.active_pid = v;
  }
  info.restart_lsn = ParseLsnOrZero(GetValue(r, 0, 4));
  info.confirmed_flush_lsn = ParseLsnOrZero(GetValue(r, 0, 5));
  info.wal_status = GetValue(r, 0, 6).value_or("");
  if (auto bytes = GetValue(r, 0, 7)) {
    int64_t v = 0;
    std::from_chars(bytes->data(), bytes->data() + bytes->size(), v);
    info.retained_bytes = v;
  }
  info.invalidation_reason = GetValue(r, 0, 8).value_or("");
  if (auto failover = GetValue(r, 0, 9)) info.failover = *failover == "t";
  info.synced = GetValue(r, 0, 10).value_or("f") == "t";
  return info;
}

Result<StandbyPositions> ReadStandbyPositions(Connection& conn) {
  // A walsender's positions are NULL to a role without pg_read_all_stats
  // (its state too), and while it sends a base backup (state 'backup').
  static constexpr const char* kSql =
      "WITH senders AS ("
      " SELECT r.state, r.flush_lsn FROM pg_stat_replication r"
      " WHERE NOT EXISTS (SELECT 1 FROM pg_replication_slots s"
      "  WHERE s.active_pid = r.pid AND s.slot_type = 'logical'))"
      " SELECT pg_current_wal_insert_lsn()::text,"
      " (SELECT min(lsn)::text FROM ("
      "   SELECT flush_lsn AS lsn FROM senders WHERE flush_lsn IS NOT NULL"
      "   UNION ALL SELECT restart_lsn FROM pg_replication_slots"
      "   WHERE slot_type = 'physical' AND restart_lsn IS NOT NULL"
      "   AND wal_status IS DISTINCT FROM 'lost') p),"
      " (SELECT count(*) FROM senders WHERE state IS NULL)::text,"
      " (SELECT count(*) FROM senders WHERE flush_lsn IS NULL"
      "  AND state IS NOT NULL AND state <> 'backup')::text";
  auto res = conn.Exec(kSql);
  if (!res) return std::unexpected(res.error());
  PGresult* r = res->get();
  StandbyPositions out;
  out.written = ParseLsnOrZero(GetValue(r, 0, 0));
  if (auto lowest = GetValue(r, 0, 1)) out.lowest = ParseLsnOrZero(lowest);
  std::string_view hidden = GetValue(r, 0, 2).value_or("0");
  std::from_chars(hidden.data(), hidden.data() + hidden.size(), out.hidden);
  std::string_view starting = GetValue(r, 0, 3).value_or("0");
  std::from_chars(starting.data(), starting.data() + starting.size(), out.starting);
  return out;
}

std::string DescribeInvalidation(const SlotInfo& slot) {
  const std::string& reason = slot.invalidation_reason;
  if (reason == "wal_removed" || (reason.empty() && slot.wal_status == "lost")) {
    return "was invalidated (wal_status=lost; the WAL it needed is gone, see "
           "max_slot_wal_keep_size)";
  }
  if (reason == "idle_timeout") {
    return "was invalidated (invalidation_reason=idle_timeout: it stayed inactive longer than "
           "idle_replication_slot_timeout)";
  }
  if (reason == "rows_removed") {
    return "was invalidated (invalidation_reason=rows_removed: catalog rows it needed were "
           "vacuumed away; on a standby, turn on hot_standby_feedback with a physical slot)";
  }
  if (reason == "wal_level_insufficient") {
    return "was invalidated (invalidation_reason=wal_level_insufficient: wal_level was lowered "
           "below logical)";
  }
  return fmt::format("was invalidated (wal_status={}{})", slot.wal_status,
                     reason.empty() ? "" : ", invalidation_reason=" + reason);
}

Result<SystemIdentity> IdentifySystem(Connection& replication_conn) {
  auto res = replication_conn.Exec("IDENTIFY_SYSTEM");
  if (!res) return std::unexpected(res.error());
  // Columns: systemid, timeline, xlogpos, dbname.
  SystemIdentity out;
  out.system_id = std::string(GetValue(res->get(), 0, 0).value_or(""));
  std::string_view tli = GetValue(res->get(), 0, 1).value_or("0");
  std::from_chars(tli.data(), tli.data() + tli.size(), out.timeline);
  out.xlogpos = ParseLsnOrZero(GetValue(res->get(), 0, 2));
  return out;
}

Result<WalHistory> ServerWalHistory(Connection& replication_conn, const SystemIdentity& identity) {
  if (identity.timeline <= 1) return WalHistory{identity.timeline, {}};
  auto res = replication_conn.Exec(fmt::format("TIMELINE_HISTORY {}", identity.timeline));
  if (!res) return std::unexpected(res.error());
  // Columns: filename, content.
  auto content = GetValue(res->get(), 0, 1);
  if (!content) {
    return Fail(ErrorCode::kProtocol, "TIMELINE_HISTORY {}: no content", identity.timeline);
  }
  return ParseTimelineHistory(identity.timeline, *content);
}

Result<CreatedSlot> CreateSlot(Connection& replication_conn, std::string_view slot,
                               bool export_snapshot, bool failover) {
  const int version = replication_conn.server_version();
  if (failover && version < 170000) {
    return Fail(ErrorCode::kInvalidArgument,
                "a failover slot needs PostgreSQL 17 or newer (the server is {})", version);
  }
  std::string sql;
  if (version >= 150000) {
    sql = fmt::format("CREATE_REPLICATION_SLOT {} LOGICAL pgoutput (SNAPSHOT '{}'{})",
                      QuoteIdent(slot), export_snapshot ? "export" : "nothing",
                      failover ? ", FAILOVER true" : "");
  } else {
    sql = fmt::format("CREATE_REPLICATION_SLOT {} LOGICAL pgoutput {}", QuoteIdent(slot),
                      export_snapshot ? "EXPORT_SNAPSHOT" : "NOEXPORT_SNAPSHOT");
  }
  auto res = replication_conn.Exec(sql);
  if (!res) {
    Error e = res.error();
    if (e.code == ErrorCode::kPermission) {
      e.message += fmt::format(
          "\nThe relay's role needs the REPLICATION attribute to create the slot. Run as a "
          "superuser:\n  ALTER ROLE {} REPLICATION;\nor create the slot yourself:\n  SELECT "
          "pg_create_logical_replication_slot({}, 'pgoutput');",
          QuoteIdent(replication_conn.user()), QuoteLiteral(slot));
    }
    return std::unexpected(std::move(e));
  }
  // Columns: slot_name, consistent_point, snapshot_name, output_plugin.
  CreatedSlot out;
  out.consistent_point = ParseLsnOrZero(GetValue(res->get(), 0, 1));
  out.snapshot_name = std::string(GetValue(res->get(), 0, 2).value_or(""));
  return out;
}

Status AlterSlotFailover(Connection& replication_conn, std::string_view slot, bool failover) {
  if (replication_conn.server_version() < 170000) {
    return Fail(ErrorCode::kInvalidArgument,
                "a failover slot needs PostgreSQL 17 or newer (the server is {})",
                replication_conn.server_version());
  }
  auto res = replication_conn.Exec(fmt::format("ALTER_REPLICATION_SLOT {} (FAILOVER {})",
                                               QuoteIdent(slot), failover ? "true" : "false"));
  if (!res) return std::unexpected(res.error());
  return Ok();
}

Result<ReplicationStream> ReplicationStream::Start(Connection conn, std::string_view slot,
                                                   std::string_view publication, Lsn start) {
  // publication_names is a list of identifiers inside a string literal.
  std::string sql =
      fmt::format("START_REPLICATION SLOT {} LOGICAL {} (proto_version '1', publication_names {})",
                  QuoteIdent(slot), start, QuoteLiteral(QuoteIdent(publication)));
  ResultHandle res(PQexec(conn.get(), sql.c_str()));
  if (!res || PQresultStatus(res.get()) != PGRES_COPY_BOTH) {
    return std::unexpected(ErrorFromResult(res.get(), conn.get(), "START_REPLICATION"));
  }
  if (PQsetnonblocking(conn.get(), 1) != 0) {
    return Fail(ErrorCode::kTransient, "set non-blocking: {}", PQerrorMessage(conn.get()));
  }
  return ReplicationStream(std::move(conn));
}

Result<std::optional<std::string_view>> ReplicationStream::TryRead() {
  current_.reset();
  char* buf = nullptr;
  int n = PQgetCopyData(conn_.get(), &buf, /*async=*/1);
  if (n == 0) {
    // Nothing complete in libpq's buffer: pull what the socket has.
    if (PQconsumeInput(conn_.get()) == 0) {
      return Fail(ErrorCode::kTransient, "replication connection: {}", PQerrorMessage(conn_.get()));
    }
    n = PQgetCopyData(conn_.get(), &buf, 1);
  }
  if (n > 0) {
    current_.reset(buf);
    return std::optional<std::string_view>(std::string_view(buf, static_cast<size_t>(n)));
  }
  if (n == 0) return std::optional<std::string_view>();
  return std::unexpected(StreamEnded());
}

Error ReplicationStream::StreamEnded() {
  // -1: the server ended the COPY; the reason is in the following result.
  ResultHandle res(PQgetResult(conn_.get()));
  if (res && PQresultStatus(res.get()) == PGRES_COMMAND_OK) {
    return Error{ErrorCode::kTransient, "the server ended the replication stream"};
  }
  return ErrorFromResult(res.get(), conn_.get(), "replication stream");
}

Doorbell::Doorbell() : fd_(eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) {}

Doorbell::~Doorbell() {
  if (fd_ >= 0) close(fd_);
}

void Doorbell::Ring() const {
  if (fd_ < 0) return;
  const uint64_t one = 1;
  // Fails only when the counter is full: rung already.
  [[maybe_unused]] ssize_t n = write(fd_, &one, sizeof one);
}

void Doorbell::Clear() const {
  if (fd_ < 0) return;
  uint64_t count = 0;
  [[maybe_unused]] ssize_t n = read(fd_, &count, sizeof count);  // EAGAIN: not rung
}

Status ReplicationStream::Wait(std::chrono::milliseconds timeout, bool want_read) {
  pollfd pfd[2] = {};
  pfd[0].fd = PQsocket(conn_.get());
  if (pfd[0].fd < 0) return Fail(ErrorCode::kTransient, "replication connection has no socket");
  pfd[0].events = want_read ? POLLIN : 0;
  if (PQisBusy(conn_.get()) || PQflush(conn_.get()) == 1) pfd[0].events |= POLLOUT;
  if (pfd[0].events == 0) pfd[0].events = POLLIN;
  const bool bell = doorbell_ != nullptr && doorbell_->fd() >= 0;
  if (bell) pfd[1] = pollfd{doorbell_->fd(), POLLIN, 0};
  int rc = poll(pfd, bell ? 2 : 1, static_cast<int>(timeout.count()));
  if (rc < 0 && errno != EINTR) {
    return Fail(ErrorCode::kTransient, "poll replication socket: {}", std::strerror(errno));
  }
  if (bell && (pfd[1].revents & POLLIN)) doorbell_->Clear();
  if (pfd[0].revents & POLLOUT) return FlushOutput();
  return Ok();
}

Status ReplicationStream::FlushOutput() {
  if (PQflush(conn_.get()) < 0) {
    return Fail(ErrorCode::kTransient, "send to the server: {}", PQerrorMessage(conn_.get()));
  }
  return Ok();
}

Status ReplicationStream::SendStatus(const walproto::StandbyStatusUpdate& update) {
  std::string msg = walproto::Encode(update);
  if (PQputCopyData(conn_.get(), msg.data(), static_cast<int>(msg.size())) != 1) {
    return Fail(ErrorCode::kTransient, "send standby status: {}", PQerrorMessage(conn_.get()));
  }
  return FlushOutput();
}

std::optional<uint64_t> ReplicationStream::BytesReceived() const {
  int fd = PQsocket(conn_.get());
  if (fd < 0) return std::nullopt;
  tcp_info info{};
  socklen_t len = sizeof(info);
  if (::getsockopt(fd, IPPROTO_TCP, TCP_INFO, &info, &len) != 0 ||
      len < offsetof(tcp_info, tcpi_bytes_received) + sizeof(info.tcpi_bytes_received)) {
    return std::nullopt;  // not TCP (a unix socket), or an old kernel
  }
  return info.tcpi_bytes_received;
}

Status ReplicationStream::Finish(std::chrono::milliseconds timeout) {
  if (PQputCopyEnd(conn_.get(), nullptr) != 1) {
    return Fail(ErrorCode::kTransient, "send CopyDone: {}", PQerrorMessage(conn_.get()));
  }
  auto deadline = std::chrono::steady_clock::now() + timeout;
  // Drain what the server still sends until it answers our CopyDone.
  while (std::chrono::steady_clock::now() < deadline) {
    if (PQflush(conn_.get()) < 0) break;
    if (PQconsumeInput(conn_.get()) == 0) break;
    char* buf = nullptr;
    int n = 0;
    while ((n = PQgetCopyData(conn_.get(), &buf, 1)) > 0) PQfreemem(buf);
    if (n == -1 || n == -2) break;
    pollfd pfd{PQsocket(conn_.get()), POLLIN, 0};
    poll(&pfd, 1, 50);
  }
  // Collect the final results without blocking on a server that went quiet.
  while (PQconsumeInput(conn_.get()) != 0 && !PQisBusy(conn_.get())) {
    ResultHandle res(PQgetResult(conn_.get()));
    if (!res) break;
  }
  return Ok();
}

}  // namespace outbox_relay::pg
