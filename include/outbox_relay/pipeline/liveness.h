// Liveness: when a replication connection counts as silent (pure; the loop
// thread's).
//
// A peer that vanishes without a reset (a NAT or load balancer that dropped
// the flow, a failover that left the old address answering nothing) sends
// nothing, and TCP alone may take many minutes to say so. The walsender is
// never silent for long when asked: a standby status update with
// replyRequested set is answered with a keepalive at once by an idle
// walsender, and within wal_sender_timeout/2 by one busy decoding a large
// transaction that publishes nothing (it reads replies only then). So:
//
// - silence is counted only while the loop listens: when it holds back
//   (Kafka or the marker behind) it reads nothing, and the time does not count;
// - anything received counts: a whole message, or bytes of one (a large row
//   on a thin link is slow, not silent);
// - after half the bound of silence, every status update asks for a reply
//   (the first one at once);
// - after the bound, the connection is dead: the loop closes it and the
//   supervisor connects again (from the confirmed position, as after any
//   break).
//
// The bound is --pg-receive-timeout-ms, raised to wal_sender_timeout/2 plus
// a margin when that is longer (see ForServer), so that a busy walsender is
// never taken for a dead one.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <optional>

namespace outbox_relay::pipeline {

class Liveness {
 public:
  using Clock = std::chrono::steady_clock;
  // How late a busy walsender's answer may come after wal_sender_timeout/2.
  static constexpr std::chrono::milliseconds kServerMargin{5000};

  // `bound` 0: never silent (the check is off).
  Liveness(std::chrono::milliseconds bound, Clock::time_point now) : bound_(bound), heard_(now) {}

  // The bound for a server whose wal_sender_timeout is `wal_sender_timeout`
  // (0: the server has none, and answers a busy walsender's replies late).
  static std::chrono::milliseconds ForServer(std::chrono::milliseconds bound,
                                             std::chrono::milliseconds wal_sender_timeout) {
    if (bound.count() <= 0 || wal_sender_timeout.count() <= 0) return bound;
    return std::max(bound, wal_sender_timeout / 2 + kServerMargin);
  }

  std::chrono::milliseconds bound() const { return bound_; }

  // Something arrived from the server.
  void Heard(Clock::time_point now) {
    heard_ = now;
    probed_ = false;
  }
  // `bytes` is the connection's received-bytes count (nullopt: unknown).
  void SawBytes(std::optional<uint64_t> bytes, Clock::time_point now) {
    if (!bytes) return;
    if (bytes_ && *bytes != *bytes_) Heard(now);
    bytes_ = bytes;
  }
  // The loop is not reading: silence is not judged meanwhile.
  void NotListening(Clock::time_point now) { heard_ = std::max(heard_, now); }

  // Status updates should ask the server for a reply.
  bool WantReply(Clock::time_point now) const { return on() && now - heard_ >= bound_ / 2; }
  // True once per silence, when the first reply request is due: send it now.
  bool ProbeDue(Clock::time_point now) {
    if (!WantReply(now) || probed_) return false;
    probed_ = true;
    return true;
  }
  // Silent for the bound or longer: how long (nullopt: not silent).
  std::optional<std::chrono::milliseconds> Silent(Clock::time_point now) const {
    if (!on() || now - heard_ < bound_) return std::nullopt;
    return std::chrono::duration_cast<std::chrono::milliseconds>(now - heard_);
  }

 private:
  bool on() const { return bound_.count() > 0; }

  std::chrono::milliseconds bound_;
  Clock::time_point heard_;
  std::optional<uint64_t> bytes_;
  bool probed_ = false;
};

}  // namespace outbox_relay::pipeline
