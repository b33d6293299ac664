// A small synchronous PostgreSQL client for the tests, on the project's own
// libpq wrapper. Errors throw std::runtime_error (gtest reports an exception
// escaping a test body as a failure with its message).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "outbox_relay/pg/connection.h"

namespace outbox_test {

using Row = std::vector<std::optional<std::string>>;

class Pg {
 public:
  explicit Pg(const std::string& url, std::string_view application_name = "outbox-it");

  // Runs one or more statements (simple query protocol).
  void Exec(std::string_view sql);
  // Text parameters, std::nullopt = SQL NULL.
  void Exec(std::string_view sql, const std::vector<std::optional<std::string>>& params);
  std::vector<Row> Query(std::string_view sql,
                         const std::vector<std::optional<std::string>>& params = {});
  // The first column of the first row (nullopt: no row or SQL NULL).
  std::optional<std::string> Scalar(std::string_view sql,
                                    const std::vector<std::optional<std::string>>& params = {});
  // Scalar that must be a non-NULL integer.
  int64_t Int(std::string_view sql, const std::vector<std::optional<std::string>>& params = {});

  PGconn* raw() const { return conn_->get(); }

 private:
  std::optional<outbox_relay::pg::Connection> conn_;
};

// "16/B374D848" -> 0x16B374D848.
uint64_t ParseLsn(std::string_view text);
std::string FormatLsn(uint64_t lsn);

std::string QuoteIdent(std::string_view ident);
std::string QuoteLiteral(std::string_view literal);

// The seed's outbox table (DESIGN §3) under `name` in schema public.
std::string OutboxTableDdl(const std::string& name);

// State of a replication slot (nullopt: no such slot).
struct SlotState {
  bool active = false;
  std::optional<int> active_pid;
  std::optional<uint64_t> restart_lsn;
  std::optional<uint64_t> confirmed_flush_lsn;
  std::string wal_status;
};
std::optional<SlotState> QuerySlot(Pg& pg, const std::string& slot);
uint64_t CurrentWalLsn(Pg& pg);

// Drops what a test created: waits up to `wait_inactive_ms` for the slot to be
// released (then terminates its walsender), drops slot, publication and tables,
// and deletes the slot's rows in outbox_relay.commits. Best effort: never throws.
void DropRelayObjects(const std::string& url, const std::string& slot,
                      const std::string& publication, const std::vector<std::string>& tables,
                      int wait_inactive_ms = 10000);

}  // namespace outbox_test
