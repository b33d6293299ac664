// The Relay's side of exactly-once delivery: the producer it makes, the facts
// the progress is trusted on, and when the unit (pipeline/exactly_once.h)
// starts or is rebased. The protocol itself is the unit's.
#include <spdlog/spdlog.h>

#include "outbox_relay/app/relay.h"
#include "outbox_relay/core/failpoint.h"
#include "outbox_relay/pg/relay_schema.h"
#include "outbox_relay/pg/replication.h"

namespace outbox_relay::app {

namespace {

using std::chrono::milliseconds;

}  // namespace

Result<pg::Connection> Relay::OpenReplication() const {
  return pg::Connection::Open(config_.replication_url(), pg::Connection::Mode::kReplication,
                              "outbox-relay", config_.pg_network);
}

Result<Relay::RelaySink> Relay::MakeRelaySink() {
  auto on_error = [this](const Error&) {
    metrics_.CountError(metrics::ErrorReason::kKafkaUnavailable);
  };
  RelaySink out;
  if (config_.sink == SinkKind::kNull) {
    out.sink = std::make_unique<kafka::NullSink>(publisher_->DeliveryCallback());
    return out;
  }
  kafka::ProducerOptions opts = ProducerOptionsOf(config_);
  if (config_.delivery == DeliveryMode::kExactlyOnce) {
    if (transactional_id_.empty()) {
      auto id = TransactionalId();
      if (!id) return std::unexpected(id.error());
      transactional_id_ = *id;
    }
    opts.transactional_id = transactional_id_;
    opts.transaction_timeout = milliseconds(config_.transaction_timeout_ms);
    opts.transaction_interval = milliseconds(config_.txn_interval_ms);
    opts.batch_size = required_batch_size_;
  }
  auto producer = kafka::KafkaProducer::Create(opts, publisher_->DeliveryCallback(), on_error);
  if (!producer) return std::unexpected(producer.error());
  out.kafka = producer->get();
  out.sink = std::move(*producer);
  return out;
}

Result<std::string> Relay::TransactionalId() {
  if (!config_.transactional_id.empty()) return config_.transactional_id;
  // The cluster (its system identifier), the database and the slot: two
  // relays of different databases never share a transactional.id, and an
  // instance taking a slot over takes its predecessor's, fencing it.
  auto repl = OpenReplication();
  if (!repl) return std::unexpected(repl.error());
  auto identity = pg::IdentifySystem(*repl);
  if (!identity) return std::unexpected(identity.error());
  return pipeline::DefaultTransactionalId(identity->system_id, repl->database(), config_.slot);
}

std::string Relay::ProgressTopic() const {
  return config_.progress_topic.empty() ? pipeline::DefaultProgressTopic(transactional_id_)
                                        : config_.progress_topic;
}

pipeline::TransactionOptions Relay::TransactionOptionsOf() const {
  pipeline::TransactionOptions to;
  to.interval = milliseconds(config_.txn_interval_ms);
  to.max_rows = config_.txn_max_rows;
  if constexpr (failpoint::kCompiledIn) {
    if (failpoint::Active("eos-no-skip")) {
      spdlog::warn("TEST FAULT eos-no-skip: what Kafka already has is produced again");
      to.skip_committed = false;
    }
  }
  return to;
}

Result<pipeline::ProgressFacts> Relay::ProgressFactsOf(pg::Connection& replication_conn,
                                                       const pg::SystemIdentity& identity) {
  pipeline::ProgressFacts facts;
  facts.me = {identity.system_id, replication_conn.database(), config_.slot};
  facts.key = transactional_id_;
  facts.wal_end = identity.xlogpos;
  auto history = pg::ServerWalHistory(replication_conn, identity);
  if (!history) return std::unexpected(history.error());
  facts.history = std::move(*history);
  // The slot's incarnation: the consistent point the relay created it at.
  auto admin = pg::Connection::Open(config_.database_url, pg::Connection::Mode::kNormal,
                                    "outbox-relay", config_.pg_network);
  if (!admin) return std::unexpected(admin.error());
  auto created = pg::ReadState(*admin, config_.slot, pg::kStateSlotCreated);
  if (!created) return std::unexpected(created.error());
  facts.incarnation = created->value_or("");
  return facts;
}

Status Relay::CheckSlotHeld() {
  auto admin = pg::Connection::Open(config_.database_url, pg::Connection::Mode::kNormal,
                                    "outbox-relay", config_.pg_network);
  if (!admin) return std::unexpected(admin.error());
  auto slot = pg::QuerySlot(*admin, config_.slot);
  if (!slot) return std::unexpected(slot.error());
  if (!slot->active || slot->active_pid != last_walsender_pid_) {
    return Fail(ErrorCode::kSlotInUse,
                "slot {} is no longer held by this relay's walsender (pid {}): another instance "
                "took it over; this one does not fence it",
                config_.slot, last_walsender_pid_);
  }
  return Ok();
}

Status Relay::EnsureTransactions(const pipeline::ProgressFacts* known) {
  if (config_.delivery != DeliveryMode::kExactlyOnce) return Ok();
  pipeline::ProgressFacts facts;
  if (known != nullptr) {
    facts = *known;
  } else {
    auto repl = OpenReplication();
    if (!repl) return std::unexpected(repl.error());
    auto identity = pg::IdentifySystem(*repl);
    if (!identity) return std::unexpected(identity.error());
    auto f = ProgressFactsOf(*repl, *identity);
    if (!f) return std::unexpected(f.error());
    facts = std::move(*f);
  }
  if (transactions_ready_) {
    pipeline::ExactlyOnce* eos = publisher_->transactions();
    if (eos->facts().history == facts.history && eos->facts().incarnation == facts.incarnation) {
      return Ok();
    }
    // A promotion, a restore or a recreated slot: what the progress proves
    // is judged again on the history the server has now.
    spdlog::warn(
        "exactly-once: the server's history (timeline {} -> {}) or the slot's "
        "incarnation ({} -> {}) changed: the progress is trusted anew",
        eos->facts().history.timeline, facts.history.timeline, eos->facts().incarnation,
        facts.incarnation);
    return eos->Rebase(facts);
  }
  if (kafka_producer_ == nullptr) {
    return Fail(ErrorCode::kFatal, "internal: exactly-once without Kafka");
  }
  if (!progress_log_) {
    kafka::ProgressLogOptions lo;
    lo.connection = ProducerOptionsOf(config_);
    lo.topic = ProgressTopic();
    // An older relay kept its progress in the topic all relays shared.
    if (config_.progress_topic.empty()) lo.legacy_topic = pipeline::kLegacyProgressTopic;
    lo.replication_factor = static_cast<int>(config_.topic_replication_factor);
    lo.open_wait = milliseconds(config_.transaction_timeout_ms) + milliseconds(15000);
    auto log = kafka::KafkaProgressLog::Create(std::move(lo));
    if (!log) return std::unexpected(log.error());
    progress_log_ = std::move(*log);
  }
  pipeline::ExactlyOnce* eos =
      publisher_->EnableTransactions(TransactionOptionsOf(), kafka_producer_, progress_log_.get());
  // The server's WAL end as IDENTIFY_SYSTEM says it when the progress is
  // judged (after the fencing), not when the facts were gathered.
  eos->ReadWalEndWith([this]() -> Result<Lsn> {
    auto repl = OpenReplication();
    if (!repl) return std::unexpected(repl.error());
    auto identity = pg::IdentifySystem(*repl);
    if (!identity) return std::unexpected(identity.error());
    return identity->xlogpos;
  });
  if (auto st = eos->Start(facts); !st) return st;
  transactions_ready_ = true;
  return Ok();
}

}  // namespace outbox_relay::app
