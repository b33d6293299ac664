#include "outbox_relay/app/relay.h"

#include <spdlog/spdlog.h>

#include <charconv>
#include <random>
#include <thread>
#include <utility>

#include "outbox_relay/app/commands.h"
#include "outbox_relay/app/failover.h"
#include "outbox_relay/app/recovery.h"
#include "outbox_relay/core/failpoint.h"
#include "outbox_relay/kafka/admin.h"
#include "outbox_relay/kafka/producer.h"
#include "outbox_relay/pg/publication.h"
#include "outbox_relay/pg/relay_schema.h"
#include "outbox_relay/pg/replication.h"
#include "outbox_relay/pg/rows.h"
#include "outbox_relay/pipeline/liveness.h"
#include "outbox_relay/pipeline/tables.h"

namespace outbox_relay::app {

namespace {

using Clock = std::chrono::steady_clock;
using pipeline::RelayStats;
using std::chrono::milliseconds;

// Sleeps up to `d` in small steps so a stop request is noticed quickly; the
// loop is alive meanwhile (heartbeat).
void SleepUnlessStopped(milliseconds d, const std::atomic<bool>& stop, RelayStats& stats) {
  auto until = Clock::now() + d;
  while (!stop.load() && Clock::now() < until) {
    stats.Beat();
    std::this_thread::sleep_for(milliseconds(50));
  }
}

// Full-jitter exponential backoff.
milliseconds Backoff(int attempt) {
  static thread_local std::mt19937 rng{std::random_device{}()};
  int64_t cap = std::min<int64_t>(30000, 250LL << std::min(attempt, 7));
  return milliseconds(std::uniform_int_distribution<int64_t>(cap / 2, cap)(rng));
}

// A time setting as SHOW prints it ("60s", "1min", "500ms", "0"); 0 when
// it is off or unreadable.
milliseconds ParseTimeSetting(std::string_view text) {
  int64_t n = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), n);
  if (ec != std::errc() || n <= 0) return milliseconds(0);
  std::string_view unit(end, static_cast<size_t>(text.data() + text.size() - end));
  if (unit == "ms" || unit.empty()) return milliseconds(n);  // the setting's own unit
  if (unit == "s") return std::chrono::seconds(n);
  if (unit == "min") return std::chrono::minutes(n);
  if (unit == "h") return std::chrono::hours(n);
  if (unit == "d") return std::chrono::hours(24 * n);
  return milliseconds(0);
}

}  // namespace

Relay::Relay(RelayConfig config)
    : config_(std::move(config)),
      metrics_(config_.service, static_cast<size_t>(config_.metrics_label_cap)),
      // The start position is set by SlotSetup from the slot itself.
      tracker_(std::make_unique<tracking::AckTracker>(kInvalidLsn, config_.mark)) {}

Relay::~Relay() { StopWatchdog(); }

Status Relay::RestartPipeline(std::string_view why) {
  auto t0 = Clock::now();
  spdlog::warn(
      "restarting the pipeline: {}. Nothing past {} is confirmed; the Kafka producer is "
      "replaced and the transactions in flight are sent again from the slot",
      why.empty() ? tracker_->failure().value_or("?") : std::string(why), tracker_->confirmed());
  // After this no delivery report arrives: the old producer's records are
  // never counted, whatever the brokers did with them.
  publisher_->CloseSink();
  publisher_->DropRefused();
  // The marker finishes the delivered transactions it holds (as usual, by
  // primary key); those behind the failed one are marked but not confirmed,
  // and come again from the slot (marking them again changes nothing).
  const auto marker_bound = std::max<milliseconds>(
      milliseconds(60000),
      2 * (milliseconds(config_.pg_statement_timeout_ms) + pg::Connection::kStatementGrace +
           std::chrono::seconds(config_.pg_connect_timeout_s)));
  while (!tracker_->Restart()) {
    if (stop_->requested()) {
      return Fail(ErrorCode::kCancelled, "stop requested while restarting the pipeline");
    }
    if (Clock::now() - t0 > marker_bound) {
      return Fail(ErrorCode::kFatal,
                  "restarting the pipeline: the marker still holds {} delivered transactions "
                  "after {} s; exiting so that a restart resumes from {}",
                  tracker_->awaiting_mark(),
                  std::chrono::duration_cast<std::chrono::seconds>(marker_bound).count(),
                  tracker_->confirmed());
    }
    stats_.Beat();
    tracker_->WaitForProgress(milliseconds(100));
  }
  if (auto st = AttachSink(); !st) return st;
  stats_.pipeline_restarts.fetch_add(1);
  spdlog::info("pipeline restarted in {} ms: streaming again from {}",
               std::chrono::duration_cast<milliseconds>(Clock::now() - t0).count(),
               tracker_->confirmed());
  return Ok();
}

