#include "outbox_relay/app/config.h"

#include <CLI/CLI.hpp>

#include "outbox_relay/app/commands.h"

namespace outbox_relay::app {

namespace {

std::vector<std::string> SplitCommas(std::string_view text) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= text.size()) {
    size_t end = text.find(',', start);
    if (end == std::string_view::npos) end = text.size();
    std::string_view item = text.substr(start, end - start);
    while (!item.empty() && (item.front() == ' ' || item.front() == '\t')) item.remove_prefix(1);
    while (!item.empty() && (item.back() == ' ' || item.back() == '\t')) item.remove_suffix(1);
    if (!item.empty()) out.emplace_back(item);
    start = end + 1;
  }
  return out;
}

}  // namespace

void AddLogFlags(CLI::App& app, LogConfig& c) {
  AddEnumOption(app, "--log-format", "OUTBOX_LOG_FORMAT", &c.format,
                {{"text", LogFormat::kText}, {"json", LogFormat::kJson}},
                "Log format: text or json");
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
  AddEnumOption(app, "--sink", "OUTBOX_SINK", &c.sink,
                {{"kafka", SinkKind::kKafka}, {"null", SinkKind::kNull}},
                "Where records go: kafka, or null (benchmarks only)");
  AddEnumOption(
      app, "--delivery", "OUTBOX_DELIVERY", &c.delivery,
      {{"at-least-once", DeliveryMode::kAtLeastOnce}, {"exactly-once", DeliveryMode::kExactlyOnce}},
      "at-least-once (the idempotent producer; a crash re-sends what was in flight) or "
      "exactly-once (Kafka transactions holding the relay's progress: nothing twice, "
      "for consumers with isolation.level=read_committed)");
  app.add_option("--transactional-id", c.transactional_id,
                 "Exactly-once: the producer's transactional.id (empty: outbox-relay.<system "
                 "id>.<database>.<slot>, so relays of different databases never share one); the "
                 "relay also uses it with '.2' appended (grant both, or a prefixed ACL)")
      ->envname("OUTBOX_TRANSACTIONAL_ID");
  app.add_option("--progress-topic", c.progress_topic,
                 "Exactly-once: compacted topic of the relay's progress, written in each Kafka "
                 "transaction (created when missing; empty: the relay's own, "
                 "<transactional-id>.progress, which no other relay writes)")
      ->envname("OUTBOX_PROGRESS_TOPIC");
  app.add_option("--txn-interval-ms", c.txn_interval_ms,
                 "Exactly-once: a Kafka transaction is committed this long after its first row")
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
  app.add_option("--max-in-flight-bytes", c.max_in_flight_bytes,
                 "Bytes of those rows' records (key, value, headers) produced but not yet "
                 "acknowledged before the relay stops reading: bounds memory whatever the row "
                 "size (a record larger than this is still sent, alone)")
      ->envname("OUTBOX_MAX_IN_FLIGHT_BYTES")
      ->capture_default_str();
  app.add_option("--marker-batch", c.marker_batch, "Transactions marked per statement, at most")
      ->envname("OUTBOX_MARKER_BATCH")
      ->capture_default_str();
  app.add_option("--marker-interval-ms", c.marker_interval_ms,
                 "A marking statement gathers the transactions delivered within this time "
                 "(fewer statements at a steady rate; delays confirmation, not Kafka; 0: mark "
                 "at once)")
      ->envname("OUTBOX_MARKER_INTERVAL_MS")
      ->capture_default_str();
  app.add_option("--marker-split-rows", c.marker_split_rows,
                 "A batch of at least this many rows is marked by two statements at once on "
                 "two connections, half of its transactions each (0: always one statement)")
      ->envname("OUTBOX_MARKER_SPLIT_ROWS")
      ->capture_default_str();
  app.add_option("--status-interval-ms", c.status_interval_ms,
                 "Standby status update interval (keep well below wal_sender_timeout)")
      ->envname("OUTBOX_STATUS_INTERVAL_MS")
      ->capture_default_str();
  app.add_option("--shutdown-timeout-ms", c.shutdown_timeout_ms,
                 "On SIGTERM: time to flush Kafka and the marker before giving up; the process "
                 "exits at most 1.5 s after it, whatever it still waits on")
      ->envname("OUTBOX_SHUTDOWN_TIMEOUT_MS")
      ->capture_default_str();
  AddEnumOption(app, "--on-poison", "OUTBOX_ON_POISON", &c.on_poison,
                {{"dlq", pipeline::OnPoison::kDeadLetter}, {"halt", pipeline::OnPoison::kHalt}},
                "A row that cannot be published: dlq (dead-letter topic, then continue) or "
                "halt (stop before it)");
  app.add_option("--dlq-topic", c.dlq_topic, "Dead-letter topic")
      ->envname("OUTBOX_DLQ_TOPIC")
      ->capture_default_str();
  app.add_option("--dlq-max-bytes", c.dlq_max_bytes,
                 "Largest dead-letter record; bigger payloads are replaced by a reference")
      ->envname("OUTBOX_DLQ_MAX_BYTES")
      ->capture_default_str();
  AddEnumOption(
      app, "--on-slot-lost", "OUTBOX_ON_SLOT_LOST", &c.on_slot_lost,
      {{"reconcile", pipeline::OnSlotLost::kReconcile}, {"fail", pipeline::OnSlotLost::kFail}},
      "The slot is missing or invalidated: reconcile (recreate it and backfill the "
      "unacked rows) or fail (exit with an error)");
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
                 "HTTP listener for /metrics, /healthz, /readyz, host:port (empty: off). All "
                 "addresses by default, as a pod needs (the kubelet probes from the node, "
                 "Prometheus scrapes the pod IP); 127.0.0.1:9464 where nothing else must reach "
                 "it")
      ->envname("OUTBOX_METRICS_ADDR")
      ->capture_default_str();
  app.add_option("--metrics-max-connections", c.metrics_max_connections,
                 "Open connections to the HTTP listener, at most: a new one over the cap closes "
                 "the oldest one that has not sent its request yet")
      ->envname("OUTBOX_METRICS_MAX_CONNECTIONS")
      ->capture_default_str();
  app.add_option("--metrics-max-connections-per-client", c.metrics_max_connections_per_client,
                 "Open connections to the HTTP listener from one client address, at most (over "
                 "it, that client's oldest unfinished one is closed)")
      ->envname("OUTBOX_METRICS_MAX_CONNECTIONS_PER_CLIENT")
      ->capture_default_str();
  app.add_option("--metrics-request-timeout-ms", c.metrics_request_timeout_ms,
                 "A connection to the HTTP listener that has not sent its whole request this "
                 "long after it was accepted is closed (idle, or sending its header slowly)")
      ->envname("OUTBOX_METRICS_REQUEST_TIMEOUT_MS")
      ->capture_default_str();
  app.add_option("--metrics-label-cap", c.metrics_label_cap,
                 "Label values taken from rows, at most: topics of "
                 "outbox_forwarder_publish_duration_seconds, (topic, event_type) pairs of "
                 "events_published_total. Further ones are counted under \"__overflow__\" "
                 "(outbox_relay_metric_label_overflow_total), so no row can grow the process or "
                 "Prometheus without bound")
      ->envname("OUTBOX_METRICS_LABEL_CAP")
      ->capture_default_str();
  app.add_option("--max-topics", c.max_topics,
                 "Distinct Kafka topics rows may go to (the topic comes from the row, through "
                 "--topic-template): a row whose topic would be one more is poison (--on-poison), "
                 "so no row can make the relay hold, and with --create-topics create, a topic per "
                 "row")
      ->envname("OUTBOX_MAX_TOPICS")
      ->capture_default_str();
  app.add_option("--readyz-stall-timeout-s", c.readyz_stall_timeout_s,
                 "/readyz answers 503 once rows in flight have moved neither to Kafka nor past "
                 "the slot for this long, or the marker (its statement, or a Watermill table's "
                 "position) has failed for this long")
      ->envname("OUTBOX_READYZ_STALL_TIMEOUT_S")
      ->capture_default_str();
  app.add_option("--row-count-interval-s", c.row_count_interval_s,
                 "How often outbox_rows_total is sampled from the table")
      ->envname("OUTBOX_ROW_COUNT_INTERVAL_S")
      ->capture_default_str();
  AddEnumOption(
      app, "--uuid-in-metadata", "OUTBOX_UUID_IN_METADATA", &c.mapper.uuid_in_metadata,
      {{"watermill", outbox::UuidInMetadata::kWatermill}, {"drop", outbox::UuidInMetadata::kDrop}},
      "A metadata entry named _watermill_message_uuid: watermill (as watermill-kafka's "
      "marshaler: an empty one is sent as a second UUID header, which its consumers "
      "read as the message's UUID; a non-empty one makes the row poison) or drop (an "
      "empty one is left out; a non-empty one is still poison)");
  AddWatermillTableFlags(app, c.watermill_flags);
  app.add_option("--watermill-consumer-group", c.watermill_consumer_group,
                 "watermill mode: the consumer group whose position the relay reads (backfill) "
                 "and advances (so the polling forwarder can take over); the forwarder's "
                 "ConsumerGroup")
      ->envname("OUTBOX_WATERMILL_CONSUMER_GROUP")
      ->capture_default_str();
  app.add_option("--watermill-key-field", c.mapper.watermill_key_field,
                 "watermill mode: metadata key whose value is the record key (\"\" when "
                 "absent, as a partitioning marshaler over msg.Metadata.Get); empty: null keys, "
                 "as DefaultMarshaler")
      ->envname("OUTBOX_WATERMILL_KEY_FIELD")
      ->capture_default_str();
  app.add_option("--watermill-discover-interval-s", c.watermill_discover_interval_s,
                 "watermill mode: how often to look for selected tables not yet in the "
                 "publication (new topics)")
      ->envname("OUTBOX_WATERMILL_DISCOVER_INTERVAL_S")
      ->capture_default_str();
  app.add_option("--watermill-join-lock-timeout-ms", c.watermill_join_lock_timeout_ms,
                 "watermill mode: a table joining the publication is locked against inserts "
                 "for at most this long (then the join is retried later)")
      ->envname("OUTBOX_WATERMILL_JOIN_LOCK_TIMEOUT_MS")
      ->capture_default_str();
  AddNetworkFlags(app, c);
}

