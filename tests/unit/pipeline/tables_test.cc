// TableRouter: which Relation is which outbox table, in seed and watermill
// mode; and the watermill settings' table selection.
#include "outbox_relay/pipeline/tables.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "outbox_relay/pipeline/watermill.h"

namespace outbox_relay::pipeline {
namespace {

using ::testing::HasSubstr;

pgoutput::Relation Rel(pgoutput::Oid id, std::string schema, std::string name,
                       std::vector<std::string> columns) {
  pgoutput::Relation r;
  r.relation_id = id;
  r.nspname = std::move(schema);
  r.relname = std::move(name);
  for (auto& c : columns) r.columns.push_back(pgoutput::RelationColumn{0, c, 25, -1});
  return r;
}

std::vector<std::string> WatermillColumns() {
  return {"offset", "uuid", "created_at", "payload", "metadata", "transaction_id"};
}

TEST(TableRouter, SeedTableByItsConfiguredName) {
  TableRouter router({OutboxTable{pg::QualifiedName{"public", "outbox"}}}, outbox::ColumnNames{});
  ASSERT_TRUE(router.OnRelation(Rel(1, "public", "other", {"a"})));
  ASSERT_TRUE(router.OnRelation(Rel(2, "public", "outbox",
                                    {"offset_acked", "offset_consumed", "uuid", "created_at",
                                     "payload", "metadata", "transaction_id"})));
  EXPECT_EQ(router.Find(1), nullptr);
  const outbox::ColumnMap* m = router.Find(2);
  ASSERT_NE(m, nullptr);
  EXPECT_EQ(m->kind, outbox::TableKind::kSeed);
  EXPECT_EQ(m->table, "public.outbox");
  EXPECT_EQ(m->offset, 1);
  EXPECT_FALSE(m->processed.has_value());
}

TEST(TableRouter, WatermillTablesCarryKindTopicAndTheGroupsPosition) {
  std::vector<OutboxTable> tables = {
      {pg::QualifiedName{"public", "watermill_orders"}, outbox::TableKind::kWatermill, "orders",
       pg::QualifiedName{"public", "watermill_offsets_orders"}},
      {pg::QualifiedName{"public", "watermill_forwarder_topic"}, outbox::TableKind::kForwarder,
       "forwarder_topic", pg::QualifiedName{"public", "watermill_offsets_forwarder_topic"}},
  };
  TableRouter router(tables, outbox::ColumnNames{},
                     {{"public.watermill_orders", outbox::TablePosition{900, 7}}});
  ASSERT_TRUE(router.OnRelation(Rel(10, "public", "watermill_orders", WatermillColumns())));
  ASSERT_TRUE(
      router.OnRelation(Rel(11, "public", "watermill_forwarder_topic", WatermillColumns())));
  const outbox::ColumnMap* orders = router.Find(10);
  ASSERT_NE(orders, nullptr);
  EXPECT_EQ(orders->kind, outbox::TableKind::kWatermill);
  EXPECT_EQ(orders->topic, "orders");
  EXPECT_EQ(orders->offset, 0);
  ASSERT_TRUE(orders->processed.has_value());
  EXPECT_EQ(orders->processed->transaction_id, 900u);
  const outbox::ColumnMap* fwd = router.Find(11);
  ASSERT_NE(fwd, nullptr);
  EXPECT_EQ(fwd->kind, outbox::TableKind::kForwarder);
  EXPECT_FALSE(fwd->processed.has_value());
}

TEST(TableRouter, RenamedTableStopsTheStreamNamingTheSetting) {
  TableRouter router({{pg::QualifiedName{"public", "watermill_orders"},
                       outbox::TableKind::kWatermill,
                       "orders",
                       {}}},
                     outbox::ColumnNames{});
  ASSERT_TRUE(router.OnRelation(Rel(10, "public", "watermill_orders", WatermillColumns())));
  auto st = router.OnRelation(Rel(10, "public", "watermill_orders_v2", WatermillColumns()));
  ASSERT_FALSE(st.has_value());
  EXPECT_EQ(st.error().code, ErrorCode::kFatal);
  EXPECT_THAT(st.error().message, HasSubstr("--watermill-tables"));
}

TEST(TableRouter, ASelectedTableItDoesNotKnowEndsTheSession) {
  bool asked = false;
  TableRouter router({}, outbox::ColumnNames{}, {},
                     [&](std::string_view schema, std::string_view name, const OutboxTable* prev) {
                       asked = true;
                       EXPECT_EQ(prev, nullptr);
                       return schema == "public" && name.starts_with("watermill_");
                     });
  auto st = router.OnRelation(Rel(12, "public", "watermill_new", WatermillColumns()));
  ASSERT_FALSE(st.has_value());
  EXPECT_TRUE(asked);
  EXPECT_EQ(st.error().code, ErrorCode::kTransient);
  EXPECT_TRUE(router.OnRelation(Rel(13, "public", "business", {"id"})));
}

TEST(TableRouter, MissingColumnAfterASchemaChangeIsFatal) {
  TableRouter router({{pg::QualifiedName{"public", "watermill_orders"},
                       outbox::TableKind::kWatermill,
                       "orders",
                       {}}},
                     outbox::ColumnNames{});
  auto st = router.OnRelation(Rel(10, "public", "watermill_orders", {"offset", "uuid"}));
  ASSERT_FALSE(st.has_value());
  EXPECT_THAT(st.error().message, HasSubstr("\"payload\""));
}

TEST(WatermillSelection, GlobAndLists) {
  EXPECT_TRUE(GlobMatch("watermill_*", "watermill_orders"));
  EXPECT_TRUE(GlobMatch("watermill_*", "watermill_"));
  EXPECT_TRUE(GlobMatch("*", ""));
  EXPECT_TRUE(GlobMatch("w*_*s", "watermill_orders"));
  EXPECT_FALSE(GlobMatch("watermill_*", "watermil_orders"));
  EXPECT_FALSE(GlobMatch("watermill_*x", "watermill_orders"));
  EXPECT_TRUE(GlobMatch("a*b*c", "aXbYbZc"));

  WatermillSettings s;
  s.tables = {pg::QualifiedName{"public", "outbox"}};
  s.forwarder_tables = {pg::QualifiedName{"app", "watermill_forwarder_topic"}};
  s.pattern = pg::QualifiedName{"public", "watermill_*"};
  EXPECT_TRUE(s.Selects("public", "outbox"));
  EXPECT_TRUE(s.Selects("public", "watermill_orders"));
  EXPECT_TRUE(s.Selects("app", "watermill_forwarder_topic"));
  EXPECT_FALSE(s.Selects("app", "watermill_orders"));
  EXPECT_FALSE(s.Selects("public", "orders"));
  EXPECT_TRUE(s.IsForwarder(pg::QualifiedName{"app", "watermill_forwarder_topic"}));
  EXPECT_FALSE(s.IsForwarder(pg::QualifiedName{"public", "outbox"}));
}

}  // namespace
}  // namespace outbox_relay::pipeline

