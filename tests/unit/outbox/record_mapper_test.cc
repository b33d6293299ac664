// ColumnMap and RecordMapper: an inserted outbox row becomes the record the
// Watermill forwarder produced (DESIGN §4), a poison row, or a stop.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

#include "outbox_relay/outbox/record.h"

namespace outbox_relay::outbox {
namespace {

using pgoutput::TupleData;
using pgoutput::TupleValue;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Pair;

using Headers = std::vector<std::pair<std::string, std::string>>;

constexpr std::string_view kUuid = "01HQZX3V5K8Y2M4N6P7R9S0T1U";
constexpr std::string_view kPayload = R"({"review_id":"r-1","rating":5,"text":"Отлично"})";
// Go's json.Marshal output for the seed's envelope.
constexpr std::string_view kMetadata =
    R"({"Aggregate-Id":"r-1","Correlation-Id":"c-9","Event-Type":"review.created",)"
    R"("Published-At":"2024-03-01T12:00:00Z","Schema-Version":"1","Source-Service":"review",)"
    R"("traceparent":"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"})";

pgoutput::Relation MakeRelation(std::vector<std::string> names) {
  pgoutput::Relation r;
  r.relation_id = 16390;
  r.nspname = "public";
  r.relname = "outbox";
  for (std::string& n : names)
    r.columns.push_back(pgoutput::RelationColumn{0, std::move(n), 25, -1});
  return r;
}

// The seed's table, in its column order.
pgoutput::Relation SeedRelation() {
  return MakeRelation({"offset_acked", "offset_consumed", "uuid", "created_at", "payload",
                       "metadata", "transaction_id"});
}

TupleValue Text(std::string_view s) { return TupleValue{TupleValue::Kind::kText, s}; }
TupleValue Null() { return TupleValue{TupleValue::Kind::kNull, {}}; }
TupleValue Toast() { return TupleValue{TupleValue::Kind::kUnchangedToast, {}}; }

// A row of the seed's table; each needed column can be replaced.
struct Row {
  TupleValue offset = Text("45");
  TupleValue uuid = Text(kUuid);
  TupleValue payload = Text(kPayload);
  TupleValue metadata = Text(kMetadata);
  TupleValue xid = Text("742");

  TupleData Tuple() const {
    return TupleData{
        {Null(), offset, uuid, Text("2024-03-01 12:00:00.1+00"), payload, metadata, xid}};
  }
};

Headers Copy(const std::vector<std::pair<std::string_view, std::string_view>>& h) {
  Headers out;
  for (const auto& [k, v] : h) out.emplace_back(std::string(k), std::string(v));
  return out;
}

class RecordMapperTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto map = ColumnMap::Resolve(SeedRelation(), ColumnNames{});
    ASSERT_TRUE(map.has_value()) << map.error().message;
    columns_ = *map;
  }

  RecordMapper Mapper(MapperOptions options = {}) {
    auto m = RecordMapper::Create(std::move(options));
    EXPECT_TRUE(m.has_value()) << m.error().message;
    return std::move(*m);
  }

  // Maps and expects a record.
  const KafkaRecord& MustMap(RecordMapper& mapper, const Row& row, Lsn lsn = Lsn(0x16B3748)) {
    tuple_ = row.Tuple();
    auto mapped = mapper.Map(columns_, tuple_, lsn);
    EXPECT_TRUE(mapped.has_value()) << mapped.error().message;
    static const KafkaRecord kNone;
    if (!mapped) return kNone;
    EXPECT_FALSE(mapped->poison.has_value()) << mapped->poison->message;
    EXPECT_NE(mapped->record, nullptr);
    return mapped->record ? *mapped->record : kNone;
  }

