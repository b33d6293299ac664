#include "outbox_relay/pg/publication.h"

#include <spdlog/spdlog.h>

#include <algorithm>

namespace outbox_relay::pg {

namespace {

bool IsTrue(const PGresult* res, int row, int col) {
  return GetValue(res, row, col) == std::optional<std::string_view>("t");
}

// "{a,b,"c d"}" -> a, b, c d (attribute names from array_agg(...)::text).
std::vector<std::string> ParseNameArray(std::string_view text) {
  std::vector<std::string> out;
  std::string cur;
  bool quoted = false;
  for (size_t i = 0; i < text.size(); ++i) {
    char c = text[i];
    if (!quoted && (c == '{' || c == '}')) continue;
    if (c == '"') {
      quoted = !quoted;
      continue;
    }
    if (quoted && c == '\\' && i + 1 < text.size()) {
      cur.push_back(text[++i]);
      continue;
    }
    if (!quoted && c == ',') {
      out.push_back(std::move(cur));
      cur.clear();
      continue;
    }
    cur.push_back(c);
  }
  if (!cur.empty()) out.push_back(std::move(cur));
  return out;
}

}  // namespace

Result<TableInfo> QueryTable(Connection& conn, const QualifiedName& table) {
  std::optional<std::string> params[] = {table.Quoted()};
  auto res = conn.ExecParams(
      "SELECT c.relkind, pg_get_userbyid(c.relowner), "
      "pg_has_role(current_user, c.relowner, 'USAGE') "
      "FROM pg_class c WHERE c.oid = to_regclass($1)",
      params);
  if (!res) return std::unexpected(res.error());
  TableInfo info;
  if (PQntuples(res->get()) == 0) return info;
  info.exists = true;
  info.relkind = GetValue(res->get(), 0, 0).value_or("?").front();
  info.owner = GetValue(res->get(), 0, 1).value_or("");
  info.owned_by_user = IsTrue(res->get(), 0, 2);
  return info;
}

Result<PublicationInfo> QueryPublication(Connection& conn, std::string_view publication,
                                         const QualifiedName& table) {
  PublicationInfo info;
  std::optional<std::string> name[] = {std::string(publication)};
  auto pub = conn.ExecParams(
      "SELECT oid, puballtables, pubinsert, pubupdate, pubdelete, pubtruncate, pubviaroot "
      "FROM pg_publication WHERE pubname = $1",
      name);
  if (!pub) return std::unexpected(pub.error());
  if (PQntuples(pub->get()) == 0) return info;
  const PGresult* p = pub->get();
  info.exists = true;
  std::string oid(GetValue(p, 0, 0).value_or("0"));
  info.all_tables = IsTrue(p, 0, 1);
  info.insert = IsTrue(p, 0, 2);
  info.update = IsTrue(p, 0, 3);
  info.del = IsTrue(p, 0, 4);
  info.truncate = IsTrue(p, 0, 5);
  info.via_root = IsTrue(p, 0, 6);

  const bool pg15 = conn.server_version() >= 150000;
  std::optional<std::string> rel[] = {oid, table.Quoted()};
  // Membership of the table itself (for a partitioned table pg_publication_tables
  // lists its partitions instead unless publish_via_partition_root is on).
  auto member = conn.ExecParams(
      pg15 ? "SELECT EXISTS (SELECT 1 FROM pg_publication_rel r WHERE r.prpubid = $1::oid "
             "AND r.prrelid = to_regclass($2)) OR EXISTS (SELECT 1 FROM "
             "pg_publication_namespace n JOIN pg_class c ON c.relnamespace = n.pnnspid "
             "WHERE n.pnpubid = $1::oid AND c.oid = to_regclass($2))"
           : "SELECT EXISTS (SELECT 1 FROM pg_publication_rel r WHERE r.prpubid = $1::oid "
             "AND r.prrelid = to_regclass($2))",
      rel);
  if (!member) return std::unexpected(member.error());
  info.includes_table = info.all_tables || IsTrue(member->get(), 0, 0);

  if (pg15) {
    auto shape = conn.ExecParams(
        "SELECT pg_get_expr(r.prqual, r.prrelid), "
        "(SELECT array_agg(a.attname ORDER BY a.attnum) FROM pg_attribute a "
        " WHERE a.attrelid = r.prrelid AND a.attnum = ANY (r.prattrs::int2[]))::text "
        "FROM pg_publication_rel r WHERE r.prpubid = $1::oid AND r.prrelid = to_regclass($2)",
        rel);
    if (!shape) return std::unexpected(shape.error());
    if (PQntuples(shape->get()) > 0) {
      if (auto filter = GetValue(shape->get(), 0, 0)) info.row_filter = std::string(*filter);
      if (auto cols = GetValue(shape->get(), 0, 1)) {
        info.column_list = std::string(*cols);
        info.published_columns = ParseNameArray(*cols);
      }
    }
  }

  std::optional<std::string> others_params[] = {std::string(publication), table.schema, table.name};
  auto others = conn.ExecParams(
      "SELECT schemaname || '.' || tablename, count(*) OVER () FROM pg_publication_tables "
      "WHERE pubname = $1 AND NOT (schemaname = $2 AND tablename = $3) "
      "ORDER BY 1 LIMIT 5",
      others_params);
  if (!others) return std::unexpected(others.error());
  for (int i = 0; i < PQntuples(others->get()); ++i) {
    info.other_tables.emplace_back(GetValue(others->get(), i, 0).value_or(""));
  }
  if (PQntuples(others->get()) > 0) {
    auto total = std::stoll(std::string(GetValue(others->get(), 0, 1).value_or("0")));
    if (total > PQntuples(others->get())) {
      info.other_tables.push_back(fmt::format("and {} more", total - PQntuples(others->get())));
    }
  }
  return info;
}

std::string CreatePublicationSql(std::string_view publication, const QualifiedName& table) {
  return fmt::format(
      "CREATE PUBLICATION {} FOR TABLE {} WITH (publish = 'insert', "
      "publish_via_partition_root = true)",
      QuoteIdent(publication), table.Quoted());
}

std::vector<PublicationProblem> Problems(const PublicationInfo& pub, const TableInfo& table,
                                         std::string_view publication,
                                         const QualifiedName& table_name,
                                         const std::vector<std::string>& needed_columns) {
  std::vector<PublicationProblem> out;
  if (!pub.exists) return out;
  const std::string p = QuoteIdent(publication);
  const std::string t = table_name.Quoted();
  const std::string own = fmt::format(
      "give the relay a publication of its own: {}; (and "
      "--publication / OUTBOX_PUBLICATION)",
      CreatePublicationSql("outbox_relay_own", table_name));
  if (pub.all_tables) {
    out.push_back({true,
                   "is FOR ALL TABLES: every table's changes are streamed to the relay, its own "
                   "commit index outbox_relay.commits among them (whose inserts would come back "
                   "to it without end)",
                   own});
  } else if (!pub.includes_table) {
    out.push_back(
        {true,
         fmt::format("exists but does not include {}: no row would arrive", table_name.ToString()),
         fmt::format("ALTER PUBLICATION {} ADD TABLE {};", p, t)});
  }
  if (!pub.insert) {
    out.push_back({true, "does not publish inserts: no row would arrive",
                   fmt::format("ALTER PUBLICATION {} SET (publish = 'insert');", p)});
  }
  if (pub.row_filter) {
    out.push_back(
        {true,
         fmt::format("has a row filter WHERE {} on {}: rows it excludes never reach the relay, "
                     "yet the slot would be confirmed past them and they would never be published",
                     *pub.row_filter, table_name.ToString()),
         fmt::format("ALTER PUBLICATION {} SET TABLE {}; (or {})", p, t, own)});
  }
  if (pub.column_list) {
    for (const std::string& col : needed_columns) {
      if (std::find(pub.published_columns.begin(), pub.published_columns.end(), col) ==
          pub.published_columns.end()) {
        out.push_back({true,
                       fmt::format("its column list {} leaves out \"{}\", which every record needs",
                                   *pub.column_list, col),
                       fmt::format("ALTER PUBLICATION {} SET TABLE {};", p, t)});
        break;
      }
    }
  }
  if (table.partitioned() && !pub.via_root) {
    out.push_back(
        {true,
         fmt::format("{} is partitioned and the publication lacks publish_via_partition_root: "
                     "rows would arrive under the partitions' names, not the table's",
                     table_name.ToString()),
         fmt::format("ALTER PUBLICATION {} SET (publish_via_partition_root = true);", p)});
  }
  std::vector<std::string> extra_ops;
  if (pub.update) extra_ops.push_back("update");
  if (pub.del) extra_ops.push_back("delete");
  if (pub.truncate) extra_ops.push_back("truncate");
  if (!extra_ops.empty()) {
    out.push_back({false,
                   fmt::format("also publishes {}: the relay ignores them, but every "
                               "offset_acked marking UPDATE is then decoded and sent to it too",
                               fmt::join(extra_ops, ", ")),
                   fmt::format("ALTER PUBLICATION {} SET (publish = 'insert');", p)});
  }
  if (!pub.all_tables && !pub.other_tables.empty()) {
    out.push_back({false,
                   fmt::format("also publishes {}: their changes are decoded and streamed to the "
                               "relay, which skips them",
                               fmt::join(pub.other_tables, ", ")),
                   own});
  }
  return out;
}

Status EnsurePublication(Connection& conn, std::string_view publication, const QualifiedName& table,
                         const std::vector<std::string>& needed_columns) {
  auto info = QueryPublication(conn, publication, table);
  if (!info) return std::unexpected(info.error());
  if (!info->exists) {
    std::string sql = CreatePublicationSql(publication, table);
    auto created = conn.Exec(sql);
    if (!created) {
      Error e = created.error();
      if (e.code == ErrorCode::kPermission) {
        e.message += fmt::format(
            "\nThe relay's role may not create the publication. Run as the table owner or a "
            "superuser:\n  {};",
            sql);
      }
      return std::unexpected(std::move(e));
    }
    spdlog::info("created publication {}: {}", publication, sql);
    info = QueryPublication(conn, publication, table);
    if (!info) return std::unexpected(info.error());
  }
  auto table_info = QueryTable(conn, table);
  if (!table_info) return std::unexpected(table_info.error());
  for (const PublicationProblem& problem :
       Problems(*info, *table_info, publication, table, needed_columns)) {
    if (problem.refuse) {
      return Fail(ErrorCode::kInvalidArgument,
                  "invalid setting --publication (OUTBOX_PUBLICATION): publication {} {}. The "
                  "relay cannot publish it exactly and does not start. Fix: {}",
                  publication, problem.what, problem.fix);
    }
    spdlog::warn("publication {} {} (fix: {})", publication, problem.what, problem.fix);
  }
  return Ok();
}

}  // namespace outbox_relay::pg
