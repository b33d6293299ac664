// The tables a relay publishes, and which Relation is which.
//
// `--table-mode=seed` publishes one table, the house outbox table.
// `--table-mode=watermill` publishes watermill-sql's tables: one per topic
// ("watermill_<topic>", or a name the application chose), and the forwarder's
// envelope table. Each row's record depends on its table's kind and topic
// (outbox::ColumnMap carries both into the mapper).
//
// TableRouter lives as long as one replication connection: the server sends
// a Relation message before the first row of each table and again after a
// schema change, and every new connection sends them all again. Columns are
// found by name each time. The name in a Relation is the table's name when
// the row was written (logical decoding reads the catalog as it was then):
// rows written before a rename or a DROP come under the old name, also
// after a reconnection.
//
// A followed table renamed, moved, or changed so that it no longer has the
// needed columns: in seed mode the stream stops (the marker and the
// backfill find the table by name: a new name is a configuration change).
// In watermill mode the `unrouted` callback decides (WatermillTables): the
// session ends and the supervisor resolves the tables again, which
// unfollows a table of the pattern or stops the relay naming a listed one;
// or the table is not ours any more and its further rows are skipped.
//
// Thread: the loop thread.
#pragma once

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "outbox_relay/core/result.h"
#include "outbox_relay/outbox/record.h"
#include "outbox_relay/pg/connection.h"
#include "outbox_relay/pgoutput/messages.h"

namespace outbox_relay::pipeline {

struct OutboxTable {
  pg::QualifiedName name;
  outbox::TableKind kind = outbox::TableKind::kSeed;
  // kWatermill/kForwarder: the Watermill topic the application publishes to
  // (the Kafka topic of a direct table's rows; it names the offsets table).
  std::string topic;
  // kWatermill/kForwarder: the polling subscriber's offsets table
  // ("watermill_offsets_<topic>" unless configured).
  pg::QualifiedName offsets;
};

// The column names of watermill-sql's DefaultPostgreSQLSchema.
outbox::ColumnNames WatermillColumnNames();

class TableRouter {
 public:
  // `processed`: per table ("schema.name"), the consumer group's position
  // when the stream started; rows at or before it are skipped.
  // `unrouted`: what to do with a Relation that cannot be routed as it is:
  // a table not in `tables` (`previous` null: it may have joined the
  // publication after the list was made), or one of `tables` renamed, moved
  // or no longer fitting (`previous`: the table as it was known). true: end
  // the session (kTransient) before any of its rows could be skipped; false:
  // not ours (any more), its rows are skipped.
  using Unrouted = std::function<bool(std::string_view schema, std::string_view name,
                                      const OutboxTable* previous)>;
  TableRouter(std::vector<OutboxTable> tables, outbox::ColumnNames seed_columns,
              std::map<std::string, outbox::TablePosition> processed = {}, Unrouted unrouted = {});

  // A Relation message. Without `unrouted`: kFatal when one of the tables
  // was renamed or can no longer be published (a needed column dropped).
  Status OnRelation(const pgoutput::Relation& relation);
  // The columns of an outbox table's relation; nullptr for any other table.
  const outbox::ColumnMap* Find(pgoutput::Oid relation_id) const;

  const std::vector<OutboxTable>& tables() const { return tables_; }

 private:
  const OutboxTable* ByName(const pgoutput::Relation& relation) const;
  const OutboxTable* ByName(std::string_view qualified) const;
  // `relation` cannot be routed; `previous`: the table it was known as.
  Status Unroutable(const pgoutput::Relation& relation, const OutboxTable* previous,
                    const std::string& why);

  std::vector<OutboxTable> tables_;
  outbox::ColumnNames seed_columns_;
  std::map<std::string, outbox::TablePosition> processed_;
  Unrouted unrouted_;
  std::unordered_map<pgoutput::Oid, outbox::ColumnMap> columns_;  // relation id -> columns
  std::unordered_map<pgoutput::Oid, std::string> names_;          // relation id -> table
};

}  // namespace outbox_relay::pipeline
