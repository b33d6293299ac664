#include "outbox_relay/pg/connection.h"

#include <poll.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>

namespace outbox_relay::pg {

namespace {

// Unquotes one part of a qualified name; unquoted parts fold to lower case
// as PostgreSQL does.
Result<std::string> ParseIdentPart(std::string_view part, std::string_view whole) {
  if (part.empty()) return Fail(ErrorCode::kInvalidArgument, "invalid table name '{}'", whole);
  if (part.front() == '"') {
    if (part.size() < 2 || part.back() != '"') {
      return Fail(ErrorCode::kInvalidArgument, "invalid table name '{}': unbalanced quote", whole);
    }
    std::string out;
    for (size_t i = 1; i + 1 < part.size(); ++i) {
      if (part[i] == '"') {
        // Inside quotes a quote is written twice; a single one ends the
        // identifier, so anything after it (the `b"` of `"a"b"`) is garbage.
        if (i + 2 >= part.size() || part[i + 1] != '"') {
          return Fail(ErrorCode::kInvalidArgument,
                      "invalid table name '{}': a quote inside a quoted name must be doubled "
                      "(\"\")",
                      whole);
        }
        ++i;
      }
      out.push_back(part[i]);
    }
    if (out.empty()) {
      return Fail(ErrorCode::kInvalidArgument, "invalid table name '{}': empty quoted name", whole);
    }
    return out;
  }
  if (part.find('"') != std::string_view::npos) {
    return Fail(ErrorCode::kInvalidArgument,
                "invalid table name '{}': a quote in an unquoted name (quote the whole part)",
                whole);
  }
  std::string out(part);
  for (char& c : out) {
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  }
  return out;
}

// What to fix when a connection attempt fails for a reason retrying cannot
// cure: TLS verification and authentication. Empty for everything else (a
// refused connection, a server starting up, a broken TLS session are retried).
std::string_view ConnectFailureSetting(std::string_view msg) {
  if (msg.find("certificate verify failed") != std::string_view::npos ||
      msg.find("root certificate file") != std::string_view::npos ||
      msg.find("certificate present, but not private key") != std::string_view::npos) {
    return "the server's certificate does not verify against the CA in sslrootcert (with "
           "sslmode=verify-ca or verify-full): point sslrootcert at the CA that signed it";
  }
  if (msg.find("does not match host name") != std::string_view::npos) {
    return "the host name is not in the server's certificate (sslmode=verify-full): connect by "
           "a name the certificate lists, or fix the certificate";
  }
  if (msg.find("server does not support SSL") != std::string_view::npos ||
      msg.find("SSL is not enabled on the server") != std::string_view::npos) {
    return "sslmode requires TLS, but the server does not offer it";
  }
  if (msg.find("password authentication failed") != std::string_view::npos ||
      msg.find("no password supplied") != std::string_view::npos ||
      msg.find("SCRAM authentication") != std::string_view::npos) {
    return "the server refused the credentials: check the user and password (in the URL, "
           "PGPASSWORD or a passfile)";
  }
  if (msg.find("no pg_hba.conf entry") != std::string_view::npos) {
    return "pg_hba.conf admits no such connection (host, user, database, TLS): add a line for it";
  }
  return {};
}

}  // namespace

Result<QualifiedName> QualifiedName::Parse(std::string_view text) {
  // Find the dot that separates schema and name, outside quotes.
  bool quoted = false;
  size_t dot = std::string_view::npos;
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '"') quoted = !quoted;
    if (text[i] == '.' && !quoted) {
      if (dot != std::string_view::npos) {
        return Fail(ErrorCode::kInvalidArgument, "invalid table name '{}': too many dots", text);
      }
      dot = i;
    }
  }
  QualifiedName out;
  if (dot == std::string_view::npos) {
    auto name = ParseIdentPart(text, text);
    if (!name) return std::unexpected(name.error());
    out.name = *name;
    return out;
  }
  auto schema = ParseIdentPart(text.substr(0, dot), text);
  if (!schema) return std::unexpected(schema.error());
  auto name = ParseIdentPart(text.substr(dot + 1), text);
  if (!name) return std::unexpected(name.error());
  out.schema = *schema;
  out.name = *name;
  return out;
}

std::string QualifiedName::Quoted() const { return QuoteIdent(schema) + "." + QuoteIdent(name); }

std::string QuoteIdent(std::string_view ident) {
  std::string out = "\"";
  for (char c : ident) {
    if (c == '"') out.push_back('"');
    out.push_back(c);
  }
  out.push_back('"');
  return out;
}

