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
#include <cstdint>
#include <string>
#include <thread>

#include "outbox_relay/core/mutex.h"
#include "outbox_relay/metrics/metrics.h"
#include "outbox_relay/pg/connection.h"
#include "outbox_relay/pipeline/watermill.h"

namespace outbox_relay::pipeline {

struct SamplerOptions {
  std::string database_url;
  pg::NetworkOptions network;
  pg::QualifiedName table;        // the seed table (not in watermill mode)
  std::string acked_column;       // its offset_acked
  std::string created_at_column;  // "": no outbox_forwarder_lag_seconds
  int64_t row_count_interval_s = 60;
  bool mark = true;        // the relay marks rows (else nothing is counted)
  bool watermill = false;  // watermill-sql's tables instead of the seed table
  WatermillSettings watermill_settings;
  std::string slot;
};

class Sampler {
 public:
  Sampler(SamplerOptions options, metrics::Metrics* metrics);
  ~Sampler();
  void Start();
  void Stop();

 private:
  void Loop();
  const SamplerOptions config_;
  metrics::Metrics* metrics_;
  std::thread thread_;
  StopLatch stop_;
  // Set by Stop(): a statement of the sampler's waiting for an answer gives
  // up at once (pg::Connection::set_abort), so Stop() does not wait out the
  // sampler's long statement deadline on a connection gone silent.
  std::atomic<bool> aborting_{false};
};

}  // namespace outbox_relay::pipeline
