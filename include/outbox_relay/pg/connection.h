// RAII libpq handles and a small synchronous SQL helper.
//
// Ownership: every libpq object is held by a unique_ptr with its libpq
// deleter; `Connection` is move-only. Errors come back as values whose code
// says what to do (see `ErrorFromResult`): lost connections are kTransient,
// "slot is active for PID" (55006) is kSlotInUse, missing privilege is
// kPermission.
#pragma once

#include <libpq-fe.h>

#include <atomic>
#include <chrono>
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

// How the relay finds a silent peer (docs/configuration.md, "Timeouts").
// The libpq parameters are given before the URL's own, so a connection
// string that sets one of them keeps its value; 0 leaves libpq's default.
struct NetworkOptions {
  int connect_timeout_s = 0;    // connect_timeout, per host: a black-holed address
  int tcp_user_timeout_ms = 0;  // tcp_user_timeout: data unacknowledged this long
  int keepalives_idle_s = 0;    // keepalives_idle/_interval/_count: a dead idle peer
  int keepalives_interval_s = 0;
  int keepalives_count = 0;
  // kNormal connections only: the server's statement_timeout, and a
  // client-side deadline a little longer (kStatementGrace), for a server
  // whose answers the network drops. 0: neither.
  std::chrono::milliseconds statement_timeout{0};
};

class Connection {
 public:
  enum class Mode { kNormal, kReplication };

  // What the client waits beyond the server's statement_timeout before it
  // takes the connection for dead: the server's own cancel comes first.
  static constexpr std::chrono::milliseconds kStatementGrace{5000};

  // `url` is a libpq connection string or URI (DATABASE_URL). Replication
  // mode adds replication=database. `application_name` is set unless the URL has one.
  static Result<Connection> Open(std::string_view url, Mode mode,
                                 std::string_view application_name = "outbox-relay");
  // The same, with the relay's network settings (see NetworkOptions).
  static Result<Connection> Open(std::string_view url, Mode mode, std::string_view application_name,
                                 const NetworkOptions& network);

  Connection(Connection&&) = default;
  Connection& operator=(Connection&&) = default;

  // Runs a statement; error unless it returns PGRES_COMMAND_OK or PGRES_TUPLES_OK.
  Result<ResultHandle> Exec(std::string_view sql);
  // Text-format parameters; std::nullopt is SQL NULL.
  Result<ResultHandle> ExecParams(std::string_view sql,
                                  std::span<const std::optional<std::string>> params);
  // A named prepared statement: prepare it, run it with text parameters.
  Status Prepare(std::string_view name, std::string_view sql, int n_params);
  Result<ResultHandle> ExecPrepared(std::string_view name, std::span<const char* const> params);

  // Statements wait at most this long for the server's answer (0: for ever).
  // A statement that gets none closes the connection (kTransient): the
  // network dropped it or its answer, and nothing else can be sent on it.
  void set_deadline(std::chrono::milliseconds deadline) { deadline_ = deadline; }
  std::chrono::milliseconds deadline() const { return deadline_; }
  // Once *abort is true (another thread sets it to stop this one), a
  // statement waiting for its answer gives up within 100 ms: the connection
  // is closed and kCancelled returned, so a stopping thread never waits out
  // the deadline on a connection the network went silent on. nullptr: none.
  void set_abort(const std::atomic<bool>* abort) { abort_ = abort; }

  PGconn* get() const { return conn_.get(); }
  bool ok() const { return conn_ && PQstatus(conn_.get()) == CONNECTION_OK; }
  int server_version() const { return PQserverVersion(conn_.get()); }
  std::string user() const { return PQuser(conn_.get()); }
  std::string database() const { return PQdb(conn_.get()); }

 private:
  explicit Connection(ConnHandle conn) : conn_(std::move(conn)) {}
  // Sends with `send` and collects the results within the deadline.
  template <typename Send>
  Result<ResultHandle> Run(std::string_view what, Send send);
  ConnHandle conn_;
  std::chrono::milliseconds deadline_{0};
  const std::atomic<bool>* abort_ = nullptr;
};

// Value of row `row`, column `col`; std::nullopt for SQL NULL.
std::optional<std::string_view> GetValue(const PGresult* res, int row, int col);

}  // namespace outbox_relay::pg
