// Writing JSON strings: the one escaping routine for logs and command output.
#pragma once

#include <fmt/format.h>

#include <iterator>
#include <string_view>

namespace outbox_relay {

// Appends `text` to `out` as the inside of a JSON string (no quotes):
// " and \ escaped, control characters as \n \r \t or \u00XX. Other bytes are
// copied as they are (the caller's text is UTF-8).
template <typename Out>
void AppendJsonEscaped(std::string_view text, Out& out) {
  auto append = [&out](std::string_view s) { out.append(s.data(), s.data() + s.size()); };
  for (char c : text) {
    switch (c) {
      case '"':
        append("\\\"");
        break;
      case '\\':
        append("\\\\");
        break;
      case '\n':
        append("\\n");
        break;
      case '\r':
        append("\\r");
        break;
      case '\t':
        append("\\t");
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          fmt::format_to(std::back_inserter(out), "\\u{:04x}", static_cast<unsigned>(c));
        } else {
          out.push_back(c);
        }
    }
  }
}

}  // namespace outbox_relay