std::string QuoteLiteral(std::string_view literal) {
  // standard_conforming_strings is on (the default since 9.1): only ' needs doubling.
  std::string out = "'";
  for (char c : literal) {
    if (c == '\'') out.push_back('\'');
    out.push_back(c);
  }
  out.push_back('\'');
  return out;
}

Error ErrorFromResult(const PGresult* res, PGconn* conn, std::string_view what) {
  std::string message;
  const char* sqlstate = nullptr;
  if (res != nullptr) {
    sqlstate = PQresultErrorField(res, PG_DIAG_SQLSTATE);
    message = PQresultErrorMessage(res);
  }
  if (message.empty() && conn != nullptr) message = PQerrorMessage(conn);
  while (!message.empty() && (message.back() == '\n' || message.back() == ' ')) message.pop_back();
  std::string text = fmt::format("{}: {}", what, message);
  if (sqlstate != nullptr) text += fmt::format(" (SQLSTATE {})", sqlstate);

  ErrorCode code = ErrorCode::kFatal;
  std::string_view state = sqlstate ? sqlstate : "";
  if (conn != nullptr && PQstatus(conn) == CONNECTION_BAD) {
    code = ErrorCode::kTransient;
  } else if (state == "55006") {
    code = ErrorCode::kSlotInUse;  // replication slot is active for another PID
  } else if (state == "42501") {
    code = ErrorCode::kPermission;
  } else if (state == "23505") {
    code = ErrorCode::kDuplicateKey;  // unique_violation
  } else if (state.starts_with("08") || state.starts_with("57P") || state == "53300" ||
             state == "40001" || state == "40P01" || state == "55P03") {
    // connection exceptions, admin shutdown / crash recovery, too many
    // connections, serialization failure, deadlock, lock not available
    code = ErrorCode::kTransient;
  } else if (state == "42704" && message.find("replication slot") != std::string::npos) {
    code = ErrorCode::kSlotLost;  // slot does not exist
  } else if (state == "55000" && (message.find("invalidated") != std::string::npos ||
                                  message.find("can no longer get changes") != std::string::npos ||
                                  message.find("can no longer access") != std::string::npos)) {
    // 14 to 17: "can no longer get changes from replication slot"; 18: "can
    // no longer access replication slot" with the reason in the detail.
    code = ErrorCode::kSlotLost;
  } else if (sqlstate == nullptr) {
    code = ErrorCode::kTransient;  // no server error at all: the connection broke
  }
  return Error{code, std::move(text)};
}

Result<Connection> Connection::Open(std::string_view url, Mode mode,
                                    std::string_view application_name) {
  return Open(url, mode, application_name, NetworkOptions{});
}

Result<Connection> Connection::Open(std::string_view url, Mode mode,
                                    std::string_view application_name,
                                    const NetworkOptions& network) {
  // Keywords are applied in order and the last one wins; dbname is expanded
  // as a connection string/URI in its place. So the network defaults go
  // before it (the URL's own settings win) and the rest after it.
  std::string url_str(url);
  std::string app(application_name);
  std::vector<std::pair<const char*, std::string>> defaults;
  auto add = [&](const char* key, int value) {
    if (value > 0) defaults.emplace_back(key, std::to_string(value));
  };
  add("connect_timeout", network.connect_timeout_s);
  add("tcp_user_timeout", network.tcp_user_timeout_ms);
  if (network.keepalives_idle_s > 0 || network.keepalives_interval_s > 0 ||
      network.keepalives_count > 0) {
    add("keepalives", 1);
  }
  add("keepalives_idle", network.keepalives_idle_s);
  add("keepalives_interval", network.keepalives_interval_s);
  add("keepalives_count", network.keepalives_count);
  std::vector<const char*> keys;
  std::vector<const char*> values;
  for (const auto& [key, value] : defaults) {
    keys.push_back(key);
    values.push_back(value.c_str());
  }
  keys.push_back("dbname");
  values.push_back(url_str.c_str());
  keys.push_back("fallback_application_name");
  values.push_back(app.c_str());
  if (mode == Mode::kReplication) {
    keys.push_back("replication");
    values.push_back("database");
  }
  keys.push_back(nullptr);
  values.push_back(nullptr);
  ConnHandle conn(PQconnectdbParams(keys.data(), values.data(), /*expand_dbname=*/1));
  if (!conn) return Fail(ErrorCode::kTransient, "connect: out of memory");
  if (PQstatus(conn.get()) != CONNECTION_OK) {
    std::string msg = PQerrorMessage(conn.get());
    while (!msg.empty() && msg.back() == '\n') msg.pop_back();
    ErrorCode code = ErrorCode::kTransient;
    if (msg.find("permission denied") != std::string::npos ||
        msg.find("must be superuser or replication role") != std::string::npos ||
        msg.find("no pg_hba.conf entry for replication") != std::string::npos) {
      code = ErrorCode::kPermission;
    }
    if (msg.find("invalid connection option") != std::string::npos ||
        msg.find("invalid URI") != std::string::npos ||
        msg.find("missing \"=\"") != std::string::npos) {
      code = ErrorCode::kInvalidArgument;
    }
    std::string_view fix = code == ErrorCode::kTransient ? ConnectFailureSetting(msg) : "";
    if (!fix.empty()) {
      // Also a replication connection the server refuses while the normal
      // one worked: the same URL, so the same setting.
      return Fail(ErrorCode::kInvalidArgument,
                  "invalid setting --database-url (DATABASE_URL): connect to PostgreSQL{}: {}: {}",
                  mode == Mode::kReplication ? " (replication)" : "", msg, fix);
    }
    return Fail(code, "connect to PostgreSQL{}: {}",
                mode == Mode::kReplication ? " (replication)" : "", msg);
  }
  // Server notices ("relation already exists, skipping") are not errors;
  // keep them out of stderr unless debugging.
  PQsetNoticeProcessor(
      conn.get(),
      [](void*, const char* message) {
        std::string_view m(message);
        while (!m.empty() && m.back() == '\n') m.remove_suffix(1);
        spdlog::debug("postgres: {}", m);
      },
      nullptr);
  Connection out(std::move(conn));
  if (mode == Mode::kNormal && network.statement_timeout.count() > 0) {
    // The server cancels a statement that runs too long (locks, a slow
    // disk); the client gives up a little later, when the network dropped
    // the statement or its answer and the server never saw or never told.
    out.set_deadline(network.statement_timeout + kStatementGrace);
    auto set =
        out.Exec(fmt::format("SET statement_timeout = {}", network.statement_timeout.count()));
    if (!set) return std::unexpected(set.error());
  }
  return out;
}

