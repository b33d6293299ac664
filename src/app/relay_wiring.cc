#include <spdlog/spdlog.h>

#include <charconv>
#include <utility>

#include "outbox_relay/app/commands.h"
#include "outbox_relay/app/failover.h"
#include "outbox_relay/app/relay.h"
#include "outbox_relay/core/failpoint.h"
#include "outbox_relay/kafka/admin.h"
#include "outbox_relay/kafka/producer.h"
#include "outbox_relay/pg/publication.h"
#include "outbox_relay/pg/relay_schema.h"
#include "outbox_relay/pg/replication.h"
#include "outbox_relay/pg/rows.h"
#include "outbox_relay/pipeline/liveness.h"
#include "outbox_relay/pipeline/tables.h"

// The relay's set-up: from the settings (RelayConfig) to each component's
// options, and the checks that can be made before the slot is touched.
namespace outbox_relay::app {

namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

std::vector<std::string> NeededColumns(const outbox::ColumnNames& c) {
  return {c.uuid, c.payload, c.metadata, c.transaction_id, c.offset};
}

// A dead letter must pass the producer's own size check, or the row it
// stands in for stops the stream ("cannot dead-letter row"): with
// message.max.bytes set below --dlq-max-bytes (the default 1,000,000 is
// librdkafka's default too), dead letters shed their payload at the smaller
// of the two.
size_t DeadLetterMaxBytes(const RelayConfig& config) {
  size_t max_bytes = static_cast<size_t>(config.dlq_max_bytes);
  for (const auto& [key, value] : config.kafka_property_pairs) {
    size_t v = 0;
    auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), v);
    if (key == "message.max.bytes" && ec == std::errc() && end == value.data() + value.size() &&
        v < max_bytes) {
      spdlog::info("dead letters limited to {} bytes (kafka property message.max.bytes)", v);
      max_bytes = v;
    }
  }
  return max_bytes;
}

}  // namespace

