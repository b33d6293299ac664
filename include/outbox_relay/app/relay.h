// `outbox-relay run`: the supervisor of the streaming pipeline.
//
//   Relay (this) ── retries, backoff, standby, shutdown, health, metrics
//     ├─ pipeline::SlotSetup      slot, stored snapshot, backfill
//     ├─ pipeline::StreamSession  one replication connection: decode → publish → status
//     ├─ pipeline::Publisher      mapping, dead letters, the Sink, deliveries
//     ├─ tracking::AckTracker     what may be confirmed (the confirmation rule)
//     ├─ marker::Marker           offset_acked + commit index (own thread, own connection)
//     ├─ Sampler                  row counts, lag, slot WAL (own thread, own connection)
//     └─ metrics::HttpServer      /metrics /healthz /readyz (its event loop and renderer)
//
// Threads and what each may touch:
// - the loop thread (the one in Run) owns everything here and calls the
//   pipeline, the supervisor's state and the sink's lifecycle;
// - the sink's threads call Publisher::OnDelivery (tracker, stats, metrics);
// - the marker thread uses the tracker and sets `last_marker_error_ns_`;
// - the HTTP threads read `stats_`, `metrics_` and `tracker_` only (all
//   thread-safe, all alive as long as the Relay), and `counted_` under
//   `refresh_mu_`. `http_` is declared last so it is destroyed (its threads
//   joined) before anything they read.
#pragma once

#include <atomic>
#include <memory>
#include <optional>
#include <thread>

#include "outbox_relay/app/config.h"
#include "outbox_relay/app/recovery.h"
#include "outbox_relay/app/signals.h"
#include "outbox_relay/core/mutex.h"
#include "outbox_relay/core/result.h"
#include "outbox_relay/kafka/progress_log.h"
#include "outbox_relay/marker/marker.h"
#include "outbox_relay/marker/watermill_progress.h"
#include "outbox_relay/metrics/http_server.h"
#include "outbox_relay/metrics/metrics.h"
#include "outbox_relay/pg/replication.h"
#include "outbox_relay/pipeline/publisher.h"
#include "outbox_relay/pipeline/sampler.h"
#include "outbox_relay/pipeline/slot_setup.h"
#include "outbox_relay/pipeline/stats.h"
#include "outbox_relay/pipeline/stop.h"
#include "outbox_relay/pipeline/stream_session.h"
#include "outbox_relay/pipeline/watermill.h"
#include "outbox_relay/tracking/ack_tracker.h"

namespace outbox_relay::app {

class Relay {
 public:
  explicit Relay(RelayConfig config);
  ~Relay();

  // Runs until `stop` becomes true (then drains and returns 0) or a fatal
  // error (returns non-zero after logging it).
  int Run(const std::atomic<bool>& stop);

  const pipeline::RelayStats& stats() const { return stats_; }

 private:
  // Table, relay schema, publication, sink, marker, publisher: everything
  // that can be checked before touching the slot. The wiring from the
  // settings to each component's options (relay_wiring.cc).
  Status Prepare();
  // The metrics sampler's options (relay_wiring.cc).
  pipeline::SamplerOptions SamplerSettings() const;
  // How long a stop waits for Kafka to take the open transaction: half of
  // --shutdown-timeout-ms, the rest is for the marks.
  std::chrono::milliseconds stop_grace() const {
    return std::chrono::milliseconds(config_.shutdown_timeout_ms / 2);
  }
  // --table-mode=seed: the table exists and has the columns.
  Status PrepareSeedTable(pg::Connection& conn);
  // One phase of an attempt (app/recovery.h).
  Status RunPhase(Phase phase, std::optional<pipeline::StreamSession>* session,
                  std::optional<pipeline::PgSource>* source);
  // One replication connection, from START_REPLICATION to its end.
  Status Stream(std::optional<pipeline::StreamSession>* session,
                std::optional<pipeline::PgSource>* source);
  // Before START_REPLICATION: after a promotion (the server writes another
  // timeline than the last stream), start from the new primary's copy of the
  // slot, never from a position confirmed on the old one (relay_failover.cc).
  Status FollowPromotion(const pg::SystemIdentity& identity, pg::Connection& repl);
  // At a stop, when the marker met a promotion the stream has not followed
  // (its connection was lost and not made again yet): reads where the
  // timelines part, as FollowPromotion does, so that the marker marks what
  // they share and gives the rest back. True when it did.
  bool FollowPromotionAtStop();
  // The sink: the Kafka producer (transactional for exactly-once), or the null
  // sink (relay_exactly_once.cc).
  struct RelaySink {
    std::unique_ptr<kafka::Sink> sink;
    kafka::KafkaProducer* kafka = nullptr;  // the sink, when it is Kafka's
  };
  Result<RelaySink> MakeRelaySink();
  // A replication connection to the server with the relay's network settings
  // (IDENTIFY_SYSTEM, TIMELINE_HISTORY; the stream has its own).
  Result<pg::Connection> OpenReplication() const;
  // Exactly-once (relay_exactly_once.cc): the transactional.id
  // (--transactional-id, or derived), and the progress topic.
  Result<std::string> TransactionalId();
  std::string ProgressTopic() const;
  // What the progress is trusted on: who this relay is, the server's WAL
  // history and the slot's incarnation.
  Result<pipeline::ProgressFacts> ProgressFactsOf(pg::Connection& replication_conn,
                                                  const pg::SystemIdentity& identity);
  // Starts the exactly-once unit once per producer, when this instance owns
  // the slot (before its backfill or its stream: a standby must not fence the
  // active one); rebases it when the history or the slot changed. `facts`:
  // read on the stream's connection (nullptr: read now).
  Status EnsureTransactions(const pipeline::ProgressFacts* facts = nullptr);
  // The slot's walsender is still this relay's (before fencing anyone).
  Status CheckSlotHeld();
  // The unit's Kafka-transaction settings (the test fault included).
  pipeline::TransactionOptions TransactionOptionsOf() const;
  // Waits (bounded) for what is in flight, dead-lettering refused records.
  void Drain(std::chrono::milliseconds bound);
  // A new sink (Kafka producer) for the publisher; waits up to 10 s for a
  // first answer from the brokers.
  Status AttachSink();
  // After a retryable failure (records Kafka did not acknowledge in time):
  // closes the sink, forgets everything in flight and attaches a new one, so
  // the stream restarts at the confirmed position and the server sends it
  // all again. Without a process restart; nothing of it was confirmed.
  Status RestartPipeline(std::string_view why = {});
  // The delivery deadline (--kafka-delivery-timeout-ms), on its own thread:
  // fails overdue transactions in the tracker, which ends the stream.
  void StartWatchdog();
  void StopWatchdog();
  // Before START_REPLICATION: our previous walsender may still hold the slot
  // when its connection died silently (the server has not noticed yet).
  void TerminateStaleWalsender(pg::Connection& admin, const pg::SlotInfo& slot);
  int Shutdown(pipeline::StreamSession* session, bool failed);
  Status StartHttp();
  void RefreshMetrics();
  metrics::Health Healthz() const;
  metrics::Health Readyz() const;