  // Maps and expects poison.
  Mapped MustPoison(RecordMapper& mapper, const Row& row) {
    tuple_ = row.Tuple();
    auto mapped = mapper.Map(columns_, tuple_, Lsn(1));
    EXPECT_TRUE(mapped.has_value()) << mapped.error().message;
    if (!mapped) return {};
    EXPECT_TRUE(mapped->poison.has_value());
    EXPECT_EQ(mapped->record, nullptr);
    if (mapped->poison) {
      EXPECT_EQ(mapped->poison->code, ErrorCode::kPoison);
    }
    return *mapped;
  }

  // Maps and expects an error (the caller must stop).
  Error MustFail(RecordMapper& mapper, const Row& row) {
    tuple_ = row.Tuple();
    auto mapped = mapper.Map(columns_, tuple_, Lsn(1));
    EXPECT_FALSE(mapped.has_value());
    if (mapped) return Error{ErrorCode::kPoison, "mapped"};
    EXPECT_EQ(DispositionOf(mapped.error()), Disposition::kStop) << mapped.error().message;
    return mapped.error();
  }

  ColumnMap columns_;
  TupleData tuple_;
};

// --- ColumnMap -------------------------------------------------------------

TEST(ColumnMapResolve, FindsTheSeedTablesColumnsByName) {
  auto map = ColumnMap::Resolve(SeedRelation(), ColumnNames{});
  ASSERT_TRUE(map.has_value()) << map.error().message;
  EXPECT_EQ(map->offset, 1);
  EXPECT_EQ(map->uuid, 2);
  EXPECT_EQ(map->payload, 4);
  EXPECT_EQ(map->metadata, 5);
  EXPECT_EQ(map->transaction_id, 6);
}

TEST(ColumnMapResolve, FindsColumnsInAnyOrderAmongExtraColumns) {
  auto map = ColumnMap::Resolve(MakeRelation({"tenant", "transaction_id", "metadata", "extra_1",
                                              "payload", "uuid", "offset_consumed", "trace"}),
                                ColumnNames{});
  ASSERT_TRUE(map.has_value()) << map.error().message;
  EXPECT_EQ(map->transaction_id, 1);
  EXPECT_EQ(map->metadata, 2);
  EXPECT_EQ(map->payload, 4);
  EXPECT_EQ(map->uuid, 5);
  EXPECT_EQ(map->offset, 6);
}

TEST(ColumnMapResolve, UsesConfiguredColumnNames) {
  // watermill-sql's own table: "offset" rather than offset_consumed.
  ColumnNames names;
  names.offset = "offset";
  auto map = ColumnMap::Resolve(
      MakeRelation({"offset", "uuid", "created_at", "payload", "metadata", "transaction_id"}),
      names);
  ASSERT_TRUE(map.has_value()) << map.error().message;
  EXPECT_EQ(map->offset, 0);
}

TEST(ColumnMapResolve, MissingColumnsAreNamedAlongWithTheTablesColumns) {
  auto map = ColumnMap::Resolve(MakeRelation({"offset_consumed", "uuid", "body", "transaction_id"}),
                                ColumnNames{});
  ASSERT_FALSE(map.has_value());
  EXPECT_EQ(map.error().code, ErrorCode::kInvalidArgument);
  EXPECT_EQ(map.error().message,
            "table public.outbox (relation 16390) lacks column(s) \"payload\", \"metadata\" "
            "needed for the outbox; its columns are: offset_consumed, uuid, body, transaction_id");
}

TEST(ColumnMapResolve, NamesAreCaseSensitiveAsPostgresSendsThem) {
  auto map = ColumnMap::Resolve(
      MakeRelation({"offset_consumed", "UUID", "payload", "metadata", "transaction_id"}),
      ColumnNames{});
  ASSERT_FALSE(map.has_value());
  EXPECT_THAT(map.error().message, HasSubstr("lacks column(s) \"uuid\""));
}

// --- The record contract ---------------------------------------------------