void Relay::StartWatchdog() {
  if (config_.kafka_delivery_timeout_ms <= 0 || watchdog_.joinable()) return;
  const milliseconds timeout(config_.kafka_delivery_timeout_ms);
  // Checked four times per timeout (at most every second): a transaction is
  // given up at most a quarter of the timeout late.
  const milliseconds period = std::min(milliseconds(1000), timeout / 4);
  watchdog_ = std::thread([this, timeout, period] {
    while (!watchdog_stop_.SleepFor(period)) {
      if (auto why = tracker_->ExpireOverdue(Clock::now(), timeout)) {
        spdlog::warn("kafka: {} (--kafka-delivery-timeout-ms {}): giving them up", *why,
                     timeout.count());
      }
    }
  });
}

void Relay::StopWatchdog() {
  watchdog_stop_.Set();
  if (watchdog_.joinable()) watchdog_.join();
}

void Relay::TerminateStaleWalsender(pg::Connection& admin, const pg::SlotInfo& slot) {
  if (!slot.active || !slot.active_pid || last_walsender_pid_ == 0 ||
      *slot.active_pid != last_walsender_pid_) {
    return;
  }
  // It is ours (the pid of the connection we closed): its peer is gone, and
  // the server would keep it until wal_sender_timeout or TCP says so. Our own
  // role may terminate its own backends.
  spdlog::warn(
      "slot {} is still held by walsender pid {}, this relay's previous replication "
      "connection, which the server has not found dead yet: terminating it",
      config_.slot, last_walsender_pid_);
  std::optional<std::string> params[] = {std::to_string(last_walsender_pid_)};
  if (auto r = admin.ExecParams("SELECT pg_terminate_backend($1::int)", params); !r) {
    spdlog::warn("cannot terminate walsender {}: {}; waiting for the server to end it",
                 last_walsender_pid_, r.error().message);
    return;
  }
  for (int i = 0; i < 50; ++i) {
    auto now = pg::QuerySlot(admin, config_.slot);
    if (!now || !now->active || now->active_pid != slot.active_pid) return;
    std::this_thread::sleep_for(milliseconds(100));
  }
}

