// RelationCache and Relation::ColumnIndex: columns are found by name, and a re-sent Relation
// (a schema change) replaces the previous one wholesale.
#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "outbox_relay/pgoutput/decoder.h"

namespace outbox_relay::pgoutput {
namespace {

constexpr Oid kOutboxOid = 16385;

Relation Outbox() {
  Relation r;
  r.relation_id = kOutboxOid;
  r.nspname = "public";
  r.relname = "outbox";
  r.replica_identity = 'd';
  r.columns = {{0, "offset_acked", 20, -1},    {1, "offset_consumed", 20, -1},
               {0, "uuid", 1043, 40},          {0, "created_at", 1184, -1},
               {0, "payload", 114, -1},        {0, "metadata", 114, -1},
               {1, "transaction_id", 5069, -1}};
  return r;
}

TEST(ColumnIndex, FindsColumnsByName) {
  Relation r = Outbox();
  EXPECT_EQ(r.ColumnIndex("offset_acked"), 0);
  EXPECT_EQ(r.ColumnIndex("uuid"), 2);
  EXPECT_EQ(r.ColumnIndex("transaction_id"), 6);
}

TEST(ColumnIndex, MissingColumnIsMinusOne) {
  Relation r = Outbox();
  EXPECT_EQ(r.ColumnIndex("offset"), -1);  // watermill-sql's name, not in the seed's table
  EXPECT_EQ(r.ColumnIndex(""), -1);
  EXPECT_EQ(Relation{}.ColumnIndex("uuid"), -1);
}

TEST(ColumnIndex, NamesAreCaseSensitiveAsPostgresSendsThemAfterQuoting) {
  Relation r = Outbox();
  r.columns.push_back({0, "Payload", 114, -1});  // CREATE TABLE ... ("Payload" json)
  EXPECT_EQ(r.ColumnIndex("payload"), 4);
  EXPECT_EQ(r.ColumnIndex("Payload"), 7);
  EXPECT_EQ(r.ColumnIndex("UUID"), -1);
}

TEST(ColumnIndex, NameMustMatchWholly) {
  Relation r = Outbox();
  EXPECT_EQ(r.ColumnIndex("offset_"), -1);
  EXPECT_EQ(r.ColumnIndex("uuid2"), -1);
  EXPECT_EQ(r.ColumnIndex(std::string_view("uuid\0", 5)), -1);
}

TEST(RelationCache, UnknownRelationIsNull) {
  RelationCache cache;
  EXPECT_EQ(cache.Find(kOutboxOid), nullptr);
}

TEST(RelationCache, FindsWhatWasPut) {
  RelationCache cache;
  cache.Put(Outbox());
  const Relation* r = cache.Find(kOutboxOid);
  ASSERT_NE(r, nullptr);
  EXPECT_EQ(r->relname, "outbox");
  EXPECT_EQ(r->columns.size(), 7u);
  EXPECT_EQ(cache.Find(kOutboxOid + 1), nullptr);
}

TEST(RelationCache, ResentRelationWithAnAddedColumnReplacesTheOldOne) {
  RelationCache cache;
  cache.Put(Outbox());
  Relation altered = Outbox();
  altered.columns.push_back({0, "trace_id", 25, -1});
  cache.Put(altered);
  const Relation* r = cache.Find(kOutboxOid);
  ASSERT_NE(r, nullptr);
  EXPECT_EQ(r->columns.size(), 8u);
  EXPECT_EQ(r->ColumnIndex("trace_id"), 7);
  EXPECT_EQ(r->ColumnIndex("payload"), 4);
}

TEST(RelationCache, ResentRelationWithADroppedColumnMovesTheColumnsAfterIt) {
  RelationCache cache;
  cache.Put(Outbox());
  ASSERT_EQ(cache.Find(kOutboxOid)->ColumnIndex("payload"), 4);
  Relation altered = Outbox();
  altered.columns.erase(altered.columns.begin() + 3);  // ALTER TABLE outbox DROP created_at
  cache.Put(altered);
  const Relation* r = cache.Find(kOutboxOid);
  EXPECT_EQ(r->ColumnIndex("created_at"), -1);
  EXPECT_EQ(r->ColumnIndex("payload"), 3);  // why positions must never be cached across Relations
  EXPECT_EQ(r->ColumnIndex("transaction_id"), 5);
}

TEST(RelationCache, ResentRelationReplacesNameAndReplicaIdentityToo) {
  RelationCache cache;
  cache.Put(Outbox());
  Relation renamed = Outbox();
  renamed.nspname = "events";
  renamed.relname = "outbox_v2";
  renamed.replica_identity = 'f';
  cache.Put(renamed);
  const Relation* r = cache.Find(kOutboxOid);
  EXPECT_EQ(r->nspname, "events");
  EXPECT_EQ(r->relname, "outbox_v2");
  EXPECT_EQ(r->replica_identity, 'f');
}

TEST(RelationCache, RelationsAreKeptPerOid) {
  RelationCache cache;
  cache.Put(Outbox());
  Relation other = Outbox();
  other.relation_id = kOutboxOid + 10;
  other.relname = "outbox_archive";
  other.columns.resize(2);
  cache.Put(other);
  EXPECT_EQ(cache.Find(kOutboxOid)->relname, "outbox");
  EXPECT_EQ(cache.Find(kOutboxOid)->columns.size(), 7u);
  EXPECT_EQ(cache.Find(kOutboxOid + 10)->relname, "outbox_archive");
}

TEST(RelationCache, ClearForgetsEverything) {
  RelationCache cache;
  cache.Put(Outbox());
  cache.Clear();
  EXPECT_EQ(cache.Find(kOutboxOid), nullptr);
}

TEST(RelationCache, CachedRelationOutlivesTheBufferItWasDecodedFrom) {
  RelationCache cache;
  {
    auto buffer = std::make_unique<std::string>(Encode(Outbox()));
    DecodedMessage m;
    ASSERT_TRUE(Decode(*buffer, &m));
    cache.Put(std::get<Relation>(std::move(m)));
    buffer->assign(buffer->size(), 'X');  // scribble over it, then free it
  }
  const Relation* r = cache.Find(kOutboxOid);
  ASSERT_NE(r, nullptr);
  EXPECT_EQ(r->nspname, "public");
  EXPECT_EQ(r->columns[2].name, "uuid");
}

}  // namespace
}  // namespace outbox_relay::pgoutput
