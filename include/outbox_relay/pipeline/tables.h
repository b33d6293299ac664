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
// found by name each time. A table renamed or moved while the relay runs
// stops the stream: the backfill and the progress writer find tables by
// name, and a new name is a configuration change.
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
  // `selects`: whether a table not in `tables` should be (it joined the
  // publication after the list was made): its Relation ends the session
  // (kTransient) before any of its rows could be skipped.
  using Selects = std::function<bool(std::string_view schema, std::string_view name)>;
  TableRouter(std::vector<OutboxTable> tables, outbox::ColumnNames seed_columns,
              std::map<std::string, outbox::TablePosition> processed = {}, Selects selects = {});

  // A Relation message. kFatal when one of the tables was renamed or can no
  // longer be published (a needed column dropped).
  Status OnRelation(const pgoutput::Relation& relation);
  // The columns of an outbox table's relation; nullptr for any other table.
  const outbox::ColumnMap* Find(pgoutput::Oid relation_id) const;

  const std::vector<OutboxTable>& tables() const { return tables_; }

 private:
  const OutboxTable* ByName(const pgoutput::Relation& relation) const;

  std::vector<OutboxTable> tables_;
  outbox::ColumnNames seed_columns_;
  std::map<std::string, outbox::TablePosition> processed_;
  Selects selects_;
  std::unordered_map<pgoutput::Oid, outbox::ColumnMap> columns_;  // relation id -> columns
  std::unordered_map<pgoutput::Oid, std::string> names_;          // relation id -> table
};

}  // namespace outbox_relay::pipeline
