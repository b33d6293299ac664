// The publication the slot reads, and whether the relay can serve it exactly.
//
// The relay marks a row `offset_acked` once Kafka has it; a row that never
// reaches the relay stays unacked, but a publication shape that hides rows
// while the slot moves past them loses them silently. So `run` refuses, and
// `check` reports, every shape it cannot serve exactly (DESIGN §5):
//
//   FOR ALL TABLES            streams every table, the relay's own
//                             outbox_relay.commits included (its INSERTs come
//                             back as transactions to index: a loop)
//   no `insert`               nothing arrives at all
//   outbox table missing      nothing arrives at all
//   a row filter (15+)        rows it excludes are never sent, yet the slot
//                             is confirmed past them
//   a column list (15+)       that leaves out a column the record needs
//   partitioned outbox table  without publish_via_partition_root: rows arrive
//                             under the partitions' names, not the table's
//
// and warns about shapes that cost but lose nothing (other tables, update/
// delete/truncate: decoded and sent only to be skipped).
//
// `QueryPublication` reads the catalog (versions 14..18); `Problems` is pure.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "outbox_relay/core/result.h"
#include "outbox_relay/pg/connection.h"

namespace outbox_relay::pg {

// The outbox table as the catalog describes it.
struct TableInfo {
  bool exists = false;
  char relkind = 0;  // 'r' plain, 'p' partitioned, ...
  std::string owner;
  bool owned_by_user = false;  // current_user may act as the owner
  bool partitioned() const { return relkind == 'p'; }
};

Result<TableInfo> QueryTable(Connection& conn, const QualifiedName& table);

struct PublicationInfo {
  bool exists = false;
  bool all_tables = false;
  bool insert = false, update = false, del = false, truncate = false;
  bool via_root = false;                       // publish_via_partition_root
  bool includes_table = false;                 // directly, or through its schema (15+)
  std::optional<std::string> row_filter;       // 15+: the table's WHERE clause
  std::optional<std::string> column_list;      // 15+: "{a,b}" when not all columns
  std::vector<std::string> published_columns;  // of column_list
  std::vector<std::string> other_tables;       // schema.table, other than the outbox table
};

Result<PublicationInfo> QueryPublication(Connection& conn, std::string_view publication,
                                         const QualifiedName& table);

struct PublicationProblem {
  bool refuse = false;  // true: the relay cannot serve it exactly; false: a warning
  std::string what;     // one line for people
  std::string fix;      // SQL (or a setting) that mends it
};

// Everything wrong with `pub` for streaming `table` (`needed_columns`: the
// columns a record is made of). Empty: the publication is right.
std::vector<PublicationProblem> Problems(const PublicationInfo& pub, const TableInfo& table,
                                         std::string_view publication,
                                         const QualifiedName& table_name,
                                         const std::vector<std::string>& needed_columns);

// The publication `run` creates: inserts only, rows of a partitioned table
// under the table's own name.
std::string CreatePublicationSql(std::string_view publication, const QualifiedName& table);

// Creates the publication when missing (without the privilege: kPermission
// with the SQL to run); then refuses a publication the relay cannot serve
// exactly (kInvalidArgument naming --publication and the fix) and logs the
// warnings.
Status EnsurePublication(Connection& conn, std::string_view publication, const QualifiedName& table,
                         const std::vector<std::string>& needed_columns);

}  // namespace outbox_relay::pg
