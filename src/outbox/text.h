// Small text helpers private to the outbox module.
#pragma once

#include <cstddef>
#include <string_view>

namespace outbox_relay::outbox {

// Row values go into error messages: keep them bounded, cut at a UTF-8
// character boundary so the message stays valid UTF-8.
inline std::string_view Shorten(std::string_view s, size_t max = 128) {
  if (s.size() <= max) return s;
  size_t n = max;
  while (n > 0 && (static_cast<unsigned char>(s[n]) & 0xC0) == 0x80) --n;
  return s.substr(0, n);
}

// "..." when Shorten(s, max) cut something off.
inline std::string_view Ellipsis(std::string_view s, size_t max = 128) {
  return s.size() <= max ? "" : "...";
}

}  // namespace outbox_relay::outbox
