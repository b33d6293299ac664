// core/mutex.h: the waits the relay's threads sleep in.
#include "outbox_relay/core/mutex.h"

#include <gtest/gtest.h>

#include <chrono>
#include <thread>

namespace outbox_relay {
namespace {

using namespace std::chrono_literals;
using Clock = CondVar::Clock;

TEST(StopLatch, SleepsItsTimeUnlessSetAndSetWakesASleeperAtOnce) {
  StopLatch latch;
  auto t0 = Clock::now();
  EXPECT_FALSE(latch.SleepFor(20ms));
  EXPECT_GE(Clock::now() - t0, 20ms);

  std::thread setter([&] {
    std::this_thread::sleep_for(20ms);
    latch.Set();
  });
  t0 = Clock::now();
  EXPECT_TRUE(latch.SleepFor(60s));
  EXPECT_LT(Clock::now() - t0, 10s);
  setter.join();
  // Set for good: later sleeps return at once.
  EXPECT_TRUE(latch.SleepUntil(Clock::now() + 60s));
}

TEST(CondVar, ADeadlineAlreadyPassedReturnsAtOnceWithTheMutexHeld) {
  Mutex mu;
  CondVar cv;
  MutexLock lock(&mu);
  auto t0 = Clock::now();
  // Polls, as a caller with a timeout of 0 makes them.
  for (int i = 0; i < 10000; ++i) EXPECT_FALSE(cv.WaitFor(&mu, 0ms));
  EXPECT_FALSE(cv.WaitUntil(&mu, Clock::now() - 1ms));
  // 10,000 polls in well under the 20-90 us a call a kernel wait sleeps.
  EXPECT_LT(Clock::now() - t0, 100ms);
}

}  // namespace
}  // namespace outbox_relay
