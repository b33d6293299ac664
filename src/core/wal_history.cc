#include "outbox_relay/core/wal_history.h"

#include <algorithm>
#include <charconv>

namespace outbox_relay {

namespace {

std::string_view Trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t' || s.front() == '\r')) {
    s.remove_prefix(1);
  }
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r')) {
    s.remove_suffix(1);
  }
  return s;
}

// The next whitespace-separated field of `s`, removed from it.
std::string_view NextField(std::string_view* s) {
  *s = Trim(*s);
  size_t end = s->find_first_of(" \t");
  std::string_view field = s->substr(0, end);
  s->remove_prefix(end == std::string_view::npos ? s->size() : end);
  return field;
}

// The history as a list of (timeline, end), the last one open.
std::vector<TimelineFork> Spans(const WalHistory& h) {
  std::vector<TimelineFork> spans = h.ancestors;
  spans.push_back(TimelineFork{h.timeline, kEndOfWal});
  return spans;
}

}  // namespace

Result<WalHistory> ParseTimelineHistory(uint32_t timeline, std::string_view text) {
  WalHistory h;
  h.timeline = timeline;
  int line_no = 0;
  while (!text.empty()) {
    size_t nl = text.find('\n');
    std::string_view line = text.substr(0, nl);
    text.remove_prefix(nl == std::string_view::npos ? text.size() : nl + 1);
    ++line_no;
    line = Trim(line);
    if (line.empty() || line.front() == '#') continue;
    std::string_view tli_text = NextField(&line);
    std::string_view lsn_text = NextField(&line);
    uint32_t tli = 0;
    auto [end, ec] = std::from_chars(tli_text.data(), tli_text.data() + tli_text.size(), tli);
    if (ec != std::errc() || end != tli_text.data() + tli_text.size() || tli == 0) {
      return Fail(ErrorCode::kProtocol, "timeline history of {}: line {}: bad timeline '{}'",
                  timeline, line_no, tli_text);
    }
    auto lsn = Lsn::Parse(lsn_text);
    if (!lsn) {
      return Fail(ErrorCode::kProtocol, "timeline history of {}: line {}: bad switch point '{}'",
                  timeline, line_no, lsn_text);
    }
    if (!h.ancestors.empty() &&
        (tli <= h.ancestors.back().timeline || *lsn < h.ancestors.back().end)) {
      return Fail(ErrorCode::kProtocol,
                  "timeline history of {}: line {}: timeline {} at {} does not follow {} at {}",
                  timeline, line_no, tli, *lsn, h.ancestors.back().timeline,
                  h.ancestors.back().end);
    }
    if (tli >= timeline) {
      return Fail(ErrorCode::kProtocol,
                  "timeline history of {}: line {}: ancestor {} is not older than it", timeline,
                  line_no, tli);
    }
    h.ancestors.push_back(TimelineFork{tli, *lsn});
  }
  return h;
}

Lsn DivergencePoint(const WalHistory& a, const WalHistory& b) {
  if (a.timeline == 0 || b.timeline == 0) {
    // Unknown: only what lies below the known history's first fork is the
    // same whatever timeline the unknown one was written on.
    const WalHistory& known = a.timeline == 0 ? b : a;
    if (known.timeline == 0) return Lsn(0);
    return known.ancestors.empty() ? kEndOfWal : known.ancestors.front().end;
  }
  std::vector<TimelineFork> x = Spans(a);
  std::vector<TimelineFork> y = Spans(b);
  Lsn begin(0);  // where span i begins
  for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
    if (x[i].timeline != y[i].timeline) return begin;
    if (x[i].end != y[i].end) return std::min(x[i].end, y[i].end);
    begin = x[i].end;
  }
  return kEndOfWal;  // unreachable: the last spans are open, and equal only when the same
}

}  // namespace outbox_relay
