// Every statement on the relay's own tables (their layout: relay_schema.h):
//   outbox_relay.commits — the commit-LSN index, one row per published
//                          transaction: written by the marker, read by replay
//                          and `slot status`, pruned by cleanup;
//   outbox_relay.state   — key/value state per slot (relay_schema.h has its
//                          keys and ReadState / WriteState / DeleteState);
// and what a role may do with them (check, `slot status`).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "outbox_relay/core/lsn.h"
#include "outbox_relay/core/result.h"
#include "outbox_relay/pg/connection.h"

namespace outbox_relay::pg {

// ---- access ---------------------------------------------------------------

// What the connection's role finds of schema outbox_relay. Asked step by step
// (a role without USAGE on the schema is reported, not an error).
struct RelayTables {
  bool schema = false;    // the schema exists
  bool usage = false;     // the role has USAGE on it (true when it does not exist)
  bool tables = false;    // commits and state exist (false without USAGE)
  bool readable = false;  // SELECT on both
  bool writable = false;  // what the relay does: SELECT, INSERT on commits; SELECT..DELETE on state
};
Result<RelayTables> ReadRelayTables(Connection& conn);

// ---- state ----------------------------------------------------------------

struct StateEntry {
  std::string key;
  std::string value;
  std::string updated_at;
};
// The slot's state rows, by key.
Result<std::vector<StateEntry>> ListState(Connection& conn, std::string_view slot);

// ---- the commit index: the marker -------------------------------------------

// The newest commit LSN indexed for `slot` (0/0: none).
Result<Lsn> NewestIndexedCommit(Connection& conn, std::string_view slot);

// The INSERT of a batch's commits into the index, for the marker's one
// statement (marker.cc): its parameters are $4 the slot, $5 commit LSNs, $6
// end LSNs, $7 first transaction ids, $8 commit times (microseconds since
// 2000), $9 row counts, $10 the further transaction ids of each commit (text
// arrays, NULL for none). Only commits whose every transaction is visible
// (committed) are inserted; backfilled rows (commit LSN 0/0) are not. The
// caller appends its own conditions (AND ...) and ON CONFLICT / RETURNING.
std::string IndexCommitsSql();

// ---- the commit index: replay ---------------------------------------------

// A range of the index: by commit LSN or by commit time (both ends
// included), as a condition on the index's rows `c` with the range's ends as
// parameters $2 and $3 (text: pg_lsn, or anything timestamptz accepts).
enum class IndexRangeBy { kLsn, kTime };
std::string IndexRangeCondition(IndexRangeBy by);

// Whether the index exists (whether the relay ever published from this database).
Result<bool> CommitIndexExists(Connection& conn);

// What the index holds of a range, and what of it the outbox table still has.
struct IndexSurvey {
  int64_t transactions = 0;
  int64_t indexed_rows = 0;
  int64_t rows_found = 0;
  int64_t transactions_missing = 0;  // with fewer rows in the table than indexed
  int64_t rows_missing = 0;
  std::optional<std::string> first_commit_lsn, last_commit_lsn;  // none in range: nullopt
  std::optional<std::string> first_commit_time, last_commit_time;
};
Result<IndexSurvey> SurveyIndex(Connection& conn, std::string_view slot,
                                std::string_view quoted_table, std::string_view xid_column,
                                IndexRangeBy by, const std::string& from, const std::string& to);

// The slot's oldest indexed commit (commits before it were pruned by cleanup
// or precede the relay); nullopt when the index has none of the slot.
struct IndexedCommit {
  std::string commit_lsn;
  std::string commit_time;
};
Result<std::optional<IndexedCommit>> OldestIndexedCommit(Connection& conn, std::string_view slot);

// One page of the range's rows in commit order, then offset: each row of
// `quoted_table` whose transaction the index lists, after the column
// outbox_replay_commit_lsn (text). Parameters: $1 the slot, $2 and $3 the
// range, $4 and $5 the (commit LSN, offset) the page starts after, $6 the page's rows.
std::string IndexedRowsPageSql(std::string_view quoted_table, std::string_view xid_column,
                               std::string_view offset_column, IndexRangeBy by);

// ---- the commit index: `slot status` and cleanup ----------------------------

struct IndexExtent {
  int64_t transactions = 0;
  std::optional<std::string> first_commit_lsn, last_commit_lsn;
  std::optional<std::string> first_commit_time, last_commit_time;
};
Result<IndexExtent> DescribeIndex(Connection& conn, std::string_view slot);

// Cleanup's statements over every slot's commits older than $1 (timestamptz):
// the count, a planner's estimate (EXPLAIN of it), and one batch's delete
// ($2 the batch size).
inline constexpr std::string_view kCountCommitsBefore =
    "SELECT count(*) FROM outbox_relay.commits WHERE commit_time < $1::timestamptz";
inline constexpr std::string_view kCommitsBefore =
    "SELECT 1 FROM outbox_relay.commits WHERE commit_time < $1::timestamptz";
inline constexpr std::string_view kPruneCommitsBatch =
    "WITH victims AS ("
    " SELECT slot_name, commit_lsn FROM outbox_relay.commits"
    " WHERE commit_time < $1::timestamptz ORDER BY slot_name, commit_lsn LIMIT $2::bigint"
    ") DELETE FROM outbox_relay.commits c USING victims v"
    " WHERE c.slot_name = v.slot_name AND c.commit_lsn = v.commit_lsn";

}  // namespace outbox_relay::pg
