#include "outbox_relay/app/relay.h"

#include <spdlog/spdlog.h>

#include <charconv>
#include <random>
#include <thread>
#include <utility>

#include "outbox_relay/app/failover.h"
#include "outbox_relay/kafka/producer.h"
#include "outbox_relay/pg/relay_schema.h"
#include "outbox_relay/walproto/walproto.h"

namespace outbox_relay::app {

namespace {

using Clock = std::chrono::steady_clock;
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

// Exit codes: 0 clean stop, 1 runtime failure, 2 bad configuration/setup.
constexpr int kExitFailure = 1;
constexpr int kExitConfig = 2;

}  // namespace

Relay::Relay(RelayConfig config) : config_(std::move(config)), metrics_(config_.service) {}

Relay::~Relay() = default;

Status Relay::Prepare() {
  auto conn = pg::Connection::Open(config_.database_url, pg::Connection::Mode::kNormal);
  if (!conn) return std::unexpected(conn.error());
  spdlog::info("connected to PostgreSQL {} as {}", conn->server_version(), conn->user());
  if (auto st = ValidateFailoverSlot(config_, *conn); !st) return st;

  // Fail fast on a table that cannot work, before touching slots.
  std::optional<std::string> params[] = {config_.table_name.Quoted()};
  auto cols = conn->ExecParams(
      "SELECT attname FROM pg_attribute WHERE attrelid = to_regclass($1) AND attnum > 0 AND "
      "NOT attisdropped",
      params);
  if (!cols) return std::unexpected(cols.error());
  if (PQntuples(cols->get()) == 0) {
    return Fail(ErrorCode::kInvalidArgument,
                "invalid setting --table (OUTBOX_TABLE): table {} does not exist (create it with "
                "sql/outbox.sql)",
                config_.table_name.ToString());
  }
  pgoutput::Relation rel;
  for (int i = 0; i < PQntuples(cols->get()); ++i) {
    rel.columns.push_back({0, std::string(*pg::GetValue(cols->get(), i, 0)), 0, -1});
  }
  if (auto map = outbox::ColumnMap::Resolve(rel, config_.columns); !map) {
    return std::unexpected(map.error());
  }
  if (config_.mark && rel.ColumnIndex(config_.acked_column) < 0) {
    return Fail(ErrorCode::kInvalidArgument,
                "invalid setting --column-acked (OUTBOX_COLUMN_ACKED): table {} has no column "
                "'{}' (use --mark=false to publish without marking)",
                config_.table_name.ToString(), config_.acked_column);
  }

  if (auto st = pg::EnsureRelaySchema(*conn); !st) return st;
  if (auto st = pg::EnsurePublication(*conn, config_.publication, config_.table_name); !st) {
    return st;
  }

  // The start position is set by SetupSlot from the slot itself.
  tracker_ = std::make_unique<tracking::AckTracker>(kInvalidLsn, config_.mark);
  // Test-only faults, so the fault tests can show what they would catch.
  if (const char* env = std::getenv("OUTBOX_TEST_FAULT")) {
    std::string_view fault(env);
    if (fault == "confirm-newest") {
      spdlog::warn("TEST FAULT confirm-newest: the confirmation rule is broken on purpose");
      tracker_->EnableUnsafeConfirmNewest();
    } else if (fault.starts_with("fatal-after:")) {
      test_fatal_after_ = std::stoull(std::string(fault.substr(12)));
      spdlog::warn("TEST FAULT: fatal producer error after {} records", test_fatal_after_);
    }
  }
  auto mapper = outbox::RecordMapper::Create(config_.mapper);
  if (!mapper) return std::unexpected(mapper.error());
  mapper_.emplace(std::move(*mapper));
  // A dead letter must pass the producer's own size check, or the row it
  // stands in for stops the stream ("cannot dead-letter row"): with
  // message.max.bytes set below --dlq-max-bytes (the default 1,000,000 is
  // librdkafka's default too), dead letters shed their payload at the smaller
  // of the two.
  size_t dlq_max_bytes = static_cast<size_t>(config_.dlq_max_bytes);
  for (const auto& [key, value] : config_.kafka_property_pairs) {
    size_t v = 0;
    auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), v);
    if (key == "message.max.bytes" && ec == std::errc() && end == value.data() + value.size() &&
        v < dlq_max_bytes) {
      spdlog::info("dead letters limited to {} bytes (kafka property message.max.bytes)", v);
      dlq_max_bytes = v;
    }
  }
  dead_letters_.emplace(config_.dlq_topic, dlq_max_bytes, config_.columns);
  refused_letters_.emplace(config_.dlq_topic, dlq_max_bytes, config_.columns);

  auto on_delivery = [this](const kafka::Delivery& d) { OnDelivery(d); };
  if (config_.sink == "null") {
    sink_ = std::make_unique<kafka::NullSink>(on_delivery);
  } else {
    kafka::ProducerOptions opts{config_.kafka_brokers, config_.kafka_property_pairs,
                                config_.create_topics, static_cast<int>(config_.topic_partitions),
                                static_cast<int>(config_.topic_replication_factor)};
    auto producer = kafka::KafkaProducer::Create(opts, on_delivery, [this](const Error&) {
      metrics_.CountError(metrics::ErrorReason::kKafkaUnavailable);
    });
    if (!producer) return std::unexpected(producer.error());
    if (auto st = (*producer)->CheckConnection(milliseconds(10000)); !st) {
      if (st.error().code == ErrorCode::kInvalidArgument) return st;  // credentials, TLS
      spdlog::warn("Kafka not reachable yet ({}); records wait in the producer until it is",
                   st.error().message);
    }
    producer_ = producer->get();
    sink_ = std::move(*producer);
  }
  if (config_.mark) {
    marker::MarkerOptions mo;
    mo.database_url = config_.database_url;
    mo.table = config_.table_name;
    mo.transaction_id_column = config_.columns.transaction_id;
    mo.offset_column = config_.columns.offset;
    mo.acked_column = config_.acked_column;
    mo.slot_name = config_.slot;
    mo.batch_max = static_cast<size_t>(config_.marker_batch);
    marker_ = std::make_unique<marker::Marker>(mo, tracker_.get(), [this](const Error&) {
      metrics_.CountError(metrics::ErrorReason::kDbAck);
      last_marker_error_ns_.store(Clock::now().time_since_epoch().count());
    });
    if (auto st = marker_->Start(); !st) return st;
  }
  return Ok();
}

