#include "support/pg.h"

#include <fmt/format.h>

#include <chrono>
#include <cstdio>
#include <stdexcept>
#include <thread>

namespace outbox_test {

namespace pg = outbox_relay::pg;

Pg::Pg(const std::string& url, std::string_view application_name) {
  auto conn = pg::Connection::Open(url, pg::Connection::Mode::kNormal, application_name);
  if (!conn) throw std::runtime_error("connect to " + url + ": " + conn.error().message);
  conn_.emplace(std::move(*conn));
}

void Pg::Exec(std::string_view sql) {
  auto res = conn_->Exec(sql);
  if (!res) {
    throw std::runtime_error(
        fmt::format("SQL failed: {}\n  in: {:.300}", res.error().message, sql));
  }
}

void Pg::Exec(std::string_view sql, const std::vector<std::optional<std::string>>& params) {
  (void)Query(sql, params);
}

std::vector<Row> Pg::Query(std::string_view sql,
                           const std::vector<std::optional<std::string>>& params) {
  auto res = params.empty() ? conn_->Exec(sql) : conn_->ExecParams(sql, params);
  if (!res) {
    throw std::runtime_error(
        fmt::format("SQL failed: {}\n  in: {:.300}", res.error().message, sql));
  }
  const PGresult* r = res->get();
  std::vector<Row> rows;
  int n = PQntuples(r);
  int cols = PQnfields(r);
  rows.reserve(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) {
    Row row;
    row.reserve(static_cast<size_t>(cols));
    for (int c = 0; c < cols; ++c) {
      auto v = pg::GetValue(r, i, c);
      row.push_back(v ? std::optional<std::string>(std::string(*v)) : std::nullopt);
    }
    rows.push_back(std::move(row));
  }
  return rows;
}

std::optional<std::string> Pg::Scalar(std::string_view sql,
                                      const std::vector<std::optional<std::string>>& params) {
  auto rows = Query(sql, params);
  if (rows.empty() || rows[0].empty()) return std::nullopt;
  return rows[0][0];
}

int64_t Pg::Int(std::string_view sql, const std::vector<std::optional<std::string>>& params) {
  auto v = Scalar(sql, params);
  if (!v) throw std::runtime_error(fmt::format("expected an integer, got NULL from: {}", sql));
  return std::stoll(*v);
}

uint64_t ParseLsn(std::string_view text) {
  size_t slash = text.find('/');
  if (slash == std::string_view::npos) throw std::runtime_error("bad LSN: " + std::string(text));
  uint64_t hi = std::stoull(std::string(text.substr(0, slash)), nullptr, 16);
  uint64_t lo = std::stoull(std::string(text.substr(slash + 1)), nullptr, 16);
  return (hi << 32) | lo;
}

std::string FormatLsn(uint64_t lsn) {
  return fmt::format("{:X}/{:X}", lsn >> 32, lsn & 0xffffffffu);
}

std::string QuoteIdent(std::string_view ident) { return pg::QuoteIdent(ident); }
std::string QuoteLiteral(std::string_view literal) { return pg::QuoteLiteral(literal); }

std::string OutboxTableDdl(const std::string& name) {
  return fmt::format(
      "CREATE TABLE {0} ("
      " offset_acked BIGINT,"
      " offset_consumed BIGSERIAL NOT NULL,"
      " uuid VARCHAR(36) NOT NULL,"
      " created_at TIMESTAMPTZ NOT NULL DEFAULT NOW(),"
      " payload JSON,"
      " metadata JSON,"
      " transaction_id xid8 NOT NULL DEFAULT pg_current_xact_id(),"
      " CONSTRAINT {1} PRIMARY KEY (transaction_id, offset_consumed));"
      "CREATE INDEX {2} ON {0} (offset_acked) WHERE offset_acked IS NULL;",
      QuoteIdent(name), QuoteIdent(name + "_pk"), QuoteIdent(name + "_acked"));
}

std::optional<SlotState> QuerySlot(Pg& pg, const std::string& slot) {
  auto rows = pg.Query(
      "SELECT active, active_pid, restart_lsn, confirmed_flush_lsn, coalesce(wal_status, '') "
      "FROM pg_replication_slots WHERE slot_name = $1",
      {slot});
  if (rows.empty()) return std::nullopt;
  const Row& r = rows[0];
  SlotState s;
  s.active = r[0] == "t";
  if (r[1]) s.active_pid = std::stoi(*r[1]);
  if (r[2]) s.restart_lsn = ParseLsn(*r[2]);
  if (r[3]) s.confirmed_flush_lsn = ParseLsn(*r[3]);
  s.wal_status = r[4].value_or("");
  return s;
}

uint64_t CurrentWalLsn(Pg& pg) { return ParseLsn(*pg.Scalar("SELECT pg_current_wal_lsn()")); }

void DropRelayObjects(const std::string& url, const std::string& slot,
                      const std::string& publication, const std::vector<std::string>& tables,
                      int wait_inactive_ms) {
  auto attempt = [](const char* what, auto&& fn) {
    try {
      fn();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "[cleanup] %s: %s\n", what, e.what());
    }
  };
  std::optional<Pg> db;
  attempt("connect", [&] { db.emplace(url, "outbox-it-cleanup"); });
  if (!db) return;
  attempt("drop slot", [&] {
    auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(wait_inactive_ms);
    while (true) {
      auto s = QuerySlot(*db, slot);
      if (!s) return;
      if (!s->active) break;
      if (std::chrono::steady_clock::now() >= deadline) {
        std::fprintf(stderr, "[cleanup] slot %s still active (pid %d): terminating it\n",
                     slot.c_str(), s->active_pid.value_or(0));
        db->Exec(
            "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots "
            "WHERE slot_name = $1 AND active_pid IS NOT NULL",
            {slot});
        deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    db->Exec("SELECT pg_drop_replication_slot($1)", {slot});
  });
  attempt("drop publication",
          [&] { db->Exec("DROP PUBLICATION IF EXISTS " + QuoteIdent(publication)); });
  for (const std::string& t : tables) {
    attempt("drop table", [&] { db->Exec("DROP TABLE IF EXISTS " + QuoteIdent(t)); });
  }
  attempt("delete commit index rows", [&] {
    if (db->Scalar("SELECT to_regclass('outbox_relay.commits') IS NOT NULL") == "t") {
      db->Exec("DELETE FROM outbox_relay.commits WHERE slot_name = $1", {slot});
    }
  });
}

}  // namespace outbox_test
