#include "outbox_relay/core/lsn.h"

#include <charconv>

namespace outbox_relay {

namespace {

// One half of "X/Y": 1 to 8 hex digits.
Result<uint32_t> ParseHalf(std::string_view half, std::string_view whole) {
  uint32_t v = 0;
  if (half.empty() || half.size() > 8) {
    return Fail(ErrorCode::kInvalidArgument, "invalid LSN '{}': expected X/Y in hex", whole);
  }
  auto [ptr, ec] = std::from_chars(half.data(), half.data() + half.size(), v, 16);
  if (ec != std::errc() || ptr != half.data() + half.size()) {
    return Fail(ErrorCode::kInvalidArgument, "invalid LSN '{}': expected X/Y in hex", whole);
  }
  return v;
}

}  // namespace

Result<Lsn> Lsn::Parse(std::string_view text) {
  size_t slash = text.find('/');
  if (slash == std::string_view::npos) {
    return Fail(ErrorCode::kInvalidArgument, "invalid LSN '{}': expected X/Y in hex", text);
  }
  auto hi = ParseHalf(text.substr(0, slash), text);
  if (!hi) return std::unexpected(hi.error());
  auto lo = ParseHalf(text.substr(slash + 1), text);
  if (!lo) return std::unexpected(lo.error());
  return Lsn((static_cast<uint64_t>(*hi) << 32) | *lo);
}

std::string Lsn::ToString() const { return fmt::format("{}", *this); }

std::string_view ErrorCodeName(ErrorCode code) {
  switch (code) {
    case ErrorCode::kProtocol:
      return "protocol";
    case ErrorCode::kInvalidArgument:
      return "invalid_argument";
    case ErrorCode::kPoison:
      return "poison";
    case ErrorCode::kTransient:
      return "transient";
    case ErrorCode::kSlotInUse:
      return "slot_in_use";
    case ErrorCode::kSlotLost:
      return "slot_lost";
    case ErrorCode::kPermission:
      return "permission";
    case ErrorCode::kCancelled:
      return "cancelled";
    case ErrorCode::kAborted:
      return "aborted";
    case ErrorCode::kDuplicateKey:
      return "duplicate_key";
    case ErrorCode::kFenced:
      return "fenced";
    case ErrorCode::kFatal:
      return "fatal";
  }
  return "unknown";
}

}  // namespace outbox_relay