Status Relay::PrepareSeedTable(pg::Connection& conn) {
  // Fail fast on a table that cannot work, before touching slots.
  auto table = pg::QueryTable(conn, config_.table_name);
  if (!table) return std::unexpected(table.error());
  if (!table->exists) {
    return Fail(ErrorCode::kInvalidArgument,
                "invalid setting --table (OUTBOX_TABLE): table {} does not exist (create it with "
                "sql/outbox.sql)",
                config_.table_name.ToString());
  }
  if (table->relkind != 'r' && table->relkind != 'p') {
    return Fail(ErrorCode::kInvalidArgument,
                "invalid setting --table (OUTBOX_TABLE): {} is not a table (relkind '{}'): "
                "logical replication publishes plain and partitioned tables only",
                config_.table_name.ToString(), table->relkind);
  }
  std::optional<std::string> params[] = {config_.table_name.Quoted()};
  auto cols = conn.ExecParams(
      "SELECT attname FROM pg_attribute WHERE attrelid = to_regclass($1) AND attnum > 0 AND "
      "NOT attisdropped",
      params);
  if (!cols) return std::unexpected(cols.error());
  pgoutput::Relation rel;
  pg::Rows rows(cols->get());
  for (int i = 0; i < rows.size(); ++i) {
    auto name = rows.Text(i, 0);
    if (!name) return std::unexpected(name.error());
    rel.columns.push_back({0, std::string(*name), 0, -1});
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
  if (!config_.created_at_column.empty() && rel.ColumnIndex(config_.created_at_column) < 0) {
    return Fail(ErrorCode::kInvalidArgument,
                "invalid setting --column-created-at (OUTBOX_COLUMN_CREATED_AT): table {} has no "
                "column '{}' (it dates the oldest unpublished row for "
                "outbox_forwarder_lag_seconds; set it to '' to go without that metric)",
                config_.table_name.ToString(), config_.created_at_column);
  }

  return Ok();
}

Status Relay::Prepare() {
  auto conn = pg::Connection::Open(config_.database_url, pg::Connection::Mode::kNormal,
                                   "outbox-relay", config_.pg_network);
  if (!conn) return std::unexpected(conn.error());
  spdlog::info("connected to PostgreSQL {} as {}", conn->server_version(), conn->user());
  if (auto st = ValidateFailoverSlot(config_, *conn); !st) return st;

  if (!config_.watermill) {
    if (auto st = PrepareSeedTable(*conn); !st) return st;
  }
  if (auto st = pg::EnsureRelaySchema(*conn); !st) return st;
  if (!config_.watermill) {
    if (auto st = pg::EnsurePublication(*conn, config_.publication, config_.table_name,
                                        NeededColumns(config_.columns));
        !st) {
      return st;
    }
  }

  // Test-only faults (core/failpoint.h), so the fault tests can show what they would catch.
  if constexpr (failpoint::kCompiledIn) {
    if (failpoint::Active("confirm-newest")) {
      spdlog::warn("TEST FAULT confirm-newest: the confirmation rule is broken on purpose");
      tracker_->EnableUnsafeConfirmNewest();
    }
    if (auto after = failpoint::Active("fatal-after")) {
      fatal_after_ = std::stoull(std::string(*after));
      spdlog::warn("TEST FAULT: fatal producer error after {} records", fatal_after_);
    }
  }

  pipeline::PublisherOptions po;
  po.table = config_.table_name.ToString();
  po.mapper = config_.mapper;
  po.columns = config_.columns;
  if (config_.watermill) {
    po.table = "(watermill tables)";
    po.columns = pipeline::WatermillColumnNames();
  }
  po.on_poison = config_.on_poison;
  po.dlq_topic = config_.dlq_topic;
  po.dlq_max_bytes = DeadLetterMaxBytes(config_);
  po.max_in_flight = config_.max_in_flight;
  po.max_in_flight_bytes = config_.max_in_flight_bytes;
  po.max_awaiting_mark = static_cast<size_t>(config_.marker_batch) * 4;
  po.stop_grace = stop_grace();
  po.max_topics = static_cast<size_t>(config_.max_topics);
  auto publisher = pipeline::Publisher::Create(po, tracker_.get(), &stats_, &metrics_, &*stop_);
  if (!publisher) return std::unexpected(publisher.error());
  publisher_ = std::move(*publisher);

  if (auto st = AttachSink(); !st) return st;

  if (config_.watermill) {
    if (config_.mark) {
      watermill_progress_ = std::make_unique<marker::WatermillProgress>(
          std::vector<marker::WatermillProgressTable>{}, config_.watermill_settings.consumer_group,
          tracker_.get());
    }
    pipeline::WatermillOptions wo;
    wo.database_url = config_.database_url;
    wo.publication = config_.publication;
    wo.slot = config_.slot;
    wo.mark = config_.mark;
    wo.backfill_batch = config_.backfill_batch;
    wo.join_lock_timeout = milliseconds(config_.watermill_join_lock_timeout_ms);
    wo.discover_interval = std::chrono::seconds(config_.watermill_discover_interval_s);
    watermill_ = std::make_unique<pipeline::WatermillTables>(
        config_.watermill_settings, wo, publisher_.get(), tracker_.get(), &stats_, &*stop_,
        watermill_progress_.get());
    if (auto st = watermill_->Prepare(*conn); !st) return st;
  }

  if (config_.mark) {
    marker::MarkerOptions mo;
    mo.database_url = config_.database_url;
    mo.table = config_.table_name;
    mo.transaction_id_column = config_.columns.transaction_id;
    mo.offset_column = config_.columns.offset;
    mo.acked_column = config_.acked_column;
    mo.slot_name = config_.slot;
    if (config_.watermill) {
      mo.acked_column.clear();  // no per-row column: the offsets tables instead
      mo.progress = watermill_progress_.get();
    }
    mo.batch_max = static_cast<size_t>(config_.marker_batch);
    mo.interval = std::chrono::milliseconds(config_.marker_interval_ms);
    mo.rows_worth_two_statements = static_cast<uint64_t>(config_.marker_split_rows);
    mo.on_statement = [this] { metrics_.marker_statements().Increment(); };
    mo.on_marked = [this] { marked_.Ring(); };
    mo.on_round = [this](const Status& round) {
      if (round) {
        marker_failing_since_ns_.store(0);
        return;
      }
      metrics_.CountMarkerRoundFailed();
      int64_t none = 0;
      marker_failing_since_ns_.compare_exchange_strong(none,
                                                       Clock::now().time_since_epoch().count());
      MutexLock lock(&readyz_mu_);
      marker_failure_ = round.error().message;
    };
    mo.network = config_.pg_network;
    marker_ = std::make_unique<marker::Marker>(mo, tracker_.get(), [this](const Error&) {
      metrics_.CountError(metrics::ErrorReason::kDbAck);
      last_marker_error_ns_.store(Clock::now().time_since_epoch().count());
    });
    if (auto st = marker_->Start(); !st) return st;
  }

  pipeline::SlotSetupOptions so;
  so.database_url = config_.database_url;
  so.replication_database_url = config_.replication_database_url;
  so.network = config_.pg_network;
  so.slot = config_.slot;
  so.table = config_.table_name;
  so.columns = config_.columns;
  so.acked_column = config_.acked_column;
  so.mark = config_.mark;
  so.backfill = config_.backfill;
  so.on_slot_lost = config_.on_slot_lost;
  so.backfill_batch = config_.backfill_batch;
  so.failover_slot = config_.failover_slot;
  if (watermill_) {
    so.backfill_rows = [this](pg::Connection& c, const std::string& snapshot) {
      return watermill_->Backfill(c, snapshot);
    };
  }
  so.before_backfill = [this] { return EnsureTransactions(); };
  slot_setup_ =
      std::make_unique<pipeline::SlotSetup>(so, publisher_.get(), tracker_.get(), &stats_, &*stop_);
  return Ok();
}

Status Relay::AttachSink() {
  auto made = MakeRelaySink();
  if (!made) return std::unexpected(made.error());
  kafka_producer_ = made->kafka;
  if (kafka::KafkaProducer* producer = made->kafka) {
    // Up to 10 s for a first answer, in slices: a stop request is not held up.
    Status reached = Fail(ErrorCode::kTransient, "no answer");
    for (int i = 0; i < 10 && !reached && !stop_->requested(); ++i) {
      stats_.Beat();
      reached = producer->CheckConnection(milliseconds(1000));
      // Refused credentials or a certificate that does not verify: a setting.
      if (!reached && reached.error().code == ErrorCode::kInvalidArgument) return reached;
    }
    if (!reached) {
      spdlog::warn("Kafka not reachable yet ({}); records wait in the producer until it is",
                   reached.error().message);
    }
    stats_.kafka_reachable.store(static_cast<bool>(reached));
    if (fatal_after_ > 0) {
      publisher_->InjectFatalAfter(fatal_after_,
                                   [producer] { producer->InjectFatalErrorForTest(); });
    }
  } else {
    stats_.kafka_reachable.store(true);
  }
  // Exactly-once: the transactions are initialised (fencing every other
  // producer of the transactional.id) only once this instance owns the
  // slot: EnsureTransactions, before the backfill and before streaming.
  transactions_ready_ = false;
  publisher_->AttachSink(std::move(made->sink));
  return Ok();
}

pipeline::SamplerOptions Relay::SamplerSettings() const {
  pipeline::SamplerOptions o;
  o.database_url = config_.database_url;
  o.network = config_.pg_network;
  o.table = config_.table_name;
  o.acked_column = config_.acked_column;
  o.created_at_column = config_.created_at_column;
  o.row_count_interval_s = config_.row_count_interval_s;
  o.mark = config_.mark;
  o.watermill = config_.watermill;
  o.watermill_settings = config_.watermill_settings;
  o.slot = config_.slot;
  return o;
}

}  // namespace outbox_relay::app