int Relay::Run(const std::atomic<bool>& stop) {
  stop_ = &stop;
  stats_.Beat();
  if (auto st = StartHttp(); !st) {
    spdlog::error("{}", st.error().message);
    return kExitConfig;
  }
  sampler_ = std::make_unique<Sampler>(config_, &metrics_);
  sampler_->Start();
  // Setup: retried while the database is not reachable; bad settings stop here.
  for (int attempt = 0;; ++attempt) {
    if (stop.load()) return 0;
    auto st = Prepare();
    if (st) break;
    if (DispositionOf(st.error()) != Disposition::kRetry) {
      spdlog::error("{}", st.error().message);
      return st.error().code == ErrorCode::kInvalidArgument ||
                     st.error().code == ErrorCode::kPermission
                 ? kExitConfig
                 : kExitFailure;
    }
    milliseconds wait = Backoff(attempt);
    spdlog::warn("setup: {} (retrying in {} ms)", st.error().message, wait.count());
    marker_.reset();
    producer_ = nullptr;
    sink_.reset();
    SleepUnlessStopped(wait, stop, stats_);
  }

  int attempt = 0;
  while (true) {
    if (stop.load()) return Shutdown(nullptr, false);
    if (need_slot_setup_) {
      auto st = SetupSlot(stop);
      if (!st) {
        if (DispositionOf(st.error()) != Disposition::kRetry) {
          spdlog::error("{}", st.error().message);
          return Shutdown(nullptr, true);
        }
        milliseconds wait = Backoff(attempt++);
        spdlog::warn("slot setup: {} (retrying in {} ms)", st.error().message, wait.count());
        SleepUnlessStopped(wait, stop, stats_);
        continue;
      }
      need_slot_setup_ = false;
      slot_loss_counted_ = false;
    }
    // Start from what the slot itself says if that is further than what we
    // confirmed (another instance may have held it meanwhile).
    if (auto admin = pg::Connection::Open(config_.database_url, pg::Connection::Mode::kNormal)) {
      if (auto slot = pg::QuerySlot(*admin, config_.slot); slot && slot->exists) {
        tracker_->RaiseConfirmed(slot->confirmed_flush_lsn);
      }
    }
    auto conn = pg::Connection::Open(config_.database_url, pg::Connection::Mode::kReplication);
    if (conn) {
      if (auto st = FollowPromotion(*conn, stop); !st) conn = std::unexpected(st.error());
    }
    Result<pg::ReplicationStream> stream =
        conn ? pg::ReplicationStream::Start(std::move(*conn), config_.slot, config_.publication,
                                            tracker_->confirmed())
             : Result<pg::ReplicationStream>(std::unexpected(conn.error()));
    Status st;
    if (stream) {
      if (stats_.standby.exchange(false))
        spdlog::info("slot {} is free: taking over", config_.slot);
      spdlog::info("streaming from slot {} at {}", config_.slot, tracker_->confirmed());
      stats_.streaming = true;
      attempt = 0;
      relations_.Clear();
      columns_.reset();
      outbox_relid_ = 0;
      st = StreamSession(*stream, stop);
      stats_.streaming = false;
      if (open_tx_ != nullptr) {
        // The server will send this transaction again from its start.
        tracker_->Abandon(open_tx_);
        open_tx_ = nullptr;
      }
      if (st) return Shutdown(&*stream, false);
    } else {
      st = std::unexpected(stream.error());
    }

    const Error& err = st.error();
    if (err.code == ErrorCode::kSlotLost && config_.on_slot_lost == "reconcile") {
      spdlog::error("{}: recreating the slot and backfilling the unacked rows", err.message);
      if (!std::exchange(slot_loss_counted_, true)) stats_.slot_lost.fetch_add(1);
      need_slot_setup_ = true;
      // The new slot needs an empty tracker to start from its position.
      while (!tracker_->empty() && !tracker_->failure() && !stop.load()) {
        stats_.Beat();
        tracker_->WaitForProgress(milliseconds(100));
      }
      continue;
    }
    if (err.code == ErrorCode::kSlotLost) {
      // --on-slot-lost=fail. The server's error alone ("can no longer get
      // changes from replication slot") says neither what to do nor that
      // nothing is lost: say it, as the check at start does.
      spdlog::error(
          "{}: replication slot {} is lost. Rows committed since are not (they are still unacked "
          "in {}); restart with OUTBOX_ON_SLOT_LOST=reconcile (--on-slot-lost) to recreate the "
          "slot and publish them",
          err.message, config_.slot, config_.table_name.ToString());
      return Shutdown(stream ? &*stream : nullptr, true);
    }
    if (DispositionOf(err) != Disposition::kRetry) {
      spdlog::error("{}", err.message);
      return Shutdown(stream ? &*stream : nullptr, true);
    }
    if (err.code == ErrorCode::kSlotInUse) {
      if (!stats_.standby.exchange(true)) {
        spdlog::info("standby: {}; waiting to take over", err.message);
      }
    } else {
      metrics_.CountError(metrics::ErrorReason::kDbRead);
      spdlog::warn("replication: {}", err.message);
    }
    stats_.reconnects.fetch_add(1);
    // Close the replication connection now, not after the wait below: a
    // server that is stopping waits for its walsender, which waits for us.
    if (stream) stream = std::unexpected(err);
    // Let what is in flight finish so the restart position covers it and
    // nothing is sent twice; bounded, since Kafka may be the one that is down.
    auto drain_until = Clock::now() + milliseconds(5000);
    while (!tracker_->empty() && !tracker_->failure() && Clock::now() < drain_until &&
           !stop.load()) {
      stats_.Beat();
      tracker_->WaitForProgress(milliseconds(100));
    }
    milliseconds wait = err.code == ErrorCode::kSlotInUse ? milliseconds(2000) : Backoff(attempt++);
    SleepUnlessStopped(wait, stop, stats_);
  }
}

