// Which WAL a position belongs to: a timeline and the forks before it.
//
// A PostgreSQL cluster's WAL is a tree. Every promotion of a standby and
// every end of an archive recovery (a point-in-time restore) starts a new
// timeline at a switch point: the new timeline shares its parent's WAL below
// that point and nothing above it. The server's timeline history file
// (TIMELINE_HISTORY on a replication connection) lists each ancestor and the
// point where its child began:
//
//   # comment
//   1	0/3000148	no recovery target specified
//   2	0/5000000	before 2026-12-01 10:00:00+00
//
// A position ("the commit record at 0/4000000") means the same transaction
// on two servers only below the point where their histories part
// (DivergencePoint). Exactly-once delivery relies on it: a position its
// progress record proves is trusted only on the WAL the server has now.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "outbox_relay/core/lsn.h"
#include "outbox_relay/core/result.h"

namespace outbox_relay {

// No end: the timeline a server writes now.
inline constexpr Lsn kEndOfWal{UINT64_MAX};

struct TimelineFork {
  uint32_t timeline = 0;  // an ancestor timeline
  Lsn end;                // where its child timeline began (the switch point)
  bool operator==(const TimelineFork&) const = default;
};

struct WalHistory {
  uint32_t timeline = 0;                // the timeline written now (0: unknown)
  std::vector<TimelineFork> ancestors;  // oldest first
  bool operator==(const WalHistory&) const = default;
};

// Parses a timeline history file's text (the history of `timeline`).
// kProtocol naming the line that cannot be read.
Result<WalHistory> ParseTimelineHistory(uint32_t timeline, std::string_view text);

// The first position at which `a` and `b` may hold different WAL: every
// record that begins below it is the same record on both. kEndOfWal when the
// two are the same history; Lsn(0) when they share nothing (different first
// timelines). A history of timeline 0 (unknown) shares nothing but the WAL
// below the first fork of the other: it could be any of its timelines.
Lsn DivergencePoint(const WalHistory& a, const WalHistory& b);

}  // namespace outbox_relay