int Relay::Run(const std::atomic<bool>& stop) {
  stop_.emplace(stop);
  // Past the shutdown timeout, the stop has this long for what is left
  // (closing the clients, the process exit) before the process exits anyway.
  constexpr milliseconds kStopGrace(1500);
  stop_deadline_ =
      std::make_unique<StopDeadline>(stop, milliseconds(config_.shutdown_timeout_ms) + kStopGrace);
  stats_.Beat();
  if (auto st = StartHttp(); !st) {
    spdlog::error("{}", st.error().message);
    return kExitConfig;
  }
  sampler_ = std::make_unique<pipeline::Sampler>(SamplerSettings(), &metrics_);
  sampler_->Start();
  // Setup: retried while the database is not reachable; bad settings stop here.
  for (int attempt = 0;; ++attempt) {
    if (stop.load()) return 0;
    auto st = Prepare();
    if (st) break;
    if (DispositionOf(st.error()) != Disposition::kRetry) {
      spdlog::error("{}", st.error().message);
      return ExitCodeOf(st.error());
    }
    milliseconds wait = Backoff(attempt);
    spdlog::warn("setup: {} (retrying in {} ms)", st.error().message, wait.count());
    slot_setup_.reset();
    watermill_.reset();
    marker_.reset();
    watermill_progress_.reset();
    publisher_.reset();
    SleepUnlessStopped(wait, stop, stats_);
  }
  StartWatchdog();

  // Attempts and recoveries (app/recovery.h): each attempt runs the phases in
  // order, the slot's setup only when it is needed; whatever ends one is
  // mapped to one recovery by Decide, applied here, and the next attempt
  // starts again from the first phase.
  int backoff = 0;
  Phase phase = Phase::kSlotSetup;
  while (true) {
    if (stop.load()) return Shutdown(nullptr, false);
    std::optional<pipeline::PgSource> source;
    std::optional<pipeline::StreamSession> session;
    Attempt attempt;
    attempt.phase = phase;
    if (Status st = RunPhase(phase, &session, &source); !st) attempt.error = st.error();
    attempt.stop_requested = stop.load();
    attempt.failure_retryable = tracker_->failure_retryable();
    attempt.transactions_ready = transactions_ready_;
    attempt.batch_size_required =
        kafka_producer_ != nullptr && kafka_producer_->RequiredBatchSize().has_value();
    attempt.end_requested = watermill_ && watermill_->end_requested()->load();
    attempt.on_slot_lost = config_.on_slot_lost;
    const Recovery recovery = Decide(attempt);
    pipeline::StreamSession* live = session ? &*session : nullptr;
    const std::string why = attempt.error ? attempt.error->message : "";
    if (!recovery.metric_reason.empty()) {
      metrics_.CountError(recovery.metric_reason == "db_read"
                              ? metrics::ErrorReason::kDbRead
                              : metrics::ErrorReason::kKafkaUnavailable);
    }
    if (recovery.reconnect) stats_.reconnects.fetch_add(1);
    switch (recovery.action) {
      case Action::kNextPhase:
        phase = phase == Phase::kSlotSetup ? Phase::kCatchUp : Phase::kStream;
        continue;
      case Action::kDone: {
        if (!attempt.error) return Shutdown(live, false);
        // A stop that gave something up (the open transaction, while Kafka took
        // nothing): it is sent again after the restart, and the exit says so.
        spdlog::info("{}", why);
        int code = Shutdown(live, false);
        return code == kExitOk && phase == Phase::kStream ? kExitFailure : code;
      }
      case Action::kStop:
        if (recovery.telling == Telling::kSlotLost) {
          // --on-slot-lost=fail. The server's error alone ("can no longer get
          // changes from replication slot") says neither what to do nor that
          // nothing is lost: say it, as the check at start does.
          spdlog::error(
              "{}: replication slot {} is lost. Rows committed since are not (they are still "
              "unacked in {}); restart with OUTBOX_ON_SLOT_LOST=reconcile (--on-slot-lost) to "
              "recreate the slot and publish them",
              why, config_.slot, config_.table_name.ToString());
        } else {
          spdlog::error("{}", why);
        }
        Shutdown(live, true);
        return ExitCodeOf(*attempt.error);
      case Action::kRestartPipeline:
        if (recovery.telling == Telling::kReplaced) {
          spdlog::warn(
              "this relay was replaced ({}); the Kafka producer is replaced, and the relay "
              "resumes from slot {} if it is still its own, else waits as a standby",
              why, config_.slot);
        }
        // The connection goes first, so the server resends from the confirmed position.
        session.reset();
        source.reset();
        if (auto st = RestartPipeline(attempt.failure_retryable ? "" : why); !st) {
          if (st.error().code != ErrorCode::kCancelled) spdlog::error("{}", st.error().message);
          return Shutdown(nullptr, true);
        }
        SleepUnlessStopped(Backoff(backoff++), stop, stats_);
        break;
      case Action::kReconnect:
        spdlog::warn("{}{}", recovery.telling == Telling::kReplication ? "replication: " : "", why);
        if (session) backoff = 0;  // it streamed: start the backoff over
        // Close the replication connection now, not after the wait below: a
        // server that is stopping waits for its walsender, which waits for us.
        session.reset();
        source.reset();
        // Let what is in flight finish so the restart position covers it and
        // nothing is sent twice; bounded, since Kafka may be the one that is down.
        Drain(milliseconds(5000));
        SleepUnlessStopped(Backoff(backoff++), stop, stats_);
        break;
      case Action::kStandby:
        // Another instance holds the slot (or sets it up): we are its standby.
        if (!stats_.standby.exchange(true)) {
          spdlog::info("standby: {}; waiting to take over", why);
        }
        session.reset();
        source.reset();
        if (phase == Phase::kStream) Drain(milliseconds(5000));
        SleepUnlessStopped(milliseconds(2000), stop, stats_);
        break;
      case Action::kRecreateSlot:
        spdlog::error("{}: recreating the slot and backfilling the unacked rows", why);
        slot_setup_->CountLoss();
        need_slot_setup_ = true;
        // The new slot needs an empty tracker to start from its position.
        session.reset();
        source.reset();
        Drain(milliseconds::max());
        break;
      case Action::kRejoin:
        // Asked for: tables join the publication before the next session.
        spdlog::info("stream ended to let watermill tables join ({})", why);
        session.reset();
        source.reset();
        Drain(milliseconds(5000));
        break;
      case Action::kRetry: {
        milliseconds wait = Backoff(backoff++);
        spdlog::warn("{}: {} (retrying in {} ms)",
                     phase == Phase::kSlotSetup ? "slot setup" : "watermill tables", why,
                     wait.count());
        SleepUnlessStopped(wait, stop, stats_);
        break;
      }
    }
    phase = Phase::kSlotSetup;
  }
}

