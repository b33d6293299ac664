// A WAL position. PostgreSQL prints it as two 32-bit hex halves, "X/Y".
#pragma once

#include <compare>
#include <cstdint>
#include <string>
#include <string_view>

#include "outbox_relay/core/result.h"

namespace outbox_relay {

class Lsn {
 public:
  constexpr Lsn() = default;
  constexpr explicit Lsn(uint64_t value) : value_(value) {}

  // Parses "X/Y" where X and Y are 1 to 8 hex digits, as pg_lsn prints it.
  static Result<Lsn> Parse(std::string_view text);

  constexpr uint64_t value() const { return value_; }
  constexpr bool valid() const { return value_ != 0; }
  std::string ToString() const;

  constexpr auto operator<=>(const Lsn&) const = default;

 private:
  uint64_t value_ = 0;
};

inline constexpr Lsn kInvalidLsn{};

}  // namespace outbox_relay

template <>
struct fmt::formatter<outbox_relay::Lsn> : fmt::formatter<std::string_view> {
  // Formats "X/Y" first so width and alignment apply to the whole text.
  auto format(outbox_relay::Lsn lsn, fmt::format_context& ctx) const {
    char buf[24];
    auto end = fmt::format_to(buf, "{:X}/{:X}", static_cast<uint32_t>(lsn.value() >> 32),
                              static_cast<uint32_t>(lsn.value()));
    return fmt::formatter<std::string_view>::format(
        std::string_view(buf, static_cast<size_t>(end - buf)), ctx);
  }
};
