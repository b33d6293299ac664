#include "outbox_relay/pipeline/tables.h"

#include <spdlog/spdlog.h>

#include <utility>

namespace outbox_relay::pipeline {

outbox::ColumnNames WatermillColumnNames() {
  outbox::ColumnNames names;
  names.uuid = "uuid";
  names.payload = "payload";
  names.metadata = "metadata";
  names.transaction_id = "transaction_id";
  names.offset = "offset";
  return names;
}

TableRouter::TableRouter(std::vector<OutboxTable> tables, outbox::ColumnNames seed_columns,
                         std::map<std::string, outbox::TablePosition> processed, Unrouted unrouted)
    : tables_(std::move(tables)),
      seed_columns_(std::move(seed_columns)),
      processed_(std::move(processed)),
      unrouted_(std::move(unrouted)) {}

const OutboxTable* TableRouter::ByName(const pgoutput::Relation& relation) const {
  for (const OutboxTable& t : tables_) {
    if (t.name.schema == relation.nspname && t.name.name == relation.relname) return &t;
  }
  return nullptr;
}

const OutboxTable* TableRouter::ByName(std::string_view qualified) const {
  for (const OutboxTable& t : tables_) {
    if (t.name.ToString() == qualified) return &t;
  }
  return nullptr;
}

Status TableRouter::Unroutable(const pgoutput::Relation& relation, const OutboxTable* previous,
                               const std::string& why) {
  if (unrouted_(relation.nspname, relation.relname, previous)) {
    return Fail(ErrorCode::kTransient, "{}: the stream restarts to follow the tables as they are",
                why);
  }
  // Not ours (any more): its rows are skipped from here on.
  if (previous != nullptr) {
    spdlog::warn("{}: its further rows are not published", why);
    columns_.erase(relation.relation_id);
    names_.erase(relation.relation_id);
  }
  return Ok();
}

Status TableRouter::OnRelation(const pgoutput::Relation& relation) {
  const OutboxTable* table = ByName(relation);
  auto known = names_.find(relation.relation_id);
  if (known != names_.end() && (table == nullptr || known->second != table->name.ToString())) {
    const OutboxTable* previous = ByName(known->second);
    const std::string why =
        fmt::format("the outbox table {} is now {}.{} (renamed or moved while the relay ran)",
                    known->second, relation.nspname, relation.relname);
    if (unrouted_ && previous != nullptr) {
      // Watermill: both names followed (a rename within the pattern, once
      // resolved again): the rows go where the new name says.
      if (table != nullptr) {
        spdlog::info("{}", why);
      } else {
        return Unroutable(relation, previous, why);
      }
    } else {
      // Renamed (or moved to another schema): the publication follows the
      // table, but the marker, the backfill and the progress writer find it
      // by the configured name. Going on with the old column positions
      // would misread its rows.
      const auto& kind = columns_.at(relation.relation_id).kind;
      return Fail(ErrorCode::kFatal, "{}: start the relay with {} naming it", why,
                  kind == outbox::TableKind::kSeed
                      ? "--table (OUTBOX_TABLE)"
                      : "--watermill-tables (OUTBOX_WATERMILL_TABLES) and --watermill-topic-map "
                        "(OUTBOX_WATERMILL_TOPIC_MAP)");
    }
  }
  if (table == nullptr) {
    if (unrouted_) {
      // A selected table joined by another instance (its rows are coming),
      // or one the settings select that is no longer followed.
      return Unroutable(relation, nullptr,
                        fmt::format("table {}.{} is in the publication but not followed yet",
                                    relation.nspname, relation.relname));
    }
    return Ok();  // another table in a shared publication
  }

  // Sent before the first row and again after any schema change: columns
  // are found by name each time.
  const bool seed = table->kind == outbox::TableKind::kSeed;
  auto map = outbox::ColumnMap::Resolve(relation, seed ? seed_columns_ : WatermillColumnNames());
  if (!map) {
    if (unrouted_ && !seed) {
      return Unroutable(relation, table,
                        fmt::format("outbox table {} changed and can no longer be published: {}",
                                    table->name.ToString(), map.error().message));
    }
    return Fail(ErrorCode::kFatal, "outbox table changed and can no longer be published: {}",
                map.error().message);
  }
  map->kind = table->kind;
  map->table = table->name.ToString();
  map->topic = table->topic;
  if (auto p = processed_.find(map->table); p != processed_.end()) map->processed = p->second;
  if (known != names_.end() && known->second == map->table) {
    spdlog::info("outbox table {} changed: {} columns", map->table, relation.columns.size());
  }
  names_[relation.relation_id] = map->table;
  columns_[relation.relation_id] = std::move(*map);
  return Ok();
}

const outbox::ColumnMap* TableRouter::Find(pgoutput::Oid relation_id) const {
  auto it = columns_.find(relation_id);
  return it == columns_.end() ? nullptr : &it->second;
}

}  // namespace outbox_relay::pipeline
