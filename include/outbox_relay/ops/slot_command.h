// `outbox-relay slot status|drop`: the replication slot as an operator sees it.
//
// status  pg_replication_slots for the slot (plugin, active and by whom,
//         confirmed_flush_lsn, restart_lsn, the WAL it retains, wal_status,
//         safe_wal_size; on 16+ conflicting; on 17+ invalidation_reason,
//         inactive_since, failover, synced), the relay's rows in outbox_relay.state for it and a
//         summary of its commit-LSN index (what `replay` can reach); with
//         --kafka-brokers also the exactly-once progress Kafka holds
//         (--progress-topic, key --transactional-id or the derived one).
//         --output text|json. A missing slot is reported (exists: false), exit 0.
// drop    Drops the slot, only with --confirm and only while no walsender
//         holds it (an active slot is refused with the holder's PID). Without
//         --confirm it says what it would do and exits 2. The relay's state
//         rows are kept on purpose: `slot_created` is how the next `run`
//         knows the slot existed, so it treats it as lost and (with
//         --on-slot-lost=reconcile) recreates it and backfills every unacked row.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "outbox_relay/app/commands.h"
#include "outbox_relay/app/config.h"
#include "outbox_relay/core/result.h"
#include "outbox_relay/ops/commands.h"
#include "outbox_relay/pg/connection.h"
#include "outbox_relay/pg/relay_schema.h"
#include "outbox_relay/pipeline/kafka_progress.h"

namespace CLI {
class App;
}

namespace outbox_relay::ops {

// The key the relay writes when it creates a slot (outbox_relay.state).
inline constexpr const char* kSlotCreatedStateKey = pg::kStateSlotCreated;

struct SlotCommandConfig {
  std::string database_url;
  std::string slot = "outbox_relay";
  OutputFormat output = OutputFormat::kText;  // (status)
  bool confirm = false;                       // drop
  // status: the exactly-once progress in Kafka (read when brokers are given;
  // TLS/SASL from OUTBOX_KAFKA_PROPERTIES as `run` reads them).
  std::string kafka_brokers;
  std::string progress_topic;    // "": the relay's own (pipeline::DefaultProgressTopic)
  std::string transactional_id;  // "" = derived as `run` derives it
  app::LogConfig log;
};

// --database-url, --slot (and --output for status, --confirm for drop), log flags.
void AddSlotStatusFlags(CLI::App& app, SlotCommandConfig& config);
void AddSlotDropFlags(CLI::App& app, SlotCommandConfig& config);

struct SlotStateRow {
  std::string key;
  std::string value;
  std::string updated_at;
};

struct SlotReport {
  std::string slot;
  std::string current_wal_lsn;  // pg_current_wal_lsn()
  bool exists = false;
  std::string plugin;
  std::string slot_type;
  std::string database;
  bool active = false;
  std::optional<int> active_pid;
  std::string holder;  // application_name and client address of the active walsender
  std::optional<std::string> restart_lsn;
  std::optional<std::string> confirmed_flush_lsn;
  std::optional<int64_t> retained_bytes;     // current WAL - restart_lsn
  std::optional<int64_t> unconfirmed_bytes;  // current WAL - confirmed_flush_lsn
  std::string wal_status;
  std::optional<int64_t> safe_wal_size;  // NULL when max_slot_wal_keep_size = -1
  // Columns of newer servers (nullopt where the server has no such column):
  std::optional<bool> conflicting;                 // 16+
  std::optional<std::string> invalidation_reason;  // 17+ (empty: valid)
  std::optional<std::string> inactive_since;       // 17+ (empty: active)
  std::optional<bool> failover;                    // 17+
  std::optional<bool> synced;                      // 17+
  bool relay_schema = false;         // outbox_relay.state and .commits exist and are readable
  std::string relay_schema_access;   // why they cannot be read, when they exist but cannot
  std::vector<SlotStateRow> state;   // outbox_relay.state rows of the slot
  int64_t indexed_transactions = 0;  // outbox_relay.commits rows of the slot
  std::optional<std::string> first_commit_lsn, last_commit_lsn;
  std::optional<std::string> first_commit_time, last_commit_time;

  // The exactly-once progress (only when asked for with --kafka-brokers).
  struct KafkaSide {
    std::string topic, key;
    std::optional<pipeline::KafkaProgress> progress;  // nullopt: nothing committed
    std::string owner;                                // whose record ("": format 1, unsaid)
    uint32_t timeline = 0;                            // the timeline its position is on
    std::string error;                                // why it could not be read
  };
  std::optional<KafkaSide> kafka;

  const SlotStateRow* FindState(std::string_view key) const;
};

Result<SlotReport> QuerySlotReport(pg::Connection& conn, const std::string& slot);
std::string FormatSlotReportText(const SlotReport& report);
std::string FormatSlotReportJson(const SlotReport& report);

// The commands: logging, validation, the work, output. Return the exit code.
int SlotStatusCommand(SlotCommandConfig& config);
int SlotDropCommand(SlotCommandConfig& config);

}  // namespace outbox_relay::ops
