// Lsn: parsed and printed exactly as PostgreSQL's pg_lsn type does ("X/Y", two hex halves).
#include "outbox_relay/core/lsn.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <string>

namespace outbox_relay {
namespace {

using ::testing::HasSubstr;

TEST(LsnParse, AcceptsWhatPgLsnPrints) {
  auto lsn = Lsn::Parse("16/B374D848");
  ASSERT_TRUE(lsn) << lsn.error().message;
  EXPECT_EQ(lsn->value(), 0x16B374D848u);
}

TEST(LsnParse, ZeroIsTheInvalidLsn) {
  auto lsn = Lsn::Parse("0/0");
  ASSERT_TRUE(lsn);
  EXPECT_EQ(*lsn, kInvalidLsn);
  EXPECT_FALSE(lsn->valid());
}

TEST(LsnParse, AcceptsLowerCaseAndLeadingZeros) {
  EXPECT_EQ(Lsn::Parse("16/b374d848")->value(), 0x16B374D848u);
  EXPECT_EQ(Lsn::Parse("00000016/0B374D84")->value(), 0x160B374D84u);
}

TEST(LsnParse, AcceptsTheLargestValue) {
  EXPECT_EQ(Lsn::Parse("FFFFFFFF/FFFFFFFF")->value(), UINT64_MAX);
}

TEST(LsnParse, HalvesAreIndependentNotConcatenatedText) {
  // "1/2" is 0x0000000100000002, not 0x12.
  EXPECT_EQ(Lsn::Parse("1/2")->value(), (uint64_t{1} << 32) | 2);
}

class LsnParseRejects : public ::testing::TestWithParam<const char*> {};

TEST_P(LsnParseRejects, WithAnInvalidArgumentErrorQuotingTheInput) {
  std::string text = GetParam();
  auto lsn = Lsn::Parse(text);
  ASSERT_FALSE(lsn) << "parsed '" << text << "' as " << lsn->value();
  EXPECT_EQ(lsn.error().code, ErrorCode::kInvalidArgument);
  EXPECT_THAT(lsn.error().message, HasSubstr("'" + text + "'"));
}

INSTANTIATE_TEST_SUITE_P(Malformed, LsnParseRejects,
                         ::testing::Values("",             // empty
                                           "16B374D848",   // no slash
                                           "/",            // both halves empty
                                           "16/",          // low half empty
                                           "/B374D848",    // high half empty
                                           "1/2/3",        // two slashes
                                           "123456789/0",  // nine hex digits
                                           "0/123456789",  // nine hex digits
                                           "0x16/0",       // C prefix
                                           "G/0",          // not hex
                                           "-1/0",         // sign
                                           "+1/0",         // sign
                                           " 1/0",         // leading space
                                           "1/0 ",         // trailing space
                                           "1 /0",         // space before the slash
                                           "1/0\n"));      // newline from a file

TEST(LsnToString, PrintsUpperCaseHexWithoutLeadingZeros) {
  EXPECT_EQ(Lsn(0x16B374D848).ToString(), "16/B374D848");
  EXPECT_EQ(Lsn(0).ToString(), "0/0");
  EXPECT_EQ(Lsn(0x100000000).ToString(), "1/0");
  EXPECT_EQ(Lsn(UINT64_MAX).ToString(), "FFFFFFFF/FFFFFFFF");
}

TEST(LsnToString, ParseOfToStringIsIdentity) {
  for (uint64_t v : {uint64_t{0}, uint64_t{1}, uint64_t{0xFFFFFFFF}, uint64_t{0x100000000},
                     uint64_t{0x16B374D848}, uint64_t{0x8000000000000000}, UINT64_MAX}) {
    auto parsed = Lsn::Parse(Lsn(v).ToString());
    ASSERT_TRUE(parsed) << v;
    EXPECT_EQ(parsed->value(), v);
  }
}

TEST(LsnFormat, FmtPrintsTheSameAsToString) {
  Lsn lsn(0x16B374D848);
  EXPECT_EQ(fmt::format("{}", lsn), "16/B374D848");
  EXPECT_EQ(fmt::format("confirmed {} of {}", lsn, Lsn(0)), "confirmed 16/B374D848 of 0/0");
}

TEST(LsnCompare, OrdersByPositionNotByText) {
  // As text "9/0" > "10/0"; as positions it is smaller.
  EXPECT_LT(*Lsn::Parse("9/0"), *Lsn::Parse("10/0"));
  EXPECT_LT(*Lsn::Parse("0/FFFFFFFF"), *Lsn::Parse("1/0"));
  EXPECT_EQ(Lsn(5), Lsn(5));
  EXPECT_GT(Lsn(6), Lsn(5));
  EXPECT_LT(kInvalidLsn, Lsn(1));
}

TEST(LsnCompare, DefaultIsInvalid) {
  EXPECT_FALSE(Lsn().valid());
  EXPECT_TRUE(Lsn(1).valid());
  static_assert(Lsn().value() == 0);
}

TEST(ErrorCodeName, NamesEveryCode) {
  EXPECT_EQ(ErrorCodeName(ErrorCode::kProtocol), "protocol");
  EXPECT_EQ(ErrorCodeName(ErrorCode::kInvalidArgument), "invalid_argument");
  EXPECT_EQ(ErrorCodeName(ErrorCode::kPoison), "poison");
  EXPECT_EQ(ErrorCodeName(ErrorCode::kTransient), "transient");
  EXPECT_EQ(ErrorCodeName(ErrorCode::kSlotInUse), "slot_in_use");
  EXPECT_EQ(ErrorCodeName(ErrorCode::kSlotLost), "slot_lost");
  EXPECT_EQ(ErrorCodeName(ErrorCode::kPermission), "permission");
  EXPECT_EQ(ErrorCodeName(ErrorCode::kDuplicateKey), "duplicate_key");
  EXPECT_EQ(ErrorCodeName(ErrorCode::kFenced), "fenced");
  EXPECT_EQ(ErrorCodeName(ErrorCode::kFatal), "fatal");
}

TEST(DispositionOf, RetriesOnlyWhatMaySucceedLaterAndDeadLettersOnlyPoison) {
  EXPECT_EQ(DispositionOf({ErrorCode::kTransient, ""}), Disposition::kRetry);
  EXPECT_EQ(DispositionOf({ErrorCode::kSlotInUse, ""}), Disposition::kRetry);
  EXPECT_EQ(DispositionOf({ErrorCode::kPoison, ""}), Disposition::kDeadLetter);
  // A protocol error is never retried: the same bytes would come again.
  EXPECT_EQ(DispositionOf({ErrorCode::kProtocol, ""}), Disposition::kStop);
  EXPECT_EQ(DispositionOf({ErrorCode::kInvalidArgument, ""}), Disposition::kStop);
  EXPECT_EQ(DispositionOf({ErrorCode::kSlotLost, ""}), Disposition::kStop);
  EXPECT_EQ(DispositionOf({ErrorCode::kPermission, ""}), Disposition::kStop);
  EXPECT_EQ(DispositionOf({ErrorCode::kDuplicateKey, ""}), Disposition::kStop);
  EXPECT_EQ(DispositionOf({ErrorCode::kFenced, ""}), Disposition::kStop);
  EXPECT_EQ(DispositionOf({ErrorCode::kFatal, ""}), Disposition::kStop);
}

}  // namespace
}  // namespace outbox_relay
