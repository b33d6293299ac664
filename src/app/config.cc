#include "outbox_relay/app/config.h"

#include <CLI/CLI.hpp>

namespace outbox_relay::app {

void AddLogFlags(CLI::App& app, LogConfig& c) {
  app.add_option("--log-format", c.format, "Log format: text or json")
      ->envname("OUTBOX_LOG_FORMAT")
      ->check(CLI::IsMember({"text", "json"}))
      ->capture_default_str();
  app.add_option("--log-level", c.level, "Log level: trace, debug, info, warn, error")
      ->envname("OUTBOX_LOG_LEVEL")
      ->check(CLI::IsMember({"trace", "debug", "info", "warn", "error"}))
      ->capture_default_str();
}

void AddRunFlags(CLI::App& app, RelayConfig& c) {
  app.add_option("--database-url", c.database_url,
                 "PostgreSQL connection string or URI of the service database")
      ->envname("DATABASE_URL");
  app.add_option("--kafka-brokers", c.kafka_brokers, "Kafka bootstrap servers, host:port,...")
      ->envname("KAFKA_BROKERS");
  app.add_option("--table", c.table, "The outbox table, schema-qualified")
      ->envname("OUTBOX_TABLE")
      ->capture_default_str();
  app.add_option("--publication", c.publication, "Publication the slot reads (created if missing)")
      ->envname("OUTBOX_PUBLICATION")
      ->capture_default_str();
  app.add_option("--slot", c.slot, "Logical replication slot (created if missing)")
      ->envname("OUTBOX_SLOT")
      ->capture_default_str();
  app.add_option("--service", c.service, "Service name: the `service` label of the metrics")
      ->envname("OUTBOX_SERVICE")
      ->capture_default_str();
  app.add_option("--topic-template", c.mapper.topic_template,
                 "Kafka topic from metadata: {Key} or {Key:aggregate} (the part before the "
                 "first '.')")
      ->envname("OUTBOX_TOPIC_TEMPLATE")
      ->capture_default_str();
  app.add_option("--key-field", c.mapper.key_field,
                 "Metadata key whose value is the Kafka record key; when it is empty or absent, "
                 "the metadata's partition_key, else the empty key, as the Go pipeline's "
                 "partitioning marshaler (set it empty for a null key, as DefaultMarshaler)")
      ->envname("OUTBOX_KEY_FIELD")
      ->capture_default_str();
  app.add_option("--partition-key-header", c.mapper.partition_key_header,
                 "Add the partition_key header (= the record key), as the Go middleware did")
      ->envname("OUTBOX_PARTITION_KEY_HEADER")
      ->capture_default_str();
  app.add_option("--commit-lsn-header", c.mapper.commit_lsn_header,
                 "Name of an extra header carrying the commit LSN (empty: none)")
      ->envname("OUTBOX_COMMIT_LSN_HEADER");
  app.add_option("--column-uuid", c.columns.uuid, "Column with the message UUID")
      ->envname("OUTBOX_COLUMN_UUID")
      ->capture_default_str();
  app.add_option("--column-payload", c.columns.payload, "Column with the payload (Kafka value)")
      ->envname("OUTBOX_COLUMN_PAYLOAD")
      ->capture_default_str();
  app.add_option("--column-metadata", c.columns.metadata, "Column with the metadata JSON")
      ->envname("OUTBOX_COLUMN_METADATA")
      ->capture_default_str();
  app.add_option("--column-transaction-id", c.columns.transaction_id,
                 "Column with the writing transaction's xid8")
      ->envname("OUTBOX_COLUMN_TRANSACTION_ID")
      ->capture_default_str();
  app.add_option("--column-offset", c.columns.offset, "Column with the row's sequence number")
      ->envname("OUTBOX_COLUMN_OFFSET")
      ->capture_default_str();
  app.add_option("--column-acked", c.acked_column,
                 "Column set to the offset once published (NULL until then)")
      ->envname("OUTBOX_COLUMN_ACKED")
      ->capture_default_str();
  app.add_option("--column-created-at", c.created_at_column,
                 "Column with the row's creation time: outbox_forwarder_lag_seconds is now minus "
                 "the oldest unacked one (empty: no lag metric)")
      ->envname("OUTBOX_COLUMN_CREATED_AT")
      ->capture_default_str();
  app.add_option("--mark", c.mark,
                 "Mark published rows (offset_acked); confirmation waits for the marking")
      ->envname("OUTBOX_MARK")
      ->capture_default_str();
  app.add_option("--kafka-property", c.kafka_properties,
                 "librdkafka property key=value, repeatable (TLS, SASL, compression, tuning). "
                 "Env OUTBOX_KAFKA_PROPERTIES: 'k=v;k=v' (\\; for a ';' in a value) or one per "
                 "line (values verbatim)");
  app.add_option("--sink", c.sink_flag, "Where records go: kafka, or null (benchmarks only)")
      ->envname("OUTBOX_SINK")
      ->check(CLI::IsMember({"kafka", "null"}))
      ->capture_default_str();
  app.add_option("--delivery", c.delivery_flag,
                 "at-least-once (the idempotent producer; a crash re-sends what was in flight) or "
                 "exactly-once (Kafka transactions holding the relay's progress: nothing twice, "
                 "for consumers with isolation.level=read_committed)")
      ->envname("OUTBOX_DELIVERY")
      ->check(CLI::IsMember({"at-least-once", "exactly-once"}))
      ->capture_default_str();
  app.add_option("--transactional-id", c.transactional_id,
                 "Exactly-once: the producer's transactional.id (empty: outbox-relay.<system "
                 "id>.<database>.<slot>, so relays of different databases never share one)")
      ->envname("OUTBOX_TRANSACTIONAL_ID");
  app.add_option("--progress-topic", c.progress_topic,
                 "Exactly-once: compacted topic of the relay's progress, written in each Kafka "
                 "transaction (created when missing)")
      ->envname("OUTBOX_PROGRESS_TOPIC")
      ->capture_default_str();
  app.add_option("--txn-interval-ms", c.txn_interval_ms,
                 "Exactly-once: a Kafka transaction is committed this long after it began")
      ->envname("OUTBOX_TXN_INTERVAL_MS")
      ->capture_default_str();
  app.add_option("--txn-max-rows", c.txn_max_rows,
                 "Exactly-once: ... or once it holds this many rows (a larger PostgreSQL "
                 "transaction is split)")
      ->envname("OUTBOX_TXN_MAX_ROWS")
      ->capture_default_str();
  app.add_option("--transaction-timeout-ms", c.transaction_timeout_ms,
                 "Exactly-once: transaction.timeout.ms of the producer (a Kafka transaction "
                 "never stays open longer; records wait for Kafka at most this long)")
      ->envname("OUTBOX_TRANSACTION_TIMEOUT_MS")
      ->capture_default_str();
  app.add_option("--max-in-flight", c.max_in_flight,
                 "Rows produced but not yet acknowledged before the relay stops reading")
      ->envname("OUTBOX_MAX_IN_FLIGHT")
      ->capture_default_str();
  app.add_option("--marker-batch", c.marker_batch, "Transactions marked per statement, at most")
      ->envname("OUTBOX_MARKER_BATCH")
      ->capture_default_str();
  app.add_option("--status-interval-ms", c.status_interval_ms,
                 "Standby status update interval (keep well below wal_sender_timeout)")
      ->envname("OUTBOX_STATUS_INTERVAL_MS")
      ->capture_default_str();
  app.add_option("--shutdown-timeout-ms", c.shutdown_timeout_ms,
                 "On SIGTERM: time to flush Kafka and the marker before giving up")
      ->envname("OUTBOX_SHUTDOWN_TIMEOUT_MS")
      ->capture_default_str();
  app.add_option("--on-poison", c.on_poison_flag,
                 "A row that cannot be published: dlq (dead-letter topic, then continue) or "
                 "halt (stop before it)")
      ->envname("OUTBOX_ON_POISON")
      ->check(CLI::IsMember({"dlq", "halt"}))
      ->capture_default_str();
  app.add_option("--dlq-topic", c.dlq_topic, "Dead-letter topic")
      ->envname("OUTBOX_DLQ_TOPIC")
      ->capture_default_str();
  app.add_option("--dlq-max-bytes", c.dlq_max_bytes,
                 "Largest dead-letter record; bigger payloads are replaced by a reference")
      ->envname("OUTBOX_DLQ_MAX_BYTES")
      ->capture_default_str();
  app.add_option("--on-slot-lost", c.on_slot_lost_flag,
                 "The slot is missing or invalidated: reconcile (recreate it and backfill the "
                 "unacked rows) or fail (exit with an error)")
      ->envname("OUTBOX_ON_SLOT_LOST")
      ->check(CLI::IsMember({"reconcile", "fail"}))
      ->capture_default_str();
  app.add_option("--backfill", c.backfill,
                 "When the slot is created: publish the unacked rows committed before it "
                 "(migration from a polling forwarder)")
      ->envname("OUTBOX_BACKFILL")
      ->capture_default_str();
  app.add_option("--backfill-batch", c.backfill_batch,
                 "Rows per backfill query (a page of the keyset scan over the unacked rows)")
      ->envname("OUTBOX_BACKFILL_BATCH")
      ->capture_default_str();
  app.add_option("--failover-slot", c.failover_slot,
                 "Create the slot as a failover slot (PostgreSQL 17+, failover = true; an "
                 "existing slot is altered), so that a physical standby keeps a synced copy and "
                 "the relay resumes from it after a promotion, without a backfill. Needs on the "
                 "primary synchronized_standby_slots = '<the standby's physical slot>'; on the "
                 "standby sync_replication_slots = on, hot_standby_feedback = on, "
                 "primary_slot_name and a dbname in primary_conninfo; and a DATABASE_URL naming "
                 "both servers with target_session_attrs=read-write. `check --standby-url` "
                 "verifies all of it. Older servers: refused at start")
      ->envname("OUTBOX_FAILOVER_SLOT")
      ->capture_default_str();
  app.add_option("--create-topics", c.create_topics, "Create missing Kafka topics")
      ->envname("OUTBOX_CREATE_TOPICS")
      ->capture_default_str();
  app.add_option("--topic-partitions", c.topic_partitions, "Partitions of created topics")
      ->envname("OUTBOX_TOPIC_PARTITIONS")
      ->capture_default_str();
  app.add_option("--topic-replication-factor", c.topic_replication_factor,
                 "Replication factor of created topics (-1: the broker's default)")
      ->envname("OUTBOX_TOPIC_REPLICATION_FACTOR")
      ->capture_default_str();
  app.add_option("--metrics-addr", c.metrics_addr,
                 "HTTP listener for /metrics, /healthz, /readyz (empty: off)")
      ->envname("OUTBOX_METRICS_ADDR")
      ->capture_default_str();
  app.add_option("--row-count-interval-s", c.row_count_interval_s,
                 "How often outbox_rows_total is sampled from the table")
      ->envname("OUTBOX_ROW_COUNT_INTERVAL_S")
      ->capture_default_str();
}

std::vector<std::string> SplitPropertyList(std::string_view text) {
  // One property per line when there is a line break: values are then taken
  // verbatim, ';' included. Otherwise ';' separates, and "\;" is a ';' and
  // "\\" a backslash inside a value (a password may hold either).
  const bool lines = text.find('\n') != std::string_view::npos;
  std::vector<std::string> out;
  std::string item;
  auto flush = [&] {
    std::string_view v = item;
    while (!v.empty() && (v.front() == ' ' || v.front() == '\t')) v.remove_prefix(1);
    while (!v.empty() && (v.back() == ' ' || v.back() == '\t' || v.back() == '\r')) {
      v.remove_suffix(1);
    }
    if (!v.empty()) out.emplace_back(v);
    item.clear();
  };
  for (size_t i = 0; i < text.size(); ++i) {
    char c = text[i];
    if (lines) {
      if (c == '\n') {
        flush();
      } else {
        item.push_back(c);
      }
    } else if (c == '\\' && i + 1 < text.size() && (text[i + 1] == ';' || text[i + 1] == '\\')) {
      item.push_back(text[++i]);
    } else if (c == ';') {
      flush();
    } else {
      item.push_back(c);
    }
  }
  flush();
  return out;
}

namespace {

std::unexpected<Error> Bad(std::string_view flag, std::string_view env, std::string_view why) {
  return Fail(ErrorCode::kInvalidArgument, "invalid setting {} ({}): {}", flag, env, why);
}

}  // namespace

Status Validate(RelayConfig& c) {
  if (c.database_url.empty()) {
    return Bad("--database-url", "DATABASE_URL", "required, e.g. postgresql://user@host/db");
  }
  // The flags are checked by CLI11 (IsMember); a config built in code is checked here.
  if (c.sink_flag != "kafka" && c.sink_flag != "null") {
    return Bad("--sink", "OUTBOX_SINK", fmt::format("'{}': kafka or null", c.sink_flag));
  }
  if (c.on_poison_flag != "dlq" && c.on_poison_flag != "halt") {
    return Bad("--on-poison", "OUTBOX_ON_POISON",
               fmt::format("'{}': dlq or halt", c.on_poison_flag));
  }
  if (c.on_slot_lost_flag != "reconcile" && c.on_slot_lost_flag != "fail") {
    return Bad("--on-slot-lost", "OUTBOX_ON_SLOT_LOST",
               fmt::format("'{}': reconcile or fail", c.on_slot_lost_flag));
  }
  c.sink = c.sink_flag == "null" ? SinkKind::kNull : SinkKind::kKafka;
  if (c.delivery_flag != "at-least-once" && c.delivery_flag != "exactly-once") {
    return Bad("--delivery", "OUTBOX_DELIVERY",
               fmt::format("'{}': at-least-once or exactly-once", c.delivery_flag));
  }
  c.delivery = c.delivery_flag == "exactly-once" ? DeliveryMode::kExactlyOnce
                                                 : DeliveryMode::kAtLeastOnce;
  if (c.delivery == DeliveryMode::kExactlyOnce) {
    if (c.sink != SinkKind::kKafka) {
      return Bad("--delivery", "OUTBOX_DELIVERY", "exactly-once needs --sink kafka");
    }
    if (c.progress_topic.empty()) {
      return Bad("--progress-topic", "OUTBOX_PROGRESS_TOPIC", "empty with --delivery=exactly-once");
    }
    if (c.txn_interval_ms < 1 || c.txn_interval_ms > 60000) {
      return Bad("--txn-interval-ms", "OUTBOX_TXN_INTERVAL_MS", "must be 1..60000");
    }
    if (c.txn_max_rows < 1) return Bad("--txn-max-rows", "OUTBOX_TXN_MAX_ROWS", "must be >= 1");
    if (c.transaction_timeout_ms < 1000 || c.transaction_timeout_ms > 900000) {
      return Bad("--transaction-timeout-ms", "OUTBOX_TRANSACTION_TIMEOUT_MS",
                 "must be 1000..900000 (the broker's transaction.max.timeout.ms is 15 min)");
    }
    if (c.txn_interval_ms * 4 > c.transaction_timeout_ms) {
      return Bad("--txn-interval-ms", "OUTBOX_TXN_INTERVAL_MS",
                 "must be well below --transaction-timeout-ms (a quarter of it at most)");
    }
  }
  c.on_poison =
      c.on_poison_flag == "halt" ? pipeline::OnPoison::kHalt : pipeline::OnPoison::kDeadLetter;
  c.on_slot_lost = c.on_slot_lost_flag == "fail" ? pipeline::OnSlotLost::kFail
                                                 : pipeline::OnSlotLost::kReconcile;
  if (c.sink == SinkKind::kKafka && c.kafka_brokers.empty()) {
    return Bad("--kafka-brokers", "KAFKA_BROKERS", "required, e.g. kafka-0:9092,kafka-1:9092");
  }
  auto table = pg::QualifiedName::Parse(c.table);
  if (!table) return Bad("--table", "OUTBOX_TABLE", table.error().message);
  c.table_name = *table;
  if (c.publication.empty()) return Bad("--publication", "OUTBOX_PUBLICATION", "empty");
  // Slot names: lower-case letters, digits and underscores, at most 63 (NAMEDATALEN-1).
  if (c.slot.empty() || c.slot.size() > 63 ||
      c.slot.find_first_not_of("abcdefghijklmnopqrstuvwxyz0123456789_") != std::string::npos) {
    return Bad("--slot", "OUTBOX_SLOT",
               fmt::format("'{}': use 1-63 lower-case letters, digits and underscores", c.slot));
  }
  if (auto t = outbox::TopicTemplate::Compile(c.mapper.topic_template); !t) {
    return Bad("--topic-template", "OUTBOX_TOPIC_TEMPLATE", t.error().message);
  }
  struct NamedColumn {
    const char* flag;
    const char* env;
    const std::string* value;
  };
  for (const NamedColumn& col : {
           NamedColumn{"--column-uuid", "OUTBOX_COLUMN_UUID", &c.columns.uuid},
           NamedColumn{"--column-payload", "OUTBOX_COLUMN_PAYLOAD", &c.columns.payload},
           NamedColumn{"--column-metadata", "OUTBOX_COLUMN_METADATA", &c.columns.metadata},
           NamedColumn{"--column-transaction-id", "OUTBOX_COLUMN_TRANSACTION_ID",
                       &c.columns.transaction_id},
           NamedColumn{"--column-offset", "OUTBOX_COLUMN_OFFSET", &c.columns.offset},
       }) {
    if (col.value->empty()) return Bad(col.flag, col.env, "empty column name");
  }
  if (c.mark && c.acked_column.empty()) {
    return Bad("--column-acked", "OUTBOX_COLUMN_ACKED", "empty; use --mark=false to not mark");
  }
  if (c.max_in_flight < 1) return Bad("--max-in-flight", "OUTBOX_MAX_IN_FLIGHT", "must be >= 1");
  if (c.marker_batch < 1) return Bad("--marker-batch", "OUTBOX_MARKER_BATCH", "must be >= 1");
  if (c.status_interval_ms < 10 || c.status_interval_ms > 60000) {
    return Bad("--status-interval-ms", "OUTBOX_STATUS_INTERVAL_MS", "must be 10..60000");
  }
  if (c.shutdown_timeout_ms < 0) {
    return Bad("--shutdown-timeout-ms", "OUTBOX_SHUTDOWN_TIMEOUT_MS", "must be >= 0");
  }
  if (c.on_poison == pipeline::OnPoison::kDeadLetter && c.dlq_topic.empty()) {
    return Bad("--dlq-topic", "OUTBOX_DLQ_TOPIC", "empty while --on-poison=dlq");
  }
  if (c.dlq_max_bytes < 1024)
    return Bad("--dlq-max-bytes", "OUTBOX_DLQ_MAX_BYTES", "must be >= 1024");
  if (c.backfill_batch < 1) return Bad("--backfill-batch", "OUTBOX_BACKFILL_BATCH", "must be >= 1");
  if (c.topic_partitions < 1) {
    return Bad("--topic-partitions", "OUTBOX_TOPIC_PARTITIONS", "must be >= 1");
  }
  if (c.topic_replication_factor == 0 || c.topic_replication_factor < -1) {
    return Bad("--topic-replication-factor", "OUTBOX_TOPIC_REPLICATION_FACTOR",
               "must be -1 (broker default) or >= 1");
  }
  if (c.row_count_interval_s < 1) {
    return Bad("--row-count-interval-s", "OUTBOX_ROW_COUNT_INTERVAL_S", "must be >= 1");
  }
  // Properties: flags first, then the environment list.
  std::vector<std::string> props = c.kafka_properties;
  if (const char* env = std::getenv("OUTBOX_KAFKA_PROPERTIES")) {
    for (auto& p : SplitPropertyList(env)) props.push_back(std::move(p));
  }
  c.kafka_property_pairs.clear();
  for (size_t i = 0; i < props.size(); ++i) {
    const std::string& p = props[i];
    size_t eq = p.find('=');
    if (eq == std::string::npos || eq == 0) {
      // Not repeated: the text may be (part of) a secret.
      return Bad("--kafka-property", "OUTBOX_KAFKA_PROPERTIES",
                 fmt::format("property {} of {} is not key=value (a ';' inside a value is "
                             "written \\; in OUTBOX_KAFKA_PROPERTIES, or give one property per "
                             "line)",
                             i + 1, props.size()));
    }
    c.kafka_property_pairs.emplace_back(p.substr(0, eq), p.substr(eq + 1));
  }
  return Ok();
}

kafka::ProducerOptions ProducerOptionsOf(const RelayConfig& c) {
  kafka::ProducerOptions opts;
  opts.brokers = c.kafka_brokers;
  opts.properties = c.kafka_property_pairs;
  opts.create_topics = c.create_topics;
  opts.topic_partitions = static_cast<int>(c.topic_partitions);
  opts.topic_replication_factor = static_cast<int>(c.topic_replication_factor);
  return opts;
}

Result<std::unique_ptr<kafka::Sink>> MakeSink(const RelayConfig& config,
                                              kafka::DeliveryCallback on_delivery,
                                              kafka::SinkErrorCallback on_error) {
  if (config.sink == SinkKind::kNull) {
    return std::unique_ptr<kafka::Sink>(std::make_unique<kafka::NullSink>(std::move(on_delivery)));
  }
  auto producer = kafka::KafkaProducer::Create(ProducerOptionsOf(config), std::move(on_delivery),
                                               std::move(on_error));
  if (!producer) return std::unexpected(producer.error());
  return std::unique_ptr<kafka::Sink>(std::move(*producer));
}

}  // namespace outbox_relay::app
