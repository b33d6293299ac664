// Samples the table and the slot for the metrics, on its own connection and
// thread, so a slow count never holds up the stream:
//   every row-count interval (60 s): outbox_rows_total{acked,pending,unacked}
//     (two count(*) as the seed's collector did);
//   every 10 s: outbox_forwarder_lag_seconds (oldest unacked created_at) and
//     the slot's retained WAL / active flag.
// In watermill mode "acked" means processed by the consumer group (at or
// before its position in watermill_offsets_<topic>), summed over the tables.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "outbox_relay/app/config.h"
#include "outbox_relay/metrics/metrics.h"

namespace outbox_relay::app {

class Sampler {
 public:
  Sampler(const RelayConfig& config, metrics::Metrics* metrics);
  ~Sampler();
  void Start();
  void Stop();

 private:
  void Loop();
  const RelayConfig& config_;
  metrics::Metrics* metrics_;
  std::thread thread_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  // Set by Stop(): a statement of the sampler's waiting for an answer gives
  // up at once (pg::Connection::set_abort), so Stop() does not wait out the
  // sampler's long statement deadline on a connection gone silent.
  std::atomic<bool> aborting_{false};
};

}  // namespace outbox_relay::app
