#include <spdlog/spdlog.h>

#include "outbox_relay/app/relay.h"
#include "outbox_relay/pipeline/liveness.h"

// The relay's HTTP side: /metrics, /healthz, /readyz.
namespace outbox_relay::app {

namespace {

using Clock = std::chrono::steady_clock;
using pipeline::UnixMicrosNow;
using std::chrono::milliseconds;

}  // namespace

Status Relay::StartHttp() {
  if (config_.metrics_addr.empty()) return Ok();
  metrics::HttpOptions options;
  options.address = config_.metrics_addr;
  options.max_connections = static_cast<size_t>(config_.metrics_max_connections);
  options.max_connections_per_client =
      static_cast<size_t>(config_.metrics_max_connections_per_client);
  options.request_timeout = milliseconds(config_.metrics_request_timeout_ms);
  auto server = metrics::HttpServer::Start(
      options, &metrics_, [this] { return Healthz(); }, [this] { return Readyz(); },
      [this] { RefreshMetrics(); });
  if (!server) return std::unexpected(server.error());
  http_ = std::move(*server);
  spdlog::info("metrics and health on http://{}/metrics, /healthz, /readyz", config_.metrics_addr);
  return Ok();
}

metrics::Health Relay::Healthz() const {
  double age = static_cast<double>(UnixMicrosNow() - stats_.heartbeat_unix_micros.load()) / 1e6;
  if (age > 30) return {false, fmt::format("replication loop silent for {:.0f} s", age)};
  return {true, fmt::format("ok: loop alive ({:.1f} s ago)", age)};
}

metrics::Health Relay::Readyz() const {
  if (stats_.standby.load()) return {false, "standby: another instance holds the slot"};
  if (!stats_.streaming.load()) return {false, "not streaming"};
  if (!stats_.kafka_reachable.load()) return {false, "Kafka not reachable"};
  // Streaming and connected is not enough: rows must move (DESIGN §2.9).
  const int64_t now = Clock::now().time_since_epoch().count();
  const int64_t bound =
      std::chrono::nanoseconds(std::chrono::seconds(config_.readyz_stall_timeout_s)).count();
  MutexLock lock(&readyz_mu_);
  if (int64_t since = marker_failing_since_ns_.load(); since != 0 && now - since > bound) {
    return {false, fmt::format("the marker has failed for {} s: {}", (now - since) / 1000000000,
                               marker_failure_)};
  }
  // In flight, and neither acknowledged by Kafka nor confirmed since the
  // last look: stalled since then (idle counts as moving).
  const uint64_t delivered = stats_.delivered.load();
  const Lsn confirmed = tracker_->confirmed();
  if (tracker_->empty() || delivered != seen_delivered_ || confirmed != seen_confirmed_ ||
      seen_moving_ns_ == 0) {
    seen_delivered_ = delivered;
    seen_confirmed_ = confirmed;
    seen_moving_ns_ = now;
  } else if (now - seen_moving_ns_ > bound) {
    auto in_flight = tracker_->stats();
    return {false, fmt::format("nothing moved for {} s: {} rows unacknowledged by Kafka, {} "
                               "transactions delivered but not marked; confirmed {}",
                               (now - seen_moving_ns_) / 1000000000, in_flight.rows_in_flight,
                               in_flight.awaiting_mark, confirmed)};
  }
  return {true, "ok: streaming, Kafka reachable, rows moving"};
}

void Relay::RefreshMetrics() {
  MutexLock lock(&refresh_mu_);
  auto delta = [](std::atomic<uint64_t>& now, std::atomic<uint64_t>& seen) {
    uint64_t v = now.load();
    uint64_t d = v - seen.load();
    seen.store(v);
    return static_cast<double>(d);
  };
  metrics_.transactions().Increment(delta(stats_.transactions, counted_.transactions));
  metrics_.reconnects().Increment(delta(stats_.reconnects, counted_.reconnects));
  metrics_.slot_lost().Increment(delta(stats_.slot_lost, counted_.slot_lost));
  metrics_.backfilled().Increment(delta(stats_.backfilled, counted_.backfilled));
  metrics_.pipeline_restarts().Increment(
      delta(stats_.pipeline_restarts, counted_.pipeline_restarts));
  metrics_.CountDeadLetter(delta(stats_.dead_lettered, counted_.dead_lettered));
  metrics_.heartbeat().Set(static_cast<double>(stats_.heartbeat_unix_micros.load()) / 1e6);
  metrics_.standby().Set(stats_.standby.load() ? 1 : 0);
  metrics_.streaming().Set(stats_.streaming.load() ? 1 : 0);
  metrics_.last_commit_time().Set(static_cast<double>(stats_.last_commit_unix_micros.load()) / 1e6);
  metrics_.in_flight().Set(static_cast<double>(tracker_->rows_in_flight()));
  metrics_.in_flight_bytes().Set(static_cast<double>(stats_.in_flight_bytes.load()));
  metrics_.backfill_estimated().Set(static_cast<double>(stats_.backfill_estimated.load()));
  metrics_.slot_confirmed_lsn().Set(static_cast<double>(tracker_->confirmed().value()));
}

}  // namespace outbox_relay::app