Status Relay::StreamSession(pg::ReplicationStream& stream, const std::atomic<bool>& stop) {
  last_status_ = Clock::now() - milliseconds(config_.status_interval_ms);
  while (true) {
    stats_.Beat();
    if (auto failure = tracker_->failure()) return Fail(ErrorCode::kFatal, "{}", *failure);
    // Stop only between transactions: a half-read transaction would be sent
    // again in full after a restart, and its first rows would be duplicates.
    if (stop.load() && open_tx_ == nullptr) return Ok();
    if (auto st = SendStatus(stream, false); !st) return st;
    LogProgress();
    if (Backpressured()) {
      tracker_->WaitForProgress(milliseconds(2));
      continue;
    }
    auto msg = stream.TryRead();
    if (!msg) return std::unexpected(msg.error());
    if (!*msg) {
      if (auto st = stream.Wait(milliseconds(100)); !st) return st;
      continue;
    }
    auto server_msg = walproto::DecodeServerMessage(**msg);
    if (!server_msg) return std::unexpected(server_msg.error());
    if (auto* k = std::get_if<walproto::PrimaryKeepalive>(&*server_msg)) {
      stats_.keepalives.fetch_add(1, std::memory_order_relaxed);
      received_ = std::max(received_, k->wal_end);
      // Idle rule: nothing in flight and not inside a transaction, so every
      // commit before wal_end was received and confirmed already.
      if (open_tx_ == nullptr) tracker_->FollowServer(k->wal_end);
      if (k->reply_requested) {
        if (auto st = SendStatus(stream, true); !st) return st;
        // A stopping server (pg_ctl stop -m fast) waits until we confirm all
        // it sent, asking for replies meanwhile; it ended the marker's session
        // first, so we cannot confirm what awaits marking. Holding on would
        // hold its shutdown forever: let go, and resume from the confirmed
        // position (re-sending the rest) once it is back.
        auto since_marker_error =
            Clock::now().time_since_epoch().count() - last_marker_error_ns_.load();
        if (last_marker_error_ns_.load() != 0 && tracker_->awaiting_mark() > 0 &&
            since_marker_error < std::chrono::nanoseconds(std::chrono::seconds(10)).count()) {
          return Fail(ErrorCode::kTransient,
                      "the server asks for a confirmation the relay cannot give (the marker "
                      "cannot reach PostgreSQL: is it stopping?); closing the replication "
                      "connection, resuming from {}",
                      tracker_->confirmed());
        }
      }
      continue;
    }
    const auto& x = std::get<walproto::XLogData>(*server_msg);
    received_ = std::max(received_, x.wal_end);
    if (auto st = HandleXLogData(x.data, stream); !st) return st;
  }
}

