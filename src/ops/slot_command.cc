#include "outbox_relay/ops/slot_command.h"

#include <spdlog/spdlog.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <cstdlib>

#include "outbox_relay/app/commands.h"
#include "outbox_relay/app/logging.h"
#include "outbox_relay/kafka/progress_log.h"
#include "outbox_relay/ops/commands.h"
#include "outbox_relay/pg/commit_index.h"
#include "outbox_relay/pg/replication.h"
#include "outbox_relay/pg/rows.h"

namespace outbox_relay::ops {

namespace {

// Slot status reads cells that are NULL in some states (a slot that never
// streamed has no confirmed_flush_lsn, an inactive one no pid, an older
// server no failover column): nullopt then.
std::optional<std::string> Text(const PGresult* r, int row, int col) {
  return pg::Rows(r).OptionalText(row, col);
}

void AddCommonFlags(CLI::App& app, SlotCommandConfig& c) {
  app.add_option("--database-url", c.database_url,
                 "PostgreSQL connection string or URI of the service database")
      ->envname("DATABASE_URL");
  app.add_option("--slot", c.slot, "The relay's logical replication slot")
      ->envname("OUTBOX_SLOT")
      ->capture_default_str();
  app::AddLogFlags(app, c.log);
}

Status Validate(const SlotCommandConfig& c) {
  if (c.database_url.empty()) {
    return app::BadSetting("--database-url", "DATABASE_URL",
                           "required, e.g. postgresql://user@host/db");
  }
  if (c.slot.empty()) return app::BadSetting("--slot", "OUTBOX_SLOT", "empty");
  return Ok();
}

std::string OptionalJson(const std::optional<std::string>& v) { return v ? JsonQuote(*v) : "null"; }

std::string OptionalJson(const std::optional<int64_t>& v) {
  return v ? std::to_string(*v) : "null";
}

std::string Holder(const SlotReport& r) {
  std::string out = fmt::format("pid {}", r.active_pid.value_or(0));
  if (!r.holder.empty()) out += ", " + r.holder;
  return out;
}

}  // namespace

const SlotStateRow* SlotReport::FindState(std::string_view key) const {
  for (const SlotStateRow& row : state) {
    if (row.key == key) return &row;
  }
  return nullptr;
}

void AddSlotStatusFlags(CLI::App& app, SlotCommandConfig& c) {
  AddCommonFlags(app, c);
  AddOutputOption(app, &c.output);
  app.add_option("--kafka-brokers", c.kafka_brokers,
                 "Also show the exactly-once progress Kafka holds (--delivery=exactly-once) "
                 "next to the slot's confirmed position")
      ->envname("KAFKA_BROKERS");
  app.add_option("--progress-topic", c.progress_topic,
                 "Exactly-once: the progress topic (empty: the relay's own, as run derives it)")
      ->envname("OUTBOX_PROGRESS_TOPIC");
  app.add_option("--transactional-id", c.transactional_id,
                 "Exactly-once: the relay's transactional.id (empty: derived as run derives it)")
      ->envname("OUTBOX_TRANSACTIONAL_ID");
}

void AddSlotDropFlags(CLI::App& app, SlotCommandConfig& c) {
  AddCommonFlags(app, c);
  app.add_flag("--confirm", c.confirm,
               "Really drop the slot (without it: say what would happen, change nothing)");
}

Result<SlotReport> QuerySlotReport(pg::Connection& conn, const std::string& slot) {
  SlotReport report;
  report.slot = slot;
  {
    auto res = conn.Exec("SELECT pg_current_wal_lsn()::text");
    if (!res) return std::unexpected(res.error());
    report.current_wal_lsn = Text(res->get(), 0, 0).value_or("");
  }
  std::optional<std::string> params[] = {slot};
  {
    // pg_replication_slots grows with the server version: ask only for what it has.
    const int version = conn.server_version();
    std::string newer = fmt::format(
        "{}, {}", version >= 160000 ? "s.conflicting" : "NULL::bool",
        version >= 170000 ? "coalesce(s.invalidation_reason, ''), "
                            "coalesce(date_trunc('second', s.inactive_since)::text, ''), "
                            "s.failover, s.synced"
                          : "NULL::text, NULL::text, NULL::bool, NULL::bool");
    auto res = conn.ExecParams(
        "SELECT s.plugin, s.slot_type, s.database, s.active, s.active_pid, s.restart_lsn::text, "
        "s.confirmed_flush_lsn::text, (pg_current_wal_lsn() - s.restart_lsn)::bigint, "
        "(pg_current_wal_lsn() - s.confirmed_flush_lsn)::bigint, s.wal_status, s.safe_wal_size, "
        "(SELECT concat_ws(' ', nullif(a.application_name, ''), 'from ' || host(a.client_addr), "
        "'since ' || date_trunc('second', a.backend_start)::text) "
        "FROM pg_stat_activity a WHERE a.pid = s.active_pid), " +
            newer + " FROM pg_replication_slots s WHERE s.slot_name = $1",
        params);
    if (!res) return std::unexpected(res.error());
    const PGresult* r = res->get();
    if (pg::Rows(r).size() > 0) {
      report.exists = true;
      report.plugin = Text(r, 0, 0).value_or("");
      report.slot_type = Text(r, 0, 1).value_or("");
      report.database = Text(r, 0, 2).value_or("");
      report.active = Text(r, 0, 3) == "t";
      // NULL while inactive / unknown; a cell that is not a number is an error.
      pg::Rows rows(r);
      auto pid = rows.OptionalInt(0, 4);
      auto retained = rows.OptionalInt(0, 7);
      auto unconfirmed = rows.OptionalInt(0, 8);
      auto safe_wal_size = rows.OptionalInt(0, 10);
      if (const Error* e = pg::FirstError(pid, retained, unconfirmed, safe_wal_size)) {
        return std::unexpected(*e);
      }
      if (*pid) report.active_pid = static_cast<int>(**pid);
      report.restart_lsn = Text(r, 0, 5);
      report.confirmed_flush_lsn = Text(r, 0, 6);
      report.retained_bytes = *retained;
      report.unconfirmed_bytes = *unconfirmed;
      report.wal_status = Text(r, 0, 9).value_or("");
      report.safe_wal_size = *safe_wal_size;
      report.holder = Text(r, 0, 11).value_or("");
      auto flag = [&](int col) -> std::optional<bool> {
        auto v = Text(r, 0, col);
        if (!v) return std::nullopt;
        return *v == "t";
      };
      report.conflicting = flag(12);
      report.invalidation_reason = Text(r, 0, 13);
      report.inactive_since = Text(r, 0, 14);
      report.failover = flag(15);
      report.synced = flag(16);
    }
  }
  {
    auto tables = pg::ReadRelayTables(conn);
    if (!tables) return std::unexpected(tables.error());
    report.relay_schema = tables->tables && tables->readable;
    const char* access = !tables->schema || (tables->usage && !tables->tables) ? "missing"
                         : !tables->usage    ? "no USAGE on schema"
                         : !tables->readable ? "no SELECT on tables"
                                             : "ok";
    if (std::string_view(access) != "ok" && std::string_view(access) != "missing") {
      report.relay_schema_access = fmt::format("{} (role {})", access, conn.user());
    }
  }
  if (report.relay_schema) {
    auto state = pg::ListState(conn, slot);
    if (!state) return std::unexpected(state.error());
    for (auto& entry : *state) {
      report.state.push_back(
          {std::move(entry.key), std::move(entry.value), std::move(entry.updated_at)});
    }
    auto extent = pg::DescribeIndex(conn, slot);
    if (!extent) return std::unexpected(extent.error());
    report.indexed_transactions = extent->transactions;
    report.first_commit_lsn = extent->first_commit_lsn;
    report.last_commit_lsn = extent->last_commit_lsn;
    report.first_commit_time = extent->first_commit_time;
    report.last_commit_time = extent->last_commit_time;
  }
  return report;
}

namespace {

// The exactly-once progress Kafka holds for the relay of this slot.
SlotReport::KafkaSide ReadKafkaSide(const SlotCommandConfig& c) {
  SlotReport::KafkaSide side;
  side.topic = c.progress_topic;
  side.key = c.transactional_id;
  if (side.key.empty()) {
    auto repl = pg::Connection::Open(c.database_url, pg::Connection::Mode::kReplication,
                                     "outbox-relay-slot");
    if (!repl) {
      side.error = "cannot derive the transactional.id: " + repl.error().message;
      return side;
    }
    auto identity = pg::IdentifySystem(*repl);
    if (!identity) {
      side.error = "cannot derive the transactional.id: " + identity.error().message;
      return side;
    }
    side.key = pipeline::DefaultTransactionalId(identity->system_id, repl->database(), c.slot);
  }
  kafka::ProducerOptions connection;
  connection.brokers = c.kafka_brokers;
  if (const char* env = std::getenv("OUTBOX_KAFKA_PROPERTIES")) {
    for (const std::string& p : app::SplitPropertyList(env)) {
      size_t eq = p.find('=');
      if (eq != std::string::npos)
        connection.properties.emplace_back(p.substr(0, eq), p.substr(eq + 1));
    }
  }
  kafka::ProgressLogOptions lo;
  lo.connection = std::move(connection);
  lo.topic = side.topic.empty() ? pipeline::DefaultProgressTopic(side.key) : side.topic;
  if (side.topic.empty()) lo.legacy_topic = pipeline::kLegacyProgressTopic;
  lo.timeout = std::chrono::milliseconds(15000);
  lo.open_wait = std::chrono::milliseconds(15000);
  side.topic = lo.topic;
  auto log = kafka::KafkaProgressLog::Create(std::move(lo));
  if (!log) {
    side.error = log.error().message;
    return side;
  }
  auto value = (*log)->ReadLast(side.key);
  if (!value) {
    side.error = value.error().message;
  } else if (*value) {
    auto decoded = pipeline::DecodeProgress(**value);
    if (decoded) {
      side.progress = decoded->progress;
      if (decoded->owner) side.owner = decoded->owner->ToString();
      side.timeline = decoded->history.timeline;
    } else {
      side.error = "cannot read the progress record: " + decoded.error().message;
    }
  }
  return side;
}

std::string BackfillText(const pipeline::BackfillCursor& b) {
  return fmt::format("snapshot {} up to (transaction_id {}, offset {})", b.snapshot,
                     b.transaction_id, b.offset);
}

}  // namespace

std::string FormatSlotReportText(const SlotReport& r) {
  std::string out;
  auto line = [&](std::string_view name, std::string_view value) {
    fmt::format_to(std::back_inserter(out), "  {:<22}{}\n", name, value);
  };
  fmt::format_to(std::back_inserter(out), "slot {}\n", r.slot);
  if (!r.exists) {
    line("exists", "no");
    if (const SlotStateRow* created = r.FindState(kSlotCreatedStateKey)) {
      line("note", fmt::format("the relay created it at {} (state slot_created): the next run "
                               "treats it as lost",
                               created->value));
    }
  } else {
    line("exists", "yes");
    line("plugin", r.plugin);
    line("slot_type", r.slot_type);
    line("database", r.database);
    line("active", r.active ? fmt::format("yes ({})", Holder(r)) : "no");
    line("confirmed_flush_lsn", r.confirmed_flush_lsn.value_or("-"));
    line("restart_lsn", r.restart_lsn.value_or("-"));
    line("current_wal_lsn", r.current_wal_lsn);
    line("retained WAL", r.retained_bytes
                             ? fmt::format("{} ({} bytes, restart_lsn to now)",
                                           PrettyBytes(*r.retained_bytes), *r.retained_bytes)
                             : "-");
    line("unconfirmed WAL", r.unconfirmed_bytes ? fmt::format("{} (confirmed_flush_lsn to now)",
                                                              PrettyBytes(*r.unconfirmed_bytes))
                                                : "-");
    line("wal_status", r.wal_status.empty() ? "-" : r.wal_status);
    line("safe_wal_size", r.safe_wal_size ? PrettyBytes(*r.safe_wal_size)
                                          : "unlimited (max_slot_wal_keep_size = -1)");
    if (r.invalidation_reason) {
      line("invalidation_reason", r.invalidation_reason->empty() ? "-" : *r.invalidation_reason);
    }
    if (r.conflicting) line("conflicting", *r.conflicting ? "yes" : "no");
    if (r.inactive_since) {
      line("inactive_since", r.inactive_since->empty() ? "-" : *r.inactive_since);
    }
    if (r.failover) line("failover", *r.failover ? "yes" : "no");
    if (r.synced) line("synced", *r.synced ? "yes (from a primary)" : "no");
  }
  if (!r.relay_schema_access.empty()) {
    out += fmt::format("relay state: cannot read schema outbox_relay: {}\n", r.relay_schema_access);
    return out;
  }
  if (!r.relay_schema) {
    out += "relay state: schema outbox_relay not found (the relay never ran here)\n";
    return out;
  }
  out += "relay state (outbox_relay.state)\n";
  if (r.state.empty()) line("(none)", "");
  for (const SlotStateRow& s : r.state) {
    line(s.key, fmt::format("{}  (updated {})", s.value, s.updated_at));
  }
  out += "commit index (outbox_relay.commits)\n";
  line("transactions", std::to_string(r.indexed_transactions));
  if (r.indexed_transactions > 0) {
    line("commit_lsn", fmt::format("{} .. {}", r.first_commit_lsn.value_or("-"),
                                   r.last_commit_lsn.value_or("-")));
    line("commit_time", fmt::format("{} .. {}", r.first_commit_time.value_or("-"),
                                    r.last_commit_time.value_or("-")));
  }
  if (r.kafka) {
    out += fmt::format("Kafka progress (exactly-once; topic {}, key {})\n", r.kafka->topic,
                       r.kafka->key);
    if (!r.kafka->error.empty()) {
      line("error", r.kafka->error);
    } else if (!r.kafka->progress) {
      line("(none)", "no committed progress: the relay never committed in exactly-once mode");
    } else {
      const pipeline::KafkaProgress& k = *r.kafka->progress;
      line("relay",
           r.kafka->owner.empty() ? "(not said: a record of an older relay)" : r.kafka->owner);
      line("commit_lsn", r.kafka->timeline == 0
                             ? k.final_lsn.ToString()
                             : fmt::format("{} (timeline {})", k.final_lsn, r.kafka->timeline));
      line("rows", fmt::format("{}{}", k.rows,
                               k.complete ? " (the whole transaction)" : " (more of it to come)"));
      if (k.backfill) line("backfill", BackfillText(*k.backfill));
      if (!k.unmarked.empty()) {
        line("unmarked",
             fmt::format("{} runs of rows Kafka holds that may be unmarked", k.unmarked.size()));
      }
      if (r.confirmed_flush_lsn) {
        line("vs the slot", fmt::format("confirmed_flush_lsn {}: what lies between is sent again "
                                        "after a restart and skipped, not produced twice",
                                        *r.confirmed_flush_lsn));
      }
    }
  }
  return out;
}

std::string FormatSlotReportJson(const SlotReport& r) {
  std::string out = "{";
  auto field = [&](std::string_view name, const std::string& json) {
    if (out.size() > 1) out += ",";
    fmt::format_to(std::back_inserter(out), "{}:{}", JsonQuote(name), json);
  };
  auto str = [](const std::string& s) { return JsonQuote(s); };
  field("slot", str(r.slot));
  field("exists", r.exists ? "true" : "false");
  field("current_wal_lsn", str(r.current_wal_lsn));
  if (r.exists) {
    field("plugin", str(r.plugin));
    field("slot_type", str(r.slot_type));
    field("database", str(r.database));
    field("active", r.active ? "true" : "false");
    field("active_pid", r.active_pid ? std::to_string(*r.active_pid) : "null");
    field("holder", r.holder.empty() ? "null" : str(r.holder));
    field("confirmed_flush_lsn", OptionalJson(r.confirmed_flush_lsn));
    field("restart_lsn", OptionalJson(r.restart_lsn));
    field("retained_wal_bytes", OptionalJson(r.retained_bytes));
    field("retained_wal", r.retained_bytes ? str(PrettyBytes(*r.retained_bytes)) : "null");
    field("unconfirmed_wal_bytes", OptionalJson(r.unconfirmed_bytes));
    field("wal_status", r.wal_status.empty() ? "null" : str(r.wal_status));
    field("safe_wal_size", OptionalJson(r.safe_wal_size));
    auto flag = [](const std::optional<bool>& v) -> std::string {
      return v ? (*v ? "true" : "false") : "null";
    };
    auto text = [&](const std::optional<std::string>& v) -> std::string {
      return v && !v->empty() ? str(*v) : "null";
    };
    // null where the server has no such column, or where it says nothing.
    field("conflicting", flag(r.conflicting));
    field("invalidation_reason", text(r.invalidation_reason));
    field("inactive_since", text(r.inactive_since));
    field("failover", flag(r.failover));
    field("synced", flag(r.synced));
  }
  field("relay_schema", r.relay_schema ? "true" : "false");
  if (!r.relay_schema_access.empty()) field("relay_schema_access", str(r.relay_schema_access));
  std::string state = "{";
  for (const SlotStateRow& s : r.state) {
    if (state.size() > 1) state += ",";
    fmt::format_to(std::back_inserter(state), "{}:{{\"value\":{},\"updated_at\":{}}}",
                   JsonQuote(s.key), JsonQuote(s.value), JsonQuote(s.updated_at));
  }
  state += "}";
  field("state", state);
  field("commit_index",
        fmt::format("{{\"transactions\":{},\"first_commit_lsn\":{},\"last_commit_lsn\":{},"
                    "\"first_commit_time\":{},\"last_commit_time\":{}}}",
                    r.indexed_transactions, OptionalJson(r.first_commit_lsn),
                    OptionalJson(r.last_commit_lsn), OptionalJson(r.first_commit_time),
                    OptionalJson(r.last_commit_time)));
  if (r.kafka) {
    std::string progress = "null";
    if (const auto& k = r.kafka->progress) {
      progress = fmt::format(
          "{{\"commit_lsn\":{},\"rows\":{},\"complete\":{},\"backfill\":{}}}",
          JsonQuote(k->final_lsn.ToString()), k->rows, k->complete ? "true" : "false",
          k->backfill ? fmt::format("{{\"snapshot\":{},\"transaction_id\":{},\"offset\":{}}}",
                                    JsonQuote(k->backfill->snapshot), k->backfill->transaction_id,
                                    k->backfill->offset)
                      : "null");
    }
    field("kafka_progress",
          fmt::format("{{\"topic\":{},\"key\":{},\"progress\":{},\"error\":{}}}",
                      JsonQuote(r.kafka->topic), JsonQuote(r.kafka->key), progress,
                      r.kafka->error.empty() ? "null" : JsonQuote(r.kafka->error)));
  }
  out += "}\n";
  return out;
}

int SlotStatusCommand(SlotCommandConfig& c) {
  app::SetupLogging(c.log);
  if (auto st = Validate(c); !st) {
    spdlog::error("{}", st.error().message);
    return app::kExitConfig;
  }
  auto conn =
      pg::Connection::Open(c.database_url, pg::Connection::Mode::kNormal, "outbox-relay-slot");
  if (!conn) {
    spdlog::error("{}", conn.error().message);
    return app::kExitFailure;
  }
  auto report = QuerySlotReport(*conn, c.slot);
  if (!report) {
    spdlog::error("slot status: {}", report.error().message);
    return app::kExitFailure;
  }
  if (!c.kafka_brokers.empty()) report->kafka = ReadKafkaSide(c);
  std::string text = c.output == OutputFormat::kJson ? FormatSlotReportJson(*report)
                                                     : FormatSlotReportText(*report);
  std::fwrite(text.data(), 1, text.size(), stdout);
  std::fflush(stdout);
  return app::kExitOk;
}

int SlotDropCommand(SlotCommandConfig& c) {
  app::SetupLogging(c.log);
  if (auto st = Validate(c); !st) {
    spdlog::error("{}", st.error().message);
    return app::kExitConfig;
  }
  auto conn =
      pg::Connection::Open(c.database_url, pg::Connection::Mode::kNormal, "outbox-relay-slot");
  if (!conn) {
    spdlog::error("{}", conn.error().message);
    return app::kExitFailure;
  }
  auto report = QuerySlotReport(*conn, c.slot);
  if (!report) {
    spdlog::error("slot drop: {}", report.error().message);
    return app::kExitFailure;
  }
  if (!report->exists) {
    std::printf("slot %s does not exist: nothing to drop\n", c.slot.c_str());
    return app::kExitOk;
  }
  if (report->active) {
    spdlog::error(
        "refusing to drop slot {}: it is active, held by {}. Stop that relay first "
        "(SIGTERM lets it drain), or end its connection with "
        "SELECT pg_terminate_backend({}); then run this again",
        c.slot, Holder(*report), report->active_pid.value_or(0));
    return app::kExitFailure;
  }
  // What the next `run` does without the slot (relay_slot.cc, Relay::SetupSlot).
  std::string next_run;
  if (const SlotStateRow* created = report->FindState(kSlotCreatedStateKey)) {
    next_run = fmt::format(
        "Nothing is lost: the relay's state (outbox_relay.state slot_created = {}) says the slot "
        "existed, so the next `outbox-relay run` treats it as lost and, with "
        "--on-slot-lost=reconcile (the default), recreates it and backfills every unacked row "
        "from the table (rows published but not yet marked are published again: at least "
        "once); with --on-slot-lost=fail it stops and says so. A standby instance that is "
        "running now does this at once.",
        created->value);
  } else {
    next_run =
        "The relay's state has no slot_created row for it (it was not created by this relay, or "
        "the state was removed): the next `outbox-relay run` creates a new slot and, with "
        "--backfill=true (the default), publishes the unacked rows committed before it.";
  }
  std::string what = fmt::format(
      "drop replication slot {} (plugin {}, confirmed_flush_lsn {}, retaining {} of WAL)", c.slot,
      report->plugin, report->confirmed_flush_lsn.value_or("-"),
      report->retained_bytes ? PrettyBytes(*report->retained_bytes) : "unknown");
  if (!c.confirm) {
    spdlog::error(
        "refusing without --confirm. This would {}. {} Run again with --confirm to "
        "drop it.",
        what, next_run);
    return app::kExitConfig;
  }
  std::optional<std::string> params[] = {c.slot};
  auto dropped = conn->ExecParams("SELECT pg_drop_replication_slot($1)", params);
  if (!dropped) {
    spdlog::error("drop slot {}: {}", c.slot, dropped.error().message);
    return app::kExitFailure;
  }
  std::printf(
      "dropped replication slot %s (it was at confirmed_flush_lsn %s, retaining %s of "
      "WAL)\n%s\n",
      c.slot.c_str(), report->confirmed_flush_lsn.value_or("-").c_str(),
      report->retained_bytes ? PrettyBytes(*report->retained_bytes).c_str() : "unknown",
      next_run.c_str());
  std::fflush(stdout);
  spdlog::info("dropped replication slot {}", c.slot);
  return app::kExitOk;
}

}  // namespace outbox_relay::ops