void AddWatermillTableFlags(CLI::App& app, WatermillFlags& f) {
  AddEnumOption(app, "--table-mode", "OUTBOX_TABLE_MODE", &f.table_mode,
                {{"seed", TableMode::kSeed}, {"watermill", TableMode::kWatermill}},
                "seed: the house outbox table (--table, --topic-template, --key-field, "
                "offset_acked); watermill: watermill-sql's own tables (--watermill-*), topic "
                "from each table, progress in watermill_offsets_<topic>");
  app.add_option("--watermill-tables", f.tables,
                 "watermill mode: tables written by watermill-sql publishers, comma-separated "
                 "(\"watermill_<topic>\"; quote names with upper case or dots: "
                 "public.\"watermill_orders.v1\")")
      ->envname("OUTBOX_WATERMILL_TABLES");
  app.add_option("--watermill-forwarder-tables", f.forwarder_tables,
                 "watermill mode: tables written through Watermill's forwarder publisher "
                 "(envelopes; default name watermill_forwarder_topic), comma-separated: each "
                 "row's topic, UUID, metadata and payload come from its envelope")
      ->envname("OUTBOX_WATERMILL_FORWARDER_TABLES");
  app.add_option("--watermill-table-pattern", f.pattern,
                 "watermill mode: also every table whose name matches this pattern ('*' for any "
                 "text, e.g. public.watermill_*) and has watermill-sql's columns; new ones join "
                 "the publication as they appear")
      ->envname("OUTBOX_WATERMILL_TABLE_PATTERN");
  app.add_option("--watermill-topic-map", f.topic_map,
                 "watermill mode: table=topic,... for tables whose topic their name does not "
                 "tell (a name the application chose, or one PostgreSQL cut at 63 bytes)")
      ->envname("OUTBOX_WATERMILL_TOPIC_MAP");
  app.add_option("--watermill-offsets-table-map", f.offsets_map,
                 "watermill mode: table=offsets_table,... where the offsets table is not "
                 "watermill_offsets_<topic> in the table's schema")
      ->envname("OUTBOX_WATERMILL_OFFSETS_TABLE_MAP");
}

