// A stop request as the pipeline sees it: the flag a signal handler sets,
// and when the loop first noticed it. The shutdown timeout counts from then,
// and an open transaction is read to its end only within a grace period.
//
// Thread: the loop thread only (the flag itself may be set from anywhere).
#pragma once

#include <atomic>
#include <chrono>

namespace outbox_relay::pipeline {

class StopSignal {
 public:
  using Clock = std::chrono::steady_clock;

  explicit StopSignal(const std::atomic<bool>& flag) : flag_(&flag) {}

  // Whether a stop was asked for (and from when, the first time it is seen).
  bool requested() {
    if (!flag_->load()) return false;
    if (seen_ == Clock::time_point{}) seen_ = Clock::now();
    return true;
  }
  // A stop was asked for at least `grace` ago.
  bool Over(std::chrono::milliseconds grace) {
    return requested() && Clock::now() - seen_ >= grace;
  }
  // When the stop was first seen; now when it was not (yet).
  Clock::time_point since() const { return seen_ == Clock::time_point{} ? Clock::now() : seen_; }
  const std::atomic<bool>& flag() const { return *flag_; }

 private:
  const std::atomic<bool>* flag_;
  Clock::time_point seen_{};
};

}  // namespace outbox_relay::pipeline
