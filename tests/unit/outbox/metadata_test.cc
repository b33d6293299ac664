// Metadata::Parse and Metadata::Set: the envelope JSON as Go's
// json.Marshal(map[string]string) writes it, and everything else a table can
// hold in a `json` column.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

#include "outbox_relay/outbox/record.h"

namespace outbox_relay::outbox {
namespace {

using Entries = std::vector<std::pair<std::string, std::string>>;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Pair;

Entries Copy(const Metadata& m) {
  Entries out;
  for (const auto& [k, v] : m.entries()) out.emplace_back(std::string(k), std::string(v));
  return out;
}

Entries MustParse(Metadata& m, std::string_view json) {
  auto st = m.Parse(json);
  EXPECT_TRUE(st.has_value()) << json << ": " << st.error().message;
  return Copy(m);
}

Error MustFail(std::string_view json) {
  Metadata m;
  auto st = m.Parse(json);
  EXPECT_FALSE(st.has_value()) << json;
  if (st) return Error{ErrorCode::kFatal, "unexpectedly parsed"};
  EXPECT_EQ(st.error().code, ErrorCode::kPoison) << st.error().message;
  EXPECT_TRUE(m.entries().empty());
  return st.error();
}

// Produced by Go 1.x: json.Marshal(map[string]string{...}) with the seed's
// envelope keys, an Aggregate-Id containing < > &, and a note with non-ASCII
// text, an emoji, U+2028, quotes, a backslash, control characters and an
// invalid UTF-8 byte (which Go writes as \ufffd).
constexpr std::string_view kGoMarshalOutput =
    R"({"Aggregate-Id":"b1c2\u003cd3\u003e\u0026e4","Correlation-Id":"01HQZX3V5K8Y2M4N6P7R9S0T1U",)"
    R"("Event-Type":"review.created","Note":"Zoë 😀 \u2028 \"q\" \\ \n\t\u0001 \ufffd",)"
    R"("Published-At":"2024-03-01T12:00:00.123456Z","Schema-Version":"1",)"
    R"("Source-Service":"review","traceparent":"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"})";

TEST(MetadataParse, DecodesGoJsonMarshalOutputExactly) {
  Metadata m;
  EXPECT_THAT(
      MustParse(m, kGoMarshalOutput),
      ElementsAre(Pair("Aggregate-Id", "b1c2<d3>&e4"),
                  Pair("Correlation-Id", "01HQZX3V5K8Y2M4N6P7R9S0T1U"),
                  Pair("Event-Type", "review.created"),
                  Pair("Note", std::string("Zo\xC3\xAB \xF0\x9F\x98\x80 \xE2\x80\xA8 \"q\" "
                                           "\\ \n\t\x01 \xEF\xBF\xBD")),
                  Pair("Published-At", "2024-03-01T12:00:00.123456Z"), Pair("Schema-Version", "1"),
                  Pair("Source-Service", "review"),
                  Pair("traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")));
}

TEST(MetadataParse, DecodesSurrogatePairsToOneFourByteCharacter) {
  Metadata m;
  EXPECT_THAT(MustParse(m, R"({"e":"\ud83d\ude00","E":"\uD83D\uDE00"})"),
              ElementsAre(Pair("E", "\xF0\x9F\x98\x80"), Pair("e", "\xF0\x9F\x98\x80")));
}

TEST(MetadataParse, DecodesEveryShortEscape) {
  Metadata m;
  EXPECT_THAT(MustParse(m, R"({"k":"\" \\ \/ \b \f \n \r \t"})"),
              ElementsAre(Pair("k", "\" \\ / \b \f \n \r \t")));
}

TEST(MetadataParse, DecodesEscapedNulToANulByte) {
  Metadata m;
  MustParse(m, R"({"k":"a\u0000b"})");
  EXPECT_EQ(m.Get("k"), std::string_view("a\0b", 3));
}

TEST(MetadataParse, DecodesEscapesInKeys) {
  Metadata m;
  EXPECT_THAT(MustParse(m, R"({"a\u003cb":"1","\u00e9":"2"})"),
              ElementsAre(Pair("a<b", "1"), Pair("\xC3\xA9", "2")));
}

TEST(MetadataParse, KeepsRawNonAsciiUtf8AsIs) {
  Metadata m;
  EXPECT_THAT(MustParse(m, "{\"\xD0\xBA\xD0\xBB\xD1\x8E\xD1\x87\":\"\xE6\x97\xA5\xE6\x9C\xAC\"}"),
              ElementsAre(Pair("\xD0\xBA\xD0\xBB\xD1\x8E\xD1\x87", "\xE6\x97\xA5\xE6\x9C\xAC")));
}

