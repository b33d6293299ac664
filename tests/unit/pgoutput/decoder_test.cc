// Specification of the pgoutput v1 decoder: every message type round-trips, every truncation
// and every corruption is an error that says what and where, and decoding reuses storage.
#include "outbox_relay/pgoutput/decoder.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "outbox_relay/core/bytes.h"

namespace outbox_relay::pgoutput {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

// ---------------------------------------------------------------------------------------------
// Realistic messages, shaped like what PostgreSQL 15 sends for the seed's outbox table.

constexpr Oid kOutboxOid = 16385;
constexpr Oid kInt8Oid = 20;
constexpr Oid kVarcharOid = 1043;
constexpr Oid kTimestamptzOid = 1184;
constexpr Oid kJsonOid = 114;
constexpr Oid kXid8Oid = 5069;

// 2024-05-01 12:00:00 UTC in PostgreSQL microseconds.
constexpr PgTimestamp kCommitTime{767'880'000'000'000};

constexpr std::string_view kPayload =
    R"({"review_id":"0b6f8e0e-3c1f-4a57-9d2e-5f0f8b1c2d3e","place_id":"kz-almaty-000123",)"
    R"("author_id":"u-4821","rating":5,"text":"Great coffee, quick service. Will come back!",)"
    R"("created_at":"2024-05-01T12:00:00.123456Z","tags":["coffee","service"]})";
constexpr std::string_view kMetadata =
    R"({"Aggregate-Id":"review-0b6f8e0e-3c1f-4a57-9d2e-5f0f8b1c2d3e",)"
    R"("Correlation-Id":"7d1c9e2a-4b3f-4e8a-9c6d-1a2b3c4d5e6f","Event-Type":"review.created",)"
    R"("Published-At":"2024-05-01T12:00:00.123456Z","Schema-Version":"1",)"
    R"("Source-Service":"review","traceparent":"00-4bf92f3577b34da6a3ce929d0e0e4736-)"
    R"(00f067aa0ba902b7-01"})";

Relation OutboxRelation() {
  Relation r;
  r.relation_id = kOutboxOid;
  r.nspname = "public";
  r.relname = "outbox";
  r.replica_identity = 'd';
  r.columns = {
      {0, "offset_acked", kInt8Oid, -1},   {1, "offset_consumed", kInt8Oid, -1},
      {0, "uuid", kVarcharOid, 40},        {0, "created_at", kTimestamptzOid, -1},
      {0, "payload", kJsonOid, -1},        {0, "metadata", kJsonOid, -1},
      {1, "transaction_id", kXid8Oid, -1},
  };
  return r;
}

TupleValue Text(std::string_view s) { return {TupleValue::Kind::kText, s}; }
TupleValue Null() { return {TupleValue::Kind::kNull, {}}; }
TupleValue Unchanged() { return {TupleValue::Kind::kUnchangedToast, {}}; }

TupleData OutboxRow() {
  return TupleData{{Null(), Text("1042"), Text("01HZX3K4M5N6P7Q8R9S0T1V2W3"),
                    Text("2024-05-01 12:00:00.123456+00"), Text(kPayload), Text(kMetadata),
                    Text("731")}};
}

TupleData OutboxKey() {
  return TupleData{{Null(), Text("1042"), Null(), Null(), Null(), Null(), Text("731")}};
}

struct Sample {
  std::string name;
  DecodedMessage message;
};