namespace {

using Clock = std::chrono::steady_clock;

enum class Wait { kReady, kTimedOut, kAborted };

// Waits until the socket is ready for `events`, `until` passes, or *abort
// turns true (looked at every 100 ms).
Wait WaitSocket(PGconn* conn, short events, Clock::time_point until,
                const std::atomic<bool>* abort) {
  pollfd pfd{PQsocket(conn), events, 0};
  if (pfd.fd < 0) return Wait::kReady;  // libpq reports the broken connection
  const int64_t slice = abort != nullptr ? 100 : 1000;
  while (true) {
    if (abort != nullptr && abort->load()) return Wait::kAborted;
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - Clock::now());
    if (left.count() <= 0) return Wait::kTimedOut;
    int rc = ::poll(&pfd, 1, static_cast<int>(std::min<int64_t>(left.count(), slice)));
    if (rc > 0 || (rc < 0 && errno != EINTR)) return Wait::kReady;
  }
}

bool Succeeded(const PGresult* res) {
  ExecStatusType st = res ? PQresultStatus(res) : PGRES_FATAL_ERROR;
  return st == PGRES_COMMAND_OK || st == PGRES_TUPLES_OK;
}

}  // namespace

template <typename Send>
Result<ResultHandle> Connection::Run(std::string_view what, Send send) {
  if (!conn_) {
    return Fail(ErrorCode::kTransient,
                "{}: the connection was closed after a statement got no answer", what);
  }
  PGconn* c = conn_.get();
  auto timed_out = [&]() -> std::unexpected<Error> {
    conn_.reset();  // a statement is still pending on it: nothing else can follow
    return Fail(ErrorCode::kTransient,
                "{}: no answer from PostgreSQL within {} ms; connection closed (the network may "
                "be dropping packets)",
                what, deadline_.count());
  };
  auto gave_up = [&](Wait why) -> std::unexpected<Error> {
    if (why == Wait::kTimedOut) return timed_out();
    conn_.reset();
    return Fail(ErrorCode::kCancelled,
                "{}: stopped while waiting for PostgreSQL's answer; connection closed", what);
  };
  auto until = deadline_.count() > 0 ? Clock::now() + deadline_ : Clock::time_point::max();
  if (PQsetnonblocking(c, 1) != 0) {
    return std::unexpected(ErrorFromResult(nullptr, c, what));
  }
  if (send(c) != 1) {
    PQsetnonblocking(c, 0);
    return std::unexpected(ErrorFromResult(nullptr, c, what));
  }
  int flushed = 0;
  while ((flushed = PQflush(c)) == 1) {
    if (Wait w = WaitSocket(c, POLLIN | POLLOUT, until, abort_); w != Wait::kReady) {
      return gave_up(w);
    }
    if (PQconsumeInput(c) == 0) break;
  }
  // As PQexec: the last result, or the first error (execution stops there).
  ResultHandle first_error;
  ResultHandle last;
  while (flushed >= 0) {
    while (PQisBusy(c) != 0) {
      if (Wait w = WaitSocket(c, POLLIN, until, abort_); w != Wait::kReady) return gave_up(w);
      if (PQconsumeInput(c) == 0) break;
    }
    ResultHandle res(PQgetResult(c));
    if (!res) break;
    ExecStatusType st = PQresultStatus(res.get());
    bool copy = st == PGRES_COPY_IN || st == PGRES_COPY_OUT || st == PGRES_COPY_BOTH;
    if (!Succeeded(res.get()) && !copy && !first_error) {
      first_error = std::move(res);
    } else {
      last = std::move(res);
    }
    if (copy) break;
  }
  PQsetnonblocking(c, 0);
  ResultHandle res = first_error ? std::move(first_error) : std::move(last);
  if (!Succeeded(res.get())) return std::unexpected(ErrorFromResult(res.get(), c, what));
  return res;
}