Status Relay::HandleXLogData(std::string_view data, pg::ReplicationStream& stream) {
  // Inserts decode into their own message so its tuple storage survives the
  // Begin/Commit around it: no allocation per row.
  bool is_insert = !data.empty() && data[0] == 'I';
  pgoutput::DecodedMessage& msg = is_insert ? insert_message_ : message_;
  if (auto st = pgoutput::Decode(data, &msg); !st) {
    return Fail(ErrorCode::kProtocol, "pgoutput: {}", st.error().message);
  }
  if (is_insert) return HandleInsert(std::get<pgoutput::Insert>(msg), stream);
  if (auto* b = std::get_if<pgoutput::Begin>(&message_)) {
    if (open_tx_ != nullptr) {
      return Fail(ErrorCode::kProtocol, "pgoutput: Begin of xid {} inside xid {}", b->xid,
                  open_tx_->xid);
    }
    open_tx_ = tracker_->Begin(b->final_lsn, b->commit_time, b->xid);
    return Ok();
  }
  if (auto* c = std::get_if<pgoutput::Commit>(&message_)) {
    if (open_tx_ == nullptr) {
      return Fail(ErrorCode::kProtocol, "pgoutput: Commit at {} without Begin", c->commit_lsn);
    }
    if (open_tx_->rows > 0) {  // 14 also sends the transactions that published nothing
      stats_.transactions.fetch_add(1, std::memory_order_relaxed);
      stats_.last_commit_unix_micros.store(c->commit_time.ToUnixMicros(),
                                           std::memory_order_relaxed);
    }
    tracker_->Commit(open_tx_, c->end_lsn);  // open_tx_ may be gone after this
    open_tx_ = nullptr;
    return Ok();
  }
  if (auto* r = std::get_if<pgoutput::Relation>(&message_)) return HandleRelation(*r);
  if (auto* t = std::get_if<pgoutput::Truncate>(&message_)) {
    for (pgoutput::Oid id : t->relation_ids) {
      if (id == outbox_relid_) {
        spdlog::warn("the outbox table {} was truncated: rows not yet published are gone",
                     config_.table_name.ToString());
      }
    }
    return Ok();
  }
  // Type, Origin, Message, and Update/Delete from a publication that sends
  // them: nothing to publish.
  return Ok();
}