std::vector<Sample> Samples() {
  std::vector<Sample> s;
  s.push_back({"Begin", Begin{Lsn(0x16B374D848), kCommitTime, 731}});
  s.push_back({"Commit", Commit{0, Lsn(0x16B374D848), Lsn(0x16B374D878), kCommitTime}});
  s.push_back({"Origin", Origin{Lsn(0x1234ABCD), "pg_16390"}});
  s.push_back({"Relation", OutboxRelation()});
  Relation catalog = OutboxRelation();
  catalog.nspname = "";  // pg_catalog is sent as an empty string
  catalog.columns.clear();
  s.push_back({"RelationWithoutColumns", catalog});
  s.push_back({"Type", Type{16400, "public", "outbox_kind"}});
  s.push_back({"Insert", Insert{kOutboxOid, OutboxRow()}});
  s.push_back({"InsertOfEmptyTuple", Insert{kOutboxOid, TupleData{}}});
  TupleData acked = OutboxRow();
  acked.values[0] = Text("1042");
  acked.values[4] = Unchanged();  // TOASTed payload, not sent
  s.push_back({"UpdateNewOnly", Update{kOutboxOid, std::nullopt, false, acked}});
  s.push_back({"UpdateWithKey", Update{kOutboxOid, OutboxKey(), true, acked}});
  s.push_back({"UpdateWithOldTuple", Update{kOutboxOid, OutboxRow(), false, acked}});
  s.push_back({"DeleteWithKey", Delete{kOutboxOid, OutboxKey(), true}});
  s.push_back({"DeleteWithOldTuple", Delete{kOutboxOid, OutboxRow(), false}});
  s.push_back({"Truncate", Truncate{2, {kOutboxOid, 16402, 16410}}});
  s.push_back({"TruncateOfNothing", Truncate{1, {}}});
  s.push_back({"Message", Message{1, Lsn(0x16B374D900), "prefix", "content"}});
  s.push_back(
      {"NonTransactionalBinaryMessage", Message{0, Lsn(0x16B374DA00), "outbox-relay",
                                                std::string_view("\0\x01\xff\nheartbeat", 13)}});
  return s;
}

// ---------------------------------------------------------------------------------------------
// Helpers.

// A readable, complete rendering of a message: equal dumps mean equal messages, and a failing
// comparison shows which field differs.
std::string Dump(const TupleData& t) {
  std::string out = "[";
  for (const TupleValue& v : t.values) {
    if (out.size() > 1) out += ", ";
    switch (v.kind) {
      case TupleValue::Kind::kNull:
        out += "null";
        break;
      case TupleValue::Kind::kUnchangedToast:
        out += "unchanged";
        break;
      case TupleValue::Kind::kText:
        out += fmt::format("'{}'", v.text);
        break;
    }
  }
  return out + "]";
}

std::string Dump(const DecodedMessage& m) {
  struct V {
    std::string operator()(const Begin& b) {
      return fmt::format("Begin{{final_lsn={} commit_time={} xid={}}}", b.final_lsn,
                         b.commit_time.micros, b.xid);
    }
    std::string operator()(const Commit& c) {
      return fmt::format("Commit{{flags={} commit_lsn={} end_lsn={} commit_time={}}}", c.flags,
                         c.commit_lsn, c.end_lsn, c.commit_time.micros);
    }
    std::string operator()(const Origin& o) {
      return fmt::format("Origin{{origin_lsn={} name='{}'}}", o.origin_lsn, o.name);
    }
    std::string operator()(const Relation& r) {
      std::string out = fmt::format("Relation{{id={} '{}'.'{}' replident={} columns=[",
                                    r.relation_id, r.nspname, r.relname, r.replica_identity);
      for (const RelationColumn& c : r.columns) {
        out += fmt::format("({} '{}' {} {})", c.flags, c.name, c.type_oid, c.type_modifier);
      }
      return out + "]}";
    }
    std::string operator()(const Type& t) {
      return fmt::format("Type{{oid={} '{}'.'{}'}}", t.type_oid, t.nspname, t.typname);
    }
    std::string operator()(const Insert& i) {
      return fmt::format("Insert{{relid={} new={}}}", i.relation_id, Dump(i.new_tuple));
    }
    std::string operator()(const Update& u) {
      return fmt::format("Update{{relid={} old={}{} new={}}}", u.relation_id,
                         u.old_tuple ? (u.old_is_key ? "K" : "O") : "-",
                         u.old_tuple ? Dump(*u.old_tuple) : "", Dump(u.new_tuple));
    }
    std::string operator()(const Delete& d) {
      return fmt::format("Delete{{relid={} old={}{}}}", d.relation_id, d.old_is_key ? "K" : "O",
                         Dump(d.old_tuple));
    }
    std::string operator()(const Truncate& t) {
      return fmt::format("Truncate{{options={} relids=[{}]}}", t.options,
                         fmt::join(t.relation_ids, ","));
    }
    std::string operator()(const Message& m) {
      return fmt::format("Message{{flags={} lsn={} prefix='{}' content={:02x}}}", m.flags, m.lsn,
                         m.prefix, fmt::join(m.content, ""));
    }
  };
  return std::visit(V{}, m);
}