Status Relay::RunPhase(Phase phase, std::optional<pipeline::StreamSession>* session,
                       std::optional<pipeline::PgSource>* source) {
  switch (phase) {
    case Phase::kSlotSetup:
      if (!need_slot_setup_) return Ok();
      if (!tracker_->empty()) {
        // What is still in flight was read from the slot before it ended (the
        // drain before this gave up: Kafka silent, or its delivery failed). Its
        // position means nothing to a slot made anew or set up by another
        // instance: forgotten, those transactions come again from that slot or
        // from its backfill, as after a restart of the process.
        if (auto st = RestartPipeline("the slot is set up again"); !st) return st;
      }
      if (auto st = slot_setup_->Run(); !st) return st;
      need_slot_setup_ = false;
      slot_setup_->Recovered();
      return Ok();
    case Phase::kCatchUp:
      // Tables that joined meanwhile, their catch-ups, the group's positions.
      if (!watermill_) return Ok();
      if (auto st = watermill_->BeforeStream(); !st) return st;
      watermill_->StartDiscovery();
      return Ok();
    case Phase::kStream:
      return Stream(session, source);
  }
  return Ok();
}

Status Relay::Stream(std::optional<pipeline::StreamSession>* session,
                     std::optional<pipeline::PgSource>* source) {
  if constexpr (failpoint::kCompiledIn) {
    if (last_walsender_pid_ != 0 && failpoint::Active("no-restream")) {
      return Fail(ErrorCode::kTransient, "TEST FAULT no-restream: the stream connects only once");
    }
  }
  // Start from what the slot itself says if that is further than what we
  // confirmed (another instance may have held it meanwhile).
  if (auto admin = pg::Connection::Open(config_.database_url, pg::Connection::Mode::kNormal,
                                        "outbox-relay", config_.pg_network)) {
    if (auto slot = pg::QuerySlot(*admin, config_.slot); slot && slot->exists) {
      tracker_->RaiseConfirmed(slot->confirmed_flush_lsn);
      TerminateStaleWalsender(*admin, *slot);
    }
  }
  auto conn = OpenReplication();
  if (!conn) return std::unexpected(conn.error());
  auto identity = pg::IdentifySystem(*conn);
  if (!identity) return std::unexpected(identity.error());
  if (auto st = FollowPromotion(*identity, *conn); !st) return st;
  // Exactly-once: the history the progress is trusted on, read before the
  // connection turns into the stream.
  std::optional<pipeline::ProgressFacts> facts;
  if (config_.delivery == DeliveryMode::kExactlyOnce) {
    auto f = ProgressFactsOf(*conn, *identity);
    if (!f) return std::unexpected(f.error());
    facts = std::move(*f);
  }
  // Silence is judged against the server's own patience (Liveness).
  milliseconds wal_sender_timeout(0);
  if (auto shown = conn->Exec("SHOW wal_sender_timeout")) {
    // Best effort, as the query: without it the relay keeps its own timeout.
    auto text = pg::Rows(shown->get()).Text(0, 0);
    if (text) {
      wal_sender_timeout = ParseTimeSetting(*text);
    } else {
      spdlog::warn("SHOW wal_sender_timeout: {}", text.error().message);
    }
  }
  auto stream = pg::ReplicationStream::Start(std::move(*conn), config_.slot, config_.publication,
                                             tracker_->confirmed());
  if (!stream) return std::unexpected(stream.error());
  // The slot is ours now, but its setup may not be: another instance that
  // recreated it (after a loss or a promotion) runs its backfill without
  // streaming it. Streaming beside that backfill would publish the newer rows
  // first. Such a slot is set up first (Run waits for that instance, or
  // resumes the backfill if it died); checked before anyone is fenced.
  if (auto st = slot_setup_->EnsureFinished(); !st) {
    spdlog::info("{}: not streaming it, waiting for its setup", st.error().message);
    need_slot_setup_ = true;
    return st;
  }
  last_walsender_pid_ = stream->backend_pid();
  if (stats_.standby.exchange(false)) spdlog::info("slot {} is free: taking over", config_.slot);
  // The slot is ours: only now may this instance fence the previous holder
  // (and only while it still holds it: one frozen since START_REPLICATION
  // must not fence the instance that took over meanwhile).
  if (facts) {
    if (!transactions_ready_) {
      if constexpr (failpoint::kCompiledIn) {
        if (auto secs = failpoint::Active("stall-before-init"); secs && !stalled_before_init_) {
          stalled_before_init_ = true;
          spdlog::warn("TEST FAULT stall-before-init: {} s before fencing", *secs);
          std::this_thread::sleep_for(std::chrono::seconds(std::stoi(std::string(*secs))));
        }
      }
      if (auto st = CheckSlotHeld(); !st) return st;
    }
    if (auto st = EnsureTransactions(&*facts); !st) return st;
  }
  pipeline::SessionOptions so;
  so.receive_timeout = pipeline::Liveness::ForServer(milliseconds(config_.pg_receive_timeout_ms),
                                                     wal_sender_timeout);
  spdlog::info("streaming from slot {} at {} (walsender pid {}; silent after {} ms)", config_.slot,
               tracker_->confirmed(), last_walsender_pid_, so.receive_timeout.count());
  source->emplace(std::move(*stream), &marked_);
  so.table = config_.table_name;
  so.columns = config_.columns;
  if (watermill_) {
    so.tables = watermill_->routed_tables();
    so.processed = watermill_->positions();
    so.end_requested = watermill_->end_requested();
    so.unrouted = [this](std::string_view schema, std::string_view name,
                         const pipeline::OutboxTable* previous) {
      return watermill_->OnUnrouted(schema, name, previous);
    };
    if (watermill_progress_) watermill_progress_->SetStreaming(true);
  }
  so.status_interval = milliseconds(config_.status_interval_ms);
  so.stop_grace = stop_grace();
  session->emplace(so, &**source, publisher_.get(), tracker_.get(), &stats_, &*stop_,
                   &last_marker_error_ns_);
  stats_.streaming = true;
  Status st = (*session)->Run();
  stats_.streaming = false;
  if (publisher_->transactional()) {
    // Exactly-once: what the open Kafka transaction holds commits now (its
    // progress says how far, the open PostgreSQL transaction's rows
    // included), unless it failed: then it is aborted and sent again.
    if (!st && st.error().code == ErrorCode::kAborted) {
      if (auto aborted = publisher_->AbortTransaction(milliseconds(30000)); !aborted) {
        spdlog::warn("{}", aborted.error().message);
      }
    } else {
      auto finished = publisher_->FinishTransaction(milliseconds(config_.transaction_timeout_ms),
                                                    st ? &**session : nullptr);
      if (!finished && (st || finished.error().code == ErrorCode::kFatal)) st = finished;
    }
  }
  if (tracking::Transaction* open = (*session)->TakeOpenTransaction()) {
    // The server will send this transaction again from its start.
    tracker_->Abandon(open);
  }
  return st;
}

}  // namespace outbox_relay::app
