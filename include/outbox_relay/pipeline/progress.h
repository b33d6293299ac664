// The stream's position and status state in one value (pure; the loop
// thread's): what the server has sent (write), what may be confirmed
// (flush, from the ack tracker), and when the last standby status update
// went out.
//
// When a status update is due:
// - when the server asks for one (force);
// - when the confirmed position moved, at most every 10 ms (so the slot
//   follows deliveries closely without one packet per transaction; the
//   marker wakes the loop when it has marked, and at the end of a backlog
//   the last position waited up to the throttle with both cores idle);
// - at least every status interval, whatever else: the walsender's
//   wal_sender_timeout counts from our last update, including while the
//   loop holds back and reads nothing.
// write = the highest WAL end seen (never below flush), so the server does
// not repeat keepalives for positions we have; flush = apply = confirmed.
#pragma once

#include <chrono>
#include <optional>

#include "outbox_relay/core/lsn.h"
#include "outbox_relay/walproto/walproto.h"

namespace outbox_relay::pipeline {

class Progress {
 public:
  using Clock = std::chrono::steady_clock;
  static constexpr std::chrono::milliseconds kMovedThrottle{10};

  explicit Progress(std::chrono::milliseconds status_interval)
      : interval_(status_interval), last_status_(Clock::now() - status_interval) {}

  // A server message (XLogData or keepalive) reported this WAL end.
  void SawWalEnd(Lsn wal_end) { received_ = std::max(received_, wal_end); }
  Lsn received() const { return received_; }
  Lsn last_sent_flush() const { return last_sent_flush_; }

  // The update to send now for confirmed position `flush`, or nullopt.
  std::optional<walproto::StandbyStatusUpdate> Due(Clock::time_point now, Lsn flush,
                                                   bool force) const {
    auto since = now - last_status_;
    bool moved = flush != last_sent_flush_ && since >= kMovedThrottle;
    if (!force && !moved && since < interval_) return std::nullopt;
    walproto::StandbyStatusUpdate update;
    update.write = std::max(received_, flush);
    update.flush = flush;
    update.apply = flush;
    update.send_time = PgTimestamp::Now();
    return update;
  }
  // When a moved position may go out (kMovedThrottle after the last update).
  Clock::time_point MovedUpdateAt() const { return last_status_ + kMovedThrottle; }
  void Sent(Clock::time_point now, Lsn flush) {
    last_status_ = now;
    last_sent_flush_ = flush;
  }

 private:
  std::chrono::milliseconds interval_;
  Lsn received_;
  Lsn last_sent_flush_;
  Clock::time_point last_status_;
};

}  // namespace outbox_relay::pipeline
