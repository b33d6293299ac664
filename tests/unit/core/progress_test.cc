// Progress: the line a long backfill, replay or cleanup shows (rows done of the
// total, rate, time left), from figures alone.
#include "outbox_relay/core/progress.h"

#include <gtest/gtest.h>

#include <chrono>

namespace outbox_relay {
namespace {

using Seconds = std::chrono::duration<double>;

TEST(Progress, AKnownTotalGivesPercentRateAndTimeLeft) {
  Progress p{.done = 12000, .total = 48000, .estimated = false, .elapsed = Seconds(4)};
  EXPECT_EQ(DescribeProgress("backfill", p),
            "backfill: 12,000 of 48,000 rows (25%), 3,000 rows/s, 12.0 s left");
}

TEST(Progress, AnEstimatedTotalIsMarkedAndOnceExceededGivesNoTimeLeft) {
  Progress p{.done = 500, .total = 1000, .estimated = true, .elapsed = Seconds(1)};
  EXPECT_EQ(DescribeProgress("cleanup", p),
            "cleanup: 500 of ~1,000 rows (50%), 500 rows/s, 1.0 s left");
  p.done = 1500;
  p.elapsed = Seconds(3);
  EXPECT_EQ(DescribeProgress("cleanup", p), "cleanup: 1,500 rows, 500 rows/s (estimated ~1,000)");
}

TEST(Progress, WithoutATotalOnlyRowsAndRate) {
  Progress p{.done = 7, .total = std::nullopt, .estimated = false, .elapsed = Seconds(2)};
  EXPECT_EQ(DescribeProgress("replay", p), "replay: 7 rows, 4 rows/s");
}

TEST(Progress, TheStartAndTheEnd) {
  Progress start{.done = 0, .total = 10, .estimated = false, .elapsed = Seconds(0)};
  EXPECT_EQ(DescribeProgress("replay", start), "replay: 0 of 10 rows (0%), 0 rows/s");
  Progress end{.done = 10, .total = 10, .estimated = false, .elapsed = Seconds(5)};
  EXPECT_EQ(DescribeProgress("replay", end), "replay: 10 of 10 rows (100%), 2 rows/s, done");
  Progress empty{.done = 0, .total = 0, .estimated = false, .elapsed = Seconds(1)};
  EXPECT_EQ(DescribeProgress("backfill", empty), "backfill: 0 of 0 rows (100%), 0 rows/s, done");
}

TEST(Progress, DurationsAndDigits) {
  EXPECT_EQ(DescribeDuration(Seconds(4.66)), "4.7 s");
  EXPECT_EQ(DescribeDuration(Seconds(185)), "3 min 05 s");
  EXPECT_EQ(DescribeDuration(Seconds(8040)), "2 h 14 min");
  EXPECT_EQ(DescribeDuration(Seconds(-1)), "0.0 s");
  EXPECT_EQ(GroupedDigits(0), "0");
  EXPECT_EQ(GroupedDigits(999), "999");
  EXPECT_EQ(GroupedDigits(1000), "1,000");
  EXPECT_EQ(GroupedDigits(1234567), "1,234,567");
}

}  // namespace
}  // namespace outbox_relay
