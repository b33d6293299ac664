#include "outbox_relay/ops/commands.h"

#include <libpq-fe.h>
#include <librdkafka/rdkafka.h>
#include <spdlog/spdlog.h>

#include <CLI/CLI.hpp>
#include <array>
#include <exception>
#include <limits>
#include <memory>
#include <string>

#include "outbox_relay/app/commands.h"
#include "outbox_relay/core/failpoint.h"
#include "outbox_relay/core/json.h"
#include "outbox_relay/ops/check.h"
#include "outbox_relay/ops/cleanup.h"
#include "outbox_relay/ops/replay.h"
#include "outbox_relay/ops/slot_command.h"
#include "outbox_relay/pg/relay_schema.h"
#include "outbox_relay/pipeline/kafka_progress.h"

namespace outbox_relay::ops {

CLI::Option* AddOutputOption(CLI::App& app, OutputFormat* value) {
  return app::AddEnumOption(app, "--output", "OUTBOX_OUTPUT", value,
                            {{"text", OutputFormat::kText}, {"json", OutputFormat::kJson}},
                            "Output format: text or json");
}

std::string JsonQuote(std::string_view text) {
  std::string out;
  out.reserve(text.size() + 2);
  out += '"';
  AppendJsonEscaped(text, out);
  out += '"';
  return out;
}

std::string PrettyBytes(int64_t bytes) {
  static constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  if (bytes < 0) {
    return "-" + PrettyBytes(bytes == std::numeric_limits<int64_t>::min()
                                 ? std::numeric_limits<int64_t>::max()
                                 : -bytes);
  }
  if (bytes < 1024) return fmt::format("{} B", bytes);
  double v = static_cast<double>(bytes);
  size_t unit = 0;
  while (v >= 1024 && unit + 1 < std::size(kUnits)) {
    v /= 1024;
    ++unit;
  }
  return fmt::format("{:.1f} {}", v, kUnits[unit]);
}

std::string VersionReport(std::string_view relay_version, std::string_view commit) {
  std::string features = "unknown";
  if (rd_kafka_conf_t* conf = rd_kafka_conf_new()) {
    std::array<char, 512> buf{};
    size_t size = buf.size();
    if (rd_kafka_conf_get(conf, "builtin.features", buf.data(), &size) == RD_KAFKA_CONF_OK) {
      features = buf.data();
      for (size_t at = features.find(','); at != std::string::npos;
           at = features.find(',', at + 2)) {
        features.insert(at + 1, " ");
      }
    }
    rd_kafka_conf_destroy(conf);
  }
  // PQlibVersion(): major * 10000 + minor since PostgreSQL 10.
  const int libpq = PQlibVersion();
  std::string text = fmt::format(
      "outbox-relay {}\ncommit: {}\n"
      "relay schema: {} (runs against newer schemas that declare themselves readable by {})\n"
      "exactly-once progress record: format {} (reads records readable by format {} or "
      "older)\n"
      "librdkafka: {} ({})\nlibpq: {}.{}\n",
      relay_version, commit, pg::kRelaySchemaVersion, pg::kRelaySchemaVersion,
      pipeline::kProgressFormat, pipeline::kProgressFormat, rd_kafka_version_str(), features,
      libpq / 10000, libpq % 10000);
  if constexpr (failpoint::kCompiledIn) {
    text += fmt::format("failpoints: compiled in ({}): a test build, not for production\n",
                        failpoint::kVariable);
  } else {
    text += "failpoints: none (a production build)\n";
  }
  return text;
}

namespace {

// The flag values of every ops command; the callbacks share ownership, so
// they live as long as the app.
struct OpsConfigs {
  CleanupConfig cleanup;
  ReplayConfig replay;
  SlotCommandConfig slot_status;
  SlotCommandConfig slot_drop;
  CheckConfig check;
};

// Runs a command inside its CLI11 callback; a non-zero exit code leaves as
// CLI::RuntimeError, which main returns through app.exit() silently.
template <typename Fn>
void RunCommand(Fn&& fn) {
  int code = app::kExitFailure;
  try {
    code = fn();
  } catch (const CLI::Error&) {
    throw;
  } catch (const std::exception& e) {
    spdlog::error("{}", e.what());
    code = app::kExitFailure;
  }
  if (code != app::kExitOk) throw CLI::RuntimeError(code);
}

}  // namespace

// Registers cleanup (alias outbox-cleanup, the seed's CronJob argument),
// replay, slot and check; the flag values live as long as `app`.
void AddOpsCommands(CLI::App& app) {
  auto configs = std::make_shared<OpsConfigs>();

  CLI::App* cleanup = app.add_subcommand(
      "cleanup",
      "Delete acked outbox rows older than the retention (and the replay index's old rows), "
      "in batches; never an unacked row. The seed's CronJob: OUTBOX_RETENTION_DAYS, "
      "OUTBOX_BATCH_SIZE, OUTBOX_BATCH_SLEEP_MS, DATABASE_URL");
  cleanup->alias("outbox-cleanup");
  AddCleanupFlags(*cleanup, configs->cleanup);
  cleanup->callback([configs] { RunCommand([&] { return CleanupCommand(configs->cleanup); }); });

  CLI::App* replay = app.add_subcommand(
      "replay",
      "Re-publish the transactions of a commit-LSN or commit-time range from the commit index, "
      "in commit order, with their original UUIDs. A deliberate re-publish in either delivery "
      "mode: with --delivery=exactly-once too its records are produced again (outside any "
      "Kafka transaction, so read_committed consumers see them) and the relay's progress is "
      "left as it is");
  AddReplayFlags(*replay, configs->replay);
  replay->callback([configs] { RunCommand([&] { return ReplayCommand(configs->replay); }); });

  CLI::App* slot = app.add_subcommand("slot", "Inspect or drop the relay's replication slot");
  slot->require_subcommand(1);
  CLI::App* status = slot->add_subcommand(
      "status", "The slot (pg_replication_slots), the relay's state rows and commit index for it");
  AddSlotStatusFlags(*status, configs->slot_status);
  status->callback(
      [configs] { RunCommand([&] { return SlotStatusCommand(configs->slot_status); }); });
  CLI::App* drop = slot->add_subcommand(
      "drop",
      "Drop the slot (needs --confirm; refused while active). The next run backfills the "
      "unacked rows");
  AddSlotDropFlags(*drop, configs->slot_drop);
  drop->callback([configs] { RunCommand([&] { return SlotDropCommand(configs->slot_drop); }); });

  CLI::App* check = app.add_subcommand(
      "check",
      "Preflight with run's flags: PostgreSQL settings, role, table, indexes, publication, slot, "
      "relay schema, Kafka and topics. Exit 1 on any FAIL");
  AddCheckFlags(*check, configs->check);
  check->callback([configs] { RunCommand([&] { return CheckCommand(configs->check); }); });
}

}  // namespace outbox_relay::ops
