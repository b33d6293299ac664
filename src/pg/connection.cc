#include "outbox_relay/pg/connection.h"

#include <spdlog/spdlog.h>

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
  // dbname is expanded as a connection string/URI first; later keywords override it.
  std::string url_str(url);
  std::string app(application_name);
  std::vector<const char*> keys = {"dbname", "fallback_application_name"};
  std::vector<const char*> values = {url_str.c_str(), app.c_str()};
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
  return Connection(std::move(conn));
}

Result<ResultHandle> Connection::Exec(std::string_view sql) {
  std::string q(sql);
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
  ResultHandle res(PQexecParams(conn_.get(), q.c_str(), static_cast<int>(values.size()), nullptr,
                                values.data(), nullptr, nullptr, 0));
  ExecStatusType st = res ? PQresultStatus(res.get()) : PGRES_FATAL_ERROR;
  if (st != PGRES_COMMAND_OK && st != PGRES_TUPLES_OK) {
    return std::unexpected(ErrorFromResult(res.get(), conn_.get(), sql.substr(0, 80)));
  }
  return res;
}

std::optional<std::string_view> GetValue(const PGresult* res, int row, int col) {
  if (PQgetisnull(res, row, col)) return std::nullopt;
  return std::string_view(PQgetvalue(res, row, col),
                          static_cast<size_t>(PQgetlength(res, row, col)));
}

}  // namespace outbox_relay::pg