Status Relay::HandleRelation(const pgoutput::Relation& relation) {
  bool ours =
      relation.nspname == config_.table_name.schema && relation.relname == config_.table_name.name;
  if (ours) {
    // Sent before the first row and again after any schema change: columns
    // are found by name each time.
    auto map = outbox::ColumnMap::Resolve(relation, config_.columns);
    if (!map) {
      return Fail(ErrorCode::kFatal, "outbox table changed and can no longer be published: {}",
                  map.error().message);
    }
    if (outbox_relid_ != 0 && columns_) {
      spdlog::info("outbox table {} changed: {} columns", config_.table_name.ToString(),
                   relation.columns.size());
    }
    columns_ = *map;
    outbox_relid_ = relation.relation_id;
  }
  relations_.Put(relation);
  return Ok();
}

Status Relay::HandleInsert(const pgoutput::Insert& insert, pg::ReplicationStream& stream) {
  if (open_tx_ == nullptr)
    return Fail(ErrorCode::kProtocol, "pgoutput: Insert outside a transaction");
  if (insert.relation_id != outbox_relid_) {
    if (relations_.Find(insert.relation_id) == nullptr) {
      return Fail(ErrorCode::kProtocol, "pgoutput: Insert for relation {} never described",
                  insert.relation_id);
    }
    return Ok();  // another table in a shared publication
  }
  stats_.rows.fetch_add(1, std::memory_order_relaxed);
  return MapAndProduce(*columns_, insert.new_tuple, open_tx_, &stream);
}

Status Relay::MapAndProduce(const outbox::ColumnMap& columns, const pgoutput::TupleData& row,
                            tracking::Transaction* tx, pg::ReplicationStream* stream) {
  auto mapped = mapper_->Map(columns, row, tx->final_lsn);
  if (!mapped) return std::unexpected(mapped.error());
  tracking::AckTracker::NoteTransactionId(tx, mapped->identity.transaction_id);
  if (mapped->poison) {
    return DeadLetter(*mapped->poison, mapped->identity, columns, row, tx, stream);
  }
  auto st = Produce(*mapped->record, tx, stream);
  if (!st && st.error().code == ErrorCode::kPoison) {
    // Refused by the producer itself (e.g. larger than message.max.bytes).
    return DeadLetter(st.error(), mapped->identity, columns, row, tx, stream);
  }
  return st;
}

