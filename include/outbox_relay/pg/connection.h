// RAII libpq handles and a small synchronous SQL helper.
//
// Ownership: every libpq object is held by a unique_ptr with its libpq
// deleter; `Connection` is move-only. Errors come back as values whose code
// says what to do (see `ErrorFromResult`): lost connections are kTransient,
// "slot is active for PID" (55006) is kSlotInUse, missing privilege is
// kPermission.
#pragma once

#include <libpq-fe.h>

#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "outbox_relay/core/c_handle.h"
#include "outbox_relay/core/result.h"

namespace outbox_relay::pg {

using ConnHandle = CHandle<PGconn, PQfinish>;
using ResultHandle = CHandle<PGresult, PQclear>;
using PqMemory = CHandle<char, PQfreemem>;

// A schema-qualified table name, e.g. "public.outbox".
struct QualifiedName {
  std::string schema = "public";
  std::string name;

  // "outbox" -> public.outbox; "s.t" -> s.t; quoted parts ("My Schema"."t") are unquoted.
  static Result<QualifiedName> Parse(std::string_view text);
  std::string Quoted() const;  // "schema"."name"
  std::string ToString() const { return schema + "." + name; }
};

// Quotes an SQL identifier ("a""b") and a literal ('it''s').
std::string QuoteIdent(std::string_view ident);
std::string QuoteLiteral(std::string_view literal);

// Maps a failed result (or a connection without one) to an Error.
Error ErrorFromResult(const PGresult* res, PGconn* conn, std::string_view what);

class Connection {
 public:
  enum class Mode { kNormal, kReplication };

  // `url` is a libpq connection string or URI (DATABASE_URL). Replication
  // mode adds replication=database. `application_name` is set unless the URL has one.
  static Result<Connection> Open(std::string_view url, Mode mode,
                                 std::string_view application_name = "outbox-relay");

  Connection(Connection&&) = default;
  Connection& operator=(Connection&&) = default;

  // Runs a statement; error unless it returns PGRES_COMMAND_OK or PGRES_TUPLES_OK.
  Result<ResultHandle> Exec(std::string_view sql);
  // Text-format parameters; std::nullopt is SQL NULL.
  Result<ResultHandle> ExecParams(std::string_view sql,
                                  std::span<const std::optional<std::string>> params);

  PGconn* get() const { return conn_.get(); }
  bool ok() const { return conn_ && PQstatus(conn_.get()) == CONNECTION_OK; }
  int server_version() const { return PQserverVersion(conn_.get()); }
  std::string user() const { return PQuser(conn_.get()); }
  std::string database() const { return PQdb(conn_.get()); }

 private:
  explicit Connection(ConnHandle conn) : conn_(std::move(conn)) {}
  ConnHandle conn_;
};

// Value of row `row`, column `col`; std::nullopt for SQL NULL.
std::optional<std::string_view> GetValue(const PGresult* res, int row, int col);

}  // namespace outbox_relay::pg
