// Which WAL a position belongs to (core/wal_history.h): the timeline history
// file's grammar, and where two histories part.
#include "outbox_relay/core/wal_history.h"

#include <gtest/gtest.h>

namespace outbox_relay {
namespace {

Lsn L(uint64_t v) { return Lsn(v); }

TEST(WalHistory, ParsesTheServersHistoryFile) {
  auto h = ParseTimelineHistory(3,
                                "1\t0/3000148\tno recovery target specified\n"
                                "\n"
                                "# a comment\n"
                                "2\t0/5000000\tbefore 2026-12-01 10:00:00+00\n");
  ASSERT_TRUE(h) << h.error().message;
  EXPECT_EQ(h->timeline, 3u);
  ASSERT_EQ(h->ancestors.size(), 2u);
  EXPECT_EQ(h->ancestors[0], (TimelineFork{1, L(0x3000148)}));
  EXPECT_EQ(h->ancestors[1], (TimelineFork{2, L(0x5000000)}));
}

TEST(WalHistory, ABadLineIsRefusedByItsNumber) {
  for (const char* text :
       {"x\t0/1\n", "1\tnope\n", "2\t0/5\n1\t0/6\n", "1\t0/6\n2\t0/5\n", "3\t0/5\n"}) {
    auto h = ParseTimelineHistory(3, text);
    ASSERT_FALSE(h) << text;
    EXPECT_EQ(h.error().code, ErrorCode::kProtocol);
    EXPECT_NE(h.error().message.find("line"), std::string::npos) << h.error().message;
  }
}

TEST(WalHistory, TheSameHistorySharesEverything) {
  WalHistory a{2, {{1, L(0x500)}}};
  EXPECT_EQ(DivergencePoint(a, a), kEndOfWal);
  EXPECT_EQ(DivergencePoint(WalHistory{1, {}}, WalHistory{1, {}}), kEndOfWal);
}

TEST(WalHistory, APromotionPartsAtItsSwitchPoint) {
  WalHistory before{1, {}};
  WalHistory after{2, {{1, L(0x500)}}};
  EXPECT_EQ(DivergencePoint(before, after), L(0x500));
  EXPECT_EQ(DivergencePoint(after, before), L(0x500));
  // Two promotions in a row: the old one's timeline 2 up to the second fork.
  WalHistory twice{3, {{1, L(0x500)}, {2, L(0x900)}}};
  EXPECT_EQ(DivergencePoint(after, twice), L(0x900));
}

TEST(WalHistory, SiblingTimelinesShareOnlyTheirCommonAncestor) {
  // Two restores of timeline 1 at different points, each to a new timeline.
  WalHistory a{2, {{1, L(0x500)}}};
  WalHistory b{3, {{1, L(0x400)}}};
  EXPECT_EQ(DivergencePoint(a, b), L(0x400));
  // The same timeline id reused by a restore without the archive.
  WalHistory c{2, {{1, L(0x450)}}};
  EXPECT_EQ(DivergencePoint(a, c), L(0x450));
  // Different first timelines: nothing shared.
  EXPECT_EQ(DivergencePoint(WalHistory{2, {}}, WalHistory{1, {}}), L(0));
}

TEST(WalHistory, AnUnknownHistorySharesOnlyWhatLiesBelowTheFirstFork) {
  WalHistory unknown{};
  EXPECT_EQ(DivergencePoint(unknown, WalHistory{1, {}}), kEndOfWal);
  EXPECT_EQ(DivergencePoint(unknown, WalHistory{3, {{1, L(0x500)}, {2, L(0x900)}}}), L(0x500));
}

}  // namespace
}  // namespace outbox_relay
