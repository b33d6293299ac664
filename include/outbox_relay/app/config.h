// Configuration of `outbox-relay run`: flags, each with an environment
// variable (DATABASE_URL, KAFKA_BROKERS, OUTBOX_<FLAG>). A bad value fails at
// start with a message that names the flag and its variable.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "outbox_relay/core/result.h"
#include "outbox_relay/kafka/producer.h"
#include "outbox_relay/outbox/record.h"
#include "outbox_relay/pg/connection.h"
#include "outbox_relay/pipeline/publisher.h"
#include "outbox_relay/pipeline/slot_setup.h"
#include "outbox_relay/pipeline/watermill.h"

namespace CLI {
class App;
}

namespace outbox_relay::app {

enum class DeliveryMode {
  kAtLeastOnce,  // the idempotent producer; duplicates after a crash, bounded by what was in flight
  kExactlyOnce,  // Kafka transactions with the progress inside them: no duplicates
};

enum class SinkKind {
  kKafka,
  kNull,  // every record is "delivered" at once: benchmarks of everything but Kafka
};

enum class LogFormat { kText, kJson };

struct LogConfig {
  LogFormat format = LogFormat::kText;
  std::string level = "info";
};

enum class TableMode {
  kSeed,       // the house outbox table (--table)
  kWatermill,  // watermill-sql's own tables (--watermill-*)
};

// The flags that choose the tables (run, check, cleanup), as given.
struct WatermillFlags {
  TableMode table_mode = TableMode::kSeed;
  std::string tables;            // "a,b": direct tables
  std::string forwarder_tables;  // "a,b": forwarder envelope tables
  std::string pattern;           // "schema.watermill_*"
  std::string topic_map;         // "table=topic,..."
  std::string offsets_map;       // "table=offsets_table,..."
  std::string consumer_group;
};

// Registers --table-mode and the --watermill-* table flags.
void AddWatermillTableFlags(CLI::App& app, WatermillFlags& flags);
// Parses them (kInvalidArgument naming the flag); `*watermill`: the mode.
Status ParseWatermillFlags(const WatermillFlags& flags, bool* watermill,
                           pipeline::WatermillSettings* settings);

struct RelayConfig {
  std::string database_url;
  std::string kafka_brokers;
  std::string table = "public.outbox";
  std::string publication = "outbox_relay";
  std::string slot = "outbox_relay";
  std::string service = "outbox";
  outbox::MapperOptions mapper;
  outbox::ColumnNames columns;
  std::string acked_column = "offset_acked";
  std::string created_at_column = "created_at";  // "" = no outbox_forwarder_lag_seconds
  bool mark = true;
  std::vector<std::string> kafka_properties;           // "key=value"
  SinkKind sink = SinkKind::kKafka;                    // --sink
  DeliveryMode delivery = DeliveryMode::kAtLeastOnce;  // --delivery
  std::string transactional_id;                        // "" = derived (system id, database, slot)
  std::string progress_topic;  // "": the relay's own (pipeline::DefaultProgressTopic)
  int64_t txn_interval_ms = 20;
  int64_t txn_max_rows = 10000;
  int64_t transaction_timeout_ms = 60000;
  int64_t max_in_flight = 20000;          // rows produced but not yet acknowledged
  int64_t max_in_flight_bytes = 1 << 20;  // and their bytes (key, value, headers)
  int64_t marker_batch = 2000;            // transactions per marking statement
  int64_t marker_split_rows = 8000;       // a batch this large: two statements at once
  int64_t marker_interval_ms = 200;  // a marking statement gathers what was delivered in this time
  int64_t status_interval_ms = 1000;
  int64_t shutdown_timeout_ms = 25000;
  pipeline::OnPoison on_poison = pipeline::OnPoison::kDeadLetter;  // --on-poison
  std::string dlq_topic = "outbox-relay.dlq";
  int64_t dlq_max_bytes = 1000000;
  pipeline::OnSlotLost on_slot_lost = pipeline::OnSlotLost::kReconcile;  // --on-slot-lost
  bool backfill = true;           // publish unacked rows older than a newly created slot
  int64_t backfill_batch = 5000;  // rows per backfill query
  bool failover_slot = false;     // create the slot with failover = true (17+)
  bool create_topics = false;
  int64_t topic_partitions = 3;
  int64_t topic_replication_factor = -1;  // -1: the broker's default
  // All addresses: a pod's probes come from the kubelet on its node and
  // Prometheus scrapes the pod's IP (docs/configuration.md, "The HTTP port").
  std::string metrics_addr = "0.0.0.0:9464";
  int64_t metrics_max_connections = 256;
  int64_t metrics_max_connections_per_client = 8;
  int64_t metrics_request_timeout_ms = 3000;
  int64_t metrics_label_cap = 200;      // row-given values of a metric label (topic, event_type)
  int64_t readyz_stall_timeout_s = 60;  // /readyz: rows not moving, or the marker failing
  int64_t max_topics = 1000;            // distinct topics rows may go to
  int64_t row_count_interval_s = 60;
  LogConfig log;

