// Counters the pipeline keeps for logs, health and metrics. Atomics: written
// by the replication loop and the delivery threads, read by anyone (the HTTP
// threads among them).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>

namespace outbox_relay::pipeline {

inline int64_t UnixMicrosNow() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

struct RelayStats {
  std::atomic<uint64_t> transactions{0};   // committed transactions received
  std::atomic<uint64_t> rows{0};           // outbox rows received
  std::atomic<uint64_t> produced{0};       // records handed to the sink
  std::atomic<uint64_t> delivered{0};      // records acknowledged
  std::atomic<uint64_t> dead_lettered{0};  // rows sent to the dead-letter topic
  std::atomic<uint64_t> reconnects{0};
  std::atomic<uint64_t> slot_lost{0};           // slots found missing/invalidated and recreated
  std::atomic<uint64_t> backfilled{0};          // rows published from a snapshot backfill
  std::atomic<uint64_t> backfill_estimated{0};  // rows the last backfill set out to publish
  std::atomic<uint64_t> already_in_kafka{0};    // exactly-once: re-sent rows not produced again
  // Watermill tables: streamed rows skipped because the consumer group had
  // processed them (the polling forwarder published them) when the stream started.
  std::atomic<uint64_t> already_processed{0};
  std::atomic<uint64_t> pipeline_restarts{0};  // producer replaced after a delivery timeout
  std::atomic<uint64_t> keepalives{0};
  std::atomic<uint64_t> status_updates{0};
  std::atomic<int64_t> last_commit_unix_micros{0};
  std::atomic<int64_t> heartbeat_unix_micros{0};  // last loop iteration that talked to the server
  std::atomic<bool> streaming{false};
  std::atomic<bool> standby{false};
  std::atomic<bool> kafka_reachable{false};  // the sink's word, copied by the loop thread
  std::atomic<int64_t> in_flight_bytes{0};   // the sink's BytesInFlight, copied likewise

  // The loop is alive (for /healthz): every loop that waits calls it, so a
  // long backfill or a wait for Kafka is not taken for a hang.
  void Beat() { heartbeat_unix_micros.store(UnixMicrosNow(), std::memory_order_relaxed); }
};

}  // namespace outbox_relay::pipeline
