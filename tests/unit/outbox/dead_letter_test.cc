// DeadLetterBuilder: what an operator finds in the dead-letter topic, and how
// the record stays under Kafka's size limit.
#include "outbox_relay/outbox/dead_letter.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

namespace outbox_relay::outbox {
namespace {

using ::testing::ElementsAre;
using ::testing::Pair;

using Headers = std::vector<std::pair<std::string, std::string>>;

constexpr std::string_view kUuid = "01HQZX3V5K8Y2M4N6P7R9S0T1U";
constexpr std::string_view kPayload = R"({"review_id":"r-1","rating":5})";
constexpr std::string_view kMetadata = R"({"Event-Type":"review.created","Schema-Version":2})";
constexpr size_t kOneMegabyte = 1000000;

Headers Copy(const KafkaRecord& r) {
  Headers out;
  for (const auto& [k, v] : r.headers) out.emplace_back(std::string(k), std::string(v));
  return out;
}

RowIdentity Identity(std::string_view uuid = kUuid) {
  return RowIdentity{.transaction_id = 5000000000ull, .offset = 45, .uuid = uuid};
}

const Error kReason{ErrorCode::kPoison,
                    "metadata value for key \"Schema-Version\" is a number, expected a string"};

TEST(DeadLetter, CarriesTheRowTheReasonAndWhereTheRowIs) {
  DeadLetterBuilder dlq("kazmaps.outbox.dlq", kOneMegabyte);
  const KafkaRecord& r =
      dlq.Build(kReason, Identity(), "public.outbox", Lsn(0x1'0A3F00B8ull), kPayload, kMetadata);
  EXPECT_EQ(r.topic, "kazmaps.outbox.dlq");
  EXPECT_EQ(r.key, kUuid);
  EXPECT_EQ(r.value, kPayload);
  EXPECT_EQ(r.event_type, "");
  EXPECT_THAT(Copy(r), ElementsAre(Pair("_watermill_message_uuid", std::string(kUuid)),
                                   Pair("outbox_dlq_reason", kReason.message),
                                   Pair("outbox_dlq_error_code", "poison"),
                                   Pair("outbox_dlq_commit_lsn", "1/A3F00B8"),
                                   Pair("outbox_dlq_transaction_id", "5000000000"),
                                   Pair("outbox_dlq_offset", "45"),
                                   Pair("outbox_dlq_table", "public.outbox"),
                                   Pair("outbox_dlq_metadata", std::string(kMetadata))));
}

TEST(DeadLetter, EmptyUuidMeansNullKeyAndAnEmptyUuidHeader) {
  DeadLetterBuilder dlq("dlq", kOneMegabyte);
  const KafkaRecord& r = dlq.Build(Error{ErrorCode::kPoison, "the uuid column is NULL"},
                                   Identity(""), "public.outbox", Lsn(1), kPayload, kMetadata);
  EXPECT_EQ(r.key, std::nullopt);
  ASSERT_FALSE(r.headers.empty());
  EXPECT_EQ(r.headers[0].first, "_watermill_message_uuid");
  EXPECT_EQ(r.headers[0].second, "");
}

TEST(DeadLetter, SqlNullPayloadAndMetadataAreLeftOutNotTruncated) {
  DeadLetterBuilder dlq("dlq", kOneMegabyte);
  const KafkaRecord& r =
      dlq.Build(kReason, Identity(), "public.outbox", Lsn(1), std::nullopt, std::nullopt);
  EXPECT_EQ(r.value, std::nullopt);
  Headers h = Copy(r);
  EXPECT_EQ(h.size(), 7u);
  for (const auto& [name, value] : h) {
    EXPECT_NE(name, "outbox_dlq_metadata");
    EXPECT_NE(name, "outbox_dlq_truncated");
  }
}

TEST(DeadLetter, TooLargePayloadIsLeftOutWithAReference) {
  std::string payload(2 * kOneMegabyte, 'p');
  DeadLetterBuilder dlq("dlq", kOneMegabyte);
  const KafkaRecord& r = dlq.Build(Error{ErrorCode::kFatal, "Broker: Message size too large"},
                                   Identity(), "public.outbox", Lsn(0x10), payload, kMetadata);
  EXPECT_EQ(r.value, std::nullopt);
  EXPECT_THAT(
      Copy(r),
      ElementsAre(Pair("_watermill_message_uuid", std::string(kUuid)),
                  Pair("outbox_dlq_reason", "Broker: Message size too large"),
                  Pair("outbox_dlq_error_code", "fatal"), Pair("outbox_dlq_commit_lsn", "0/10"),
                  Pair("outbox_dlq_transaction_id", "5000000000"), Pair("outbox_dlq_offset", "45"),
                  Pair("outbox_dlq_table", "public.outbox"),
                  Pair("outbox_dlq_metadata", std::string(kMetadata)),
                  Pair("outbox_dlq_truncated", "true"),
                  Pair("outbox_dlq_reference",
                       "public.outbox transaction_id=5000000000 offset_consumed=45")));
  EXPECT_LE(EstimateRecordSize(r), kOneMegabyte);
}

TEST(DeadLetter, TooLargeMetadataIsLeftOutWhileTheSmallPayloadStays) {
  std::string metadata = R"({"k":")" + std::string(2 * kOneMegabyte, 'm') + R"("})";
  DeadLetterBuilder dlq("dlq", kOneMegabyte);
  const KafkaRecord& r =
      dlq.Build(kReason, Identity(), "public.outbox", Lsn(1), kPayload, metadata);
  EXPECT_EQ(r.value, kPayload);
  Headers h = Copy(r);
  for (const auto& [name, value] : h) EXPECT_NE(name, "outbox_dlq_metadata");
  EXPECT_THAT(h, testing::Contains(Pair("outbox_dlq_truncated", "true")));
  EXPECT_LE(EstimateRecordSize(r), kOneMegabyte);
}

TEST(DeadLetter, BothLeftOutWhenNeitherFits) {
  std::string payload(kOneMegabyte, 'p');
  std::string metadata(kOneMegabyte - 10, 'm');
  DeadLetterBuilder dlq("dlq", kOneMegabyte);
  const KafkaRecord& r = dlq.Build(kReason, Identity(), "public.outbox", Lsn(1), payload, metadata);
  EXPECT_EQ(r.value, std::nullopt);
  for (const auto& [name, value] : r.headers) EXPECT_NE(name, "outbox_dlq_metadata");
  EXPECT_LE(EstimateRecordSize(r), kOneMegabyte);
}

TEST(DeadLetter, ReferenceUsesTheConfiguredColumnNames) {
  ColumnNames names;
  names.offset = "offset";
  DeadLetterBuilder dlq("dlq", 800, names);
  std::string payload(1000, 'p');
  const KafkaRecord& r =
      dlq.Build(kReason, Identity(), "watermill.messages", Lsn(1), payload, std::nullopt);
  EXPECT_THAT(Copy(r), testing::Contains(Pair("outbox_dlq_reference",
                                              "watermill.messages transaction_id=5000000000 "
                                              "offset=45")));
}

TEST(DeadLetter, ReferenceFallsBackToTheUuidWhenTheOffsetIsUnknown) {
  RowIdentity identity = Identity();
  identity.offset = -1;  // a record the broker refused after the row left memory
  DeadLetterBuilder dlq("dlq", 800);
  std::string payload(1000, 'p');
  const KafkaRecord& r =
      dlq.Build(kReason, identity, "public.outbox", Lsn(1), payload, std::nullopt);
  EXPECT_THAT(Copy(r), testing::Contains(Pair(
                           "outbox_dlq_reference",
                           "public.outbox transaction_id=5000000000 uuid=" + std::string(kUuid))));
}

TEST(DeadLetter, AHugeReasonIsCutAtACharacterBoundaryToFit) {
  std::string reason;
  while (reason.size() < 5000) reason += "ошибка ";  // two-byte characters
  DeadLetterBuilder dlq("dlq", 2000);
  const KafkaRecord& r = dlq.Build(Error{ErrorCode::kPoison, reason}, Identity(), "public.outbox",
                                   Lsn(1), kPayload, kMetadata);
  EXPECT_LE(EstimateRecordSize(r), 2000u);
  std::string_view got = r.headers[1].second;
  EXPECT_EQ(r.headers[1].first, "outbox_dlq_reason");
  EXPECT_GT(got.size(), 1000u);
  EXPECT_EQ(reason.substr(0, got.size()), got);
  // Cut before a character, never inside one: the next byte starts a character.
  EXPECT_NE(static_cast<unsigned char>(reason[got.size()]) & 0xC0, 0x80);
}

TEST(DeadLetter, EstimateCountsKeyValueAndHeaders) {
  KafkaRecord r;
  EXPECT_EQ(EstimateRecordSize(r), 128u);
  r.key = "k";
  r.value = "vv";
  r.headers.emplace_back("h", "xyz");
  EXPECT_EQ(EstimateRecordSize(r), 128u + 1 + 2 + 10 + 1 + 3);
}

TEST(DeadLetter, ReasonOwnedSoATemporaryErrorCanBePassed) {
  DeadLetterBuilder dlq("dlq", kOneMegabyte);
  const KafkaRecord& r = dlq.Build(Error{ErrorCode::kPoison, std::string(100, 'r')}, Identity(),
                                   std::string("public.") + "outbox", Lsn(1), kPayload, kMetadata);
  EXPECT_EQ(r.headers[1].second, std::string(100, 'r'));
  EXPECT_EQ(r.headers[6].second, "public.outbox");
}

TEST(DeadLetter, ABuilderIsReusedForTheNextRow) {
  DeadLetterBuilder dlq("dlq", 1000);
  std::string big(5000, 'p');
  dlq.Build(kReason, Identity(), "public.outbox", Lsn(1), big, kMetadata);
  const KafkaRecord& r =
      dlq.Build(kReason, Identity(), "public.outbox", Lsn(2), kPayload, kMetadata);
  EXPECT_EQ(r.value, kPayload);
  EXPECT_EQ(r.headers.size(), 8u);  // no truncation headers carried over
}

}  // namespace
}  // namespace outbox_relay::outbox