// A copy of `bytes` in a heap block of exactly that size, so that AddressSanitizer reports a
// read one byte past the end (a std::string has slack capacity and a NUL after its end).
class ExactBuffer {
 public:
  explicit ExactBuffer(std::string_view bytes)
      : size_(bytes.size()), data_(new char[bytes.size()]) {
    if (size_ > 0) std::memcpy(data_.get(), bytes.data(), size_);
  }
  std::string_view view() const { return {data_.get(), size_}; }

 private:
  size_t size_;
  std::unique_ptr<char[]> data_;
};

std::string Hex(std::string_view b) {
  return fmt::format("{:02x}", fmt::join(std::basic_string_view<uint8_t>(
                                             reinterpret_cast<const uint8_t*>(b.data()), b.size()),
                                         " "));
}

// Decodes `bytes` and returns the error message; fails the test when decoding succeeds.
std::string DecodeError(std::string_view bytes) {
  ExactBuffer buf(bytes);
  DecodedMessage out;
  Status s = Decode(buf.view(), &out);
  if (s) {
    ADD_FAILURE() << "decoded without error: " << Dump(out) << "\n  bytes: " << Hex(bytes);
    return {};
  }
  EXPECT_EQ(s.error().code, ErrorCode::kProtocol) << s.error().message;
  return s.error().message;
}

std::string Bytes(std::initializer_list<uint8_t> bytes) {
  return std::string(bytes.begin(), bytes.end());
}

// An Insert of one tuple whose encoding the test writes by hand after the 'N'.
std::string InsertWithTuple(std::string_view tuple) {
  std::string out;
  ByteWriter w(&out);
  w.U8('I');
  w.U32(kOutboxOid);
  w.U8('N');
  w.Bytes(tuple);
  return out;
}

// ---------------------------------------------------------------------------------------------
// Round trips.

class RoundTrip : public ::testing::TestWithParam<Sample> {};

TEST_P(RoundTrip, EncodeThenDecodeGivesTheSameMessageAndTheSameBytes) {
  const Sample& sample = GetParam();
  std::string bytes = Encode(sample.message);
  ExactBuffer buf(bytes);
  DecodedMessage decoded;
  Status s = Decode(buf.view(), &decoded);
  ASSERT_TRUE(s) << s.error().message;
  EXPECT_EQ(decoded.index(), sample.message.index());
  EXPECT_EQ(Dump(decoded), Dump(sample.message));
  EXPECT_EQ(Encode(decoded), bytes);
}

TEST_P(RoundTrip, EveryTruncatedPrefixIsAnError) {
  std::string bytes = Encode(GetParam().message);
  for (size_t len = 0; len < bytes.size(); ++len) {
    SCOPED_TRACE(fmt::format("prefix of {} of {} bytes", len, bytes.size()));
    std::string message = DecodeError(std::string_view(bytes).substr(0, len));
    EXPECT_THAT(message, HasSubstr(" at byte "));
  }
}

TEST_P(RoundTrip, EveryTruncatedPrefixIsAnErrorWhenDecodingIntoAReusedMessage) {
  std::string bytes = Encode(GetParam().message);
  DecodedMessage reused = GetParam().message;  // same alternative: the reuse path
  for (size_t len = 0; len < bytes.size(); ++len) {
    ExactBuffer buf(std::string_view(bytes).substr(0, len));
    EXPECT_FALSE(Decode(buf.view(), &reused)) << "prefix of " << len << " bytes";
  }
  // And the reused message still decodes the whole thing correctly afterwards.
  ExactBuffer buf(bytes);
  ASSERT_TRUE(Decode(buf.view(), &reused));
  EXPECT_EQ(Dump(reused), Dump(GetParam().message));
}

TEST_P(RoundTrip, TrailingBytesAreAnError) {
  std::string bytes = Encode(GetParam().message);
  for (std::string_view garbage : {std::string_view("\0", 1), std::string_view("xyz")}) {
    std::string message = DecodeError(bytes + std::string(garbage));
    EXPECT_THAT(message, HasSubstr(fmt::format("end of message at byte {}: {} trailing bytes",
                                               bytes.size(), garbage.size())));
  }
}

