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
                     [&](std::string_view schema, std::string_view name) {
                       asked = true;
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
