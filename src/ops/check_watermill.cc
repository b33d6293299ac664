// `check` in --table-mode=watermill: what `run` will publish from
// watermill-sql's tables, where it keeps the consumer group's position, and
// whether it may.
#include <fmt/ranges.h>

#include <set>

#include "outbox_relay/ops/check.h"
#include "outbox_relay/pg/publication.h"
#include "outbox_relay/pg/rows.h"
#include "outbox_relay/pipeline/watermill.h"

namespace outbox_relay::ops {

namespace {

struct PublicationFlags {
  bool all_tables = false;
  bool inserts = false;
};

// The relay's publication (nullopt when it does not exist) and, into
// *members, the tables it publishes (none when that query fails: every table
// then reads as not yet published).
Result<std::optional<PublicationFlags>> QueryPublicationFlags(pg::Connection& conn,
                                                              const std::string& publication,
                                                              std::set<std::string>* members) {
  std::optional<std::string> name[] = {publication};
  auto pub = conn.ExecParams(
      "SELECT puballtables, pubinsert FROM pg_publication WHERE pubname = $1", name);
  if (!pub) return std::unexpected(pub.error());
  pg::Rows rows(pub->get());
  if (rows.size() == 0) return std::nullopt;
  auto all_tables = rows.Bool(0, 0);
  auto inserts = rows.Bool(0, 1);
  if (const Error* e = pg::FirstError(all_tables, inserts)) return std::unexpected(*e);
  auto tables = conn.ExecParams(
      "SELECT schemaname || '.' || tablename FROM pg_publication_tables WHERE pubname = $1", name);
  if (tables) {
    pg::Rows table_rows(tables->get());
    for (int i = 0; i < table_rows.size(); ++i) {
      auto table = table_rows.Text(i, 0);
      if (!table) return std::unexpected(table.error());
      members->emplace(*table);
    }
  }
  return PublicationFlags{*all_tables, *inserts};
}

}  // namespace

std::vector<CheckResult> CheckWatermillTables(pg::Connection& conn, const app::RelayConfig& r) {
  std::vector<CheckResult> out;
  auto add = [&](CheckStatus s, std::string name, std::string detail, std::string fix = "") {
    out.push_back({s, std::move(name), std::move(detail), std::move(fix)});
  };
  const pipeline::WatermillSettings& w = r.watermill_settings;
  auto resolved = pipeline::ResolveWatermillTables(conn, w);
  if (!resolved) {
    add(CheckStatus::kFail, "watermill tables", resolved.error().message,
        "fix the table settings (--watermill-tables, --watermill-topic-map, ...)");
    return out;
  }
  for (const std::string& why : resolved->skipped) {
    add(CheckStatus::kWarn, "watermill table", "not followed: " + why,
        "name its topic with --watermill-topic-map (OUTBOX_WATERMILL_TOPIC_MAP)");
  }
  if (resolved->tables.empty()) {
    add(w.pattern ? CheckStatus::kWarn : CheckStatus::kFail, "watermill tables",
        w.pattern ? fmt::format("none matches {} yet: run follows them as they appear",
                                w.pattern->ToString())
                  : std::string("none"),
        w.pattern ? "" : "set --watermill-tables (OUTBOX_WATERMILL_TABLES)");
  }
  auto positions = pipeline::ReadWatermillPositions(conn, resolved->tables, w.consumer_group);
  std::set<std::string> published;
  auto pub = QueryPublicationFlags(conn, r.publication, &published);

  for (const pipeline::OutboxTable& t : resolved->tables) {
    const std::string name = "watermill table " + t.name.ToString();
    std::string what = t.kind == outbox::TableKind::kForwarder
                           ? std::string(
                                 "forwarder envelopes: each row's topic, UUID, metadata "
                                 "and payload from its envelope")
                           : fmt::format("Kafka topic {}, {} key", t.topic,
                                         r.mapper.watermill_key_field.empty()
                                             ? std::string("null")
                                             : "metadata " + r.mapper.watermill_key_field);
    std::optional<std::string> params[] = {t.name.Quoted(), t.offsets.Quoted()};
    auto priv = conn.ExecParams(
        "SELECT has_table_privilege($1, 'SELECT'), to_regclass($2) IS NOT NULL, "
        "CASE WHEN to_regclass($2) IS NULL THEN false ELSE "
        "has_table_privilege($2, 'SELECT, INSERT, UPDATE') END, "
        "has_schema_privilege((SELECT relnamespace FROM pg_class WHERE oid = to_regclass($1)), "
        "'CREATE')",
        params);
    if (!priv) {
      add(CheckStatus::kFail, name, priv.error().message);
      continue;
    }
    pg::Rows p(priv->get());
    auto may_read = p.Bool(0, 0);
    auto offsets_exist = p.Bool(0, 1);
    auto may_write_offsets = p.Bool(0, 2);
    auto may_create = p.Bool(0, 3);
    if (const Error* e = pg::FirstError(may_read, offsets_exist, may_write_offsets, may_create)) {
      add(CheckStatus::kFail, name, e->message);
      continue;
    }
    if (!*may_read) {
      add(CheckStatus::kFail, name, fmt::format("{}; the relay's role may not read it", what),
          fmt::format("GRANT SELECT ON {} TO <the relay's role>;", t.name.Quoted()));
      continue;
    }
    std::string position = "no position yet: the first start publishes every row";
    if (positions) {
      if (auto it = positions->find(t.name.ToString()); it != positions->end()) {
        position = fmt::format("position (last_processed_transaction_id {}, offset_acked {})",
                               it->second.transaction_id, it->second.offset);
      }
    }
    if (r.mark && !*offsets_exist && !*may_create) {
      add(CheckStatus::kFail, name,
          fmt::format("{}; offsets table {} is missing and the relay may not create it", what,
                      t.offsets.ToString()),
          pipeline::OffsetsTableDdl(t.offsets) +
              "; (as a role that may), then GRANT SELECT, "
              "INSERT, UPDATE on it to the relay's role");
      continue;
    }
    if (r.mark && *offsets_exist && !*may_write_offsets) {
      add(CheckStatus::kFail, name,
          fmt::format("{}; the relay may not write consumer group '{}''s position in {}", what,
                      w.consumer_group, t.offsets.ToString()),
          fmt::format("GRANT SELECT, INSERT, UPDATE ON {} TO <the relay's role>;",
                      t.offsets.Quoted()));
      continue;
    }
    add(CheckStatus::kOk, name,
        fmt::format("{}; group '{}' in {}{}: {}", what, w.consumer_group, t.offsets.ToString(),
                    *offsets_exist ? "" : " (run creates it)", position));
    if (pub && *pub && !published.contains(t.name.ToString())) {
      add(CheckStatus::kWarn, name,
          fmt::format("not in publication {} yet: run adds it (locking it against inserts for "
                      "at most --watermill-join-lock-timeout-ms) and publishes the rows written "
                      "before from a snapshot",
                      r.publication),
          "nothing, if the relay's role owns the table; else, as its owner: ALTER PUBLICATION " +
              pg::QuoteIdent(r.publication) + " ADD TABLE " + t.name.Quoted() +
              "; (run still publishes the rows written before)");
    }
  }

  if (!pub) {
    add(CheckStatus::kFail, "publication " + r.publication, pub.error().message);
  } else if (!*pub) {
    add(CheckStatus::kOk, "publication " + r.publication,
        "does not exist; run creates it: " +
            pipeline::CreateWatermillPublicationSql(r.publication, resolved->tables));
  } else if ((*pub)->all_tables) {
    add(CheckStatus::kFail, "publication " + r.publication,
        "is FOR ALL TABLES: run refuses it (the relay's own tables would stream back to it)",
        "give the relay a publication of its own (--publication)");
  } else if (!(*pub)->inserts) {
    add(CheckStatus::kFail, "publication " + r.publication, "does not publish inserts",
        "ALTER PUBLICATION " + pg::QuoteIdent(r.publication) + " SET (publish = 'insert');");
  } else {
    add(CheckStatus::kOk, "publication " + r.publication,
        fmt::format("{} table(s), publishes inserts", published.size()));
  }
  add(CheckStatus::kOk, "watermill progress",
      "no per-row acked column: positions are written to the offsets tables as watermill-sql's "
      "subscriber writes them; `cleanup` deletes rows every consumer group has processed; "
      "`replay --from-lsn` is for the seed table only");
  return out;
}

}  // namespace outbox_relay::ops