INSTANTIATE_TEST_SUITE_P(AllMessageTypes, RoundTrip, ::testing::ValuesIn(Samples()),
                         [](const auto& param_info) { return param_info.param.name; });

TEST(Decode, SamplesCoverEveryMessageType) {
  std::vector<bool> seen(std::variant_size_v<DecodedMessage>, false);
  for (const Sample& s : Samples()) seen[s.message.index()] = true;
  for (size_t i = 0; i < seen.size(); ++i) EXPECT_TRUE(seen[i]) << "alternative " << i;
}

// ---------------------------------------------------------------------------------------------
// The exact wire format, checked against bytes written by hand from the protocol docs.

TEST(Decode, BeginFieldsAreBigEndian) {
  std::string bytes = Bytes({'B', 0,    0,    0,    0x16, 0xB3, 0x74, 0xD8, 0x48,  // final_lsn
                             0,   0x02, 0xBA, 0x61, 0xFE, 0xA1, 0x50, 0,           // commit_time
                             0,   0,    0x02, 0xDB});                              // xid
  DecodedMessage out;
  ASSERT_TRUE(Decode(bytes, &out));
  const Begin& b = std::get<Begin>(out);
  EXPECT_EQ(b.final_lsn.ToString(), "16/B374D848");
  EXPECT_EQ(b.commit_time.micros, kCommitTime.micros);
  EXPECT_EQ(b.xid, 731u);
  EXPECT_EQ(Encode(out), bytes);
}

TEST(Decode, TextValuesAreViewsIntoTheInputBuffer) {
  std::string bytes = Encode(Insert{kOutboxOid, OutboxRow()});
  DecodedMessage out;
  ASSERT_TRUE(Decode(bytes, &out));
  std::string_view payload = std::get<Insert>(out).new_tuple.values[4].text;
  EXPECT_EQ(payload, kPayload);
  EXPECT_GE(payload.data(), bytes.data());
  EXPECT_LE(payload.data() + payload.size(), bytes.data() + bytes.size());
}

TEST(Decode, EmptyTextIsNotNull) {
  DecodedMessage out;
  ASSERT_TRUE(Decode(InsertWithTuple(Bytes({0, 2, 't', 0, 0, 0, 0, 'n'})), &out));
  const TupleData& t = std::get<Insert>(out).new_tuple;
  ASSERT_EQ(t.values.size(), 2u);
  EXPECT_EQ(t.values[0].kind, TupleValue::Kind::kText);
  EXPECT_EQ(t.values[0].text, "");
  EXPECT_EQ(t.values[1].kind, TupleValue::Kind::kNull);
}

TEST(Decode, MessageContentMayContainNulBytes) {
  std::string bytes = Encode(Message{0, Lsn(1), "p", std::string_view("a\0b", 3)});
  DecodedMessage out;
  ASSERT_TRUE(Decode(bytes, &out));
  EXPECT_EQ(std::get<Message>(out).content, std::string_view("a\0b", 3));
}

// ---------------------------------------------------------------------------------------------
// One test per corruption: each says what is wrong and at which byte.

TEST(DecodeError, EmptyInput) {
  EXPECT_EQ(DecodeError(""), "message type at byte 0: need 1 bytes, 0 left");
}

TEST(DecodeError, UnknownMessageTypeNamesTheByteAsCharAndHexAtOffsetZero) {
  EXPECT_EQ(DecodeError("X"), "message type at byte 0: unknown message type 'X' (0x58)");
}

TEST(DecodeError, UnprintableMessageTypeIsShownInHex) {
  EXPECT_EQ(DecodeError(Bytes({0x00, 1, 2})), "message type at byte 0: unknown message type 0x00");
  EXPECT_EQ(DecodeError(Bytes({0xC3})), "message type at byte 0: unknown message type 0xC3");
}

