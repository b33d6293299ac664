#include "outbox_relay/core/clock.h"

namespace outbox_relay {

namespace {

class SteadyClock final : public Clock {
 public:
  time_point Now() const override { return std::chrono::steady_clock::now(); }
};

}  // namespace

const Clock& Clock::Steady() {
  static const SteadyClock clock;
  return clock;
}

}  // namespace outbox_relay