Status ParseWatermillFlags(const WatermillFlags& f, bool* watermill,
                           pipeline::WatermillSettings* settings) {
  *watermill = f.table_mode == TableMode::kWatermill;
  pipeline::WatermillSettings& w = *settings;
  w = pipeline::WatermillSettings{};
  if (!*watermill) return Ok();
  struct List {
    const char* flag;
    const char* env;
    const std::string* text;
    std::vector<pg::QualifiedName>* out;
  };
  for (const List& list :
       {List{"--watermill-tables", "OUTBOX_WATERMILL_TABLES", &f.tables, &w.tables},
        List{"--watermill-forwarder-tables", "OUTBOX_WATERMILL_FORWARDER_TABLES",
             &f.forwarder_tables, &w.forwarder_tables}}) {
    for (const std::string& item : SplitCommas(*list.text)) {
      auto name = pg::QualifiedName::Parse(item);
      if (!name) return BadSetting(list.flag, list.env, name.error().message);
      list.out->push_back(*name);
    }
  }
  if (!f.pattern.empty()) {
    auto pattern = pg::QualifiedName::Parse(f.pattern);
    if (!pattern) {
      return BadSetting("--watermill-table-pattern", "OUTBOX_WATERMILL_TABLE_PATTERN",
                        pattern.error().message);
    }
    w.pattern = *pattern;
  }
  if (w.tables.empty() && w.forwarder_tables.empty() && !w.pattern) {
    return BadSetting("--watermill-tables", "OUTBOX_WATERMILL_TABLES",
                      "--table-mode=watermill needs tables: --watermill-tables, "
                      "--watermill-forwarder-tables or --watermill-table-pattern");
  }
  struct Map {
    const char* flag;
    const char* env;
    const std::string* text;
    bool offsets;
  };
  for (const Map& map :
       {Map{"--watermill-topic-map", "OUTBOX_WATERMILL_TOPIC_MAP", &f.topic_map, false},
        Map{"--watermill-offsets-table-map", "OUTBOX_WATERMILL_OFFSETS_TABLE_MAP", &f.offsets_map,
            true}}) {
    for (const std::string& item : SplitCommas(*map.text)) {
      size_t eq = item.rfind('=');
      if (eq == std::string::npos || eq == 0 || eq + 1 == item.size()) {
        return BadSetting(map.flag, map.env, fmt::format("'{}' is not table=value", item));
      }
      auto table = pg::QualifiedName::Parse(item.substr(0, eq));
      if (!table) return BadSetting(map.flag, map.env, table.error().message);
      std::string value = item.substr(eq + 1);
      if (map.offsets) {
        auto offsets = pg::QualifiedName::Parse(value);
        if (!offsets) return BadSetting(map.flag, map.env, offsets.error().message);
        w.offsets[table->ToString()] = *offsets;
      } else {
        w.topics[table->ToString()] = value;
      }
    }
  }
  w.consumer_group = f.consumer_group;
  return Ok();
}

