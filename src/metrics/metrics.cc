#include "outbox_relay/metrics/metrics.h"

#include <spdlog/spdlog.h>

namespace outbox_relay::metrics {

namespace {

prometheus::Histogram::BucketBoundaries LatencyBuckets() {
  // 0.5 ms .. 60 s: the relay's range is milliseconds, the seed's SLO is p99 < 5 s.
  return {0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60};
}

}  // namespace

Metrics::Metrics(std::string service, size_t label_cap)
    : service_(std::move(service)),
      label_cap_(label_cap),
      registry_(std::make_shared<prometheus::Registry>()) {
  using prometheus::BuildCounter;
  using prometheus::BuildGauge;
  using prometheus::BuildHistogram;
  auto& reg = *registry_;
  const prometheus::Labels svc{{"service", service_}};

  auto& rows = BuildGauge()
                   .Name("outbox_rows_total")
                   .Help("Rows in the outbox table by status (sampled)")
                   .Register(reg);
  rows_acked_ = &rows.Add({{"service", service_}, {"status", "acked"}});
  rows_pending_ = &rows.Add({{"service", service_}, {"status", "pending"}});
  rows_unacked_ = &rows.Add({{"service", service_}, {"status", "unacked"}});
  lag_seconds_ = &BuildGauge()
                      .Name("outbox_forwarder_lag_seconds")
                      .Help("now() - created_at of the oldest unacked row (sampled)")
                      .Register(reg)
                      .Add(svc);
  publish_duration_ = &BuildHistogram()
                           .Name("outbox_forwarder_publish_duration_seconds")
                           .Help("Time from handing a record to the producer to Kafka's ack")
                           .Register(reg);
  published_ = &BuildCounter()
                    .Name("events_published_total")
                    .Help("Records acknowledged by Kafka")
                    .Register(reg);
  errors_ = &BuildCounter()
                 .Name("outbox_forwarder_errors_total")
                 .Help("Errors by reason: kafka_unavailable, marshal, db_read, db_ack")
                 .Register(reg);
  const char* reasons[] = {"kafka_unavailable", "marshal", "db_read", "db_ack"};
  for (int i = 0; i < 4; ++i) {
    error_counters_[i] = &errors_->Add({{"service", service_}, {"reason", reasons[i]}});
  }
  commit_to_ack_ = &BuildHistogram()
                        .Name("outbox_relay_commit_to_ack_seconds")
                        .Help("From the transaction's commit to Kafka's ack of its row")
                        .Register(reg)
                        .Add(svc, LatencyBuckets());
  dead_lettered_ = &BuildCounter()
                        .Name("outbox_relay_dead_lettered_total")
                        .Help("Rows sent to the dead-letter topic")
                        .Register(reg)
                        .Add(svc);
  slot_retained_bytes_ = &BuildGauge()
                              .Name("outbox_relay_slot_retained_wal_bytes")
                              .Help("WAL the slot keeps: pg_current_wal_lsn() - restart_lsn")
                              .Register(reg)
                              .Add(svc);
  slot_confirmed_lsn_ = &BuildGauge()
                             .Name("outbox_relay_confirmed_lsn")
                             .Help("The flush LSN the relay confirmed, as a number")
                             .Register(reg)
                             .Add(svc);
  slot_active_ = &BuildGauge()
                      .Name("outbox_relay_slot_active")
                      .Help("1 when the slot is active (held by a walsender)")
                      .Register(reg)
                      .Add(svc);
  in_flight_ = &BuildGauge()
                    .Name("outbox_relay_in_flight_messages")
                    .Help("Records produced and not yet acknowledged")
                    .Register(reg)
                    .Add(svc);
  in_flight_bytes_ = &BuildGauge()
                          .Name("outbox_relay_in_flight_bytes")
                          .Help(
                              "Bytes (key, value, headers) of the records produced and not yet "
                              "acknowledged")
                          .Register(reg)
                          .Add(svc);
  backfill_estimated_ = &BuildGauge()
                             .Name("outbox_relay_backfill_rows_estimated")
                             .Help(
                                 "Rows the last snapshot backfill set out to publish (counted at "
                                 "its start; outbox_relay_backfilled_rows_total counts those done)")
                             .Register(reg)
                             .Add(svc);
  heartbeat_ = &BuildGauge()
                    .Name("outbox_relay_heartbeat_timestamp_seconds")
                    .Help("Last time the replication loop talked to the server (unix seconds)")
                    .Register(reg)
                    .Add(svc);
  standby_ = &BuildGauge()
                  .Name("outbox_relay_standby")
                  .Help("1 while waiting for another instance to release the slot")
                  .Register(reg)
                  .Add(svc);
  streaming_ = &BuildGauge()
                    .Name("outbox_relay_streaming")
                    .Help("1 while the replication stream is open")
                    .Register(reg)
                    .Add(svc);
  last_commit_time_ = &BuildGauge()
                           .Name("outbox_relay_last_commit_timestamp_seconds")
                           .Help("Commit time of the last transaction received (unix seconds)")
                           .Register(reg)
                           .Add(svc);
  transactions_ = &BuildCounter()
                       .Name("outbox_relay_transactions_total")
                       .Help("Committed transactions with outbox rows received")
                       .Register(reg)
                       .Add(svc);
  reconnects_ = &BuildCounter()
                     .Name("outbox_relay_reconnects_total")
                     .Help("Replication reconnects")
                     .Register(reg)
                     .Add(svc);
  slot_lost_ = &BuildCounter()
                    .Name("outbox_relay_slot_lost_total")
                    .Help("Times the slot was found missing or invalidated and recreated")
                    .Register(reg)
                    .Add(svc);
  backfilled_ = &BuildCounter()
                     .Name("outbox_relay_backfilled_rows_total")
                     .Help("Rows published by a snapshot backfill")
                     .Register(reg)
                     .Add(svc);
  auto& kafka_txns = BuildCounter()
                         .Name("outbox_relay_kafka_transactions_total")
                         .Help(
                             "Kafka transactions (exactly-once delivery) by result: committed, "
                             "aborted")
                         .Register(reg);
  kafka_txns_committed_ = &kafka_txns.Add({{"service", service_}, {"result", "committed"}});
  kafka_txns_aborted_ = &kafka_txns.Add({{"service", service_}, {"result", "aborted"}});
  kafka_txn_commit_ = &BuildHistogram()
                           .Name("outbox_relay_kafka_transaction_commit_seconds")
                           .Help("Time to commit a Kafka transaction (exactly-once delivery)")
                           .Register(reg)
                           .Add(svc, LatencyBuckets());
  skipped_ = &BuildCounter()
                  .Name("outbox_relay_rows_already_in_kafka_total")
                  .Help(
                      "Rows sent again by PostgreSQL after a restart that Kafka already had "
                      "(exactly-once delivery: marked, not produced again)")
                  .Register(reg)
                  .Add(svc);
  marker_statements_ = &BuildCounter()
                            .Name("outbox_relay_marker_statements_total")
                            .Help(
                                "Marking statements run: each marks the rows and indexes the "
                                "commits of the transactions delivered within "
                                "--marker-interval-ms")
                            .Register(reg)
                            .Add(svc);
  pipeline_restarts_ = &BuildCounter()
                            .Name("outbox_relay_pipeline_restarts_total")
                            .Help(
                                "Times Kafka did not acknowledge records within "
                                "--kafka-delivery-timeout-ms: the producer was replaced and "
                                "the transactions sent again from the slot")
                            .Register(reg)
                            .Add(svc);
  auto& http_closed = BuildCounter()
                          .Name("outbox_relay_http_connections_closed_total")
                          .Help(
                              "Connections to /metrics, /healthz, /readyz closed unanswered: "
                              "evicted (over --metrics-max-connections or the per-client cap, "
                              "the oldest unfinished one), timeout (request not complete within "
                              "--metrics-request-timeout-ms, or response not taken)")
                          .Register(reg);
  http_closed_[static_cast<int>(HttpClosed::kEvicted)] =
      &http_closed.Add({{"service", service_}, {"reason", "evicted"}});
  http_closed_[static_cast<int>(HttpClosed::kTimeout)] =
      &http_closed.Add({{"service", service_}, {"reason", "timeout"}});
  marker_rounds_failed_ =
      &BuildCounter()
           .Name("outbox_relay_marker_failed_rounds_total")
           .Help(
               "Marking rounds that failed: the marking statement (retried), or the position of "
               "a Watermill table (the other tables and the slot go on)")
           .Register(reg)
           .Add(svc);
  auto& overflow = BuildCounter()
                       .Name("outbox_relay_metric_label_overflow_total")
                       .Help(
                           "Observations counted under the label value __overflow__: their "
                           "topic or (topic, event_type) was beyond --metrics-label-cap")
                       .Register(reg);
  overflow_published_ =
      &overflow.Add({{"service", service_}, {"metric", "events_published_total"}});
  overflow_duration_ = &overflow.Add(
      {{"service", service_}, {"metric", "outbox_forwarder_publish_duration_seconds"}});
}

void Metrics::ObservePublish(std::string_view topic, std::string_view event_type, double seconds,
                             bool ok) {
  std::lock_guard lock(mu_);
  // Cache lookups with a reused key buffer: no allocation after warm-up, and
  // none for a value over the cap (it is never inserted).
  key_.assign(topic);
  TopicSeries* series = nullptr;
  std::string_view topic_label = topic;
  if (auto t = topics_.find(key_); t != topics_.end()) {
    series = &t->second;
  } else if (topics_.size() < label_cap_) {
    series = &topics_.emplace(key_, TopicSeries{}).first->second;
  } else {
    series = &overflow_topic_;
    topic_label = kOverflowValue;
    overflow_duration_->Increment();
    if (!duration_warned_) {
      duration_warned_ = true;
      spdlog::warn(
          "metrics: more than {} topics: the records of further ones are counted under "
          "topic=\"{}\" (outbox_relay_metric_label_overflow_total; --metrics-label-cap)",
          label_cap_, kOverflowValue);
    }
  }
  prometheus::Histogram*& h = ok ? series->ok : series->error;
  if (h == nullptr) {
    h = &publish_duration_->Add({{"service", service_},
                                 {"topic", std::string(topic_label)},
                                 {"result", ok ? "ok" : "error"}},
                                LatencyBuckets());
  }
  h->Observe(seconds);
  if (!ok) return;
  key_.push_back('\0');
  key_.append(event_type);
  prometheus::Counter* counter = nullptr;
  if (auto c = published_cache_.find(key_); c != published_cache_.end()) {
    counter = c->second;
  } else if (published_cache_.size() < label_cap_ && series != &overflow_topic_) {
    counter = &published_->Add({{"service", service_},
                                {"topic", std::string(topic)},
                                {"event_type", std::string(event_type)}});
    published_cache_.emplace(key_, counter);
  } else {
    // The topic's own overflow series: totals by topic stay exact.
    overflow_published_->Increment();
    if (series->overflow == nullptr) {
      series->overflow = &published_->Add({{"service", service_},
                                           {"topic", std::string(topic_label)},
                                           {"event_type", std::string(kOverflowValue)}});
    }
    counter = series->overflow;
    if (!published_warned_) {
      published_warned_ = true;
      spdlog::warn(
          "metrics: more than {} (topic, Event-Type) pairs in events_published_total: further "
          "event types are counted under event_type=\"{}\" (outbox_relay_metric_label_overflow_"
          "total). Event-Type should name a kind of event, not an instance (a request id?); "
          "raise --metrics-label-cap if these are real",
          label_cap_, kOverflowValue);
    }
  }
  counter->Increment();
}

void Metrics::CountError(ErrorReason reason) {
  error_counters_[static_cast<int>(reason)]->Increment();
}

}  // namespace outbox_relay::metrics
