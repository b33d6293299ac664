// Watermill's tables: the Go decoding rules (base64, the forwarder's envelope,
// surrogates), watermill-sql's table names, and RecordMapper on rows of a
// watermill-sql table and of the forwarder table.
#include "outbox_relay/outbox/watermill.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

namespace outbox_relay::outbox {
namespace {

using pgoutput::TupleData;
using pgoutput::TupleValue;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Pair;

using Headers = std::vector<std::pair<std::string, std::string>>;

Headers Copy(const std::vector<std::pair<std::string_view, std::string_view>>& h) {
  Headers out;
  for (const auto& [k, v] : h) out.emplace_back(std::string(k), std::string(v));
  return out;
}

std::string Base64(std::string_view text) {
  std::string out;
  EXPECT_TRUE(DecodeGoBase64(text, &out).has_value()) << text;
  return out;
}

std::string Base64Error(std::string_view text) {
  std::string out;
  auto st = DecodeGoBase64(text, &out);
  EXPECT_FALSE(st.has_value()) << text;
  return st ? "" : st.error().message;
}

// --- base64.StdEncoding ------------------------------------------------------

TEST(GoBase64, DecodesPaddedStandardBase64) {
  EXPECT_EQ(Base64(""), "");
  EXPECT_EQ(Base64("eyJvcmRlcl9pZCI6NDJ9"), R"({"order_id":42})");
  EXPECT_EQ(Base64("YQ=="), "a");
  EXPECT_EQ(Base64("YWI="), "ab");
  EXPECT_EQ(Base64("YWJj"), "abc");
  EXPECT_EQ(Base64("AP/+"), std::string("\x00\xff\xfe", 3));
}

TEST(GoBase64, IgnoresCarriageReturnsAndNewlinesAnywhere) {
  EXPECT_EQ(Base64("\r\nY\nW\rJ\nj\n"), "abc");
  EXPECT_EQ(Base64("YQ=\n=\r\n"), "a");
  EXPECT_EQ(Base64("\n\n"), "");
}

TEST(GoBase64, AcceptsNonZeroTrailingBitsAsTheNonStrictEncodingDoes) {
  EXPECT_EQ(Base64("YR=="), "a");
  EXPECT_EQ(Base64("YWJ="), "ab");
}

TEST(GoBase64, RejectsWhatGoRejectsAtTheSameByte) {
  EXPECT_EQ(Base64Error("YQ"), "illegal base64 data at input byte 0");   // no padding
  EXPECT_EQ(Base64Error("YWJ"), "illegal base64 data at input byte 0");  // no padding
  EXPECT_EQ(Base64Error("Y"), "illegal base64 data at input byte 0");    // one char
  EXPECT_EQ(Base64Error("YQ=="
                        "YQ=="),
            "illegal base64 data at input byte 4");                       // data after the padding
  EXPECT_EQ(Base64Error("YQ="), "illegal base64 data at input byte 3");   // one '=' of two
  EXPECT_EQ(Base64Error("YQ=x"), "illegal base64 data at input byte 2");  // '=' then data
  EXPECT_EQ(Base64Error("Y==="), "illegal base64 data at input byte 1");  // padding too early
  EXPECT_EQ(Base64Error("====="), "illegal base64 data at input byte 0");
  EXPECT_EQ(Base64Error("YW-j"), "illegal base64 data at input byte 2");  // URL alphabet
  EXPECT_EQ(Base64Error("YW_j"), "illegal base64 data at input byte 2");
  EXPECT_EQ(Base64Error("YW j"), "illegal base64 data at input byte 2");  // a space
}

// --- names -------------------------------------------------------------------

TEST(WatermillNames, DefaultTableNamesAsWatermillSqlMakesThem) {
  EXPECT_EQ(WatermillMessagesTable("orders"), "watermill_orders");
  EXPECT_EQ(WatermillOffsetsTable("orders"), "watermill_offsets_orders");
  EXPECT_EQ(WatermillTopicOfTable("watermill_orders.created-v1"), "orders.created-v1");
  EXPECT_EQ(WatermillTopicOfTable("watermill_forwarder_topic"), "forwarder_topic");
  EXPECT_EQ(WatermillTopicOfTable("outbox"), std::nullopt);
  EXPECT_EQ(WatermillTopicOfTable("watermill_"), std::nullopt);
}

TEST(WatermillNames, PostgreSQLTruncatesAt63BytesOnACharacterBoundary) {
  const std::string topic(60, 't');
  EXPECT_EQ(WatermillMessagesTable(topic), "watermill_" + std::string(53, 't'));
  EXPECT_EQ(WatermillOffsetsTable(topic), "watermill_offsets_" + std::string(45, 't'));
  // "é" is two bytes: the cut never splits it.
  const std::string accented = std::string(52, 'a') + "\xC3\xA9";  // 10 + 52 + 2 = 64 bytes
  EXPECT_EQ(WatermillMessagesTable(accented), "watermill_" + std::string(52, 'a'));
  // A 63-byte name may have been cut: its topic cannot be known.
  EXPECT_EQ(WatermillTopicOfTable(WatermillMessagesTable(topic)), std::nullopt);
  EXPECT_EQ(WatermillTopicOfTable("watermill_" + std::string(52, 't')), std::string(52, 't'));
}

TEST(WatermillNames, KafkaTopicNames) {
  EXPECT_TRUE(IsKafkaTopicName("orders.created_v1-x"));
  EXPECT_FALSE(IsKafkaTopicName(""));
  EXPECT_FALSE(IsKafkaTopicName("."));
  EXPECT_FALSE(IsKafkaTopicName(".."));
  EXPECT_FALSE(IsKafkaTopicName("a:b"));  // watermill-sql allows ':' and '$', Kafka does not
  EXPECT_FALSE(IsKafkaTopicName("a$b"));
  EXPECT_FALSE(IsKafkaTopicName(std::string(250, 'a')));
  EXPECT_TRUE(IsKafkaTopicName(std::string(249, 'a')));
}

// --- the forwarder's envelope ----------------------------------------------

Headers Entries(const Metadata& m) { return Copy(m.entries()); }

TEST(ForwarderEnvelope, DecodesWhatTheForwarderPublisherWrites) {
  // Bytes written by forwarder.NewPublisher (json.Marshal of messageEnvelope).
  Envelope e;
  auto st = e.Parse(
      R"({"destination_topic":"orders.created","uuid":"0a5b1e6e-6c1c-4b36-9b7e-4d0b2b1f6b8e",)"
      R"("payload":"eyJvcmRlcl9pZCI6NDIsIm5vdGUiOiI8Yj4ifQ==",)"
      R"("metadata":{"correlation_id":"abc","name":"OrderCreated","x":"\u003c\u0026\u003e"}})");
  ASSERT_TRUE(st.has_value()) << st.error().message;
  EXPECT_EQ(e.destination_topic(), "orders.created");
  EXPECT_EQ(e.uuid(), "0a5b1e6e-6c1c-4b36-9b7e-4d0b2b1f6b8e");
  EXPECT_EQ(e.payload(), std::optional<std::string_view>(R"({"order_id":42,"note":"<b>"})"));
  EXPECT_THAT(Entries(e.metadata()), ElementsAre(Pair("correlation_id", "abc"),
                                                 Pair("name", "OrderCreated"), Pair("x", "<&>")));
}

TEST(ForwarderEnvelope, NullPayloadIsNilEmptyPayloadIsEmpty) {
  Envelope e;
  ASSERT_TRUE(e.Parse(R"({"destination_topic":"t","uuid":"u","payload":null,"metadata":null})"));
  EXPECT_EQ(e.payload(), std::nullopt);
  EXPECT_TRUE(e.metadata().entries().empty());
  ASSERT_TRUE(e.Parse(R"({"destination_topic":"t","uuid":"u","payload":"","metadata":{}})"));
  EXPECT_EQ(e.payload(), std::optional<std::string_view>(""));
  ASSERT_TRUE(e.Parse(R"({"destination_topic":"t"})"));  // missing fields: zero values
  EXPECT_EQ(e.uuid(), "");
  EXPECT_EQ(e.payload(), std::nullopt);
}

TEST(ForwarderEnvelope, FieldNamesMatchCaseInsensitivelyLastOneWins) {
  Envelope e;
  auto st =
      e.Parse(R"({"Destination_Topic":"a","UUID":"u1","uuid":"u2","PAYLOAD":"YQ==","extra":[1,2],)"
              R"("MetaData":{"k":"v"}})");
  ASSERT_TRUE(st.has_value()) << st.error().message;
  EXPECT_EQ(e.destination_topic(), "a");
  EXPECT_EQ(e.uuid(), "u2");
  EXPECT_EQ(e.payload(), std::optional<std::string_view>("a"));
  EXPECT_THAT(Entries(e.metadata()), ElementsAre(Pair("k", "v")));
  // bytes.EqualFold: U+017F folds to 's', U+212A (Kelvin) to 'k'.
  ASSERT_TRUE(e.Parse("{\"de\xC5\xBFtination_topic\":\"b\"}"));
  EXPECT_EQ(e.destination_topic(), "b");
  ASSERT_FALSE(e.Parse("{\"destination_topi\xE2\x84\xAA\":\"b\"}"));  // 'c' is not 'k'
}

TEST(ForwarderEnvelope, NullLeavesAStringAloneAndClearsBytesAndTheMap) {
  Envelope e;
  ASSERT_TRUE(e.Parse(R"({"destination_topic":"t","uuid":"u","uuid":null,"payload":"YQ==",)"
                      R"("payload":null,"metadata":{"a":"1"},"metadata":null})"));
  EXPECT_EQ(e.uuid(), "u");
  EXPECT_EQ(e.payload(), std::nullopt);
  EXPECT_TRUE(e.metadata().entries().empty());
}

TEST(ForwarderEnvelope, ARepeatedMetadataObjectMergesIntoTheMap) {
  Envelope e;
  ASSERT_TRUE(e.Parse(R"({"destination_topic":"t","metadata":{"a":"1","b":"2"},)"
                      R"("metadata":{"b":"3","c":null}})"));
  EXPECT_THAT(Entries(e.metadata()), ElementsAre(Pair("a", "1"), Pair("b", "3"), Pair("c", "")));
}

TEST(ForwarderEnvelope, WhatTheForwarderCannotUnwrapIsPoison) {
  struct Case {
    std::string json;
    std::string why;
  };
  for (const Case& c : std::vector<Case>{
           {"not json", "not valid JSON"},
           {R"(["a"])", "is an array, not an object"},
           {"null", "no destination_topic"},
           {R"({"order_id":42})", "no destination_topic"},
           {R"({"destination_topic":""})", "no destination_topic"},
           {R"({"destination_topic":null})", "no destination_topic"},
           {R"({"destination_topic":5})", "\"destination_topic\" is a number"},
           {R"({"destination_topic":"t","uuid":true})", "\"uuid\" is a boolean"},
           {R"({"destination_topic":"t","payload":"YQ"})", "illegal base64 data at input byte 0"},
           {R"({"destination_topic":"t","payload":"YW-j"})", "illegal base64"},
           {R"({"destination_topic":"t","payload":[1]})", "expected a base64 string"},
           {R"({"destination_topic":"t","metadata":{"a":1}})", "key \"a\" is a number"},
           {R"({"destination_topic":"t","metadata":"x"})", "expected an object of strings"},
           {R"({"destination_topic":"a:b"})", "not a legal Kafka topic"},
       }) {
    Envelope e;
    auto st = e.Parse(c.json);
    ASSERT_FALSE(st.has_value()) << c.json;
    EXPECT_EQ(st.error().code, ErrorCode::kPoison);
    EXPECT_THAT(st.error().message, HasSubstr(c.why)) << c.json;
  }
}

TEST(ForwarderEnvelope, LoneSurrogatesBecomeReplacementCharacters) {
  Envelope e;
  ASSERT_TRUE(e.Parse(R"({"destination_topic":"t","uuid":"a\ud83db","metadata":{"k":"\udc00"}})"));
  EXPECT_EQ(e.uuid(),
            "a\xEF\xBF\xBD"
            "b");
  EXPECT_THAT(Entries(e.metadata()), ElementsAre(Pair("k", "\xEF\xBF\xBD")));
}

TEST(SurrogateEscapes, RewritesOnlyUnpairedOnes) {
  std::string s = R"("\ud83d\ude00 \ud83d \\ud83d \ude00\ud83d\u0041 \u00e9 \ud83d)";
  EXPECT_EQ(ReplaceLoneSurrogateEscapes(s.data(), s.size()), 4u);
  EXPECT_EQ(s, R"("\ud83d\ude00 \ufffd \\ud83d \ufffd\ufffd\u0041 \u00e9 \ufffd)");
  std::string cut = R"(\ud8)";  // a truncated escape is left to the parser
  EXPECT_EQ(ReplaceLoneSurrogateEscapes(cut.data(), cut.size()), 0u);
}

// --- RecordMapper on Watermill tables -----------------------------------------

TupleValue Text(std::string_view s) { return TupleValue{TupleValue::Kind::kText, s}; }
TupleValue Null() { return TupleValue{TupleValue::Kind::kNull, {}}; }

// watermill-sql's DDL, in its column order.
pgoutput::Relation WatermillRelation(pgoutput::Oid payload_type = 114) {
  pgoutput::Relation r;
  r.relation_id = 16500;
  r.nspname = "public";
  r.relname = "watermill_orders";
  for (auto [name, type] :
       std::vector<std::pair<const char*, pgoutput::Oid>>{{"offset", 20},
                                                          {"uuid", 1043},
                                                          {"created_at", 1114},
                                                          {"payload", payload_type},
                                                          {"metadata", 114},
                                                          {"transaction_id", 5069}}) {
    r.columns.push_back(pgoutput::RelationColumn{0, name, type, -1});
  }
  return r;
}

ColumnNames WatermillColumns() {
  ColumnNames n;
  n.offset = "offset";
  return n;
}

struct WRow {
  TupleValue offset = Text("7");
  TupleValue uuid = Text("uuid-1");
  TupleValue payload = Text(R"({"order_id":42})");
  TupleValue metadata = Text(R"({"correlation_id":"c-1","name":"OrderCreated"})");
  TupleValue xid = Text("900");
  TupleData Tuple() const {
    return TupleData{{offset, uuid, Text("2026-01-01 10:00:00.5"), payload, metadata, xid}};
  }
};

class WatermillMapperTest : public ::testing::Test {
 protected:
  ColumnMap Columns(TableKind kind, pgoutput::Oid payload_type = 114) {
    auto map = ColumnMap::Resolve(WatermillRelation(payload_type), WatermillColumns());
    EXPECT_TRUE(map.has_value());
    map->kind = kind;
    map->table = "public.watermill_orders";
    map->topic = "orders";
    return *map;
  }
  Mapped Map(RecordMapper& mapper, const ColumnMap& columns, const WRow& row) {
    tuple_ = row.Tuple();
    auto mapped = mapper.Map(columns, tuple_, Lsn(0x10));
    EXPECT_TRUE(mapped.has_value());
    return mapped ? *mapped : Mapped{};
  }
  static RecordMapper Mapper(MapperOptions options = {}) {
    return std::move(*RecordMapper::Create(std::move(options)));
  }
  TupleData tuple_;
};

TEST_F(WatermillMapperTest, DirectTableIsDefaultMarshalerRecord) {
  RecordMapper mapper = Mapper();
  Mapped m = Map(mapper, Columns(TableKind::kWatermill), WRow{});
  ASSERT_NE(m.record, nullptr) << m.poison->message;
  EXPECT_EQ(m.identity.transaction_id, 900u);
  EXPECT_EQ(m.identity.offset, 7);
  EXPECT_EQ(m.record->topic, "orders");
  EXPECT_EQ(m.record->key, std::nullopt);  // DefaultMarshaler: null key
  EXPECT_EQ(m.record->value, std::optional<std::string_view>(R"({"order_id":42})"));
  EXPECT_EQ(m.record->event_type, "OrderCreated");  // CQRS's "name"
  EXPECT_THAT(Copy(m.record->headers),
              ElementsAre(Pair("_watermill_message_uuid", "uuid-1"), Pair("correlation_id", "c-1"),
                          Pair("name", "OrderCreated")));
}

TEST_F(WatermillMapperTest, KeyFieldGivesTheFieldOrTheEmptyKey) {
  MapperOptions options;
  options.watermill_key_field = "correlation_id";
  RecordMapper mapper = Mapper(options);
  Mapped m = Map(mapper, Columns(TableKind::kWatermill), WRow{});
  EXPECT_EQ(m.record->key, std::optional<std::string_view>("c-1"));
  WRow row;
  row.metadata = Text("{}");
  m = Map(mapper, Columns(TableKind::kWatermill), row);
  EXPECT_EQ(m.record->key, std::optional<std::string_view>(""));  // msg.Metadata.Get: ""
}

TEST_F(WatermillMapperTest, EmptyUuidNullPayloadAndNullMetadataArePublished) {
  RecordMapper mapper = Mapper();
  WRow row;
  row.uuid = Text("");
  row.payload = Null();
  row.metadata = Text("null");
  Mapped m = Map(mapper, Columns(TableKind::kWatermill), row);
  ASSERT_NE(m.record, nullptr);
  EXPECT_EQ(m.record->value, std::nullopt);
  EXPECT_THAT(Copy(m.record->headers), ElementsAre(Pair("_watermill_message_uuid", "")));
  row.metadata = Null();
  m = Map(mapper, Columns(TableKind::kWatermill), row);
  ASSERT_NE(m.record, nullptr);
}

TEST_F(WatermillMapperTest, ByteaPayloadIsPublishedAsItsBytes) {
  RecordMapper mapper = Mapper();
  WRow row;
  row.payload = Text("\\x00fffe7b7d");
  Mapped m = Map(mapper, Columns(TableKind::kWatermill, 17), row);
  ASSERT_NE(m.record, nullptr);
  EXPECT_EQ(m.record->value, std::optional<std::string_view>(std::string_view("\0\xff\xfe{}", 5)));
}

TEST_F(WatermillMapperTest, NonStringMetadataIsPoison) {
  RecordMapper mapper = Mapper();
  WRow row;
  row.metadata = Text(R"({"a":1})");
  Mapped m = Map(mapper, Columns(TableKind::kWatermill), row);
  ASSERT_TRUE(m.poison.has_value());
  EXPECT_EQ(m.identity.uuid, "uuid-1");
}

TEST_F(WatermillMapperTest, RowsTheConsumerGroupProcessedAreSkipped) {
  RecordMapper mapper = Mapper();
  ColumnMap columns = Columns(TableKind::kWatermill);
  columns.processed = TablePosition{900, 7};
  EXPECT_TRUE(Map(mapper, columns, WRow{}).already_processed);
  columns.processed = TablePosition{900, 6};
  EXPECT_FALSE(Map(mapper, columns, WRow{}).already_processed);
  columns.processed = TablePosition{899, 1000};
  EXPECT_FALSE(Map(mapper, columns, WRow{}).already_processed);
  columns.processed = TablePosition{901, 0};
  EXPECT_TRUE(Map(mapper, columns, WRow{}).already_processed);
}

TEST_F(WatermillMapperTest, ForwarderRowIsTheEnvelopesMessage) {
  MapperOptions options;
  options.commit_lsn_header = "lsn";
  RecordMapper mapper = Mapper(options);
  WRow row;
  row.uuid = Text("wrapper-uuid");
  row.metadata = Text("{}");
  row.payload =
      Text(R"({"destination_topic":"orders.created","uuid":"inner-uuid","payload":"AP8=",)"
           R"("metadata":{"name":"OrderCreated","b":""}})");
  Mapped m = Map(mapper, Columns(TableKind::kForwarder), row);
  ASSERT_NE(m.record, nullptr) << m.poison->message;
  EXPECT_EQ(m.identity.uuid, "wrapper-uuid");  // what finds the row in the table
  EXPECT_EQ(m.record->topic, "orders.created");
  EXPECT_EQ(m.record->key, std::nullopt);
  EXPECT_EQ(m.record->value, std::optional<std::string_view>(std::string_view("\0\xff", 2)));
  EXPECT_THAT(Copy(m.record->headers),
              ElementsAre(Pair("_watermill_message_uuid", "inner-uuid"), Pair("b", ""),
                          Pair("name", "OrderCreated"), Pair("lsn", "0/10")));
}

TEST_F(WatermillMapperTest, ForwarderEnvelopeInABytea) {
  RecordMapper mapper = Mapper();
  WRow row;
  // {"destination_topic":"t","payload":null}
  row.payload =
      Text("\\x7b2264657374696e6174696f6e5f746f706963223a2274222c227061796c6f6164223a6e756c6c7d");
  Mapped m = Map(mapper, Columns(TableKind::kForwarder, 17), row);
  ASSERT_NE(m.record, nullptr) << m.poison->message;
  EXPECT_EQ(m.record->topic, "t");
  EXPECT_EQ(m.record->value, std::nullopt);
}

TEST_F(WatermillMapperTest, MalformedEnvelopeIsPoison) {
  RecordMapper mapper = Mapper();
  WRow row;
  row.payload = Text(R"({"order_id":42})");
  Mapped m = Map(mapper, Columns(TableKind::kForwarder), row);
  ASSERT_TRUE(m.poison.has_value());
  EXPECT_THAT(m.poison->message, HasSubstr("forwarder envelope: the envelope has no destination"));
  row.payload = Null();
  m = Map(mapper, Columns(TableKind::kForwarder), row);
  ASSERT_TRUE(m.poison.has_value());
}

TEST_F(WatermillMapperTest, ReservedUuidInTheEnvelopesMetadata) {
  RecordMapper mapper = Mapper();
  WRow row;
  row.payload =
      Text(R"({"destination_topic":"t","uuid":"u","metadata":{"_watermill_message_uuid":"x"}})");
  EXPECT_TRUE(Map(mapper, Columns(TableKind::kForwarder), row).poison.has_value());
  row.payload =
      Text(R"({"destination_topic":"t","uuid":"u","metadata":{"_watermill_message_uuid":""}})");
  Mapped m = Map(mapper, Columns(TableKind::kForwarder), row);
  ASSERT_NE(m.record, nullptr);
  EXPECT_THAT(Copy(m.record->headers), ElementsAre(Pair("_watermill_message_uuid", "u"),
                                                   Pair("_watermill_message_uuid", "")));
}

}  // namespace
}  // namespace outbox_relay::outbox