void AddNetworkFlags(CLI::App& app, RelayConfig& c) {
  app.add_option("--replication-database-url", c.replication_database_url,
                 "Connection string of the replication connection when it must differ from "
                 "DATABASE_URL (the same database; e.g. DATABASE_URL goes through a pooler). "
                 "Default: DATABASE_URL")
      ->envname("OUTBOX_REPLICATION_DATABASE_URL");
  app.add_option("--pg-connect-timeout-s", c.pg_connect_timeout_s,
                 "libpq connect_timeout per host: a connection attempt to an address that "
                 "answers nothing gives up after this (0: wait for the kernel). The connection "
                 "string's own setting wins")
      ->envname("OUTBOX_PG_CONNECT_TIMEOUT_S")
      ->capture_default_str();
  app.add_option("--pg-tcp-user-timeout-ms", c.pg_tcp_user_timeout_ms,
                 "libpq tcp_user_timeout: a connection whose sent data stays unacknowledged this "
                 "long is dropped by the kernel (0: the kernel's default, minutes). The "
                 "connection string's own setting wins")
      ->envname("OUTBOX_PG_TCP_USER_TIMEOUT_MS")
      ->capture_default_str();
  app.add_option("--pg-keepalives-idle-s", c.pg_keepalives_idle_s,
                 "libpq keepalives_idle: TCP keepalive probes start after this much idle time "
                 "(0: the kernel's default, 2 h). The connection string's own setting wins")
      ->envname("OUTBOX_PG_KEEPALIVES_IDLE_S")
      ->capture_default_str();
  app.add_option("--pg-keepalives-interval-s", c.pg_keepalives_interval_s,
                 "libpq keepalives_interval: seconds between unanswered keepalive probes")
      ->envname("OUTBOX_PG_KEEPALIVES_INTERVAL_S")
      ->capture_default_str();
  app.add_option("--pg-keepalives-count", c.pg_keepalives_count,
                 "libpq keepalives_count: unanswered probes before the connection is dead")
      ->envname("OUTBOX_PG_KEEPALIVES_COUNT")
      ->capture_default_str();
  app.add_option("--pg-statement-timeout-ms", c.pg_statement_timeout_ms,
                 "statement_timeout of the SQL connections (marker, setup, backfill; the "
                 "metrics sampler's at least 2 min), and the client's deadline for an answer: "
                 "this plus 5 s, after which the connection is replaced (0: none)")
      ->envname("OUTBOX_PG_STATEMENT_TIMEOUT_MS")
      ->capture_default_str();
  app.add_option("--pg-receive-timeout-ms", c.pg_receive_timeout_ms,
                 "The replication connection is taken for dead after this long without a byte "
                 "from the server while the relay reads; at half of it the relay asks the "
                 "server for a reply. Raised to wal_sender_timeout/2 + 5 s when that is longer "
                 "(a walsender busy decoding answers only then). 0: never")
      ->envname("OUTBOX_PG_RECEIVE_TIMEOUT_MS")
      ->capture_default_str();
  app.add_option("--kafka-delivery-timeout-ms", c.kafka_delivery_timeout_ms,
                 "Records Kafka has not acknowledged this long after they were produced are "
                 "given up: the producer is replaced and the transactions are sent again from "
                 "the slot, never counted as delivered. 0 (the default): wait for ever; a "
                 "silent broker is still left after --kafka-socket-timeout-ms and the request "
                 "retried, so nothing stalls for good")
      ->envname("OUTBOX_KAFKA_DELIVERY_TIMEOUT_MS")
      ->capture_default_str();
  app.add_option("--kafka-socket-timeout-ms", c.kafka_socket_timeout_ms,
                 "librdkafka socket.timeout.ms: a request a broker does not answer within this "
                 "is failed, the connection closed and the request retried (on the partition's "
                 "leader at that time)")
      ->envname("OUTBOX_KAFKA_SOCKET_TIMEOUT_MS")
      ->capture_default_str();
  app.add_option("--kafka-connect-timeout-ms", c.kafka_connect_timeout_ms,
                 "librdkafka socket.connection.setup.timeout.ms: connecting to a broker (TCP, "
                 "TLS, SASL, ApiVersion) gives up after this")
      ->envname("OUTBOX_KAFKA_CONNECT_TIMEOUT_MS")
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

// --table-mode=watermill: the table lists, pattern and maps, parsed.
Status ValidateWatermill(RelayConfig& c) {
  if (c.watermill_discover_interval_s < 1) {
    return BadSetting("--watermill-discover-interval-s", "OUTBOX_WATERMILL_DISCOVER_INTERVAL_S",
                      "must be >= 1");
  }
  if (c.watermill_join_lock_timeout_ms < 10) {
    return BadSetting("--watermill-join-lock-timeout-ms", "OUTBOX_WATERMILL_JOIN_LOCK_TIMEOUT_MS",
                      "must be >= 10");
  }
  c.watermill_flags.consumer_group = c.watermill_consumer_group;
  return ParseWatermillFlags(c.watermill_flags, &c.watermill, &c.watermill_settings);
}

// The timeouts: ranges libpq, the kernel and librdkafka accept, and a
// delivery deadline that leaves librdkafka time to retry a request.
Status ValidateNetwork(RelayConfig& c) {
  struct Range {
    const char* flag;
    const char* env;
    int64_t value;
    int64_t min;  // when not 0
    int64_t max;
    bool zero_ok;
  };
  for (const Range& r : {
           Range{"--pg-connect-timeout-s", "OUTBOX_PG_CONNECT_TIMEOUT_S", c.pg_connect_timeout_s, 2,
                 3600, true},
           Range{"--pg-tcp-user-timeout-ms", "OUTBOX_PG_TCP_USER_TIMEOUT_MS",
                 c.pg_tcp_user_timeout_ms, 1000, 3600000, true},
           Range{"--pg-keepalives-idle-s", "OUTBOX_PG_KEEPALIVES_IDLE_S", c.pg_keepalives_idle_s, 1,
                 32767, true},
           Range{"--pg-keepalives-interval-s", "OUTBOX_PG_KEEPALIVES_INTERVAL_S",
                 c.pg_keepalives_interval_s, 1, 32767, true},
           Range{"--pg-keepalives-count", "OUTBOX_PG_KEEPALIVES_COUNT", c.pg_keepalives_count, 1,
                 127, true},
           Range{"--pg-statement-timeout-ms", "OUTBOX_PG_STATEMENT_TIMEOUT_MS",
                 c.pg_statement_timeout_ms, 100, 86400000, true},
           Range{"--pg-receive-timeout-ms", "OUTBOX_PG_RECEIVE_TIMEOUT_MS", c.pg_receive_timeout_ms,
                 1000, 3600000, true},
           Range{"--kafka-delivery-timeout-ms", "OUTBOX_KAFKA_DELIVERY_TIMEOUT_MS",
                 c.kafka_delivery_timeout_ms, 1000, 86400000, true},
           Range{"--kafka-socket-timeout-ms", "OUTBOX_KAFKA_SOCKET_TIMEOUT_MS",
                 c.kafka_socket_timeout_ms, 10, 300000, false},
           Range{"--kafka-connect-timeout-ms", "OUTBOX_KAFKA_CONNECT_TIMEOUT_MS",
                 c.kafka_connect_timeout_ms, 1000, 3600000, false},
           // At most what librdkafka itself queues.
           Range{"--max-in-flight-bytes", "OUTBOX_MAX_IN_FLIGHT_BYTES", c.max_in_flight_bytes, 1024,
                 kafka::kMaxQueuedBytes, false},
       }) {
    if (r.value == 0 && r.zero_ok) continue;
    if (r.value < r.min || r.value > r.max) {
      return BadSetting(r.flag, r.env,
                        fmt::format("{} is out of range: {}{}..{}", r.value,
                                    r.zero_ok ? "0 or " : "", r.min, r.max));
    }
  }
  if (c.pg_receive_timeout_ms > 0 && c.pg_receive_timeout_ms < 2 * c.status_interval_ms) {
    return BadSetting(
        "--pg-receive-timeout-ms", "OUTBOX_PG_RECEIVE_TIMEOUT_MS",
        fmt::format("{} ms is less than two status intervals (--status-interval-ms {}): "
                    "a reply request needs one to go out and one to come back",
                    c.pg_receive_timeout_ms, c.status_interval_ms));
  }
  if (c.kafka_delivery_timeout_ms > 0 && c.kafka_delivery_timeout_ms < c.kafka_socket_timeout_ms) {
    return BadSetting(
        "--kafka-delivery-timeout-ms", "OUTBOX_KAFKA_DELIVERY_TIMEOUT_MS",
        fmt::format("{} ms is below --kafka-socket-timeout-ms ({} ms): a request to a "
                    "silent broker could not even be retried once",
                    c.kafka_delivery_timeout_ms, c.kafka_socket_timeout_ms));
  }
  c.pg_network.connect_timeout_s = static_cast<int>(c.pg_connect_timeout_s);
  c.pg_network.tcp_user_timeout_ms = static_cast<int>(c.pg_tcp_user_timeout_ms);
  c.pg_network.keepalives_idle_s = static_cast<int>(c.pg_keepalives_idle_s);
  c.pg_network.keepalives_interval_s = static_cast<int>(c.pg_keepalives_interval_s);
  c.pg_network.keepalives_count = static_cast<int>(c.pg_keepalives_count);
  c.pg_network.statement_timeout = std::chrono::milliseconds(c.pg_statement_timeout_ms);
  return Ok();
}

}  // namespace

