#include "outbox_relay/metrics/metrics.h"

namespace outbox_relay::metrics {

namespace {

prometheus::Histogram::BucketBoundaries LatencyBuckets() {
  // 0.5 ms .. 60 s: the relay's range is milliseconds, the seed's SLO is p99 < 5 s.
  return {0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60};
}

}  // namespace

Metrics::Metrics(std::string service)
    : service_(std::move(service)), registry_(std::make_shared<prometheus::Registry>()) {
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
}

void Metrics::ObservePublish(std::string_view topic, std::string_view event_type, double seconds,
                             bool ok) {
  std::lock_guard lock(mu_);
  // Cache lookups with a reused key buffer: no allocation after warm-up.
  key_.assign(topic).push_back('\0');
  key_.append(ok ? "ok" : "error");
  auto d = duration_cache_.find(key_);
  if (d == duration_cache_.end()) {
    auto* h = &publish_duration_->Add(
        {{"service", service_}, {"topic", std::string(topic)}, {"result", ok ? "ok" : "error"}},
        LatencyBuckets());
    d = duration_cache_.emplace(key_, h).first;
  }
  d->second->Observe(seconds);
  if (!ok) return;
  key_.assign(topic).push_back('\0');
  key_.append(event_type);
  auto c = published_cache_.find(key_);
  if (c == published_cache_.end()) {
    auto* counter = &published_->Add({{"service", service_},
                                      {"topic", std::string(topic)},
                                      {"event_type", std::string(event_type)}});
    c = published_cache_.emplace(key_, counter).first;
  }
  c->second->Increment();
}

void Metrics::CountError(ErrorReason reason) {
  error_counters_[static_cast<int>(reason)]->Increment();
}

}  // namespace outbox_relay::metrics
