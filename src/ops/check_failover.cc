#include "outbox_relay/ops/check_failover.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <memory>
#include <optional>
#include <set>
#include <string>

#include "outbox_relay/pg/rows.h"

namespace outbox_relay::ops {

namespace {

// synchronized_standby_slots is a comma-separated list of slot names ('*'
// is not allowed there, unlike synchronous_standby_names).
std::set<std::string> SlotList(std::string_view text) {
  std::set<std::string> out;
  std::string cur;
  for (char ch : text) {
    if (ch == ',') {
      if (!cur.empty()) out.insert(cur);
      cur.clear();
    } else if (ch != ' ' && ch != '"') {
      cur += ch;
    }
  }
  if (!cur.empty()) out.insert(cur);
  return out;
}

// Does the conninfo string name a database? (Never returns or prints values:
// primary_conninfo may hold a password.)
bool ConninfoHasDbname(const std::string& conninfo) {
  char* err = nullptr;
  PQconninfoOption* opts = PQconninfoParse(conninfo.c_str(), &err);
  if (err != nullptr) PQfreemem(err);
  if (opts == nullptr) return false;
  bool found = false;
  for (PQconninfoOption* o = opts; o->keyword != nullptr; ++o) {
    if (std::string_view(o->keyword) == "dbname" && o->val != nullptr && *o->val != '\0') {
      found = true;
    }
  }
  PQconninfoFree(opts);
  return found;
}

class FailoverChecker {
 public:
  FailoverChecker(pg::Connection& primary, const CheckConfig& c)
      : primary_(primary), c_(c), r_(c.relay) {}

  std::vector<CheckResult> Run() {
    if (!Primary()) return std::move(out_);
    if (!c_.standby_url.empty()) Standby();
    return std::move(out_);
  }

 private:
  void Add(CheckStatus s, std::string detail, std::string fix = "") {
    out_.push_back({s, name_, std::move(detail), std::move(fix)});
  }

  bool Primary() {
    name_ = "failover slot";
    const int version = primary_.server_version();
    if (version < 170000) {
      Add(r_.failover_slot ? CheckStatus::kFail : CheckStatus::kWarn,
          fmt::format("PostgreSQL {}.{} has no failover slots (17+): after a promotion the "
                      "standby has no copy of slot {}, and run recreates it and publishes every "
                      "unacked row again (--on-slot-lost=reconcile: duplicates, nothing lost)",
                      version / 10000, version % 10000, r_.slot),
          r_.failover_slot ? "drop --failover-slot (OUTBOX_FAILOVER_SLOT), or upgrade to 17"
                           : "upgrade to PostgreSQL 17 to keep the slot across a failover");
      return false;
    }
    auto res = primary_.ExecParams(
        "SELECT (SELECT failover FROM pg_replication_slots WHERE slot_name = $1), "
        "(SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = $1), "
        "current_setting('synchronized_standby_slots'), "
        "(SELECT system_identifier::text FROM pg_control_system())",
        slot_param_);
    if (!res) {
      Add(CheckStatus::kFail, res.error().message);
      return false;
    }
    pg::Rows p(res->get());
    // The slot's columns are NULL when it does not exist (yet), and
    // confirmed_flush_lsn also while it has no confirmed position; the
    // settings are never NULL.
    const bool exists = p.Value(0, 0).has_value();
    Result<bool> failover = exists ? p.Bool(0, 0) : Result<bool>(false);
    std::optional<std::string_view> confirmed = p.Value(0, 1);
    auto standby_slots = p.Text(0, 2);
    auto system_id = p.Text(0, 3);
    if (const Error* e = pg::FirstError(failover, standby_slots, system_id)) {
      Add(CheckStatus::kFail, e->message);
      return false;
    }
    primary_confirmed_ = std::string(confirmed.value_or(""));
    standby_slots_ = SlotList(*standby_slots);
    system_id_ = std::string(*system_id);
    if (!exists) {
      Add(r_.failover_slot ? CheckStatus::kOk : CheckStatus::kWarn,
          r_.failover_slot
              ? fmt::format("slot {} does not exist; run creates it with failover = true", r_.slot)
              : fmt::format("slot {} does not exist; without --failover-slot run creates it "
                            "without failover, and a promoted standby will not have it",
                            r_.slot),
          "run with --failover-slot (OUTBOX_FAILOVER_SLOT=true)");
    } else if (*failover) {
      Add(CheckStatus::kOk, fmt::format("slot {} has failover = true", r_.slot));
    } else {
      Add(r_.failover_slot ? CheckStatus::kOk : CheckStatus::kWarn,
          r_.failover_slot ? fmt::format("slot {} has failover = false; run sets it to true "
                                         "(--failover-slot)",
                                         r_.slot)
                           : fmt::format("slot {} has failover = false: a promoted standby "
                                         "will not have it",
                                         r_.slot),
          "run with --failover-slot (OUTBOX_FAILOVER_SLOT=true)");
    }

    name_ = "synchronized_standby_slots";
    if (standby_slots_.empty()) {
      Add(CheckStatus::kFail,
          "empty on the primary: the relay may publish transactions no standby has received; "
          "after a failover they are gone from the database but not from Kafka (phantoms), "
          "and the synced slot may lag behind what the relay confirmed",
          "ALTER SYSTEM SET synchronized_standby_slots = '<the standby's primary_slot_name>'; "
          "SELECT pg_reload_conf();");
    } else {
      Add(CheckStatus::kOk,
          fmt::format("{}: logical walsenders wait until these standbys have the WAL",
                      fmt::join(standby_slots_, ", ")));
    }
    return true;
  }