TEST(MetadataParse, SortsKeysByteWiseAsGoDoes) {
  Metadata m;
  // Upper case sorts before lower case, '-' before letters, bytes >= 0x80 last.
  EXPECT_THAT(
      MustParse(m, "{\"b\":\"1\",\"\xC3\xA9\":\"2\",\"B\":\"3\",\"a-b\":\"4\",\"a\":\"5\"}"),
      ElementsAre(Pair("B", "3"), Pair("a", "5"), Pair("a-b", "4"), Pair("b", "1"),
                  Pair("\xC3\xA9", "2")));
}

TEST(MetadataParse, DuplicateKeysLastOneWins) {
  Metadata m;
  EXPECT_THAT(MustParse(m, R"({"a":"1","b":"x","a":"2","a":"3"})"),
              ElementsAre(Pair("a", "3"), Pair("b", "x")));
}

TEST(MetadataParse, DuplicateKeysLastOneWinsEvenWhenItIsNull) {
  Metadata m;
  EXPECT_THAT(MustParse(m, R"({"a":"1","a":null})"), ElementsAre(Pair("a", "")));
}

TEST(MetadataParse, DuplicateKeysSpelledWithDifferentEscapesAreTheSameKey) {
  Metadata m;
  EXPECT_THAT(MustParse(m, R"({"a<":"1","a\u003c":"2"})"), ElementsAre(Pair("a<", "2")));
}

TEST(MetadataParse, NullValueBecomesEmptyString) {
  Metadata m;
  EXPECT_THAT(MustParse(m, R"({"Event-Type":"x","Correlation-Id":null})"),
              ElementsAre(Pair("Correlation-Id", ""), Pair("Event-Type", "x")));
  EXPECT_EQ(m.Get("Correlation-Id"), std::string_view());
}

TEST(MetadataParse, JsonNullDocumentMeansNoEntries) {
  Metadata m;
  EXPECT_TRUE(MustParse(m, "null").empty());
  EXPECT_TRUE(MustParse(m, " \n null \t").empty());
}

TEST(MetadataParse, SqlNullMeansNoEntries) {
  Metadata m;
  MustParse(m, R"({"a":"b"})");
  ASSERT_TRUE(m.Parse(std::nullopt).has_value());
  EXPECT_TRUE(m.entries().empty());
  EXPECT_EQ(m.Get("a"), std::nullopt);
}

TEST(MetadataParse, EmptyObjectMeansNoEntries) {
  Metadata m;
  EXPECT_TRUE(MustParse(m, "{}").empty());
  EXPECT_TRUE(MustParse(m, " { } ").empty());
}

TEST(MetadataParse, AcceptsWhitespaceAsJsonbPrintsIt) {
  Metadata m;
  EXPECT_THAT(MustParse(m, "{\"a\": \"1\", \"b\": null}\n"),
              ElementsAre(Pair("a", "1"), Pair("b", "")));
}

TEST(MetadataParse, NumberValueIsPoisonNamingTheKey) {
  Error e = MustFail(R"({"Event-Type":"x","Schema-Version":1})");
  EXPECT_EQ(e.message, "metadata value for key \"Schema-Version\" is a number, expected a string");
}

TEST(MetadataParse, EveryNonStringValueTypeIsPoisonNamingTheKeyAndType) {
  EXPECT_THAT(MustFail(R"({"k":-1.5e3})").message, HasSubstr("\"k\" is a number"));
  EXPECT_THAT(MustFail(R"({"k":18446744073709551615})").message, HasSubstr("\"k\" is a number"));
  EXPECT_THAT(MustFail(R"({"k":true})").message, HasSubstr("\"k\" is a boolean"));
  EXPECT_THAT(MustFail(R"({"k":false})").message, HasSubstr("\"k\" is a boolean"));
  EXPECT_THAT(MustFail(R"({"k":{"a":"b"}})").message, HasSubstr("\"k\" is an object"));
  EXPECT_THAT(MustFail(R"({"k":["a"]})").message, HasSubstr("\"k\" is an array"));
}

TEST(MetadataParse, PoisonMessageShortensAVeryLongKey) {
  std::string key(10000, 'k');
  Error e = MustFail("{\"" + key + "\":1}");
  EXPECT_LT(e.message.size(), 300u);
  EXPECT_THAT(e.message, HasSubstr("...\" is a number"));
}

