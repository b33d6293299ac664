// `outbox-relay check`: preflight of everything `run` needs, with the same
// flags as `run`. Each line is OK, WARN or FAIL, what was checked, and for
// WARN/FAIL the fix. Exit 1 if anything FAILs, else 0. --output text|json.
//
// PostgreSQL: server version (14 to 18 are tested; xid8 and
// pg_visible_in_snapshot need 13), wal_level = logical, free
// replication slots and WAL senders, the role's REPLICATION attribute (or
// superuser), the outbox table (columns by name and type, an index leading
// with transaction_id for marking, the partial index on offset_acked IS NULL,
// privileges), the publication (exists and holds exactly the table, publishes
// inserts only), the slot (plugin, holder, wal_status), the relay's schema,
// and failover (check_failover.h) with --failover-slot or --standby-url.
// Kafka: a metadata request within --kafka-timeout-ms, the dead-letter topic,
// and the topics the template gives for the event types of recent rows.
#pragma once

#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "outbox_relay/app/commands.h"
#include "outbox_relay/app/config.h"
#include "outbox_relay/ops/commands.h"
#include "outbox_relay/pg/connection.h"
#include "outbox_relay/pipeline/progress_report.h"

namespace CLI {
class App;
}

namespace outbox_relay::ops {

struct CheckConfig {
  app::RelayConfig relay;
  OutputFormat output = OutputFormat::kText;
  int64_t kafka_timeout_ms = 5000;
  int64_t sample_rows = 1000;  // recent rows whose topics are checked
  std::string standby_url;     // a physical standby to check for failover (17+)
};

enum class CheckStatus { kOk, kWarn, kFail };

struct CheckResult {
  CheckStatus status = CheckStatus::kOk;
  std::string name;    // what was checked, e.g. "wal_level"
  std::string detail;  // what was found
  std::string fix;     // for WARN and FAIL: what to do
};

const char* CheckStatusName(CheckStatus status);  // "OK", "WARN", "FAIL"

// The lines of a group of checks, as they are found.
class CheckList {
 protected:
  void Add(CheckStatus s, std::string name, std::string detail, std::string fix = "") {
    out_.push_back({s, std::move(name), std::move(detail), std::move(fix)});
  }
  void Ok(std::string name, std::string detail) {
    Add(CheckStatus::kOk, std::move(name), std::move(detail));
  }
  void Warn(std::string name, std::string detail, std::string fix) {
    Add(CheckStatus::kWarn, std::move(name), std::move(detail), std::move(fix));
  }
  void Failed(std::string name, std::string detail, std::string fix) {
    Add(CheckStatus::kFail, std::move(name), std::move(detail), std::move(fix));
  }
  std::vector<CheckResult> out_;
};

// The topics the template gives for the newest rows (the PostgreSQL checks
// read them), for the Kafka checks.
struct TopicSample {
  bool known = false;  // the table was read with every column the relay needs
  int rows = 0;        // rows sampled
  int poison = 0;      // of those, rows that map to no topic
  std::string first_poison;
  std::map<std::string, std::pair<int, std::set<std::string>>> topics;  // -> rows, event types
  // Exactly-once: the relay's transactional.id ("": unknown), the progress key.
  std::string transactional_id;
};

void AddCheckFlags(CLI::App& app, CheckConfig& config);

// Runs every check on a validated config. Never fails as a whole: a check
// that cannot run is itself a FAIL line. `steps` (may be null) is told each
// step that waits on a server, as it begins.
std::vector<CheckResult> RunChecks(const CheckConfig& config, pipeline::StepLine* steps = nullptr);

// --table-mode=watermill: the tables, their topics, offsets tables and the
// consumer group's positions, privileges and the publication (in place of
// the seed table's checks; check_watermill.cc).
std::vector<CheckResult> CheckWatermillTables(pg::Connection& conn, const app::RelayConfig& config);

// Kafka (check_kafka.cc): a metadata request within --kafka-timeout-ms, the
// dead-letter and progress topics, and the topics of `sample`.
std::vector<CheckResult> CheckKafka(const CheckConfig& config, const TopicSample& sample);

std::string FormatChecksText(const std::vector<CheckResult>& results);
std::string FormatChecksJson(const std::vector<CheckResult>& results);

// The whole command; returns the exit code.
int CheckCommand(CheckConfig& config);

}  // namespace outbox_relay::ops