TEST_F(RecordMapperTest, MapsTheSeedRowToTheWatermillRecord) {
  RecordMapper mapper = Mapper();
  const KafkaRecord& r = MustMap(mapper, Row{});
  EXPECT_EQ(r.topic, "kazmaps.review.review");
  EXPECT_EQ(r.key, "r-1");
  EXPECT_EQ(r.value, kPayload);
  EXPECT_EQ(r.event_type, "review.created");
  EXPECT_THAT(
      Copy(r.headers),
      ElementsAre(Pair("_watermill_message_uuid", std::string(kUuid)), Pair("Aggregate-Id", "r-1"),
                  Pair("Correlation-Id", "c-9"), Pair("Event-Type", "review.created"),
                  Pair("Published-At", "2024-03-01T12:00:00Z"), Pair("Schema-Version", "1"),
                  Pair("Source-Service", "review"), Pair("partition_key", "r-1"),
                  Pair("traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")));
}

TEST_F(RecordMapperTest, ValueIsThePayloadTextByteForByte) {
  RecordMapper mapper = Mapper();
  Row row;
  std::string payload = "{ \"a\" : 1 ,\n\"b\":\"\\u003c\"}  ";  // json keeps the text as written
  row.payload = Text(payload);
  const KafkaRecord& r = MustMap(mapper, row);
  ASSERT_TRUE(r.value.has_value());
  EXPECT_EQ(r.value->data(), payload.data());  // verbatim: a view of the row, not a re-encoding
  EXPECT_EQ(*r.value, payload);
}

TEST_F(RecordMapperTest, NullPayloadIsANullValue) {
  RecordMapper mapper = Mapper();
  Row row;
  row.payload = Null();
  EXPECT_EQ(MustMap(mapper, row).value, std::nullopt);
}

TEST_F(RecordMapperTest, EmptyPayloadIsAnEmptyNotANullValue) {
  RecordMapper mapper = Mapper();
  Row row;
  row.payload = Text("");
  EXPECT_EQ(MustMap(mapper, row).value, std::string_view());
}

TEST_F(RecordMapperTest, NoAggregateIdMeansTheEmptyKeyAndNoPartitionKey) {
  // Sarama hashes the empty key to one fixed partition, as the Go pipeline did.
  RecordMapper mapper = Mapper();
  Row row;
  row.metadata = Text(R"({"Event-Type":"review.created","Source-Service":"review"})");
  const KafkaRecord& r = MustMap(mapper, row);
  ASSERT_TRUE(r.key.has_value());
  EXPECT_EQ(*r.key, "");
  EXPECT_THAT(Copy(r.headers),
              ElementsAre(Pair("_watermill_message_uuid", std::string(kUuid)),
                          Pair("Event-Type", "review.created"), Pair("Source-Service", "review")));
}

TEST_F(RecordMapperTest, EmptyAggregateIdMeansTheEmptyKeyAndKeepsTheEmptyHeader) {
  RecordMapper mapper = Mapper();
  Row row;
  row.metadata =
      Text(R"({"Aggregate-Id":"","Event-Type":"review.created","Source-Service":"review"})");
  const KafkaRecord& r = MustMap(mapper, row);
  ASSERT_TRUE(r.key.has_value());
  EXPECT_EQ(*r.key, "");
  EXPECT_THAT(
      Copy(r.headers),
      ElementsAre(Pair("_watermill_message_uuid", std::string(kUuid)), Pair("Aggregate-Id", ""),
                  Pair("Event-Type", "review.created"), Pair("Source-Service", "review")));
}

TEST_F(RecordMapperTest, WithoutAggregateIdThePartitionKeyInTheMetadataIsTheKey) {
  RecordMapper mapper = Mapper();
  Row row;
  row.metadata =
      Text(R"({"Event-Type":"review.created","Source-Service":"review","partition_key":"p-3"})");
  const KafkaRecord& r = MustMap(mapper, row);
  EXPECT_EQ(r.key, "p-3");
  EXPECT_THAT(Copy(r.headers),
              ElementsAre(Pair("_watermill_message_uuid", std::string(kUuid)),
                          Pair("Event-Type", "review.created"), Pair("Source-Service", "review"),
                          Pair("partition_key", "p-3")));
}