Status Relay::DeadLetter(const Error& reason, const outbox::RowIdentity& identity,
                         const outbox::ColumnMap& columns, const pgoutput::TupleData& row,
                         tracking::Transaction* tx, pg::ReplicationStream* stream) {
  metrics_.CountError(metrics::ErrorReason::kMarshal);
  if (config_.on_poison == "halt") {
    return Fail(ErrorCode::kFatal,
                "poison row in {} (transaction_id={} offset={} uuid='{}', commit {}): {}. The "
                "relay stopped before it and confirmed nothing past it. It reads the row from "
                "the WAL, so it stops here again whatever is done to the row in the table: run "
                "with OUTBOX_ON_POISON=dlq (--on-poison=dlq) to send it to the dead-letter topic "
                "and go on, then republish a corrected row if it is needed.",
                config_.table_name.ToString(), identity.transaction_id, identity.offset,
                identity.uuid, tx->final_lsn, reason.message);
  }
  auto text = [&](int index) -> std::optional<std::string_view> {
    if (index < 0 || static_cast<size_t>(index) >= row.values.size()) return std::nullopt;
    const auto& v = row.values[static_cast<size_t>(index)];
    if (v.kind != pgoutput::TupleValue::Kind::kText) return std::nullopt;
    return v.text;
  };
  const outbox::KafkaRecord& record =
      dead_letters_->Build(reason, identity, config_.table_name.ToString(), tx->final_lsn,
                           text(columns.payload), text(columns.metadata));
  spdlog::warn("dead-lettering row transaction_id={} offset={} to {}: {}", identity.transaction_id,
               identity.offset, config_.dlq_topic, reason.message);
  stats_.dead_lettered.fetch_add(1, std::memory_order_relaxed);
  auto st = Produce(record, tx, stream);
  if (!st) {
    return Fail(ErrorCode::kFatal, "cannot dead-letter row transaction_id={} offset={}: {}",
                identity.transaction_id, identity.offset, st.error().message);
  }
  return st;
}

Status Relay::Produce(const outbox::KafkaRecord& record, tracking::Transaction* tx,
                      pg::ReplicationStream* stream) {
  tracker_->AddMessage(tx);
  while (true) {
    auto accepted = sink_->Produce(record, tx);
    if (!accepted) {
      // Not taken: undo the count so the transaction can still complete.
      tracker_->CancelMessage(tx);
      return std::unexpected(accepted.error());
    }
    if (*accepted == kafka::Sink::Accepted::kQueued) {
      uint64_t n = stats_.produced.fetch_add(1, std::memory_order_relaxed) + 1;
      if (n == test_fatal_after_ && producer_ != nullptr) [[unlikely]] {
        producer_->InjectFatalErrorForTest();
      }
      return Ok();
    }
    // The producer's queue is full: keep the walsender content while waiting.
    stats_.Beat();
    if (auto failure = tracker_->failure()) return Fail(ErrorCode::kFatal, "{}", *failure);
    if (stop_ != nullptr && stop_->load()) {
      // Kafka takes nothing and we are asked to stop: give up this
      // transaction (it is abandoned and re-sent after the restart) rather
      // than wait here past the shutdown timeout.
      tracker_->CancelMessage(tx);
      return Fail(ErrorCode::kTransient, "stopping while the Kafka producer's queue is full");
    }
    if (stream != nullptr) {
      if (auto st = SendStatus(*stream, false); !st) return st;
    }
    tracker_->WaitForProgress(milliseconds(1));
  }
}

Status Relay::StartHttp() {
  if (config_.metrics_addr.empty()) return Ok();
  auto server = metrics::HttpServer::Start(
      config_.metrics_addr, &metrics_, [this] { return Healthz(); }, [this] { return Readyz(); },
      [this] { RefreshMetrics(); });
  if (!server) return std::unexpected(server.error());
  http_ = std::move(*server);
  spdlog::info("metrics and health on http://{}/metrics, /healthz, /readyz", config_.metrics_addr);
  return Ok();
}

metrics::Health Relay::Healthz() const {
  double age = static_cast<double>(UnixMicrosNow() - stats_.heartbeat_unix_micros.load()) / 1e6;
  if (age > 30) return {false, fmt::format("replication loop silent for {:.0f} s", age)};
  return {true, fmt::format("ok: loop alive ({:.1f} s ago)", age)};
}

metrics::Health Relay::Readyz() const {
  if (stats_.standby.load()) return {false, "standby: another instance holds the slot"};
  if (!stats_.streaming.load()) return {false, "not streaming"};
  if (sink_ == nullptr || !sink_->Reachable()) return {false, "Kafka not reachable"};
  return {true, "ok: streaming, Kafka reachable"};
}

