// StreamSession: one replication connection's life, from START_REPLICATION to
// its end (a stop between transactions, or an error the supervisor judges).
//
//   ReplicationSource ─▶ walproto ─▶ pgoutput::Decode ─▶ Publisher::MapAndProduce
//          ▲                                                  │
//          └── standby status (Progress; flush = AckTracker::confirmed())
//
// It owns what lives exactly as long as the connection: the relation cache
// (a new connection sends every Relation again), the open transaction, and
// the Progress value. The loop never blocks on the socket; it sends a status
// update at least every status interval whatever it is waiting for, and at
// once when the server asks. Backpressure is "stop reading": while the
// Publisher says too much is in flight, it only talks status.
//
// A stop request ends the session between transactions; a transaction whose
// end does not come (Kafka holds everything back) is given up after the stop
// grace, with kCancelled. Whatever transaction is open when Run returns is
// the supervisor's to abandon (TakeOpenTransaction): the server sends it again.
//
// Thread: the loop thread only.
#pragma once

#include <atomic>
#include <chrono>
#include <map>
#include <optional>

#include "outbox_relay/core/result.h"
#include "outbox_relay/outbox/record.h"
#include "outbox_relay/pg/connection.h"
#include "outbox_relay/pgoutput/decoder.h"
#include "outbox_relay/pipeline/liveness.h"
#include "outbox_relay/pipeline/progress.h"
#include "outbox_relay/pipeline/publisher.h"
#include "outbox_relay/pipeline/source.h"
#include "outbox_relay/pipeline/stats.h"
#include "outbox_relay/pipeline/stop.h"
#include "outbox_relay/pipeline/tables.h"
#include "outbox_relay/tracking/ack_tracker.h"

namespace outbox_relay::pipeline {

struct SessionOptions {
  pg::QualifiedName table;  // the outbox table, as Relation messages name it
  outbox::ColumnNames columns;
  // Watermill mode: the tables (when empty: `table`, of the seed's kind), and
  // per table the consumer group's position when the stream started.
  std::vector<OutboxTable> tables;
  std::map<std::string, outbox::TablePosition> processed;
  TableRouter::Unrouted unrouted;  // see TableRouter
  // When set and true: end the session between transactions with kTransient
  // (the supervisor lets new tables join the publication, then reconnects).
  const std::atomic<bool>* end_requested = nullptr;
  std::chrono::milliseconds status_interval{1000};
  std::chrono::milliseconds stop_grace{12500};
  // Silence bound (Liveness): a connection that sends nothing this long
  // while the loop listens is taken for dead. 0: off.
  std::chrono::milliseconds receive_timeout{0};
};

class StreamSession final : public KeepAlive {
 public:
  // `last_marker_error_ns`: steady-clock time of the marker's last database
  // error (0: none); see the reply-requested keepalive in Run.
  StreamSession(SessionOptions options, ReplicationSource* source, Publisher* publisher,
                tracking::AckTracker* tracker, RelayStats* stats, StopSignal* stop,
                const std::atomic<int64_t>* last_marker_error_ns);
  StreamSession(const StreamSession&) = delete;
  StreamSession& operator=(const StreamSession&) = delete;

  // Reads until a stop between transactions (Ok) or an error: Step, and
  // between steps the wait a step asks for.
  Status Run();
  // One turn of the loop, never blocking on the server: everything that is
  // due (a commit, a status update, dead letters), then one message if one
  // is there. kWaiting: nothing to read (Run waits for the socket, at most
  // WaitBound()); kHeldBack: too much in flight, the loop reads nothing
  // (Run waits for the tracker); kDone: stopped between transactions.
  // Tests drive it on a ManualClock instead of Run.
  struct StepResult {
    enum State { kBusy, kWaiting, kHeldBack, kDone } state;
  };
  Result<StepResult> Step();
  // How long Run waits for the server when there is nothing to read.
  std::chrono::milliseconds WaitBound() const;
  // The transaction that was open when Run returned (nullptr: none).
  tracking::Transaction* TakeOpenTransaction();

  // A status update now if `force`, else when one is due (Progress).
  Status SendStatus(bool force);
  Status Touch() override;
  ReplicationSource& source() { return *source_; }
  const Progress& progress() const { return progress_; }

 private:
  Status HandleXLogData(std::string_view data);
  Status HandleInsert(const pgoutput::Insert& insert);
  Status HandleRelation(const pgoutput::Relation& relation);
  void LogProgress();

  const SessionOptions options_;
  ReplicationSource* const source_;
  Publisher* const publisher_;
  tracking::AckTracker* const tracker_;
  RelayStats* const stats_;
  StopSignal* const stop_;
  const std::atomic<int64_t>* const last_marker_error_ns_;

  Progress progress_;
  Liveness liveness_;
  pgoutput::RelationCache relations_;
  pgoutput::DecodedMessage message_;
  pgoutput::DecodedMessage insert_message_;  // its own: tuple storage survives Begin/Commit
  TableRouter router_;
  tracking::Transaction* open_tx_ = nullptr;
  Clock::time_point last_progress_log_{};
};

}  // namespace outbox_relay::pipeline