TEST(DecodeError, StreamingMessagesNeedProtocolVersion2) {
  for (char type : {'S', 'E', 'c', 'A'}) {
    std::string message = DecodeError(std::string(1, type) + std::string(12, '\0'));
    EXPECT_THAT(message, StartsWith(fmt::format("message type at byte 0: '{}' (0x{:02X}) is Stream",
                                                type, type)));
    EXPECT_THAT(message, HasSubstr("protocol version 2+, streaming"));
    EXPECT_THAT(message, HasSubstr("this decoder speaks protocol version 1"));
  }
}

TEST(DecodeError, TwoPhaseMessagesNeedProtocolVersion3) {
  for (char type : {'b', 'P', 'K', 'r', 'p'}) {
    std::string message = DecodeError(std::string(1, type) + std::string(40, '\0'));
    EXPECT_THAT(message, HasSubstr("protocol version 3, two_phase")) << type;
  }
}

TEST(DecodeError, NamesTheMessageTheTupleTheColumnAndTheByte) {
  // Column 3 is 't' with no length after it.
  std::string tuple = Bytes({0, 4, 'n', 'n', 'n', 't'});
  EXPECT_EQ(DecodeError(InsertWithTuple(tuple)),
            "Insert: new tuple column 3 length at byte 12: need 4 bytes, 0 left");
}

TEST(DecodeError, BinaryTupleValueNeedsProtocolVersion2) {
  std::string message = DecodeError(InsertWithTuple(Bytes({0, 1, 'b', 0, 0, 0, 1, 'x'})));
  EXPECT_THAT(message, StartsWith("Insert: new tuple column 0 kind at byte 8: binary value 'b' "
                                  "needs protocol version 2+"));
}

TEST(DecodeError, UnknownTupleValueKind) {
  EXPECT_EQ(DecodeError(InsertWithTuple(Bytes({0, 2, 'n', 'x'}))),
            "Insert: new tuple column 1 kind at byte 9: unknown value kind 'x' (0x78) (expected "
            "'n', 'u' or 't')");
}

TEST(DecodeError, NegativeTextLength) {
  EXPECT_EQ(DecodeError(InsertWithTuple(Bytes({0, 1, 't', 0xFF, 0xFF, 0xFF, 0xFF}))),
            "Insert: new tuple column 0 length at byte 9: negative length -1");
}

TEST(DecodeError, TextLongerThanTheMessage) {
  EXPECT_EQ(DecodeError(InsertWithTuple(Bytes({0, 1, 't', 0x7F, 0xFF, 0xFF, 0xFF, 'a', 'b'}))),
            "Insert: new tuple column 0 text at byte 13: need 2147483647 bytes, 2 left");
}

TEST(DecodeError, NegativeTupleColumnCount) {
  EXPECT_EQ(DecodeError(InsertWithTuple(Bytes({0xFF, 0xFE}))),
            "Insert: new tuple column count at byte 6: negative count -2");
}

TEST(DecodeError, TupleColumnCountLargerThanTheBytesLeft) {
  EXPECT_EQ(DecodeError(InsertWithTuple(Bytes({0x7F, 0xFF, 'n', 'n'}))),
            "Insert: new tuple column count at byte 6: count 32767 needs at least 32767 bytes, 2 "
            "left");
}

TEST(DecodeError, InsertWithoutNewTupleMarker) {
  std::string bytes = Encode(Insert{kOutboxOid, OutboxRow()});
  bytes[5] = 'K';
  EXPECT_EQ(DecodeError(bytes), "Insert: tuple marker at byte 5: expected 'N', got 'K' (0x4B)");
}

TEST(DecodeError, UpdateWithUnknownFirstMarker) {
  std::string bytes = Encode(Update{kOutboxOid, std::nullopt, false, OutboxRow()});
  bytes[5] = 'X';
  EXPECT_EQ(DecodeError(bytes),
            "Update: tuple marker at byte 5: expected 'K', 'O' or 'N', got 'X' (0x58)");
}

TEST(DecodeError, UpdateOldTupleNotFollowedByNewTuple) {
  std::string bytes = Encode(Update{kOutboxOid, OutboxKey(), true, OutboxRow()});
  std::string key = Encode(Update{kOutboxOid, OutboxKey(), true, TupleData{}});
  size_t marker_at = key.size() - 3;  // the new tuple is 'N' + Int16 0
  ASSERT_EQ(bytes[marker_at], 'N');
  bytes[marker_at] = 'K';
  EXPECT_EQ(
      DecodeError(bytes),
      fmt::format("Update: tuple marker at byte {}: expected 'N', got 'K' (0x4B)", marker_at));
}