void Relay::RefreshMetrics() {
  std::lock_guard lock(refresh_mu_);
  auto delta = [](std::atomic<uint64_t>& now, std::atomic<uint64_t>& seen) {
    uint64_t v = now.load();
    uint64_t d = v - seen.load();
    seen.store(v);
    return static_cast<double>(d);
  };
  metrics_.transactions().Increment(delta(stats_.transactions, counted_.transactions));
  metrics_.reconnects().Increment(delta(stats_.reconnects, counted_.reconnects));
  metrics_.slot_lost().Increment(delta(stats_.slot_lost, counted_.slot_lost));
  metrics_.backfilled().Increment(delta(stats_.backfilled, counted_.backfilled));
  metrics_.CountDeadLetter(delta(stats_.dead_lettered, counted_.dead_lettered));
  metrics_.heartbeat().Set(static_cast<double>(stats_.heartbeat_unix_micros.load()) / 1e6);
  metrics_.standby().Set(stats_.standby.load() ? 1 : 0);
  metrics_.streaming().Set(stats_.streaming.load() ? 1 : 0);
  metrics_.last_commit_time().Set(static_cast<double>(stats_.last_commit_unix_micros.load()) / 1e6);
  if (tracker_) {
    metrics_.in_flight().Set(static_cast<double>(tracker_->rows_in_flight()));
    metrics_.slot_confirmed_lsn().Set(static_cast<double>(tracker_->confirmed().value()));
  }
}

bool Relay::Backpressured() const {
  return tracker_->rows_in_flight() >= config_.max_in_flight ||
         tracker_->awaiting_mark() >= static_cast<size_t>(config_.marker_batch) * 4;
}

Status Relay::SendStatus(pg::ReplicationStream& stream, bool force) {
  auto now = Clock::now();
  Lsn flush = tracker_->confirmed();
  auto since = now - last_status_;
  bool moved = flush != last_sent_flush_ && since >= milliseconds(50);
  if (!force && !moved && since < milliseconds(config_.status_interval_ms)) return Ok();
  walproto::StandbyStatusUpdate update;
  update.write = std::max(received_, flush);
  update.flush = flush;
  update.apply = flush;
  update.send_time = PgTimestamp::Now();
  if (auto st = stream.SendStatus(update); !st) return st;
  last_status_ = now;
  last_sent_flush_ = flush;
  stats_.status_updates.fetch_add(1, std::memory_order_relaxed);
  stats_.Beat();
  return Ok();
}

void Relay::OnDelivery(const kafka::Delivery& d) {
  auto* tx = static_cast<tracking::Transaction*>(d.opaque);
  metrics_.ObservePublish(d.topic, d.event_type, static_cast<double>(d.latency.count()) / 1e6,
                          !d.error);
  if (!d.error) {
    if (tx->commit_time.micros != 0) {
      metrics_.ObserveCommitToAck(
          static_cast<double>(UnixMicrosNow() - tx->commit_time.ToUnixMicros()) / 1e6);
    }
    stats_.delivered.fetch_add(1, std::memory_order_relaxed);
    tracker_->OnDelivered(tx);
    return;
  }
  if (d.error->code != ErrorCode::kPoison) {
    metrics_.CountError(metrics::ErrorReason::kKafkaUnavailable);
  }
  if (d.error->code == ErrorCode::kPoison && config_.on_poison == "dlq" &&
      d.topic != config_.dlq_topic) {
    DeadLetterRefused(d, tx);
    return;
  }
  if (!tracker_->failure()) spdlog::error("{}", d.error->message);  // the first says it all
  tracker_->OnFailed(tx, d.error->message);
}

