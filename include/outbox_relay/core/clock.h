// The time the pipeline goes by: an interface, so that tests drive it.
//
// The stream session, the publisher's stop grace and the exactly-once
// unit's commit interval read the time from a Clock. The process uses the
// steady clock (Clock::Steady()); the pipeline tests use a ManualClock that
// moves only when the test says, so that "nothing happens for 200 ms" is a
// step of the test, not a sleep.
#pragma once

#include <atomic>
#include <chrono>

namespace outbox_relay {

class Clock {
 public:
  using time_point = std::chrono::steady_clock::time_point;
  virtual ~Clock() = default;
  virtual time_point Now() const = 0;
  // std::chrono::steady_clock.
  static const Clock& Steady();
};

// Time that moves only when told (tests). Thread-safe.
class ManualClock final : public Clock {
 public:
  ManualClock() : now_(std::chrono::steady_clock::now().time_since_epoch().count()) {}
  time_point Now() const override {
    return time_point(time_point::duration(now_.load(std::memory_order_acquire)));
  }
  void Advance(std::chrono::nanoseconds d) { now_.fetch_add(d.count(), std::memory_order_acq_rel); }

 private:
  std::atomic<time_point::rep> now_;
};

}  // namespace outbox_relay