  void Standby() {
    name_ = "standby";
    auto conn =
        pg::Connection::Open(c_.standby_url, pg::Connection::Mode::kNormal, "outbox-relay-check");
    if (!conn) {
      Add(CheckStatus::kFail, conn.error().message,
          "check --standby-url (OUTBOX_STANDBY_URL): the standby's address, as for DATABASE_URL");
      return;
    }
    auto res = conn->Exec(
        "SELECT pg_is_in_recovery(), current_setting('server_version_num')::int, "
        "(SELECT system_identifier::text FROM pg_control_system()), "
        "current_setting('wal_level'), current_setting('hot_standby_feedback'), "
        "current_setting('primary_slot_name'), current_setting('primary_conninfo'), "
        "CASE WHEN current_setting('server_version_num')::int >= 170000 "
        "THEN current_setting('sync_replication_slots') END");
    if (!res) {
      Add(CheckStatus::kFail, res.error().message);
      return;
    }
    pg::Rows s(res->get());
    auto in_recovery = s.Bool(0, 0);
    auto version = s.Int(0, 1);
    auto system_id = s.Text(0, 2);
    auto wal_level = s.Text(0, 3);
    auto feedback = s.Text(0, 4);
    auto slot_name = s.Text(0, 5);
    auto conninfo = s.Text(0, 6);
    // sync_replication_slots: NULL before 17 (the CASE), which is refused below.
    std::optional<std::string_view> sync_slots = s.Value(0, 7);
    if (const Error* e = pg::FirstError(in_recovery, version, system_id, wal_level, feedback,
                                        slot_name, conninfo)) {
      Add(CheckStatus::kFail, e->message);
      return;
    }
    if (!*in_recovery) {
      Add(CheckStatus::kFail, "--standby-url names a server that is not in recovery (a primary)",
          "point --standby-url (OUTBOX_STANDBY_URL) at the physical standby");
      return;
    }
    if (*system_id != system_id_) {
      Add(CheckStatus::kFail,
          "a standby of another cluster (its system identifier differs from the primary's)",
          "point --standby-url (OUTBOX_STANDBY_URL) at a standby of DATABASE_URL's server");
      return;
    }
    if (*version < 170000) {
      Add(CheckStatus::kFail,
          fmt::format("PostgreSQL {}.{}: slot synchronization needs 17", *version / 10000,
                      *version % 10000),
          "upgrade the standby to 17");
      return;
    }
    Add(CheckStatus::kOk, "a standby of this primary (same system identifier, in recovery)");

    Setting("sync_replication_slots", sync_slots == "on", "on",
            "ALTER SYSTEM SET sync_replication_slots = on; SELECT pg_reload_conf(); (on the "
            "standby)");
    Setting("hot_standby_feedback", *feedback == "on", "on",
            "ALTER SYSTEM SET hot_standby_feedback = on; SELECT pg_reload_conf(); (on the "
            "standby: the primary must keep the catalog rows the synced slot needs)");
    Setting("wal_level", *wal_level == "logical", "logical",
            "ALTER SYSTEM SET wal_level = logical; on the standby, then restart it");
    name_ = "primary_slot_name";
    if (slot_name->empty()) {
      Add(CheckStatus::kFail,
          "empty on the standby: it streams without a physical slot, and slots are synced only "
          "over one",
          "on the primary: SELECT pg_create_physical_replication_slot('standby1'); on the "
          "standby: ALTER SYSTEM SET primary_slot_name = 'standby1'; SELECT pg_reload_conf();");
    } else {
      PhysicalSlot(std::string(*slot_name));
    }
    name_ = "primary_conninfo";
    if (ConninfoHasDbname(std::string(*conninfo))) {
      Add(CheckStatus::kOk, "names a database (slot synchronization connects to it)");
    } else {
      Add(CheckStatus::kFail,
          "names no database: slot synchronization needs one (dbname=...) to read the "
          "primary's slots",
          "add dbname=<any database> to primary_conninfo on the standby, then reload it");
    }
    SyncedSlot(*conn);
  }

  void Setting(const char* setting, bool ok, const char* want, const char* fix) {
    name_ = setting;
    if (ok) {
      Add(CheckStatus::kOk, fmt::format("{} on the standby", want));
    } else {
      Add(CheckStatus::kFail, fmt::format("not {} on the standby", want), fix);
    }
  }

