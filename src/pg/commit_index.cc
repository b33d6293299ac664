#include "outbox_relay/pg/commit_index.h"

#include <fmt/format.h>

#include "outbox_relay/pg/rows.h"

namespace outbox_relay::pg {

Result<RelayTables> ReadRelayTables(Connection& conn) {
  // to_regclass() needs USAGE on the schema, has_table_privilege() an
  // existing table: CASE keeps the order.
  auto res = conn.Exec(
      "SELECT s, u, t,"
      " CASE WHEN t THEN has_table_privilege('outbox_relay.commits', 'SELECT')"
      "  AND has_table_privilege('outbox_relay.state', 'SELECT') ELSE false END,"
      " CASE WHEN t THEN has_table_privilege('outbox_relay.commits', 'SELECT, INSERT')"
      "  AND has_table_privilege('outbox_relay.state', 'SELECT, INSERT, UPDATE, DELETE')"
      "  ELSE false END"
      " FROM (SELECT s, u, CASE WHEN s AND u THEN to_regclass('outbox_relay.commits') IS NOT NULL"
      "  AND to_regclass('outbox_relay.state') IS NOT NULL ELSE false END AS t"
      " FROM (SELECT to_regnamespace('outbox_relay') IS NOT NULL AS s,"
      "  CASE WHEN to_regnamespace('outbox_relay') IS NULL THEN true"
      "  ELSE has_schema_privilege('outbox_relay', 'USAGE') END AS u) a) b");
  if (!res) return std::unexpected(res.error());
  Rows rows(res->get());
  auto schema = rows.Bool(0, 0);
  auto usage = rows.Bool(0, 1);
  auto tables = rows.Bool(0, 2);
  auto readable = rows.Bool(0, 3);
  auto writable = rows.Bool(0, 4);
  if (const Error* e = FirstError(schema, usage, tables, readable, writable)) {
    return std::unexpected(*e);
  }
  return RelayTables{*schema, *usage, *tables, *readable, *writable};
}

Result<std::vector<StateEntry>> ListState(Connection& conn, std::string_view slot) {
  std::optional<std::string> params[] = {std::string(slot)};
  auto res = conn.ExecParams(
      "SELECT key, value, updated_at::text FROM outbox_relay.state WHERE slot_name = $1 "
      "ORDER BY key",
      params);
  if (!res) return std::unexpected(res.error());
  Rows rows(res->get());
  std::vector<StateEntry> entries;
  entries.reserve(rows.size());
  for (int i = 0; i < rows.size(); ++i) {
    entries.push_back({std::string(rows.Value(i, 0).value_or("")),
                       std::string(rows.Value(i, 1).value_or("")),
                       std::string(rows.Value(i, 2).value_or(""))});
  }
  return entries;
}

Result<Lsn> NewestIndexedCommit(Connection& conn, std::string_view slot) {
  std::optional<std::string> params[] = {std::string(slot)};
  auto res = conn.ExecParams(
      "SELECT coalesce(max(commit_lsn), '0/0')::text FROM outbox_relay.commits"
      " WHERE slot_name = $1",
      params);
  if (!res) return std::unexpected(res.error());
  return Rows(res->get()).LsnAt(0, 0);
}

std::string IndexCommitsSql() {
  return "INSERT INTO outbox_relay.commits"
         " (slot_name, commit_lsn, end_lsn, transaction_ids, commit_time, row_count)"
         " SELECT $4, c.commit_lsn, c.end_lsn,"
         " CASE WHEN c.more IS NULL THEN ARRAY[c.x] ELSE c.x || c.more::xid8[] END,"
         " timestamptz '2000-01-01 00:00:00+00' + c.micros * interval '1 microsecond',"
         " c.row_count"
         " FROM unnest($5::pg_lsn[], $6::pg_lsn[], $7::xid8[], $10::text[], $8::bigint[],"
         " $9::int[])"
         " AS c(commit_lsn, end_lsn, x, more, micros, row_count)"
         " WHERE c.commit_lsn <> '0/0'::pg_lsn"  // backfilled rows have no commit LSN
         " AND pg_visible_in_snapshot(c.x, pg_current_snapshot())"
         " AND (c.more IS NULL OR NOT EXISTS (SELECT 1 FROM unnest(c.more::xid8[]) AS y"
         "  WHERE NOT pg_visible_in_snapshot(y, pg_current_snapshot())))";
}

std::string IndexRangeCondition(IndexRangeBy by) {
  return by == IndexRangeBy::kLsn ? "c.commit_lsn BETWEEN $2::pg_lsn AND $3::pg_lsn"
                                  : "c.commit_time BETWEEN $2::timestamptz AND $3::timestamptz";
}

Result<bool> CommitIndexExists(Connection& conn) {
  auto res = conn.Exec("SELECT to_regclass('outbox_relay.commits') IS NOT NULL");
  if (!res) return std::unexpected(res.error());
  return Rows(res->get()).Bool(0, 0);
}

Result<IndexSurvey> SurveyIndex(Connection& conn, std::string_view slot,
                                std::string_view quoted_table, std::string_view xid_column,
                                IndexRangeBy by, const std::string& from, const std::string& to) {
  // LATERAL: `found` is computed once per transaction (a scalar subquery
  // would be planned once per reference).
  std::string sql = fmt::format(
      "SELECT count(*), coalesce(sum(c.row_count), 0), coalesce(sum(f.found), 0),"
      " count(*) FILTER (WHERE f.found < c.row_count),"
      " coalesce(sum(GREATEST(c.row_count - f.found, 0)), 0),"
      " min(c.commit_lsn)::text, max(c.commit_lsn)::text,"
      " min(c.commit_time)::text, max(c.commit_time)::text"
      " FROM outbox_relay.commits c CROSS JOIN LATERAL"
      " (SELECT count(*) AS found FROM {table} o WHERE o.{xid} = ANY(c.transaction_ids)) f"
      " WHERE c.slot_name = $1 AND {range}",
      fmt::arg("table", quoted_table), fmt::arg("xid", QuoteIdent(xid_column)),
      fmt::arg("range", IndexRangeCondition(by)));
  std::optional<std::string> params[] = {std::string(slot), from, to};
  auto res = conn.ExecParams(sql, params);
  if (!res) return std::unexpected(res.error());
  Rows r(res->get());
  auto transactions = r.Int(0, 0);
  auto indexed_rows = r.Int(0, 1);
  auto rows_found = r.Int(0, 2);
  auto transactions_missing = r.Int(0, 3);
  auto rows_missing = r.Int(0, 4);
  if (const Error* e =
          FirstError(transactions, indexed_rows, rows_found, transactions_missing, rows_missing)) {
    return std::unexpected(*e);
  }
  auto text = [&](int col) { return r.OptionalText(0, col); };  // NULL: none in range
  return IndexSurvey{*transactions, *indexed_rows, *rows_found, *transactions_missing,
                     *rows_missing, text(5),       text(6),     text(7),
                     text(8)};
}

Result<std::optional<IndexedCommit>> OldestIndexedCommit(Connection& conn, std::string_view slot) {
  std::optional<std::string> params[] = {std::string(slot)};
  auto res = conn.ExecParams(
      "SELECT commit_lsn::text, commit_time::text FROM outbox_relay.commits WHERE slot_name = $1 "
      "ORDER BY commit_lsn LIMIT 1",
      params);
  if (!res) return std::unexpected(res.error());
  Rows rows(res->get());
  if (rows.size() == 0) return std::optional<IndexedCommit>();
  auto lsn = rows.Text(0, 0);
  auto time = rows.Text(0, 1);
  if (const Error* e = FirstError(lsn, time)) return std::unexpected(*e);
  return std::optional<IndexedCommit>(IndexedCommit{std::string(*lsn), std::string(*time)});
}

std::string IndexedRowsPageSql(std::string_view quoted_table, std::string_view xid_column,
                               std::string_view offset_column, IndexRangeBy by) {
  return fmt::format(
      "SELECT c.commit_lsn::text AS outbox_replay_commit_lsn, o.*"
      " FROM outbox_relay.commits c JOIN {table} o ON o.{xid} = ANY(c.transaction_ids)"
      " WHERE c.slot_name = $1 AND {range}"
      " AND c.commit_lsn >= $4::pg_lsn AND (c.commit_lsn, o.{off}) > ($4::pg_lsn, $5::bigint)"
      " ORDER BY c.commit_lsn, o.{off} LIMIT $6::bigint",
      fmt::arg("table", quoted_table), fmt::arg("xid", QuoteIdent(xid_column)),
      fmt::arg("off", QuoteIdent(offset_column)), fmt::arg("range", IndexRangeCondition(by)));
}

Result<IndexExtent> DescribeIndex(Connection& conn, std::string_view slot) {
  std::optional<std::string> params[] = {std::string(slot)};
  auto res = conn.ExecParams(
      "SELECT count(*), min(commit_lsn)::text, max(commit_lsn)::text, min(commit_time)::text, "
      "max(commit_time)::text FROM outbox_relay.commits WHERE slot_name = $1",
      params);
  if (!res) return std::unexpected(res.error());
  Rows rows(res->get());
  auto indexed = rows.Int(0, 0);  // count(*): never NULL
  if (!indexed) return std::unexpected(indexed.error());
  auto text = [&](int col) { return rows.OptionalText(0, col); };
  return IndexExtent{*indexed, text(1), text(2), text(3), text(4)};
}

}  // namespace outbox_relay::pg
