// Liveness: when the replication connection counts as silent.
#include "outbox_relay/pipeline/liveness.h"

#include <gtest/gtest.h>

namespace outbox_relay::pipeline {
namespace {

using std::chrono::milliseconds;
using T = Liveness::Clock::time_point;

TEST(Liveness, SilentOnlyAfterTheBound) {
  T t0{};
  Liveness l(milliseconds(8000), t0);
  EXPECT_FALSE(l.Silent(t0 + milliseconds(7999)));
  ASSERT_TRUE(l.Silent(t0 + milliseconds(8000)));
  EXPECT_EQ(*l.Silent(t0 + milliseconds(9000)), milliseconds(9000));
}

TEST(Liveness, AnythingHeardStartsTheCountAgain) {
  T t0{};
  Liveness l(milliseconds(8000), t0);
  l.Heard(t0 + milliseconds(5000));
  EXPECT_FALSE(l.Silent(t0 + milliseconds(12000)));
  EXPECT_TRUE(l.Silent(t0 + milliseconds(13000)));
}

TEST(Liveness, BytesOfAMessageCountButAnUnchangedCountDoesNot) {
  T t0{};
  Liveness l(milliseconds(8000), t0);
  l.SawBytes(100, t0 + milliseconds(1000));  // the first count is only a reference
  l.SawBytes(100, t0 + milliseconds(6000));
  EXPECT_TRUE(l.Silent(t0 + milliseconds(8000)));
  l.SawBytes(150, t0 + milliseconds(8500));
  EXPECT_FALSE(l.Silent(t0 + milliseconds(16000)));
  l.SawBytes(std::nullopt, t0 + milliseconds(16400));  // unknown: changes nothing
  EXPECT_TRUE(l.Silent(t0 + milliseconds(16500)));
}

TEST(Liveness, TimeNotListeningDoesNotCount) {
  T t0{};
  Liveness l(milliseconds(8000), t0);
  l.NotListening(t0 + milliseconds(20000));  // held back by Kafka for 20 s
  EXPECT_FALSE(l.Silent(t0 + milliseconds(27000)));
  EXPECT_TRUE(l.Silent(t0 + milliseconds(28000)));
}

TEST(Liveness, AsksForAReplyAtHalfTheBoundOncePerSilence) {
  T t0{};
  Liveness l(milliseconds(8000), t0);
  EXPECT_FALSE(l.WantReply(t0 + milliseconds(3999)));
  EXPECT_FALSE(l.ProbeDue(t0 + milliseconds(3999)));
  EXPECT_TRUE(l.WantReply(t0 + milliseconds(4000)));
  EXPECT_TRUE(l.ProbeDue(t0 + milliseconds(4000)));
  EXPECT_FALSE(l.ProbeDue(t0 + milliseconds(4500)));
  EXPECT_TRUE(l.WantReply(t0 + milliseconds(4500)));
  l.Heard(t0 + milliseconds(5000));
  EXPECT_FALSE(l.WantReply(t0 + milliseconds(5000)));
  EXPECT_TRUE(l.ProbeDue(t0 + milliseconds(9000)));
}

TEST(Liveness, ZeroBoundIsOff) {
  T t0{};
  Liveness l(milliseconds(0), t0);
  EXPECT_FALSE(l.Silent(t0 + std::chrono::hours(10)));
  EXPECT_FALSE(l.WantReply(t0 + std::chrono::hours(10)));
}

TEST(Liveness, TheServersPatienceRaisesTheBound) {
  // A walsender busy decoding answers within wal_sender_timeout/2.
  EXPECT_EQ(Liveness::ForServer(milliseconds(30000), milliseconds(60000)), milliseconds(35000));
  EXPECT_EQ(Liveness::ForServer(milliseconds(30000), milliseconds(20000)), milliseconds(30000));
  EXPECT_EQ(Liveness::ForServer(milliseconds(30000), milliseconds(0)), milliseconds(30000));
  EXPECT_EQ(Liveness::ForServer(milliseconds(0), milliseconds(60000)), milliseconds(0));
}

}  // namespace
}  // namespace outbox_relay::pipeline