  // The standby's physical slot on the primary, and synchronized_standby_slots naming it.
  void PhysicalSlot(const std::string& slot_name) {
    std::optional<std::string> params[] = {slot_name};
    auto res = primary_.ExecParams(
        "SELECT slot_type, active FROM pg_replication_slots WHERE slot_name = $1", params);
    if (!res) {
      Add(CheckStatus::kFail, res.error().message);
      return;
    }
    pg::Rows rows(res->get());
    auto slot_type = rows.Text(0, 0);
    auto active = rows.Bool(0, 1);
    if (rows.size() == 0) {
      Add(CheckStatus::kFail,
          fmt::format("{} (the standby's) does not exist on the primary", slot_name),
          fmt::format("on the primary: SELECT pg_create_physical_replication_slot('{}');",
                      slot_name));
    } else if (const Error* e = pg::FirstError(slot_type, active)) {
      Add(CheckStatus::kFail, e->message);
    } else if (*slot_type != "physical") {
      Add(CheckStatus::kFail, fmt::format("{} on the primary is not a physical slot", slot_name),
          "give the standby a physical slot of its own");
    } else {
      Add(*active ? CheckStatus::kOk : CheckStatus::kWarn,
          fmt::format("{}: a physical slot on the primary, {}", slot_name,
                      *active ? "in use by the standby" : "not in use (is the standby streaming?)"),
          "check the standby's log and primary_conninfo");
    }
    name_ = "synchronized_standby_slots";
    if (!standby_slots_.contains(slot_name)) {
      Add(CheckStatus::kFail,
          fmt::format("does not name the standby's slot {}: the relay may get ahead of this "
                      "standby, and the copy of the slot it holds may lag behind",
                      slot_name),
          fmt::format("on the primary: ALTER SYSTEM SET synchronized_standby_slots = '{}'; "
                      "SELECT pg_reload_conf();",
                      slot_name));
    }
  }

  void SyncedSlot(pg::Connection& standby) {
    name_ = "synced slot";
    std::optional<std::string> params[] = {r_.slot};
    auto res = standby.ExecParams(
        "SELECT synced, temporary, confirmed_flush_lsn::text, invalidation_reason, "
        "pg_last_wal_replay_lsn()::text FROM pg_replication_slots WHERE slot_name = $1",
        params);
    if (!res) {
      Add(CheckStatus::kFail, res.error().message);
      return;
    }
    if (pg::Rows(res->get()).size() == 0) {
      Add(primary_confirmed_.empty() ? CheckStatus::kWarn : CheckStatus::kFail,
          fmt::format("the standby holds no copy of slot {}{}", r_.slot,
                      primary_confirmed_.empty() ? " (it does not exist on the primary yet)" : ""),
          "the slot needs failover = true (--failover-slot) and the settings above; the "
          "standby's log says why it does not sync");
      return;
    }
    pg::Rows r(res->get());
    auto synced = r.Bool(0, 0);
    auto temporary = r.Bool(0, 1);
    // NULL while the copy has no confirmed position yet (an invalid LSN).
    std::optional<std::string_view> confirmed = r.Value(0, 2);
    // NULL while the copy is valid.
    std::string invalid(r.Value(0, 3).value_or(""));
    if (const Error* e = pg::FirstError(synced, temporary)) {
      Add(CheckStatus::kFail, e->message);
      return;
    }
    if (!*synced) {
      Add(CheckStatus::kFail,
          fmt::format("slot {} on the standby was not synced from the primary (created there)",
                      r_.slot),
          "drop it on the standby so the synchronization can create its copy");
    } else if (!invalid.empty()) {
      Add(CheckStatus::kFail,
          fmt::format("the standby's copy of slot {} is invalidated ({})", r_.slot, invalid),
          "see the standby's log; hot_standby_feedback and the physical slot keep it valid");
    } else if (*temporary) {
      Add(CheckStatus::kWarn,
          fmt::format("the standby's copy of slot {} is still temporary: the standby has not "
                      "yet caught up with the slot; a failover now would lose it",
                      r_.slot),
          "wait until it is persistent (it becomes so once the relay confirms a position the "
          "standby has)");
    } else {
      Add(CheckStatus::kOk,
          fmt::format("the standby holds a synced copy of slot {} at confirmed_flush_lsn {} "
                      "(primary: {}); a promoted standby resumes from it",
                      r_.slot, confirmed.value_or(""), primary_confirmed_));
    }
  }

  pg::Connection& primary_;
  const CheckConfig& c_;
  const app::RelayConfig& r_;
  std::optional<std::string> slot_param_[1] = {c_.relay.slot};
  std::vector<CheckResult> out_;
  std::string name_;
  std::string primary_confirmed_;
  std::set<std::string> standby_slots_;
  std::string system_id_;
};

}  // namespace

std::vector<CheckResult> CheckFailover(pg::Connection& primary, const CheckConfig& config) {
  return FailoverChecker(primary, config).Run();
}

}  // namespace outbox_relay::ops