  // First: destroyed last, so that it also bounds the teardown of the rest
  // (set by Run).
  std::unique_ptr<StopDeadline> stop_deadline_;
  RelayConfig config_;
  pipeline::RelayStats stats_;                           // atomics: any thread
  metrics::Metrics metrics_;                             // thread-safe
  const std::unique_ptr<tracking::AckTracker> tracker_;  // thread-safe; made once
  std::optional<pipeline::StopSignal> stop_;             // set by Run
  std::unique_ptr<pipeline::Sampler> sampler_;
  // Rung by the marker when it has marked transactions: the stream's loop
  // wakes and confirms them (declared before the marker, which uses it).
  pg::Doorbell marked_;
  std::unique_ptr<marker::Marker> marker_;
  // Exactly-once: where the progress is kept (before the publisher, whose
  // exactly-once unit reads and writes it).
  std::unique_ptr<kafka::KafkaProgressLog> progress_log_;
  std::unique_ptr<pipeline::Publisher> publisher_;
  std::unique_ptr<pipeline::SlotSetup> slot_setup_;
  // Exactly-once: the producer's transactional.id, and the batch.size a
  // topic's max.message.bytes asked for (0: the default).
  std::string transactional_id_;
  kafka::KafkaProducer* kafka_producer_ = nullptr;  // the attached sink, when it is Kafka's
  bool transactions_ready_ = false;                 // the unit started for the attached producer
  int64_t required_batch_size_ = 0;
  // --table-mode=watermill: the consumer group's positions (marker thread)
  // and the tables, their backfill and their joining.
  std::unique_ptr<marker::WatermillProgress> watermill_progress_;
  std::unique_ptr<pipeline::WatermillTables> watermill_;
  bool need_slot_setup_ = true;
  uint32_t timeline_ = 0;                         // the timeline the last stream read (0: none yet)
  std::atomic<int64_t> last_marker_error_ns_{0};  // the marker thread writes; steady clock
  uint64_t fatal_after_ = 0;                      // test failpoint (OUTBOX_TEST_FAULT)
  bool stalled_before_init_ = false;              // test failpoint, once
  int last_walsender_pid_ = 0;                    // of our last replication connection

  std::thread watchdog_;  // touches tracker_ only
  StopLatch watchdog_stop_;

  Mutex refresh_mu_;  // RefreshMetrics (HTTP threads)
  // What RefreshMetrics already added to the counters.
  pipeline::RelayStats counted_ GUARDED_BY(refresh_mu_);

  // /readyz. The marker thread notes since when its rounds fail (steady
  // clock, 0: they do not) and why; Readyz notes the progress it last saw.
  std::atomic<int64_t> marker_failing_since_ns_{0};
  mutable Mutex readyz_mu_;
  std::string marker_failure_ GUARDED_BY(readyz_mu_);
  mutable uint64_t seen_delivered_ GUARDED_BY(readyz_mu_) = 0;
  mutable Lsn seen_confirmed_ GUARDED_BY(readyz_mu_);
  mutable int64_t seen_moving_ns_ GUARDED_BY(readyz_mu_) = 0;  // last progress, or idle

  // Last, so it is destroyed first: its threads call into the members above.
  std::unique_ptr<metrics::HttpServer> http_;
};

}  // namespace outbox_relay::app