  // --table-mode=watermill: watermill-sql's tables (pipeline/watermill.h).
  WatermillFlags watermill_flags;
  std::string watermill_consumer_group;  // the forwarder's ConsumerGroup ("" usually)
  int64_t watermill_discover_interval_s = 10;
  int64_t watermill_join_lock_timeout_ms = 2000;
  // The replication connection's URL when it must differ from DATABASE_URL
  // (e.g. DATABASE_URL goes through a pooler, which cannot replicate): the
  // same database. "" = DATABASE_URL.
  std::string replication_database_url;
  // Timeouts: how a silent peer is found and replaced (docs/configuration.md,
  // "Timeouts"; docs/runbook.md, "A silent network").
  int64_t pg_connect_timeout_s = 10;
  int64_t pg_tcp_user_timeout_ms = 30000;
  int64_t pg_keepalives_idle_s = 15;
  int64_t pg_keepalives_interval_s = 5;
  int64_t pg_keepalives_count = 3;
  int64_t pg_statement_timeout_ms = 30000;
  int64_t pg_receive_timeout_ms = 30000;
  int64_t kafka_delivery_timeout_ms = 0;  // off: see --kafka-delivery-timeout-ms
  int64_t kafka_socket_timeout_ms = 30000;
  int64_t kafka_connect_timeout_ms = 10000;

  // Filled by Validate():
  pg::QualifiedName table_name;
  std::vector<std::pair<std::string, std::string>> kafka_property_pairs;
  bool watermill = false;  // --table-mode watermill
  pipeline::WatermillSettings watermill_settings;
  pg::NetworkOptions pg_network;  // from the pg_* timeouts

  // The replication connection's URL (replication_database_url or database_url).
  const std::string& replication_url() const {
    return replication_database_url.empty() ? database_url : replication_database_url;
  }
};

// Registers the flags of `run` on `app`, bound to `config`.
void AddRunFlags(CLI::App& app, RelayConfig& config);
void AddLogFlags(CLI::App& app, LogConfig& config);
// The timeouts and the replication URL (part of AddRunFlags).
void AddNetworkFlags(CLI::App& app, RelayConfig& config);

// Checks values that flags alone cannot (kInvalidArgument naming the setting).
Status Validate(RelayConfig& config);

// The Kafka producer's options from the relay's settings (run, replay, check).
kafka::ProducerOptions ProducerOptionsOf(const RelayConfig& config);
// The sink records go to: the Kafka producer, or the null sink.
Result<std::unique_ptr<kafka::Sink>> MakeSink(const RelayConfig& config,
                                              kafka::DeliveryCallback on_delivery,
                                              kafka::SinkErrorCallback on_error = {});

// Splits "a=b;c=d" or newline-separated lists (OUTBOX_KAFKA_PROPERTIES).
std::vector<std::string> SplitPropertyList(std::string_view text);

}  // namespace outbox_relay::app