Result<ResultHandle> Connection::Exec(std::string_view sql) {
  std::string q(sql);
  if (deadline_.count() > 0 || abort_ != nullptr || !conn_) {
    return Run(sql.substr(0, 80), [&](PGconn* c) { return PQsendQuery(c, q.c_str()); });
  }
  ResultHandle res(PQexec(conn_.get(), q.c_str()));
  ExecStatusType st = res ? PQresultStatus(res.get()) : PGRES_FATAL_ERROR;
  if (st != PGRES_COMMAND_OK && st != PGRES_TUPLES_OK) {
    return std::unexpected(ErrorFromResult(res.get(), conn_.get(), sql.substr(0, 80)));
  }
  return res;
}

Result<ResultHandle> Connection::ExecParams(std::string_view sql,
                                            std::span<const std::optional<std::string>> params) {
  std::string q(sql);
  std::vector<const char*> values;
  values.reserve(params.size());
  for (const auto& p : params) values.push_back(p ? p->c_str() : nullptr);
  if (deadline_.count() > 0 || abort_ != nullptr || !conn_) {
    return Run(sql.substr(0, 80), [&](PGconn* c) {
      return PQsendQueryParams(c, q.c_str(), static_cast<int>(values.size()), nullptr,
                               values.data(), nullptr, nullptr, 0);
    });
  }
  ResultHandle res(PQexecParams(conn_.get(), q.c_str(), static_cast<int>(values.size()), nullptr,
                                values.data(), nullptr, nullptr, 0));
  ExecStatusType st = res ? PQresultStatus(res.get()) : PGRES_FATAL_ERROR;
  if (st != PGRES_COMMAND_OK && st != PGRES_TUPLES_OK) {
    return std::unexpected(ErrorFromResult(res.get(), conn_.get(), sql.substr(0, 80)));
  }
  return res;
}

Status Connection::Prepare(std::string_view name_view, std::string_view sql, int n_params) {
  std::string name(name_view);
  std::string q(sql);
  if (deadline_.count() > 0 || abort_ != nullptr || !conn_) {
    auto res = Run("prepare " + name, [&](PGconn* c) {
      return PQsendPrepare(c, name.c_str(), q.c_str(), n_params, nullptr);
    });
    if (!res) return std::unexpected(res.error());
    return Ok();
  }
  ResultHandle res(PQprepare(conn_.get(), name.c_str(), q.c_str(), n_params, nullptr));
  if (!res || PQresultStatus(res.get()) != PGRES_COMMAND_OK) {
    return std::unexpected(ErrorFromResult(res.get(), conn_.get(), "prepare " + name));
  }
  return Ok();
}

Result<ResultHandle> Connection::ExecPrepared(std::string_view name_view,
                                              std::span<const char* const> params) {
  std::string name(name_view);
  if (deadline_.count() > 0 || abort_ != nullptr || !conn_) {
    return Run(name, [&](PGconn* c) {
      return PQsendQueryPrepared(c, name.c_str(), static_cast<int>(params.size()), params.data(),
                                 nullptr, nullptr, 0);
    });
  }
  ResultHandle res(PQexecPrepared(conn_.get(), name.c_str(), static_cast<int>(params.size()),
                                  params.data(), nullptr, nullptr, 0));
  if (!Succeeded(res.get())) {
    return std::unexpected(ErrorFromResult(res.get(), conn_.get(), name));
  }
  return res;
}

std::optional<std::string_view> GetValue(const PGresult* res, int row, int col) {
  if (PQgetisnull(res, row, col)) return std::nullopt;
  return std::string_view(PQgetvalue(res, row, col),
                          static_cast<size_t>(PQgetlength(res, row, col)));
}

}  // namespace outbox_relay::pg