TEST_F(RecordMapperTest, NoKeyFieldMeansANullKey) {
  MapperOptions options;
  options.key_field = "";
  RecordMapper mapper = Mapper(options);
  Row row;
  const KafkaRecord& r = MustMap(mapper, row);
  EXPECT_EQ(r.key, std::nullopt);
}

TEST_F(RecordMapperTest, AByteaPayloadIsPublishedAsItsBytes) {
  // A relation whose payload column is bytea (OID 17) is seen as such.
  pgoutput::Relation relation = SeedRelation();
  relation.columns[4].type_oid = 17;
  auto columns = ColumnMap::Resolve(relation, ColumnNames{});
  ASSERT_TRUE(columns.has_value());
  EXPECT_TRUE(columns->payload_is_bytea);
  EXPECT_FALSE(columns_.payload_is_bytea);
  RecordMapper mapper = Mapper();
  Row row;
  row.payload = Text("\\x7b2261223a317d00ff");
  tuple_ = row.Tuple();
  auto mapped = mapper.Map(*columns, tuple_, Lsn(0x100));
  ASSERT_TRUE(mapped.has_value());
  ASSERT_NE(mapped->record, nullptr);
  EXPECT_EQ(mapped->record->value, std::string_view("{\"a\":1}\0\xff", 9));
}

TEST(DecodeByteaText, HexAndEscapeFormsAndBadInput) {
  std::string out;
  ASSERT_TRUE(DecodeByteaText("\\x", &out));
  EXPECT_EQ(out, "");
  ASSERT_TRUE(DecodeByteaText("\\x4142", &out));
  EXPECT_EQ(out, "AB");
  ASSERT_TRUE(DecodeByteaText("A\\102\\\\", &out));
  EXPECT_EQ(out, "AB\\");
  EXPECT_FALSE(DecodeByteaText("\\x414", &out));
  EXPECT_FALSE(DecodeByteaText("\\x4g", &out));
  EXPECT_FALSE(DecodeByteaText("a\\9", &out));
  EXPECT_FALSE(DecodeByteaText("a\\", &out));
}

TEST_F(RecordMapperTest, PartitionKeyOverridesOneAlreadyInTheMetadata) {
  RecordMapper mapper = Mapper();
  Row row;
  row.metadata =
      Text(R"({"Aggregate-Id":"r-7","Event-Type":"review.created","Source-Service":"review",)"
           R"("partition_key":"stale"})");
  const KafkaRecord& r = MustMap(mapper, row);
  EXPECT_EQ(r.key, "r-7");
  EXPECT_THAT(Copy(r.headers),
              ElementsAre(Pair("_watermill_message_uuid", std::string(kUuid)),
                          Pair("Aggregate-Id", "r-7"), Pair("Event-Type", "review.created"),
                          Pair("Source-Service", "review"), Pair("partition_key", "r-7")));
}

TEST_F(RecordMapperTest, PartitionKeyHeaderCanBeTurnedOff) {
  MapperOptions options;
  options.partition_key_header = false;
  RecordMapper mapper = Mapper(options);
  const KafkaRecord& r = MustMap(mapper, Row{});
  EXPECT_EQ(r.key, "r-1");
  for (const auto& [name, value] : r.headers) EXPECT_NE(name, "partition_key");
  EXPECT_EQ(r.headers.size(), 8u);
}

TEST_F(RecordMapperTest, KeyComesFromTheConfiguredField) {
  MapperOptions options;
  options.key_field = "Correlation-Id";
  RecordMapper mapper = Mapper(options);
  const KafkaRecord& r = MustMap(mapper, Row{});
  EXPECT_EQ(r.key, "c-9");
  EXPECT_THAT(Copy(r.headers), testing::Contains(Pair("partition_key", "c-9")));
}