namespace outbox_relay::pipeline {
namespace {

OutboxTable Orders() {
  return {
      pg::QualifiedName{"public", "watermill_orders"}, outbox::TableKind::kWatermill, "orders", {}};
}

// Watermill mode (an `unrouted` callback): a followed table renamed or no
// longer fitting asks the callback, naming the table it was; true ends the
// session, false leaves its further rows unpublished; never kFatal.
TEST(TableRouter, WatermillRenameAsksWhatToDoNamingTheTableItWas) {
  std::vector<std::string> asked;
  bool end = true;
  TableRouter router({Orders()}, outbox::ColumnNames{}, {},
                     [&](std::string_view schema, std::string_view name, const OutboxTable* prev) {
                       asked.push_back(fmt::format("{}.{} was {}", schema, name,
                                                   prev ? prev->name.ToString() : "-"));
                       return end;
                     });
  ASSERT_TRUE(router.OnRelation(Rel(10, "public", "watermill_orders", WatermillColumns())));
  auto st = router.OnRelation(Rel(10, "public", "archived_orders", WatermillColumns()));
  ASSERT_FALSE(st.has_value());
  EXPECT_EQ(st.error().code, ErrorCode::kTransient);
  ASSERT_EQ(asked.size(), 1u);
  EXPECT_EQ(asked[0], "public.archived_orders was public.watermill_orders");
  // Not ours any more: its rows are skipped, the stream goes on.
  end = false;
  ASSERT_TRUE(router.OnRelation(Rel(10, "public", "archived_orders", WatermillColumns())));
  EXPECT_EQ(router.Find(10), nullptr);
  // Rows written before the rename come under the old name: still routed.
  ASSERT_TRUE(router.OnRelation(Rel(10, "public", "watermill_orders", WatermillColumns())));
  ASSERT_NE(router.Find(10), nullptr);
  EXPECT_EQ(router.Find(10)->topic, "orders");
}

TEST(TableRouter, WatermillRenameBetweenTwoRoutedNamesFollowsTheNewName) {
  OutboxTable v2{pg::QualifiedName{"public", "watermill_orders_v2"},
                 outbox::TableKind::kWatermill,
                 "orders_v2",
                 {}};
  TableRouter router({Orders(), v2}, outbox::ColumnNames{}, {},
                     [](std::string_view, std::string_view, const OutboxTable*) { return true; });
  ASSERT_TRUE(router.OnRelation(Rel(10, "public", "watermill_orders", WatermillColumns())));
  ASSERT_TRUE(router.OnRelation(Rel(10, "public", "watermill_orders_v2", WatermillColumns())));
  EXPECT_EQ(router.Find(10)->topic, "orders_v2");
}

TEST(TableRouter, WatermillTableWithoutItsColumnsAsksInsteadOfStopping) {
  const OutboxTable* seen = nullptr;
  TableRouter router({Orders()}, outbox::ColumnNames{}, {},
                     [&](std::string_view, std::string_view, const OutboxTable* prev) {
                       seen = prev;
                       return false;
                     });
  ASSERT_TRUE(router.OnRelation(Rel(10, "public", "watermill_orders", WatermillColumns())));
  ASSERT_TRUE(router.OnRelation(Rel(10, "public", "watermill_orders", {"offset", "uuid"})));
  ASSERT_NE(seen, nullptr);
  EXPECT_EQ(seen->name.ToString(), "public.watermill_orders");
  EXPECT_EQ(router.Find(10), nullptr);
}

}  // namespace
}  // namespace outbox_relay::pipeline