TEST(MetadataParse, TopLevelNonObjectIsPoison) {
  EXPECT_EQ(MustFail(R"(["a","b"])").message,
            "metadata is an array, expected a JSON object of strings");
  EXPECT_THAT(MustFail(R"("Event-Type")").message, HasSubstr("metadata is a string"));
  EXPECT_THAT(MustFail("42").message, HasSubstr("metadata is a number"));
  EXPECT_THAT(MustFail("true").message, HasSubstr("metadata is a boolean"));
}

TEST(MetadataParse, InvalidJsonIsPoisonWithSimdjsonsReason) {
  for (std::string_view json :
       {R"({"a":"b")", R"({"a" "b"})", R"({"a":"b",})", R"({a:"b"})", R"({'a':'b'})",
        R"({"a":"b"]})", "{", "", "   ", "nul", R"({"a":"\x"})", R"({"a":"\u12"})"}) {
    Error e = MustFail(json);
    EXPECT_THAT(e.message, HasSubstr("metadata is not valid JSON: ")) << json;
  }
}

TEST(MetadataParse, InvalidUtf8IsPoison) {
  EXPECT_THAT(MustFail("{\"a\":\"\xFF\"}").message, HasSubstr("UTF-8"));
  EXPECT_THAT(MustFail("{\"a\":\"\xC3\"}").message, HasSubstr("UTF-8"));
  EXPECT_THAT(MustFail("{\"a\":\"\xED\xA0\x80\"}").message, HasSubstr("UTF-8"));  // CESU surrogate
}

// PostgreSQL's json type accepts an unpaired surrogate escape (JavaScript's
// JSON.stringify writes them); Go's decoder makes each one U+FFFD and the
// pipeline publishes the row, so the relay does the same.
TEST(MetadataParse, LoneSurrogateEscapeDecodesToReplacementCharacterAsGoDoes) {
  const std::string fffd = "\xEF\xBF\xBD";
  Metadata m;
  EXPECT_THAT(MustParse(m, R"({"a":"a\ud83db"})"), ElementsAre(Pair("a", "a" + fffd + "b")));
  EXPECT_THAT(MustParse(m, R"({"a":"\ude00"})"), ElementsAre(Pair("a", fffd)));
  // A high surrogate followed by a non-surrogate: U+FFFD, then the other escape.
  EXPECT_THAT(MustParse(m, R"({"a":"\ud83d\u0041"})"), ElementsAre(Pair("a", fffd + "A")));
  // Two highs, then a low: U+FFFD for the first, the pair for the rest.
  EXPECT_THAT(MustParse(m, R"({"a":"\ud83d\ud83d\ude00"})"),
              ElementsAre(Pair("a", fffd + "\xF0\x9F\x98\x80")));
  // Low then high: both unpaired.
  EXPECT_THAT(MustParse(m, R"({"a":"\ude00\ud83d"})"), ElementsAre(Pair("a", fffd + fffd)));
  // In a key too; an escaped backslash before "u" is no escape.
  EXPECT_THAT(MustParse(m, R"({"k\udc00":"\\ud83d"})"), ElementsAre(Pair("k" + fffd, "\\ud83d")));
}

TEST(MetadataParse, UnescapedControlCharacterIsPoison) {
  EXPECT_THAT(MustFail("{\"a\":\"x\ny\"}").message, HasSubstr("must be escaped"));
  EXPECT_THAT(MustFail("{\"a\":\"x\x01y\"}").message, HasSubstr("must be escaped"));
}

TEST(MetadataParse, ByteOrderMarkIsPoison) { MustFail("\xEF\xBB\xBF{\"a\":\"b\"}"); }

// simdjson parses numbers eagerly, so a number it cannot represent fails the
// whole document instead of being reported as "a number". Poison either way.
TEST(MetadataParse, OutOfRangeNumberIsPoisonAsInvalidJson) {
  EXPECT_THAT(MustFail(R"({"a":1e999})").message, HasSubstr("not valid JSON"));
}

TEST(MetadataParse, TrailingContentIsPoison) {
  MustFail(R"({"a":"b"}x)");
  MustFail(R"({"a":"b"}{"c":"d"})");
  MustFail(R"({"a":"b"}})");
  MustFail(R"({"a":"b"} null)");
  MustFail(std::string_view("{\"a\":\"b\"}\0", 10));
}

TEST(MetadataParse, HandlesVeryLongValues) {
  std::string big(100 * 1024, 'x');
  for (size_t i = 0; i < big.size(); i += 1000) big[i] = '<';
  std::string escaped;
  for (char c : big) escaped += c == '<' ? std::string("\\u003c") : std::string(1, c);
  Metadata m;
  MustParse(m, R"({"a":"short"})");
  EXPECT_THAT(MustParse(m, R"({"big":")" + escaped + R"(","z":"end"})"),
              ElementsAre(Pair("big", big), Pair("z", "end")));
  // And a short document after the long one reuses the grown buffers.
  EXPECT_THAT(MustParse(m, R"({"a":"short"})"), ElementsAre(Pair("a", "short")));
}