TEST_F(RecordMapperTest, EmptyKeyFieldMeansNoKeyAtAll) {
  MapperOptions options;
  options.key_field = "";
  RecordMapper mapper = Mapper(options);
  const KafkaRecord& r = MustMap(mapper, Row{});
  EXPECT_EQ(r.key, std::nullopt);
  for (const auto& [name, value] : r.headers) EXPECT_NE(name, "partition_key");
}

TEST_F(RecordMapperTest, EmptyMetadataValueIsAZeroLengthNotANullHeader) {
  RecordMapper mapper = Mapper();
  Row row;
  row.metadata = Text(
      R"({"Correlation-Id":null,"Event-Type":"review.created","Note":"","Source-Service":"review"})");
  const KafkaRecord& r = MustMap(mapper, row);
  ASSERT_EQ(r.headers.size(), 5u);
  EXPECT_EQ(r.headers[1].first, "Correlation-Id");
  EXPECT_EQ(r.headers[1].second.size(), 0u);
  EXPECT_NE(r.headers[1].second.data(), nullptr);
  EXPECT_EQ(r.headers[3].first, "Note");
  EXPECT_EQ(r.headers[3].second.size(), 0u);
  EXPECT_NE(r.headers[3].second.data(), nullptr);
}

TEST_F(RecordMapperTest, HeaderValuesAreTheDecodedMetadataBytes) {
  RecordMapper mapper = Mapper();
  Row row;
  row.metadata = Text(R"({"Aggregate-Id":"a\u003cb\u003e\u0026c","Event-Type":"review.created",)"
                      R"("Note":"\ud83d\ude00 Zoë","Source-Service":"review"})");
  const KafkaRecord& r = MustMap(mapper, row);
  EXPECT_EQ(r.key, "a<b>&c");
  EXPECT_THAT(Copy(r.headers), testing::Contains(Pair("Note", "\xF0\x9F\x98\x80 Zo\xC3\xAB")));
}

