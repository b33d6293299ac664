// Loads tests/fixtures/pgoutput/stream_v1.hex (recorded from a real PostgreSQL 15 by
// tests/fixtures/record_fixtures.sh) or stream_v1_pg<major>.hex (14, 16, 17, 18). Format: '#' lines
// are comments, every other line is
// "<lsn>\t<xid>\t<hex bytes of one pgoutput message>".
#pragma once

#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

#include "outbox_relay/core/lsn.h"
#include "outbox_relay/core/result.h"

namespace outbox_relay::pgoutput::golden {

struct GoldenLine {
  int line_number = 0;
  Lsn lsn;           // the lsn column of pg_logical_slot_peek_binary_changes
  uint32_t xid = 0;  // the xid column (0 for a non-transactional message)
  std::string bytes;
};

inline std::string GoldenStreamPath(int major = 15) {
  return std::string(OUTBOX_FIXTURES_DIR) + "/pgoutput/stream_v1" +
         (major == 15 ? std::string() : "_pg" + std::to_string(major)) + ".hex";
}

// Returns the lines, or an error naming the line that does not parse.
inline Result<std::vector<GoldenLine>> LoadGoldenStream(const std::string& path) {
  std::ifstream in(path);
  if (!in) return Fail(ErrorCode::kInvalidArgument, "cannot open {}", path);
  std::vector<GoldenLine> lines;
  std::string text;
  for (int n = 1; std::getline(in, text); ++n) {
    if (text.empty() || text[0] == '#') continue;
    size_t tab1 = text.find('\t');
    size_t tab2 = tab1 == std::string::npos ? tab1 : text.find('\t', tab1 + 1);
    if (tab2 == std::string::npos) return Fail(ErrorCode::kInvalidArgument, "line {}: tabs", n);
    GoldenLine line;
    line.line_number = n;
    auto lsn = Lsn::Parse(std::string_view(text).substr(0, tab1));
    if (!lsn) return Fail(ErrorCode::kInvalidArgument, "line {}: {}", n, lsn.error().message);
    line.lsn = *lsn;
    line.xid = static_cast<uint32_t>(std::stoul(text.substr(tab1 + 1, tab2 - tab1 - 1)));
    std::string_view hex = std::string_view(text).substr(tab2 + 1);
    if (hex.size() % 2 != 0) return Fail(ErrorCode::kInvalidArgument, "line {}: odd hex", n);
    line.bytes.reserve(hex.size() / 2);
    for (size_t i = 0; i < hex.size(); i += 2) {
      auto nibble = [](char c) -> int {
        if (c >= '0' && c <= '9') return c - '0';
        if (c >= 'a' && c <= 'f') return c - 'a' + 10;
        return -1;
      };
      int hi = nibble(hex[i]);
      int lo = nibble(hex[i + 1]);
      if (hi < 0 || lo < 0) return Fail(ErrorCode::kInvalidArgument, "line {}: bad hex", n);
      line.bytes.push_back(static_cast<char>(hi * 16 + lo));
    }
    lines.push_back(std::move(line));
  }
  return lines;
}

}  // namespace outbox_relay::pgoutput::golden