void Relay::DeadLetterRefused(const kafka::Delivery& d, tracking::Transaction* tx) {
  // The broker refused a record the producer had accepted (e.g. larger than
  // the topic's max.message.bytes). The row itself is gone from memory; what
  // identifies it is its uuid header and its transaction.
  outbox::RowIdentity identity;
  identity.offset = -1;
  if (!tx->transaction_ids.empty()) identity.transaction_id = tx->transaction_ids.front();
  std::optional<std::string_view> metadata;
  for (const auto& [name, value] : d.headers) {
    if (name == outbox::kUuidHeader) identity.uuid = value;
  }
  Error reason{ErrorCode::kPoison, fmt::format("{} (offset unknown: select the row by uuid '{}')",
                                               d.error->message, identity.uuid)};
  const outbox::KafkaRecord& record = refused_letters_->Build(
      reason, identity, config_.table_name.ToString(), tx->final_lsn, d.value, metadata);
  spdlog::warn("dead-lettering refused record uuid='{}' of transaction {} to {}: {}", identity.uuid,
               identity.transaction_id, config_.dlq_topic, d.error->message);
  stats_.dead_lettered.fetch_add(1, std::memory_order_relaxed);
  // The refused message still holds its pending token, so the transaction
  // cannot complete between these two calls.
  tracker_->AddDeadLetter(tx);
  auto accepted = sink_->Produce(record, tx);
  while (accepted && *accepted == kafka::Sink::Accepted::kQueueFull) {
    std::this_thread::sleep_for(milliseconds(1));
    accepted = sink_->Produce(record, tx);
  }
  if (!accepted) {
    tracker_->OnFailed(tx, fmt::format("cannot dead-letter refused record uuid='{}': {}",
                                       identity.uuid, accepted.error().message));
    return;
  }
  tracker_->OnDelivered(tx);  // the refused original is settled by its dead letter
}

void Relay::LogProgress() {
  auto now = Clock::now();
  if (now - last_progress_log_ < std::chrono::seconds(30)) return;
  last_progress_log_ = now;
  auto s = tracker_->stats();
  spdlog::info(
      "progress: {} transactions, {} rows, {} delivered, {} dead-lettered; "
      "confirmed {}, {} rows in flight",
      stats_.transactions.load(), stats_.rows.load(), stats_.delivered.load(),
      stats_.dead_lettered.load(), s.confirmed, s.rows_in_flight);
}

int Relay::Shutdown(pg::ReplicationStream* stream, bool failed) {
  auto deadline = Clock::now() + milliseconds(config_.shutdown_timeout_ms);
  auto remaining = [&] {
    return std::max(milliseconds(0),
                    std::chrono::duration_cast<milliseconds>(deadline - Clock::now()));
  };
  bool drained = false;
  if (!failed) {
    spdlog::info("stopping: flushing {} rows in flight", tracker_->rows_in_flight());
    // Flush sends what linger holds back; deliveries then drain the tracker
    // and the marker marks. Keep talking to the walsender meanwhile.
    if (auto st = sink_->Flush(std::min(remaining(), milliseconds(1000))); !st) {
      spdlog::debug("{}", st.error().message);
    }
    while (!(drained = tracker_->WaitEmpty(milliseconds(200))) && !tracker_->failure() &&
           remaining() > milliseconds(0)) {
      if (stream != nullptr) {
        if (auto st = SendStatus(*stream, false); !st) stream = nullptr;
      }
    }
  }
  if (marker_) marker_->Stop(remaining());
  if (stream != nullptr) {
    // The final word: everything confirmed, so the next start sends nothing twice.
    if (auto st = SendStatus(*stream, true); !st) {
      spdlog::warn("final status update: {}", st.error().message);
    }
    (void)stream->Finish(std::min(remaining(), milliseconds(2000)) + milliseconds(100));
  }
  producer_ = nullptr;
  sink_.reset();  // joins the delivery thread
  if (sampler_) sampler_->Stop();
  auto failure = tracker_->failure();
  if (failed || failure) {
    if (failure) spdlog::error("stopped after a delivery failure: {}", *failure);
    spdlog::error("stopped without confirming past {}; a restart resumes there",
                  tracker_->confirmed());
    return kExitFailure;
  }
  if (!drained) {
    auto s = tracker_->stats();
    spdlog::error(
        "shutdown timeout: {} transactions in flight ({} rows unacknowledged by Kafka, {} "
        "transactions delivered but not marked); confirmed {}",
        s.transactions, s.rows_in_flight, s.awaiting_mark, s.confirmed);
    return kExitFailure;
  }
  spdlog::info("stopped cleanly: confirmed {}, {} rows delivered", tracker_->confirmed(),
               stats_.delivered.load());
  return 0;
}

}  // namespace outbox_relay::app
