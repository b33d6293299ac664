// ByteReader / ByteWriter: big-endian, bounds-checked, and errors that say what and where.
#include "outbox_relay/core/bytes.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <memory>
#include <string>

namespace outbox_relay {
namespace {

std::string Bytes(std::initializer_list<uint8_t> bytes) {
  return std::string(bytes.begin(), bytes.end());
}

TEST(ByteReader, ReadsBigEndian) {
  std::string data = Bytes(
      {0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08, 0x09, 0x0A, 0x0B, 0x0C, 0x0D, 0x0E, 0x0F});
  ByteReader r(data);
  EXPECT_EQ(*r.U8("a"), 0x01);
  EXPECT_EQ(*r.U16("b"), 0x0203);
  EXPECT_EQ(*r.U32("c"), 0x04050607u);
  EXPECT_EQ(*r.U64("d"), 0x08090A0B0C0D0E0Fu);
  EXPECT_TRUE(r.empty());
  EXPECT_EQ(r.offset(), 15u);
}

TEST(ByteReader, SignedReadsAreTwosComplement) {
  std::string data =
      Bytes({0xFF, 0xFE, 0x80, 0x00, 0x00, 0x00, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF});
  ByteReader r(data);
  EXPECT_EQ(*r.I16("a"), -2);
  EXPECT_EQ(*r.I32("b"), std::numeric_limits<int32_t>::min());
  EXPECT_EQ(*r.I64("c"), -1);
}

TEST(ByteReader, HighBitBytesAreNotSignExtended) {
  std::string data = Bytes({0x80, 0xFF, 0xFF});
  ByteReader r(data);
  EXPECT_EQ(*r.U8("a"), 0x80);
  EXPECT_EQ(*r.U16("b"), 0xFFFF);
}

TEST(ByteReader, ShortReadNamesFieldOffsetNeedAndLeft) {
  std::string data = Bytes({1, 2, 3, 4, 5});
  ByteReader r(data);
  ASSERT_TRUE(r.U16("header"));
  auto v = r.U32("length");
  ASSERT_FALSE(v);
  EXPECT_EQ(v.error().code, ErrorCode::kProtocol);
  EXPECT_EQ(v.error().message, "length at byte 2: need 4 bytes, 3 left");
}

TEST(ByteReader, FailedReadDoesNotAdvance) {
  std::string data = Bytes({1, 2, 3});
  ByteReader r(data);
  EXPECT_FALSE(r.U64("x"));
  EXPECT_EQ(r.offset(), 0u);
  EXPECT_FALSE(r.Bytes(4, "x"));
  EXPECT_EQ(r.offset(), 0u);
  EXPECT_EQ(*r.U16("y"), 0x0102);
}

TEST(ByteReader, EveryReadOfAnEmptyBufferFails) {
  ByteReader r("");
  EXPECT_TRUE(r.empty());
  EXPECT_EQ(r.U8("f").error().message, "f at byte 0: need 1 bytes, 0 left");
  EXPECT_FALSE(r.U16("f"));
  EXPECT_FALSE(r.I16("f"));
  EXPECT_FALSE(r.U32("f"));
  EXPECT_FALSE(r.I32("f"));
  EXPECT_FALSE(r.U64("f"));
  EXPECT_FALSE(r.I64("f"));
  EXPECT_FALSE(r.Bytes(1, "f"));
  EXPECT_EQ(r.CString("f").error().message, "f at byte 0: missing NUL terminator");
  EXPECT_EQ(r.Rest(), "");
}

TEST(ByteReader, ZeroBytesAtTheEndIsFine) {
  std::string data = "ab";
  ByteReader r(data);
  ASSERT_TRUE(r.Bytes(2, "x"));
  auto empty = r.Bytes(0, "y");
  ASSERT_TRUE(empty);
  EXPECT_EQ(*empty, "");
}

TEST(ByteReader, BytesAreAViewIntoTheInput) {
  std::string data = "headerPAYLOAD";
  ByteReader r(data);
  ASSERT_TRUE(r.Bytes(6, "header"));
  auto payload = r.Bytes(7, "payload");
  ASSERT_TRUE(payload);
  EXPECT_EQ(*payload, "PAYLOAD");
  EXPECT_EQ(payload->data(), data.data() + 6);
}

TEST(ByteReader, HugeLengthIsAShortReadNotAnOverflow) {
  std::string data = "abc";
  ByteReader r(data);
  ASSERT_TRUE(r.U8("x"));
  auto v = r.Bytes(std::numeric_limits<size_t>::max(), "blob");
  ASSERT_FALSE(v);
  EXPECT_EQ(r.offset(), 1u);
}

TEST(ByteReader, CStringConsumesTheTerminator) {
  std::string data("public\0outbox\0", 14);
  ByteReader r(data);
  EXPECT_EQ(*r.CString("ns"), "public");
  EXPECT_EQ(r.offset(), 7u);
  EXPECT_EQ(*r.CString("rel"), "outbox");
  EXPECT_TRUE(r.empty());
}

TEST(ByteReader, EmptyCString) {
  std::string data("\0x", 2);
  ByteReader r(data);
  EXPECT_EQ(*r.CString("s"), "");
  EXPECT_EQ(r.Rest(), "x");
}

TEST(ByteReader, CStringWithoutTerminatorFailsAndDoesNotAdvance) {
  std::string data("ab\0cd", 5);
  ByteReader r(data);
  ASSERT_TRUE(r.CString("first"));
  auto v = r.CString("second");
  ASSERT_FALSE(v);
  EXPECT_EQ(v.error().message, "second at byte 3: missing NUL terminator");
  EXPECT_EQ(r.offset(), 3u);
}

TEST(ByteReader, CStringSearchStopsAtTheEndOfTheView) {
  // The NUL right after the view (a std::string's terminator, or the next field in a bigger
  // buffer) must not be found.
  std::string backing("abc\0", 4);
  ByteReader r(std::string_view(backing.data(), 3));
  EXPECT_FALSE(r.CString("s"));
}

TEST(ByteReader, RestTakesEverythingLeft) {
  std::string data = "wXLOG";
  ByteReader r(data);
  ASSERT_TRUE(r.U8("type"));
  EXPECT_EQ(r.remaining(), 4u);
  EXPECT_EQ(r.Rest(), "XLOG");
  EXPECT_TRUE(r.empty());
  EXPECT_EQ(r.Rest(), "");
}

TEST(ByteReader, ReadsStayInsideAViewOfALargerBuffer) {
  std::string backing = Bytes({0, 0, 0, 1, 0xAA, 0xBB, 0xCC, 0xDD});
  ByteReader r(std::string_view(backing.data(), 4));
  EXPECT_EQ(*r.U32("a"), 1u);
  EXPECT_FALSE(r.U8("b"));
}

TEST(ByteWriter, WritesBigEndian) {
  std::string out;
  ByteWriter w(&out);
  w.U8(0x01);
  w.U16(0x0203);
  w.U32(0x04050607);
  w.U64(0x08090A0B0C0D0E0F);
  EXPECT_EQ(out, Bytes({0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08, 0x09, 0x0A, 0x0B, 0x0C,
                        0x0D, 0x0E, 0x0F}));
}

TEST(ByteWriter, NegativeValuesAreTwosComplement) {
  std::string out;
  ByteWriter w(&out);
  w.I16(-2);
  w.I32(std::numeric_limits<int32_t>::min());
  w.I64(-1);
  EXPECT_EQ(out,
            Bytes({0xFF, 0xFE, 0x80, 0, 0, 0, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF}));
}

TEST(ByteWriter, AppendsToWhatIsThere) {
  std::string out = "prefix:";
  ByteWriter w(&out);
  w.CString("ns");
  w.Bytes(std::string_view("\0\1", 2));
  EXPECT_EQ(out, std::string("prefix:ns\0\0\1", 12));
}

TEST(ByteWriterReader, ExtremesRoundTrip) {
  std::string out;
  ByteWriter w(&out);
  w.I16(std::numeric_limits<int16_t>::min());
  w.I16(std::numeric_limits<int16_t>::max());
  w.I32(std::numeric_limits<int32_t>::min());
  w.I32(std::numeric_limits<int32_t>::max());
  w.I64(std::numeric_limits<int64_t>::min());
  w.I64(std::numeric_limits<int64_t>::max());
  w.U64(std::numeric_limits<uint64_t>::max());
  w.CString("");
  ByteReader r(out);
  EXPECT_EQ(*r.I16("a"), std::numeric_limits<int16_t>::min());
  EXPECT_EQ(*r.I16("b"), std::numeric_limits<int16_t>::max());
  EXPECT_EQ(*r.I32("c"), std::numeric_limits<int32_t>::min());
  EXPECT_EQ(*r.I32("d"), std::numeric_limits<int32_t>::max());
  EXPECT_EQ(*r.I64("e"), std::numeric_limits<int64_t>::min());
  EXPECT_EQ(*r.I64("f"), std::numeric_limits<int64_t>::max());
  EXPECT_EQ(*r.U64("g"), std::numeric_limits<uint64_t>::max());
  EXPECT_EQ(*r.CString("h"), "");
  EXPECT_TRUE(r.empty());
}

}  // namespace
}  // namespace outbox_relay
