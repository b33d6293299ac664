// Progress of long work (a backfill, a replay, a cleanup): rows done of a
// total (exact or estimated), the rate and the time left, as one line.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace outbox_relay {

struct Progress {
  uint64_t done = 0;
  std::optional<uint64_t> total;  // nullopt: unknown
  bool estimated = false;         // the total is an estimate (shown as "~N")
  std::chrono::duration<double> elapsed{0};
};

// "12,000 of 50,000 rows (24%), 8,100 rows/s, 4.7 s left": with an unknown
// total only the rows and the rate; an estimate exceeded says "estimated
// ~N" and no time left.
std::string DescribeProgress(std::string_view what, const Progress& p);

// 1234567 -> "1,234,567".
std::string GroupedDigits(uint64_t n);

// "4.7 s", "3 min 05 s", "2 h 14 min".
std::string DescribeDuration(std::chrono::duration<double> d);

}  // namespace outbox_relay