TEST(DecodeError, DeleteWithNewTupleMarker) {
  std::string bytes = Encode(Delete{kOutboxOid, OutboxKey(), true});
  bytes[5] = 'N';
  EXPECT_EQ(DecodeError(bytes),
            "Delete: tuple marker at byte 5: expected 'K' or 'O', got 'N' (0x4E)");
}

TEST(DecodeError, DeleteKeyTupleErrorsNameTheKeyTuple) {
  std::string bytes = Encode(Delete{kOutboxOid, OutboxKey(), true});
  bytes[8] = 'z';  // column 0's kind: 'D' relid(4) 'K' ncols(2)
  EXPECT_THAT(DecodeError(bytes), StartsWith("Delete: key tuple column 0 kind at byte 8:"));
}

TEST(DecodeError, RelationWithNegativeColumnCount) {
  Relation r = OutboxRelation();
  r.columns.clear();
  std::string bytes = Encode(r);
  bytes[bytes.size() - 2] = '\xFF';
  EXPECT_EQ(
      DecodeError(bytes),
      fmt::format("Relation: column count at byte {}: negative count -256", bytes.size() - 2));
}

TEST(DecodeError, RelationColumnCountLargerThanTheBytesLeft) {
  Relation r = OutboxRelation();
  std::string bytes = Encode(r);
  Relation empty = OutboxRelation();
  empty.columns.clear();
  size_t count_at = Encode(empty).size() - 2;
  bytes[count_at + 1] = 100;  // 100 columns of at least 10 bytes each
  EXPECT_THAT(DecodeError(bytes),
              StartsWith(fmt::format("Relation: column count at byte {}: count 100 needs at least "
                                     "1000 bytes",
                                     count_at)));
}

TEST(DecodeError, RelationNameWithoutNulTerminator) {
  std::string bytes = Bytes({'R', 0, 0, 0x40, 0x01}) + std::string("public\0outbox", 13);
  EXPECT_EQ(DecodeError(bytes), "Relation: relation name at byte 12: missing NUL terminator");
}

TEST(DecodeError, TruncateWithNegativeRelationCount) {
  EXPECT_EQ(DecodeError(Bytes({'T', 0xFF, 0xFF, 0xFF, 0xFF, 0})),
            "Truncate: relation count at byte 1: negative count -1");
}

TEST(DecodeError, TruncateRelationCountLargerThanTheBytesLeft) {
  EXPECT_EQ(DecodeError(Bytes({'T', 0, 0, 0, 2, 0, 0, 0, 0x40, 0x01})),
            "Truncate: relation count at byte 1: count 2 needs at least 8 bytes, 4 left");
}

TEST(DecodeError, MessageWithNegativeContentLength) {
  std::string bytes = Encode(Message{1, Lsn(1), "p", ""});
  bytes[bytes.size() - 4] = '\x80';
  EXPECT_EQ(DecodeError(bytes),
            fmt::format("Message: content length at byte {}: negative length -2147483648",
                        bytes.size() - 4));
}

TEST(DecodeError, CommitWithNonZeroFlags) {
  std::string bytes = Encode(Commit{0, Lsn(2), Lsn(3), kCommitTime});
  bytes[1] = 1;
  EXPECT_EQ(DecodeError(bytes), "Commit: flags at byte 1: unrecognized flags 0x01");
}

TEST(DecodeError, BeginWithoutFinalLsn) {
  EXPECT_EQ(DecodeError(Encode(Begin{Lsn(0), kCommitTime, 731})),
            "Begin: final_lsn at byte 1: not set (0/0)");
}

TEST(DecodeError, ErrorLeavesNoViewIntoFreedMemoryBehindOnTheNextSuccess) {
  // After a failed decode the message is unspecified, but decoding into it again must work.
  DecodedMessage out = Insert{kOutboxOid, OutboxRow()};
  EXPECT_FALSE(Decode(InsertWithTuple(Bytes({0, 2, 'n', 'x'})), &out));
  std::string good = Encode(Insert{kOutboxOid, OutboxKey()});
  ASSERT_TRUE(Decode(good, &out));
  EXPECT_EQ(Dump(out), Dump(Insert{kOutboxOid, OutboxKey()}));
}

