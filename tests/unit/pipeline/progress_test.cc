// Progress: when a standby status update is due, and what it says.
#include "outbox_relay/pipeline/progress.h"

#include <gtest/gtest.h>

namespace outbox_relay::pipeline {
namespace {

using namespace std::chrono_literals;
using Clock = Progress::Clock;

TEST(Progress, AnUpdateIsDueAtOnceThenEveryIntervalWhenNothingMoves) {
  auto t0 = Clock::now();
  Progress p(1000ms);
  auto first = p.Due(t0, Lsn(100), false);
  ASSERT_TRUE(first.has_value());  // a new connection reports at once
  p.Sent(t0, Lsn(100));
  EXPECT_FALSE(p.Due(t0 + 999ms, Lsn(100), false));
  EXPECT_TRUE(p.Due(t0 + 1000ms, Lsn(100), false));
}

TEST(Progress, AMovedFlushIsReportedButAtMostEvery10Ms) {
  auto t0 = Clock::now();
  Progress p(1000ms);
  p.Sent(t0, Lsn(100));
  EXPECT_EQ(p.MovedUpdateAt(), t0 + 10ms);
  EXPECT_FALSE(p.Due(t0 + 9ms, Lsn(200), false));
  auto u = p.Due(t0 + 10ms, Lsn(200), false);
  ASSERT_TRUE(u.has_value());
  EXPECT_EQ(u->flush, Lsn(200));
  EXPECT_EQ(u->apply, Lsn(200));
}

TEST(Progress, ForcedUpdatesGoOutWheneverTheServerAsks) {
  auto t0 = Clock::now();
  Progress p(1000ms);
  p.Sent(t0, Lsn(100));
  EXPECT_TRUE(p.Due(t0 + 1ms, Lsn(100), true));
}

TEST(Progress, WriteIsTheHighestWalEndSeenAndNeverBelowFlush) {
  auto t0 = Clock::now();
  Progress p(1000ms);
  p.SawWalEnd(Lsn(500));
  p.SawWalEnd(Lsn(300));  // older news
  auto u = p.Due(t0, Lsn(100), true);
  ASSERT_TRUE(u.has_value());
  EXPECT_EQ(u->write, Lsn(500));
  EXPECT_EQ(u->flush, Lsn(100));
  u = p.Due(t0, Lsn(900), true);  // flush ahead of anything received (an idle slot)
  EXPECT_EQ(u->write, Lsn(900));
}

}  // namespace
}  // namespace outbox_relay::pipeline