TEST_F(RecordMapperTest, CommitLsnHeaderComesLastWhenNamed) {
  MapperOptions options;
  options.commit_lsn_header = "outbox_commit_lsn";
  RecordMapper mapper = Mapper(options);
  const KafkaRecord& r = MustMap(mapper, Row{}, Lsn(0x00000001'0A3F00B8ull));
  ASSERT_FALSE(r.headers.empty());
  EXPECT_EQ(r.headers.back(),
            std::make_pair(std::string_view("outbox_commit_lsn"), std::string_view("1/A3F00B8")));
  EXPECT_EQ(r.headers.size(), 10u);
}

TEST_F(RecordMapperTest, NoCommitLsnHeaderByDefault) {
  RecordMapper mapper = Mapper();
  const KafkaRecord& r = MustMap(mapper, Row{});
  EXPECT_EQ(r.headers.back().first, "traceparent");
}

TEST_F(RecordMapperTest, EventTypeIsEmptyWhenAbsent) {
  MapperOptions options;
  options.topic_template = "fixed";
  RecordMapper mapper = Mapper(options);
  Row row;
  row.metadata = Null();
  const KafkaRecord& r = MustMap(mapper, row);
  EXPECT_EQ(r.topic, "fixed");
  EXPECT_EQ(r.event_type, "");
  EXPECT_EQ(r.key, std::optional<std::string_view>(""));  // no Aggregate-Id: the empty key
  EXPECT_THAT(Copy(r.headers), ElementsAre(Pair("_watermill_message_uuid", std::string(kUuid))));
}

// watermill-kafka's marshaler sends an empty `_watermill_message_uuid`
// metadata entry as a second UUID header (its subscriber then reads the empty
// value as the UUID): by default the relay's record is the same.
TEST_F(RecordMapperTest, EmptyReservedUuidKeyInMetadataIsSentAsWatermillSendsIt) {
  RecordMapper mapper = Mapper();
  Row row;
  row.metadata = Text(
      R"({"Event-Type":"review.created","Source-Service":"review","_watermill_message_uuid":""})");
  const KafkaRecord& r = MustMap(mapper, row);
  EXPECT_THAT(Copy(r.headers),
              ElementsAre(Pair("_watermill_message_uuid", std::string(kUuid)),
                          Pair("Event-Type", "review.created"), Pair("Source-Service", "review"),
                          Pair("_watermill_message_uuid", "")));
}

TEST_F(RecordMapperTest, EmptyReservedUuidKeyInMetadataIsDroppedWhenAsked) {
  MapperOptions options;
  options.uuid_in_metadata = UuidInMetadata::kDrop;
  RecordMapper mapper = Mapper(options);
  Row row;
  row.metadata = Text(
      R"({"Event-Type":"review.created","Source-Service":"review","_watermill_message_uuid":""})");
  const KafkaRecord& r = MustMap(mapper, row);
  EXPECT_THAT(Copy(r.headers),
              ElementsAre(Pair("_watermill_message_uuid", std::string(kUuid)),
                          Pair("Event-Type", "review.created"), Pair("Source-Service", "review")));
}

TEST_F(RecordMapperTest, NothingFromThePreviousRowLeaksIntoTheNext) {
  MapperOptions options;
  options.commit_lsn_header = "lsn";
  RecordMapper mapper = Mapper(options);
  MustMap(mapper, Row{}, Lsn(0xFFFFFFFF'FFFFFFFFull));
  Row row;
  row.uuid = Text("u2");
  row.payload = Null();
  row.metadata = Text(R"({"Event-Type":"user.created","Source-Service":"auth"})");
  const KafkaRecord& r = MustMap(mapper, row, Lsn(0x10));
  EXPECT_EQ(r.topic, "kazmaps.auth.user");
  EXPECT_EQ(r.key, std::optional<std::string_view>(""));  // not the previous row's r-1
  EXPECT_EQ(r.value, std::nullopt);
  EXPECT_EQ(r.event_type, "user.created");
  EXPECT_THAT(Copy(r.headers),
              ElementsAre(Pair("_watermill_message_uuid", "u2"), Pair("Event-Type", "user.created"),
                          Pair("Source-Service", "auth"), Pair("lsn", "0/10")));
}

// --- Identity --------------------------------------------------------------

TEST_F(RecordMapperTest, IdentityHoldsTransactionIdOffsetAndUuid) {
  RecordMapper mapper = Mapper();
  tuple_ = Row{}.Tuple();
  auto mapped = mapper.Map(columns_, tuple_, Lsn(1));
  ASSERT_TRUE(mapped.has_value());
  EXPECT_EQ(mapped->identity.transaction_id, 742u);
  EXPECT_EQ(mapped->identity.offset, 45);
  EXPECT_EQ(mapped->identity.uuid, kUuid);
}

TEST_F(RecordMapperTest, TransactionIdAbove32BitsIsParsedWhole) {
  RecordMapper mapper = Mapper();
  for (auto [text, want] : {std::pair<std::string_view, uint64_t>{"4294967296", 1ull << 32},
                            {"8589934594", 0x2'00000002ull},
                            {"18446744073709551615", UINT64_MAX}}) {
    Row row;
    row.xid = Text(text);
    tuple_ = row.Tuple();
    auto mapped = mapper.Map(columns_, tuple_, Lsn(1));
    ASSERT_TRUE(mapped.has_value()) << mapped.error().message;
    EXPECT_EQ(mapped->identity.transaction_id, want) << text;
  }
}

TEST_F(RecordMapperTest, OffsetUpToInt64MaxIsParsed) {
  RecordMapper mapper = Mapper();
  Row row;
  row.offset = Text("9223372036854775807");
  tuple_ = row.Tuple();
  auto mapped = mapper.Map(columns_, tuple_, Lsn(1));
  ASSERT_TRUE(mapped.has_value());
  EXPECT_EQ(mapped->identity.offset, INT64_MAX);
}

TEST(ParseXid8, AcceptsDecimalUint64Only) {
  EXPECT_EQ(ParseXid8("0"), 0u);
  EXPECT_EQ(ParseXid8("18446744073709551615"), UINT64_MAX);
  for (std::string_view bad :
       {"", "-1", "+1", " 1", "1 ", "0x10", "1.0", "18446744073709551616", "abc"}) {
    auto r = ParseXid8(bad);
    ASSERT_FALSE(r.has_value()) << bad;
    EXPECT_THAT(r.error().message, HasSubstr("invalid xid8"));
  }
}

TEST(ParseInt64, AcceptsDecimalInt64Only) {
  EXPECT_EQ(ParseInt64("-9223372036854775808"), INT64_MIN);
  EXPECT_EQ(ParseInt64("9223372036854775807"), INT64_MAX);
  for (std::string_view bad : {"", "+1", "1 ", "9223372036854775808", "1e3", "--1"}) {
    EXPECT_FALSE(ParseInt64(bad).has_value()) << bad;
  }
}

// --- Poison rows -----------------------------------------------------------

TEST_F(RecordMapperTest, NullUuidIsPoisonWithIdentity) {
  RecordMapper mapper = Mapper();
  Row row;
  row.uuid = Null();
  Mapped m = MustPoison(mapper, row);
  EXPECT_EQ(m.poison->message, "the uuid column is NULL");
  EXPECT_EQ(m.identity.transaction_id, 742u);
  EXPECT_EQ(m.identity.offset, 45);
  EXPECT_EQ(m.identity.uuid, "");
}

TEST_F(RecordMapperTest, EmptyUuidIsPoison) {
  RecordMapper mapper = Mapper();
  Row row;
  row.uuid = Text("");
  EXPECT_EQ(MustPoison(mapper, row).poison->message, "the uuid column is empty");
}

TEST_F(RecordMapperTest, BadMetadataIsPoisonWithTheUuidInTheIdentity) {
  RecordMapper mapper = Mapper();
  Row row;
  row.metadata = Text(R"({"Event-Type":"review.created","Schema-Version":2})");
  Mapped m = MustPoison(mapper, row);
  EXPECT_EQ(m.poison->message,
            "metadata value for key \"Schema-Version\" is a number, expected a string");
  EXPECT_EQ(m.identity.uuid, kUuid);
  EXPECT_EQ(m.identity.transaction_id, 742u);
}

TEST_F(RecordMapperTest, MetadataThatIsNotJsonIsPoison) {
  RecordMapper mapper = Mapper();
  Row row;
  row.metadata = Text(R"({"Event-Type":)");
  EXPECT_THAT(MustPoison(mapper, row).poison->message, HasSubstr("not valid JSON"));
}

TEST_F(RecordMapperTest, MissingTopicKeyIsPoison) {
  RecordMapper mapper = Mapper();
  Row row;
  row.metadata = Text(R"({"Aggregate-Id":"r-1","Event-Type":"review.created"})");
  EXPECT_THAT(MustPoison(mapper, row).poison->message,
              HasSubstr("metadata has no key \"Source-Service\""));
}

TEST_F(RecordMapperTest, SqlNullMetadataIsPoisonUnderTheDefaultTemplate) {
  RecordMapper mapper = Mapper();
  Row row;
  row.metadata = Null();
  EXPECT_THAT(MustPoison(mapper, row).poison->message, HasSubstr("metadata has no key"));
}

TEST_F(RecordMapperTest, IllegalTopicIsPoison) {
  RecordMapper mapper = Mapper();
  Row row;
  row.metadata = Text(R"({"Event-Type":"review.created","Source-Service":"my service"})");
  EXPECT_THAT(MustPoison(mapper, row).poison->message, HasSubstr("not allowed in a Kafka topic"));
}

TEST_F(RecordMapperTest, NonEmptyReservedUuidKeyInMetadataIsPoison) {
  RecordMapper mapper = Mapper();
  Row row;
  row.metadata = Text(
      R"({"Event-Type":"review.created","Source-Service":"review","_watermill_message_uuid":"x"})");
  EXPECT_THAT(MustPoison(mapper, row).poison->message,
              HasSubstr("\"_watermill_message_uuid\" is reserved"));
}

TEST_F(RecordMapperTest, MapperKeepsWorkingAfterAPoisonRow) {
  RecordMapper mapper = Mapper();
  Row bad;
  bad.metadata = Text("[]");
  MustPoison(mapper, bad);
  EXPECT_EQ(MustMap(mapper, Row{}).topic, "kazmaps.review.review");
}

// --- Rows that stop the stream ---------------------------------------------

TEST_F(RecordMapperTest, NullTransactionIdOrOffsetIsAnError) {
  RecordMapper mapper = Mapper();
  Row row;
  row.xid = Null();
  EXPECT_THAT(MustFail(mapper, row).message, HasSubstr("transaction_id column is NULL"));
  row = Row{};
  row.offset = Null();
  EXPECT_THAT(MustFail(mapper, row).message, HasSubstr("offset column is NULL"));
}

TEST_F(RecordMapperTest, UnparsableTransactionIdOrOffsetIsAnError) {
  RecordMapper mapper = Mapper();
  Row row;
  row.xid = Text("12a");
  EXPECT_THAT(MustFail(mapper, row).message, HasSubstr("invalid xid8 \"12a\""));
  row = Row{};
  row.offset = Text("");
  EXPECT_THAT(MustFail(mapper, row).message, HasSubstr("invalid bigint"));
}

TEST_F(RecordMapperTest, UnchangedToastInAnyNeededColumnIsAnError) {
  RecordMapper mapper = Mapper();
  for (TupleValue Row::*column :
       {&Row::uuid, &Row::payload, &Row::metadata, &Row::xid, &Row::offset}) {
    Row row;
    row.*column = Toast();
    Error e = MustFail(mapper, row);
    EXPECT_EQ(e.code, ErrorCode::kProtocol);
    EXPECT_THAT(e.message, HasSubstr("unchanged TOAST"));
  }
}

TEST_F(RecordMapperTest, ErrorTakesPrecedenceOverPoison) {
  RecordMapper mapper = Mapper();
  Row row;
  row.uuid = Null();
  row.xid = Null();
  MustFail(mapper, row);
}

TEST_F(RecordMapperTest, RowShorterThanTheColumnMapIsAnError) {
  RecordMapper mapper = Mapper();
  TupleData short_row{{Null(), Text("1"), Text("u")}};
  auto mapped = mapper.Map(columns_, short_row, Lsn(1));
  ASSERT_FALSE(mapped.has_value());
  EXPECT_EQ(mapped.error().code, ErrorCode::kProtocol);
  EXPECT_THAT(mapped.error().message, HasSubstr("row has 3 columns"));
}

TEST_F(RecordMapperTest, UnresolvedColumnMapIsAnError) {
  RecordMapper mapper = Mapper();
  tuple_ = Row{}.Tuple();
  auto mapped = mapper.Map(ColumnMap{}, tuple_, Lsn(1));
  ASSERT_FALSE(mapped.has_value());
  EXPECT_EQ(mapped.error().code, ErrorCode::kProtocol);
}

TEST(RecordMapperCreate, RejectsAMalformedTopicTemplate) {
  MapperOptions options;
  options.topic_template = "kazmaps.{Source-Service";
  auto m = RecordMapper::Create(options);
  ASSERT_FALSE(m.has_value());
  EXPECT_EQ(m.error().code, ErrorCode::kInvalidArgument);
}

}  // namespace
}  // namespace outbox_relay::outbox
