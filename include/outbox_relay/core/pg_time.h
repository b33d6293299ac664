// PostgreSQL timestamps on the wire: microseconds since 2000-01-01 00:00:00 UTC.
#pragma once

#include <chrono>
#include <cstdint>

namespace outbox_relay {

// Microseconds between the Unix epoch and the PostgreSQL epoch (2000-01-01).
inline constexpr int64_t kPgEpochOffsetMicros = 946'684'800LL * 1'000'000LL;

struct PgTimestamp {
  int64_t micros = 0;  // since 2000-01-01 UTC

  static PgTimestamp FromUnixMicros(int64_t unix_micros) {
    return PgTimestamp{unix_micros - kPgEpochOffsetMicros};
  }
  static PgTimestamp Now() {
    auto now = std::chrono::system_clock::now().time_since_epoch();
    return FromUnixMicros(std::chrono::duration_cast<std::chrono::microseconds>(now).count());
  }
  int64_t ToUnixMicros() const { return micros + kPgEpochOffsetMicros; }
  auto operator<=>(const PgTimestamp&) const = default;
};

}  // namespace outbox_relay
