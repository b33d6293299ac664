#include "outbox_relay/core/progress.h"

#include <fmt/format.h>

#include <cmath>

namespace outbox_relay {

std::string GroupedDigits(uint64_t n) {
  std::string digits = std::to_string(n);
  std::string out;
  out.reserve(digits.size() + digits.size() / 3);
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return out;
}

std::string DescribeDuration(std::chrono::duration<double> d) {
  double s = std::max(0.0, d.count());
  if (s < 60) return fmt::format("{:.1f} s", s);
  auto whole = static_cast<uint64_t>(std::llround(s));
  if (whole < 3600) return fmt::format("{} min {:02} s", whole / 60, whole % 60);
  return fmt::format("{} h {:02} min", whole / 3600, whole % 3600 / 60);
}

std::string DescribeProgress(std::string_view what, const Progress& p) {
  const double secs = p.elapsed.count();
  const double rate = secs > 0 ? static_cast<double>(p.done) / secs : 0.0;
  std::string line = fmt::format("{}: {}", what, GroupedDigits(p.done));
  if (p.total && p.done <= *p.total) {
    const uint64_t total = *p.total;
    const double pct =
        total > 0 ? 100.0 * static_cast<double>(p.done) / static_cast<double>(total) : 100.0;
    line += fmt::format(" of {}{} rows ({:.0f}%)", p.estimated ? "~" : "", GroupedDigits(total),
                        std::floor(pct));
  } else {
    line += " rows";
  }
  line += fmt::format(", {} rows/s", GroupedDigits(static_cast<uint64_t>(std::llround(rate))));
  if (p.total && p.done <= *p.total) {
    if (p.done == *p.total) {
      line += ", done";
    } else if (rate > 0) {
      line += fmt::format(", {} left", DescribeDuration(std::chrono::duration<double>(
                                           static_cast<double>(*p.total - p.done) / rate)));
    }
  } else if (p.total) {
    line += fmt::format(" (estimated ~{})", GroupedDigits(*p.total));
  }
  return line;
}

}  // namespace outbox_relay
