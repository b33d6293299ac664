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
// Labels whose values come from rows (`topic`, `event_type`) are bounded:
// a service that writes a request id into Event-Type must not grow the
// process, nor Prometheus, without end. At most `label_cap` topics get a
// series of outbox_forwarder_publish_duration_seconds, and at most
// `label_cap` (topic, event_type) pairs one of events_published_total;
// later values are counted under kOverflowValue ("__overflow__": the topic
// when the topic is new, else the event type), so totals by topic stay
// exact. outbox_relay_metric_label_overflow_total{metric} counts the
// observations that went there, and the first overflow of each metric is
// logged once.
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

// Why the HTTP listener closed a connection it had not answered.
enum class HttpClosed { kEvicted, kTimeout };

class Metrics {
 public:
  static constexpr size_t kDefaultLabelCap = 200;
  static constexpr std::string_view kOverflowValue = "__overflow__";

  explicit Metrics(std::string service, size_t label_cap = kDefaultLabelCap);

  prometheus::Registry& registry() { return *registry_; }
  std::shared_ptr<prometheus::Registry> registry_ptr() { return registry_; }

  // One record acknowledged (result=ok) or failed (result=error).
  void ObservePublish(std::string_view topic, std::string_view event_type, double seconds, bool ok);
  void ObserveCommitToAck(double seconds) { commit_to_ack_->Observe(seconds); }
  void CountError(ErrorReason reason);
  void CountDeadLetter(double n = 1) { dead_lettered_->Increment(n); }
  void CountHttpClosed(HttpClosed why) { http_closed_[static_cast<int>(why)]->Increment(); }
  // Marking rounds that failed: the marking statement, or a Watermill
  // table's position (the other tables' positions and the slot still move).
  void CountMarkerRoundFailed() { marker_rounds_failed_->Increment(); }
  size_t label_cap() const { return label_cap_; }

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
  prometheus::Gauge& backfill_estimated() { return *backfill_estimated_; }
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
  const size_t label_cap_;
  std::shared_ptr<prometheus::Registry> registry_;
  prometheus::Family<prometheus::Histogram>* publish_duration_;
  prometheus::Family<prometheus::Counter>* published_;
  prometheus::Family<prometheus::Counter>* errors_;
  prometheus::Counter* error_counters_[4];
  prometheus::Histogram* commit_to_ack_;
  prometheus::Counter* dead_lettered_;
  prometheus::Gauge *rows_acked_, *rows_pending_, *rows_unacked_, *lag_seconds_;
  prometheus::Gauge *slot_retained_bytes_, *slot_confirmed_lsn_, *slot_active_, *in_flight_,
      *in_flight_bytes_, *backfill_estimated_;
  prometheus::Gauge *heartbeat_, *standby_, *streaming_, *last_commit_time_;
  prometheus::Counter *transactions_, *reconnects_, *slot_lost_, *backfilled_;
  prometheus::Counter *kafka_txns_committed_, *kafka_txns_aborted_, *skipped_;
  prometheus::Counter* marker_statements_;
  prometheus::Histogram* kafka_txn_commit_;
  prometheus::Counter* pipeline_restarts_;
  prometheus::Counter* http_closed_[2];
  prometheus::Counter* marker_rounds_failed_;
  prometheus::Counter* overflow_published_;  // label_overflow_total{metric=events_published_total}
  prometheus::Counter* overflow_duration_;  // ...{metric=outbox_forwarder_publish_duration_seconds}

  // (topic, event_type) -> counter / (topic, result) -> histogram; each
  // holds at most label_cap_ row-given values (plus the overflow ones).
  std::mutex mu_;
  std::string key_;
  struct TopicSeries {
    prometheus::Histogram* ok = nullptr;
    prometheus::Histogram* error = nullptr;
    prometheus::Counter* overflow = nullptr;  // its events of event types over the cap
  };
  std::unordered_map<std::string, prometheus::Counter*> published_cache_;  // topic \0 event_type
  std::unordered_map<std::string, TopicSeries> topics_;                    // at most label_cap_
  TopicSeries overflow_topic_;  // the topics over the cap
  bool published_warned_ = false;
  bool duration_warned_ = false;
};

}  // namespace outbox_relay::metrics
