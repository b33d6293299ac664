// `outbox-relay slot status|drop`: the JSON status parses and shows the slot
// (inactive, then held by a running relay); drop refuses without --confirm,
// refuses an active slot naming the PID that holds it, and drops an inactive
// one, after which `run` recovers by backfill.
#include <fmt/format.h>

#include <thread>

#include "fixture.h"
#include "ops_support.h"

namespace outbox_test {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

class OpsSlot : public RelayTest {
 protected:
  std::vector<std::string> Args(const std::string& command,
                                const std::vector<std::string>& extra = {}) const {
    std::vector<std::string> args = {"slot", command, "--slot", name_};
    args.insert(args.end(), extra.begin(), extra.end());
    return args;
  }
  std::map<std::string, std::optional<std::string>> Env() const {
    return {{"DATABASE_URL", env_.database_url}};
  }
  bool WaitInactive(milliseconds timeout) {
    auto deadline = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < deadline) {
      auto s = QuerySlot(*db_, name_);
      if (s && !s->active) return true;
      std::this_thread::sleep_for(milliseconds(100));
    }
    return false;
  }
};

TEST_F(OpsSlot, StatusJsonShowsAnInactiveSlot) {
  db_->Exec("SELECT pg_create_logical_replication_slot($1, 'pgoutput')", {name_});
  CommandResult r = RunRelayCommand(Args("status", {"--output", "json"}), Env());
  ASSERT_EQ(r.exit_code, 0) << r.Describe();
  // PostgreSQL parses it (JsonPath throws on invalid JSON).
  EXPECT_EQ(JsonPath(*db_, r.out, "{slot}"), name_);
  EXPECT_EQ(JsonPath(*db_, r.out, "{exists}"), "true");
  EXPECT_EQ(JsonPath(*db_, r.out, "{plugin}"), "pgoutput");
  EXPECT_EQ(JsonPath(*db_, r.out, "{active}"), "false");
  EXPECT_EQ(JsonPath(*db_, r.out, "{active_pid}"), std::nullopt);
  EXPECT_EQ(JsonPath(*db_, r.out, "{database}"), db_->Scalar("SELECT current_database()"));
  EXPECT_EQ(JsonPath(*db_, r.out, "{confirmed_flush_lsn}"),
            db_->Scalar("SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE "
                        "slot_name = $1",
                        {name_}));
  EXPECT_TRUE(JsonPath(*db_, r.out, "{retained_wal_bytes}").has_value()) << r.out;
  EXPECT_EQ(JsonPath(*db_, r.out, "{wal_status}"), "reserved");
  EXPECT_EQ(JsonPath(*db_, r.out, "{commit_index,transactions}"), "0");

  // Text output names the same things.
  CommandResult text = RunRelayCommand(Args("status"), Env());
  ASSERT_EQ(text.exit_code, 0) << text.Describe();
  EXPECT_NE(text.out.find("slot " + name_), std::string::npos) << text.Describe();
  EXPECT_NE(text.out.find("retained WAL"), std::string::npos) << text.Describe();

  // A slot that does not exist is reported, not an error.
  CommandResult missing =
      RunRelayCommand({"slot", "status", "--slot", name_ + "_none", "--output", "json"}, Env());
  ASSERT_EQ(missing.exit_code, 0) << missing.Describe();
  EXPECT_EQ(JsonPath(*db_, missing.out, "{exists}"), "false");

  CommandResult bad = RunRelayCommand(Args("status", {"--output", "yaml"}), Env());
  EXPECT_EQ(bad.exit_code, 2) << bad.Describe();
  EXPECT_NE(bad.err.find("--output"), std::string::npos) << bad.Describe();
}

TEST_F(OpsSlot, DropNeedsConfirmRefusesAnActiveSlotAndDropsAnInactiveOne) {
  CreateTables();
  RelayProcess& relay = StartRelay();
  ASSERT_TRUE(WaitStreaming(relay)) << relay.LogTail();
  auto slot = QuerySlot(*db_, name_);
  ASSERT_TRUE(slot && slot->active && slot->active_pid);

  // Active: status shows the holder, drop refuses and names its PID.
  CommandResult status = RunRelayCommand(Args("status", {"--output", "json"}), Env());
  ASSERT_EQ(status.exit_code, 0) << status.Describe();
  EXPECT_EQ(JsonPath(*db_, status.out, "{active}"), "true");
  EXPECT_EQ(JsonPath(*db_, status.out, "{active_pid}"), std::to_string(*slot->active_pid));
  EXPECT_TRUE(JsonPath(*db_, status.out, "{state,slot_created,value}").has_value()) << status.out;
  CommandResult active = RunRelayCommand(Args("drop", {"--confirm"}), Env());
  EXPECT_EQ(active.exit_code, 1) << active.Describe();
  EXPECT_NE(active.err.find("active"), std::string::npos) << active.Describe();
  EXPECT_NE(active.err.find(std::to_string(*slot->active_pid)), std::string::npos)
      << active.Describe();
  EXPECT_TRUE(QuerySlot(*db_, name_).has_value());

  // Stopped relay: without --confirm, drop says what it would do and that
  // the next run backfills; nothing changes.
  relay.Terminate();
  ASSERT_EQ(relay.Wait(seconds(30)), 0) << relay.LogTail();
  ASSERT_TRUE(WaitInactive(seconds(10)));
  CommandResult unconfirmed = RunRelayCommand(Args("drop"), Env());
  EXPECT_EQ(unconfirmed.exit_code, 2) << unconfirmed.Describe();
  EXPECT_NE(unconfirmed.err.find("--confirm"), std::string::npos) << unconfirmed.Describe();
  EXPECT_NE(unconfirmed.err.find("backfills every unacked row"), std::string::npos)
      << unconfirmed.Describe();
  EXPECT_TRUE(QuerySlot(*db_, name_).has_value());

  CommandResult dropped = RunRelayCommand(Args("drop", {"--confirm"}), Env());
  ASSERT_EQ(dropped.exit_code, 0) << dropped.Describe();
  EXPECT_NE(dropped.out.find("dropped replication slot " + name_), std::string::npos)
      << dropped.Describe();
  EXPECT_FALSE(QuerySlot(*db_, name_).has_value());

  // Rows written while the slot is gone are not lost: the next run sees the
  // slot as lost (state slot_created), recreates it and backfills them.
  Ledger ledger;
  {
    Writer writer(Workload(), &ledger, -1, 5);
    for (int i = 0; i < 3; ++i) ASSERT_TRUE(writer.Transaction({.rows = 2}));
  }
  CommandResult gone = RunRelayCommand(Args("status"), Env());
  ASSERT_EQ(gone.exit_code, 0) << gone.Describe();
  EXPECT_NE(gone.out.find("treats it as lost"), std::string::npos) << gone.Describe();
  RelayProcess& again = StartRelay();
  ASSERT_TRUE(WaitStreaming(again)) << again.LogTail();
  EXPECT_EQ(WaitAllAcked(seconds(60)), 0) << again.LogTail();
}

}  // namespace
}  // namespace outbox_test
