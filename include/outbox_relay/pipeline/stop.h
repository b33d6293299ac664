// A stop request as the pipeline sees it: the flag a signal handler sets,
// and when the loop first noticed it. The shutdown timeout counts from then,
// and an open transaction is read to its end only within a grace period.
//
// Thread: the loop thread only (the flag itself may be set from anywhere).
#pragma once

#include <atomic>
#include <chrono>

#include "outbox_relay/core/clock.h"

namespace outbox_relay::pipeline {

class StopSignal {
 public:
  explicit StopSignal(const std::atomic<bool>& flag, const Clock& clock = Clock::Steady())
      : flag_(&flag), clock_(&clock) {}

  // Whether a stop was asked for (and from when, the first time it is seen).
  bool requested() {
    if (!flag_->load()) return false;
    if (seen_ == Clock::time_point{}) seen_ = clock_->Now();
    return true;
  }
  // A stop was asked for at least `grace` ago.
  bool Over(std::chrono::milliseconds grace) {
    return requested() && clock_->Now() - seen_ >= grace;
  }
  // When the stop was first seen; now when it was not (yet).
  Clock::time_point since() const { return seen_ == Clock::time_point{} ? clock_->Now() : seen_; }
  const std::atomic<bool>& flag() const { return *flag_; }
  const Clock& clock() const { return *clock_; }

 private:
  const std::atomic<bool>* flag_;
  const Clock* clock_;
  Clock::time_point seen_{};
};

}  // namespace outbox_relay::pipeline