// ---------------------------------------------------------------------------------------------
// Storage reuse: the steady state of the relay is Insert after Insert.

TEST(DecodeReuse, InsertIntoAnInsertReusesTheTupleVector) {
  std::string first = Encode(Insert{kOutboxOid, OutboxRow()});
  std::string second = Encode(Insert{kOutboxOid + 1, OutboxKey()});
  DecodedMessage out;
  ASSERT_TRUE(Decode(first, &out));
  const std::vector<TupleValue>& values = std::get<Insert>(out).new_tuple.values;
  const TupleValue* data = values.data();
  size_t capacity = values.capacity();

  ASSERT_TRUE(Decode(second, &out));
  const std::vector<TupleValue>& again = std::get<Insert>(out).new_tuple.values;
  EXPECT_EQ(again.data(), data);
  EXPECT_EQ(again.capacity(), capacity);
  EXPECT_EQ(Dump(out), Dump(Insert{kOutboxOid + 1, OutboxKey()}));
}

TEST(DecodeReuse, FewerColumnsThanBeforeKeepTheCapacity) {
  DecodedMessage out;
  ASSERT_TRUE(Decode(Encode(Insert{kOutboxOid, OutboxRow()}), &out));
  const TupleValue* data = std::get<Insert>(out).new_tuple.values.data();
  ASSERT_TRUE(Decode(InsertWithTuple(Bytes({0, 1, 'n'})), &out));
  EXPECT_EQ(std::get<Insert>(out).new_tuple.values.size(), 1u);
  EXPECT_EQ(std::get<Insert>(out).new_tuple.values.data(), data);
}

TEST(DecodeReuse, UpdateKeepsItsOldTupleStorageAcrossUpdates) {
  std::string with_key = Encode(Update{kOutboxOid, OutboxKey(), true, OutboxRow()});
  DecodedMessage out;
  ASSERT_TRUE(Decode(with_key, &out));
  const TupleValue* old_data = std::get<Update>(out).old_tuple->values.data();
  const TupleValue* new_data = std::get<Update>(out).new_tuple.values.data();
  ASSERT_TRUE(Decode(with_key, &out));
  EXPECT_EQ(std::get<Update>(out).old_tuple->values.data(), old_data);
  EXPECT_EQ(std::get<Update>(out).new_tuple.values.data(), new_data);
}

TEST(DecodeReuse, UpdateWithoutOldTupleClearsTheOneBefore) {
  DecodedMessage out;
  ASSERT_TRUE(Decode(Encode(Update{kOutboxOid, OutboxKey(), true, OutboxRow()}), &out));
  ASSERT_TRUE(Decode(Encode(Update{kOutboxOid, std::nullopt, false, OutboxRow()}), &out));
  EXPECT_FALSE(std::get<Update>(out).old_tuple.has_value());
  EXPECT_FALSE(std::get<Update>(out).old_is_key);
}

TEST(DecodeReuse, RelationReusesItsColumnVectorAndReplacesEveryField) {
  DecodedMessage out;
  ASSERT_TRUE(Decode(Encode(OutboxRelation()), &out));
  const RelationColumn* data = std::get<Relation>(out).columns.data();

  Relation smaller = OutboxRelation();
  smaller.relname = "outbox_v2";
  smaller.replica_identity = 'f';
  smaller.columns.resize(3);
  smaller.columns[2].name = "id";
  ASSERT_TRUE(Decode(Encode(smaller), &out));
  EXPECT_EQ(std::get<Relation>(out).columns.data(), data);
  EXPECT_EQ(Dump(out), Dump(smaller));
}

TEST(DecodeReuse, SwitchingMessageTypesReplacesTheAlternative) {
  DecodedMessage out;
  for (const Sample& s : Samples()) {
    std::string bytes = Encode(s.message);
    ASSERT_TRUE(Decode(bytes, &out)) << s.name;
    EXPECT_EQ(Dump(out), Dump(s.message)) << s.name;
  }
}

}  // namespace
}  // namespace outbox_relay::pgoutput
