// `outbox-relay run`: the replication loop and its wiring.
//
//   walsender ──CopyData──▶ ReplicationStream ──▶ pgoutput::Decode ──▶ RecordMapper
//        ▲                                                                  │
//        │ standby status (flush = tracker.confirmed())                     ▼
//   AckTracker ◀── delivery reports (Kafka poller thread) ◀── Sink::Produce
//        ▲
//        └── Marker thread: UPDATE offset_acked + commit index, then OnMarked
//
// One thread runs the loop below; it never blocks on the socket and sends a
// status update at least every status interval, whatever else it is waiting
// for. Backpressure: when too many rows are in flight (or the marker lags),
// it stops reading the socket until deliveries catch up.
#pragma once

#include <atomic>
#include <memory>
#include <optional>

#include "outbox_relay/app/config.h"
#include "outbox_relay/app/sampler.h"
#include "outbox_relay/app/stats.h"
#include "outbox_relay/core/result.h"
#include "outbox_relay/kafka/producer.h"
#include "outbox_relay/kafka/sink.h"
#include "outbox_relay/marker/marker.h"
#include "outbox_relay/metrics/http_server.h"
#include "outbox_relay/metrics/metrics.h"
#include "outbox_relay/outbox/dead_letter.h"
#include "outbox_relay/outbox/record.h"
#include "outbox_relay/pg/replication.h"
#include "outbox_relay/pgoutput/decoder.h"
#include "outbox_relay/tracking/ack_tracker.h"

namespace outbox_relay::app {

class Relay {
 public:
  explicit Relay(RelayConfig config);
  ~Relay();

  // Runs until `stop` becomes true (then drains and returns 0) or a fatal
  // error (returns non-zero after logging it).
  int Run(const std::atomic<bool>& stop);

  const RelayStats& stats() const { return stats_; }

 private:
  Status Prepare();
  // Publication, slot (created, or recreated when lost) and the snapshot
  // backfill a new slot needs. Runs at start and after a slot loss.
  Status SetupSlot(const std::atomic<bool>& stop);
  Status Backfill(pg::Connection& conn, const std::string& snapshot, const std::atomic<bool>& stop);
  // Before START_REPLICATION: after a promotion (the server writes another
  // timeline than the last stream), start from the new primary's copy of the
  // slot, never from a position confirmed on the old one (relay_failover.cc).
  Status FollowPromotion(pg::Connection& replication_conn, const std::atomic<bool>& stop);
  Status StreamSession(pg::ReplicationStream& stream, const std::atomic<bool>& stop);
  Status HandleXLogData(std::string_view data, pg::ReplicationStream& stream);
  Status HandleInsert(const pgoutput::Insert& insert, pg::ReplicationStream& stream);
  Status HandleRelation(const pgoutput::Relation& relation);
  // `stream` may be null (backfill): then there is no walsender to keep content.
  Status Produce(const outbox::KafkaRecord& record, tracking::Transaction* tx,
                 pg::ReplicationStream* stream);
  Status MapAndProduce(const outbox::ColumnMap& columns, const pgoutput::TupleData& row,
                       tracking::Transaction* tx, pg::ReplicationStream* stream);
  Status DeadLetter(const Error& reason, const outbox::RowIdentity& identity,
                    const outbox::ColumnMap& columns, const pgoutput::TupleData& row,
                    tracking::Transaction* tx, pg::ReplicationStream* stream);
  Status SendStatus(pg::ReplicationStream& stream, bool force);
  void DeadLetterRefused(const kafka::Delivery& delivery, tracking::Transaction* tx);
  void OnDelivery(const kafka::Delivery& delivery);
  int Shutdown(pg::ReplicationStream* stream, bool failed);
  bool Backpressured() const;
  Status StartHttp();
  void RefreshMetrics();
  metrics::Health Healthz() const;
  metrics::Health Readyz() const;
  void LogProgress();

  RelayConfig config_;
  RelayStats stats_;
  metrics::Metrics metrics_;
  std::unique_ptr<metrics::HttpServer> http_;
  std::unique_ptr<Sampler> sampler_;
  std::mutex refresh_mu_;
  RelayStats counted_;  // what RefreshMetrics already added to the counters
  std::unique_ptr<tracking::AckTracker> tracker_;
  std::unique_ptr<kafka::Sink> sink_;
  std::unique_ptr<marker::Marker> marker_;
  std::optional<outbox::RecordMapper> mapper_;
  std::optional<outbox::DeadLetterBuilder> dead_letters_;
  std::optional<outbox::DeadLetterBuilder> refused_letters_;  // delivery thread only
  bool need_slot_setup_ = true;
  const std::atomic<bool>* stop_ = nullptr;  // Run's stop flag, for waits deep in the loop
  // The loss being recovered was counted already (outbox_relay_slot_lost_total
  // counts each loss once, though both the stream and the slot setup see it,
  // and the setup may be retried).
  bool slot_loss_counted_ = false;
  kafka::KafkaProducer* producer_ = nullptr;      // sink_ when it is Kafka
  uint64_t test_fatal_after_ = 0;                 // OUTBOX_TEST_FAULT=fatal-after:N
  std::atomic<int64_t> last_marker_error_ns_{0};  // steady clock; 0: none yet

  // Replication-loop state.
  pgoutput::RelationCache relations_;
  pgoutput::DecodedMessage message_;
  pgoutput::DecodedMessage insert_message_;
  pgoutput::Oid outbox_relid_ = 0;
  std::optional<outbox::ColumnMap> columns_;
  tracking::Transaction* open_tx_ = nullptr;
  Lsn received_;           // highest server WAL end seen: our "write" position
  uint32_t timeline_ = 0;  // the timeline the last stream read (0: none yet)
  Lsn last_sent_flush_;
  std::chrono::steady_clock::time_point last_status_{};
  std::chrono::steady_clock::time_point last_progress_log_{};
};

}  // namespace outbox_relay::app