Status Validate(RelayConfig& c) {
  if (c.database_url.empty()) {
    return BadSetting("--database-url", "DATABASE_URL", "required, e.g. postgresql://user@host/db");
  }
  // --sink, --delivery, --on-poison, --on-slot-lost and --uuid-in-metadata are
  // enums, parsed by CLI11 (AddEnumOption): a bad value never gets here.
  if (c.delivery == DeliveryMode::kExactlyOnce) {
    if (c.sink != SinkKind::kKafka) {
      return BadSetting("--delivery", "OUTBOX_DELIVERY", "exactly-once needs --sink kafka");
    }
    if (c.txn_interval_ms < 1 || c.txn_interval_ms > 60000) {
      return BadSetting("--txn-interval-ms", "OUTBOX_TXN_INTERVAL_MS", "must be 1..60000");
    }
    if (c.txn_max_rows < 1)
      return BadSetting("--txn-max-rows", "OUTBOX_TXN_MAX_ROWS", "must be >= 1");
    if (c.transaction_timeout_ms < 1000 || c.transaction_timeout_ms > 900000) {
      return BadSetting("--transaction-timeout-ms", "OUTBOX_TRANSACTION_TIMEOUT_MS",
                        "must be 1000..900000 (the broker's transaction.max.timeout.ms is 15 min)");
    }
    if (c.txn_interval_ms * 4 > c.transaction_timeout_ms) {
      return BadSetting("--txn-interval-ms", "OUTBOX_TXN_INTERVAL_MS",
                        "must be well below --transaction-timeout-ms (a quarter of it at most)");
    }
  }
  if (c.sink == SinkKind::kKafka && c.kafka_brokers.empty()) {
    return BadSetting("--kafka-brokers", "KAFKA_BROKERS",
                      "required, e.g. kafka-0:9092,kafka-1:9092");
  }
  auto table = pg::QualifiedName::Parse(c.table);
  if (!table) return BadSetting("--table", "OUTBOX_TABLE", table.error().message);
  c.table_name = *table;
  if (c.publication.empty()) return BadSetting("--publication", "OUTBOX_PUBLICATION", "empty");
  // Slot names: lower-case letters, digits and underscores, at most 63 (NAMEDATALEN-1).
  if (c.slot.empty() || c.slot.size() > 63 ||
      c.slot.find_first_not_of("abcdefghijklmnopqrstuvwxyz0123456789_") != std::string::npos) {
    return BadSetting(
        "--slot", "OUTBOX_SLOT",
        fmt::format("'{}': use 1-63 lower-case letters, digits and underscores", c.slot));
  }
  if (auto t = outbox::TopicTemplate::Compile(c.mapper.topic_template); !t) {
    return BadSetting("--topic-template", "OUTBOX_TOPIC_TEMPLATE", t.error().message);
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
    if (col.value->empty()) return BadSetting(col.flag, col.env, "empty column name");
  }
  if (c.mark && c.acked_column.empty()) {
    return BadSetting("--column-acked", "OUTBOX_COLUMN_ACKED",
                      "empty; use --mark=false to not mark");
  }
  if (c.max_in_flight < 1)
    return BadSetting("--max-in-flight", "OUTBOX_MAX_IN_FLIGHT", "must be >= 1");
  if (c.marker_batch < 1)
    return BadSetting("--marker-batch", "OUTBOX_MARKER_BATCH", "must be >= 1");
  if (c.marker_interval_ms < 0 || c.marker_interval_ms > 1000) {
    return BadSetting("--marker-interval-ms", "OUTBOX_MARKER_INTERVAL_MS", "must be 0..1000");
  }
  if (c.marker_split_rows < 0)
    return BadSetting("--marker-split-rows", "OUTBOX_MARKER_SPLIT_ROWS", "must be >= 0");
  if (c.status_interval_ms < 10 || c.status_interval_ms > 60000) {
    return BadSetting("--status-interval-ms", "OUTBOX_STATUS_INTERVAL_MS", "must be 10..60000");
  }
  if (c.shutdown_timeout_ms < 0) {
    return BadSetting("--shutdown-timeout-ms", "OUTBOX_SHUTDOWN_TIMEOUT_MS", "must be >= 0");
  }
  if (c.on_poison == pipeline::OnPoison::kDeadLetter && c.dlq_topic.empty()) {
    return BadSetting("--dlq-topic", "OUTBOX_DLQ_TOPIC", "empty while --on-poison=dlq");
  }
  if (c.dlq_max_bytes < 1024)
    return BadSetting("--dlq-max-bytes", "OUTBOX_DLQ_MAX_BYTES", "must be >= 1024");
  if (c.backfill_batch < 1)
    return BadSetting("--backfill-batch", "OUTBOX_BACKFILL_BATCH", "must be >= 1");
  if (c.topic_partitions < 1) {
    return BadSetting("--topic-partitions", "OUTBOX_TOPIC_PARTITIONS", "must be >= 1");
  }
  if (c.topic_replication_factor == 0 || c.topic_replication_factor < -1) {
    return BadSetting("--topic-replication-factor", "OUTBOX_TOPIC_REPLICATION_FACTOR",
                      "must be -1 (broker default) or >= 1");
  }
  if (c.metrics_max_connections < 2 || c.metrics_max_connections > 100000) {
    return BadSetting("--metrics-max-connections", "OUTBOX_METRICS_MAX_CONNECTIONS",
                      "must be 2..100000");
  }
  if (c.metrics_max_connections_per_client < 1 ||
      c.metrics_max_connections_per_client > c.metrics_max_connections) {
    return BadSetting(
        "--metrics-max-connections-per-client", "OUTBOX_METRICS_MAX_CONNECTIONS_PER_CLIENT",
        fmt::format("must be 1..--metrics-max-connections ({})", c.metrics_max_connections));
  }
  if (c.metrics_request_timeout_ms < 100 || c.metrics_request_timeout_ms > 60000) {
    return BadSetting("--metrics-request-timeout-ms", "OUTBOX_METRICS_REQUEST_TIMEOUT_MS",
                      "must be 100..60000");
  }
  if (c.metrics_label_cap < 1 || c.metrics_label_cap > 100000) {
    return BadSetting("--metrics-label-cap", "OUTBOX_METRICS_LABEL_CAP", "must be 1..100000");
  }
  if (c.max_topics < 1 || c.max_topics > 1000000) {
    return BadSetting("--max-topics", "OUTBOX_MAX_TOPICS", "must be 1..1000000");
  }
  if (c.readyz_stall_timeout_s < 1 || c.readyz_stall_timeout_s > 86400) {
    return BadSetting("--readyz-stall-timeout-s", "OUTBOX_READYZ_STALL_TIMEOUT_S",
                      "must be 1..86400");
  }
  if (c.row_count_interval_s < 1) {
    return BadSetting("--row-count-interval-s", "OUTBOX_ROW_COUNT_INTERVAL_S", "must be >= 1");
  }
  if (auto st = ValidateWatermill(c); !st) return st;
  if (c.watermill && c.delivery == DeliveryMode::kExactlyOnce) {
    // The Watermill tables' progress is the consumer group's offsets in
    // PostgreSQL, which a Kafka transaction cannot hold.
    return BadSetting(
        "--delivery", "OUTBOX_DELIVERY",
        "exactly-once is not available with --table-mode=watermill (use at-least-once; "
        "Watermill's consumers deduplicate)");
  }
  if (auto st = ValidateNetwork(c); !st) return st;
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
      return BadSetting(
          "--kafka-property", "OUTBOX_KAFKA_PROPERTIES",
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
  // The timeout flags first: a --kafka-property of the same name wins.
  opts.properties = {
      {"socket.timeout.ms", std::to_string(c.kafka_socket_timeout_ms)},
      {"socket.connection.setup.timeout.ms", std::to_string(c.kafka_connect_timeout_ms)},
  };
  opts.properties.insert(opts.properties.end(), c.kafka_property_pairs.begin(),
                         c.kafka_property_pairs.end());
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
