// The relay's Prometheus metrics, named as the seed names them.
//
// The seed's forwarder metrics keep their names and labels, so its alert
// rules work unchanged:
//   outbox_rows_total{service,status}  status = acked | pending | unacked (gauge;
//                                      pending and unacked are the same number:
//                                      the seed's alerts use both spellings)
//   outbox_forwarder_lag_seconds{service}                    now - oldest unacked created_at
//   outbox_forwarder_publish_duration_seconds{service,topic,result}  produce -> Kafka ack
//   outbox_forwarder_errors_total{service,reason}  kafka_unavailable | marshal | db_read | db_ack
//   events_published_total{service,topic,event_type}
// plus what a replication relay adds (outbox_relay_*): slot retained WAL,
// confirmed LSN, in-flight messages, commit-to-ack latency, heartbeat,
// dead letters, standby state.
//
// Threads: the Observe*/Count* methods are called from the delivery thread
// and the replication loop; the label caches are per method and guarded.
#pragma once

#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>

namespace outbox_relay::metrics {

enum class ErrorReason { kKafkaUnavailable, kMarshal, kDbRead, kDbAck };

class Metrics {
 public:
  explicit Metrics(std::string service);

  prometheus::Registry& registry() { return *registry_; }
  std::shared_ptr<prometheus::Registry> registry_ptr() { return registry_; }

  // One record acknowledged (result=ok) or failed (result=error).
  void ObservePublish(std::string_view topic, std::string_view event_type, double seconds, bool ok);
  void ObserveCommitToAck(double seconds) { commit_to_ack_->Observe(seconds); }
  void CountError(ErrorReason reason);
  void CountDeadLetter(double n = 1) { dead_lettered_->Increment(n); }

  // Sampled state.
  prometheus::Gauge& rows_acked() { return *rows_acked_; }
  prometheus::Gauge& rows_pending() { return *rows_pending_; }
  prometheus::Gauge& rows_unacked() { return *rows_unacked_; }
  prometheus::Gauge& lag_seconds() { return *lag_seconds_; }
  prometheus::Gauge& slot_retained_bytes() { return *slot_retained_bytes_; }
  prometheus::Gauge& slot_confirmed_lsn() { return *slot_confirmed_lsn_; }
  prometheus::Gauge& slot_active() { return *slot_active_; }
  prometheus::Gauge& in_flight() { return *in_flight_; }
  prometheus::Gauge& in_flight_bytes() { return *in_flight_bytes_; }
  prometheus::Gauge& heartbeat() { return *heartbeat_; }
  prometheus::Gauge& standby() { return *standby_; }
  prometheus::Gauge& streaming() { return *streaming_; }
  prometheus::Gauge& last_commit_time() { return *last_commit_time_; }
  prometheus::Counter& transactions() { return *transactions_; }
  prometheus::Counter& reconnects() { return *reconnects_; }
  prometheus::Counter& slot_lost() { return *slot_lost_; }
  prometheus::Counter& backfilled() { return *backfilled_; }
  // Exactly-once delivery.
  prometheus::Counter& kafka_transactions_committed() { return *kafka_txns_committed_; }
  prometheus::Counter& kafka_transactions_aborted() { return *kafka_txns_aborted_; }
  prometheus::Histogram& kafka_transaction_commit() { return *kafka_txn_commit_; }
  prometheus::Counter& rows_already_in_kafka() { return *skipped_; }
  prometheus::Counter& pipeline_restarts() { return *pipeline_restarts_; }
  prometheus::Counter& marker_statements() { return *marker_statements_; }

 private:
  std::string service_;
  std::shared_ptr<prometheus::Registry> registry_;
  prometheus::Family<prometheus::Histogram>* publish_duration_;
  prometheus::Family<prometheus::Counter>* published_;
  prometheus::Family<prometheus::Counter>* errors_;
  prometheus::Counter* error_counters_[4];
  prometheus::Histogram* commit_to_ack_;
  prometheus::Counter* dead_lettered_;
  prometheus::Gauge *rows_acked_, *rows_pending_, *rows_unacked_, *lag_seconds_;
  prometheus::Gauge *slot_retained_bytes_, *slot_confirmed_lsn_, *slot_active_, *in_flight_,
      *in_flight_bytes_;
  prometheus::Gauge *heartbeat_, *standby_, *streaming_, *last_commit_time_;
  prometheus::Counter *transactions_, *reconnects_, *slot_lost_, *backfilled_;
  prometheus::Counter *kafka_txns_committed_, *kafka_txns_aborted_, *skipped_;
  prometheus::Counter* marker_statements_;
  prometheus::Histogram* kafka_txn_commit_;
  prometheus::Counter* pipeline_restarts_;

  // (topic, event_type) -> counter / (topic, result) -> histogram.
  std::mutex mu_;
  std::string key_;
  std::unordered_map<std::string, prometheus::Counter*> published_cache_;
  std::unordered_map<std::string, prometheus::Histogram*> duration_cache_;
};

}  // namespace outbox_relay::metrics
