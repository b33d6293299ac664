// Specification of the CopyBoth replication sub-protocol codec: XLogData 'w', keepalive 'k',
// standby status update 'r'.
#include "outbox_relay/walproto/walproto.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <string>

namespace outbox_relay::walproto {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

constexpr PgTimestamp kSendTime{767'880'000'123'456};  // 2024-05-01 12:00:00.123456 UTC

std::string Bytes(std::initializer_list<uint8_t> bytes) {
  return std::string(bytes.begin(), bytes.end());
}

// A heap block of exactly the input's size, so that AddressSanitizer catches an over-read.
class ExactBuffer {
 public:
  explicit ExactBuffer(std::string_view bytes) : size_(bytes.size()), data_(new char[size_]) {
    if (size_ > 0) std::memcpy(data_.get(), bytes.data(), size_);
  }
  std::string_view view() const { return {data_.get(), size_}; }

 private:
  size_t size_;
  std::unique_ptr<char[]> data_;
};

XLogData SampleXLogData(std::string_view payload) {
  return XLogData{Lsn(0x16B374D848), Lsn(0x16B374D900), kSendTime, payload};
}

PrimaryKeepalive SampleKeepalive(bool reply) {
  return PrimaryKeepalive{Lsn(0x16B374D900), kSendTime, reply};
}

StandbyStatusUpdate SampleStatus(bool reply) {
  return StandbyStatusUpdate{Lsn(0x16B374D900), Lsn(0x16B374D878), Lsn(0x16B374D878), kSendTime,
                             reply};
}

// ---------------------------------------------------------------------------------------------
// Round trips.

TEST(XLogData, RoundTripsWithItsPayloadAsAViewIntoTheInput) {
  std::string payload("B\x00\x00\x00\x16\xB3\x74\xD8\x48", 9);  // NULs included
  std::string bytes = Encode(SampleXLogData(payload));
  ASSERT_EQ(bytes.size(), 1 + 3 * 8 + payload.size());
  auto m = DecodeServerMessage(bytes);
  ASSERT_TRUE(m) << m.error().message;
  const XLogData& x = std::get<XLogData>(*m);
  EXPECT_EQ(x.wal_start, Lsn(0x16B374D848));
  EXPECT_EQ(x.wal_end, Lsn(0x16B374D900));
  EXPECT_EQ(x.send_time, kSendTime);
  EXPECT_EQ(x.data, payload);
  EXPECT_EQ(x.data.data(), bytes.data() + 25);
  EXPECT_EQ(Encode(x), bytes);
}

TEST(XLogData, EmptyPayloadIsAllowed) {
  // Framing is not this layer's business: an empty pgoutput message is the decoder's error.
  auto m = DecodeServerMessage(Encode(SampleXLogData("")));
  ASSERT_TRUE(m);
  EXPECT_TRUE(std::get<XLogData>(*m).data.empty());
}

TEST(XLogData, WireLayoutIsBigEndian) {
  std::string bytes = Bytes({'w', 0,    0,    0,    0x16, 0xB3, 0x74, 0xD8, 0x48,  // dataStart
                             0,   0,    0,    0x16, 0xB3, 0x74, 0xD9, 0x00,        // walEnd
                             0,   0x02, 0xBA, 0x61, 0xFE, 0xA3, 0x32, 0x40,        // sendTime
                             'x'});
  auto m = DecodeServerMessage(bytes);
  ASSERT_TRUE(m) << m.error().message;
  const XLogData& x = std::get<XLogData>(*m);
  EXPECT_EQ(x.wal_start.ToString(), "16/B374D848");
  EXPECT_EQ(x.wal_end.ToString(), "16/B374D900");
  EXPECT_EQ(x.send_time, kSendTime);
  EXPECT_EQ(x.data, "x");
}

TEST(PrimaryKeepalive, RoundTripsWithAndWithoutReplyRequested) {
  for (bool reply : {false, true}) {
    std::string bytes = Encode(SampleKeepalive(reply));
    ASSERT_EQ(bytes.size(), 18u);
    EXPECT_EQ(bytes.back(), reply ? '\x01' : '\x00');
    auto m = DecodeServerMessage(bytes);
    ASSERT_TRUE(m) << m.error().message;
    const PrimaryKeepalive& k = std::get<PrimaryKeepalive>(*m);
    EXPECT_EQ(k.wal_end, Lsn(0x16B374D900));
    EXPECT_EQ(k.send_time, kSendTime);
    EXPECT_EQ(k.reply_requested, reply);
    EXPECT_EQ(Encode(k), bytes);
  }
}

TEST(StandbyStatusUpdate, RoundTripsWithAndWithoutReplyRequested) {
  for (bool reply : {false, true}) {
    std::string bytes = Encode(SampleStatus(reply));
    ASSERT_EQ(bytes.size(), 34u);
    auto m = DecodeStandbyStatusUpdate(bytes);
    ASSERT_TRUE(m) << m.error().message;
    EXPECT_EQ(m->write, Lsn(0x16B374D900));
    EXPECT_EQ(m->flush, Lsn(0x16B374D878));
    EXPECT_EQ(m->apply, Lsn(0x16B374D878));
    EXPECT_EQ(m->send_time, kSendTime);
    EXPECT_EQ(m->reply_requested, reply);
    EXPECT_EQ(Encode(*m), bytes);
  }
}

TEST(StandbyStatusUpdate, WireLayoutMatchesTheProtocolDocs) {
  StandbyStatusUpdate u{Lsn(0x0102030405060708), Lsn(0x1112131415161718), Lsn(0x2122232425262728),
                        PgTimestamp{0x3132333435363738}, true};
  EXPECT_EQ(Encode(u),
            Bytes({'r',  1,    2,    3,    4,    5,    6,    7,    8,    0x11, 0x12, 0x13,
                   0x14, 0x15, 0x16, 0x17, 0x18, 0x21, 0x22, 0x23, 0x24, 0x25, 0x26, 0x27,
                   0x28, 0x31, 0x32, 0x33, 0x34, 0x35, 0x36, 0x37, 0x38, 1}));
}

TEST(StandbyStatusUpdate, InvalidLsnsEncodeAsZero) {
  // "0/0" for apply is what a client sends when it does not apply anything.
  std::string bytes = Encode(StandbyStatusUpdate{Lsn(5), Lsn(5), kInvalidLsn, kSendTime, false});
  EXPECT_EQ(bytes.substr(17, 8), std::string(8, '\0'));
}

// ---------------------------------------------------------------------------------------------
// Truncation and corruption.

TEST(XLogData, EveryPrefixShorterThanTheHeaderIsAnError) {
  std::string bytes = Encode(SampleXLogData("payload"));
  for (size_t len = 0; len < 25; ++len) {
    ExactBuffer buf(std::string_view(bytes).substr(0, len));
    auto m = DecodeServerMessage(buf.view());
    ASSERT_FALSE(m) << "prefix of " << len;
    EXPECT_EQ(m.error().code, ErrorCode::kProtocol);
    EXPECT_THAT(m.error().message, HasSubstr(" at byte "));
    if (len > 0) {
      EXPECT_THAT(m.error().message, StartsWith("XLogData: "));
    }
  }
  // A prefix that keeps the header is a shorter payload, which is fine here.
  for (size_t len = 25; len <= bytes.size(); ++len) {
    ExactBuffer buf(std::string_view(bytes).substr(0, len));
    auto m = DecodeServerMessage(buf.view());
    ASSERT_TRUE(m) << "prefix of " << len;
    EXPECT_EQ(std::get<XLogData>(*m).data.size(), len - 25);
  }
}

TEST(XLogData, TruncatedHeaderNamesTheField) {
  std::string bytes = Encode(SampleXLogData("")).substr(0, 20);
  auto m = DecodeServerMessage(bytes);
  ASSERT_FALSE(m);
  EXPECT_EQ(m.error().message, "XLogData: sendTime at byte 17: need 8 bytes, 3 left");
}

TEST(PrimaryKeepalive, EveryTruncatedPrefixIsAnError) {
  std::string bytes = Encode(SampleKeepalive(true));
  for (size_t len = 0; len < bytes.size(); ++len) {
    ExactBuffer buf(std::string_view(bytes).substr(0, len));
    auto m = DecodeServerMessage(buf.view());
    ASSERT_FALSE(m) << "prefix of " << len;
    EXPECT_EQ(m.error().code, ErrorCode::kProtocol);
    EXPECT_THAT(m.error().message, HasSubstr(" at byte "));
  }
}

TEST(PrimaryKeepalive, MissingReplyRequestedByte) {
  auto m = DecodeServerMessage(Encode(SampleKeepalive(false)).substr(0, 17));
  ASSERT_FALSE(m);
  EXPECT_EQ(m.error().message, "PrimaryKeepalive: replyRequested at byte 17: need 1 bytes, 0 left");
}

TEST(PrimaryKeepalive, TrailingBytesAreAnError) {
  auto m = DecodeServerMessage(Encode(SampleKeepalive(false)) + "x");
  ASSERT_FALSE(m);
  EXPECT_EQ(m.error().message, "PrimaryKeepalive: end of message at byte 18: 1 trailing bytes");
}

TEST(PrimaryKeepalive, ReplyRequestedOtherThanZeroOrOneIsAnError) {
  std::string bytes = Encode(SampleKeepalive(false));
  bytes.back() = 2;
  auto m = DecodeServerMessage(bytes);
  ASSERT_FALSE(m);
  EXPECT_EQ(m.error().message,
            "PrimaryKeepalive: replyRequested at byte 17: must be 0 or 1, got 2");
}

TEST(StandbyStatusUpdate, EveryTruncatedPrefixIsAnError) {
  std::string bytes = Encode(SampleStatus(false));
  for (size_t len = 0; len < bytes.size(); ++len) {
    ExactBuffer buf(std::string_view(bytes).substr(0, len));
    auto m = DecodeStandbyStatusUpdate(buf.view());
    ASSERT_FALSE(m) << "prefix of " << len;
    EXPECT_EQ(m.error().code, ErrorCode::kProtocol);
    EXPECT_THAT(m.error().message, StartsWith("StandbyStatusUpdate: "));
    EXPECT_THAT(m.error().message, HasSubstr(" at byte "));
  }
}

TEST(StandbyStatusUpdate, TruncatedFlushNamesTheField) {
  auto m = DecodeStandbyStatusUpdate(Encode(SampleStatus(false)).substr(0, 12));
  ASSERT_FALSE(m);
  EXPECT_EQ(m.error().message, "StandbyStatusUpdate: flush at byte 9: need 8 bytes, 3 left");
}

TEST(StandbyStatusUpdate, TrailingBytesAreAnError) {
  auto m = DecodeStandbyStatusUpdate(Encode(SampleStatus(true)) + std::string(3, '\0'));
  ASSERT_FALSE(m);
  EXPECT_EQ(m.error().message, "StandbyStatusUpdate: end of message at byte 34: 3 trailing bytes");
}

TEST(StandbyStatusUpdate, OtherMessageTypeIsAnError) {
  auto m = DecodeStandbyStatusUpdate(Encode(SampleKeepalive(false)));
  ASSERT_FALSE(m);
  EXPECT_EQ(m.error().message,
            "StandbyStatusUpdate: message type at byte 0: expected 'r', got 'k' (0x6B)");
}

TEST(ServerMessage, EmptyInputIsAnError) {
  auto m = DecodeServerMessage("");
  ASSERT_FALSE(m);
  EXPECT_EQ(m.error().message, "message type at byte 0: need 1 bytes, 0 left");
}

TEST(ServerMessage, UnknownTypeNamesTheByteAsCharAndHex) {
  auto m = DecodeServerMessage(Encode(SampleStatus(false)));  // 'r' goes the other way
  ASSERT_FALSE(m);
  EXPECT_EQ(m.error().code, ErrorCode::kProtocol);
  EXPECT_EQ(m.error().message,
            "message type at byte 0: unknown replication message 'r' (0x72) (expected 'w' or "
            "'k')");
}

TEST(ServerMessage, UnprintableTypeIsShownInHex) {
  auto m = DecodeServerMessage(Bytes({0x00, 1, 2, 3}));
  ASSERT_FALSE(m);
  EXPECT_THAT(m.error().message, HasSubstr("unknown replication message 0x00 "));
}

}  // namespace
}  // namespace outbox_relay::walproto