TEST(MetadataParse, HandlesManyKeysInReverseOrder) {
  std::string json = "{";
  for (int i = 9999; i >= 0; --i) {
    json += fmt::format("\"k{:05}\":\"v{}\"{}", i, i, i == 0 ? "" : ",");
  }
  json += "}";
  Metadata m;
  Entries e = MustParse(m, json);
  ASSERT_EQ(e.size(), 10000u);
  EXPECT_EQ(e.front(), std::make_pair(std::string("k00000"), std::string("v0")));
  EXPECT_EQ(e.back(), std::make_pair(std::string("k09999"), std::string("v9999")));
  EXPECT_EQ(m.Get("k04242"), "v4242");
}

TEST(MetadataParse, ViewsStayValidUntilTheNextParse) {
  Metadata m;
  MustParse(m, R"({"a":"\u003cone\u003e","b":"two"})");
  std::string_view a = *m.Get("a");
  std::string_view b = *m.Get("b");
  EXPECT_EQ(a, "<one>");
  EXPECT_EQ(b, "two");
}

TEST(MetadataParse, AFailedParseLeavesNoEntries) {
  Metadata m;
  MustParse(m, R"({"a":"b"})");
  EXPECT_FALSE(m.Parse(R"({"a":1})").has_value());
  EXPECT_TRUE(m.entries().empty());
  EXPECT_EQ(m.Get("a"), std::nullopt);
}

TEST(MetadataGet, FindsPresentKeysOnly) {
  Metadata m;
  MustParse(m, R"({"a":"1","c":""})");
  EXPECT_EQ(m.Get("a"), "1");
  EXPECT_EQ(m.Get("c"), "");
  EXPECT_EQ(m.Get("b"), std::nullopt);
  EXPECT_EQ(m.Get(""), std::nullopt);
  EXPECT_EQ(m.Get("A"), std::nullopt);
}

TEST(MetadataSet, InsertsKeepingSortOrder) {
  Metadata m;
  MustParse(m, R"({"a":"1","c":"3"})");
  m.Set("b", "2");
  m.Set("0", "0");
  m.Set("d", "4");
  EXPECT_THAT(Copy(m), ElementsAre(Pair("0", "0"), Pair("a", "1"), Pair("b", "2"), Pair("c", "3"),
                                   Pair("d", "4")));
}

TEST(MetadataSet, ReplacesAnExistingValue) {
  Metadata m;
  MustParse(m, R"({"a":"1","partition_key":"old"})");
  m.Set("partition_key", "new");
  EXPECT_THAT(Copy(m), ElementsAre(Pair("a", "1"), Pair("partition_key", "new")));
}

TEST(MetadataSet, AcceptsAViewOfItsOwnValue) {
  Metadata m;
  MustParse(m, R"({"Aggregate-Id":"agg-1","z":"last"})");
  // Many appends force the storage to grow while the argument points into it.
  for (int i = 0; i < 100; ++i) {
    m.Set(fmt::format("key{:03}", i), *m.Get("Aggregate-Id"));
  }
  m.Set("partition_key", *m.Get("Aggregate-Id"));
  EXPECT_EQ(m.Get("partition_key"), "agg-1");
  EXPECT_EQ(m.Get("key099"), "agg-1");
  EXPECT_EQ(m.Get("z"), "last");
  EXPECT_EQ(m.entries().size(), 103u);
}

TEST(MetadataSet, WorksOnEmptyMetadataAndWithEmptyValues) {
  Metadata m;
  m.Set("k", "");
  EXPECT_THAT(Copy(m), ElementsAre(Pair("k", "")));
  ASSERT_TRUE(m.Parse(std::nullopt).has_value());
  m.Set("x", "y");
  EXPECT_THAT(Copy(m), ElementsAre(Pair("x", "y")));
}

TEST(MetadataMove, MovedMetadataKeepsItsEntriesAndTheSourceIsReusable) {
  Metadata a;
  MustParse(a, R"({"k":"v"})");
  Metadata b(std::move(a));
  EXPECT_EQ(b.Get("k"), "v");
  ASSERT_TRUE(a.Parse(R"({"x":"y"})").has_value());  // NOLINT(bugprone-use-after-move)
  EXPECT_EQ(a.Get("x"), "y");
  Metadata c;
  c = std::move(b);
  EXPECT_EQ(c.Get("k"), "v");
}

}  // namespace
}  // namespace outbox_relay::outbox
