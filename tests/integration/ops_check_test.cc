// `outbox-relay check`: passes (exit 0) on the project's services with a
// proper table, also while a relay holds the slot; fails (exit 1) with the fix
// on a server with wal_level = replica (a throwaway PostgreSQL 15 cluster,
// support/throwaway_pg.h, on 127.0.0.1:25499 or the next free port) and on a
// missing table.
#include <fmt/format.h>

#include <memory>

#include "fixture.h"
#include "ops_support.h"
#include "support/throwaway_pg.h"

namespace outbox_test {
namespace {

using std::chrono::seconds;

class OpsCheck : public RelayTest {
 protected:
  // run's flags for this test's table, slot, publication and topics.
  std::vector<std::string> CheckArgs(const std::vector<std::string>& extra = {}) const {
    std::vector<std::string> args = RelayArgs(extra);
    args[0] = "check";
    return args;
  }
  std::map<std::string, std::optional<std::string>> Env() const {
    return {{"DATABASE_URL", env_.database_url}, {"KAFKA_BROKERS", env_.kafka_brokers}};
  }
  // The status of the check named `name` in a --output json document.
  std::optional<std::string> StatusOf(const std::string& json, const std::string& name) {
    return db_->Scalar(
        "SELECT c->>'status' FROM jsonb_array_elements($1::jsonb->'checks') c "
        "WHERE c->>'check' = $2",
        {json, name});
  }
};

TEST_F(OpsCheck, PassesOnTheServicesWithAProperTable) {
  CreateTables();
  // Before the first run: publication and slot are "will be created".
  CommandResult fresh = RunRelayCommand(CheckArgs(), Env());
  EXPECT_EQ(fresh.exit_code, 0) << fresh.Describe();
  EXPECT_NE(fresh.out.find("check: 0 FAIL"), std::string::npos) << fresh.Describe();
  EXPECT_NE(fresh.out.find("OK    wal_level: logical"), std::string::npos) << fresh.Describe();
  EXPECT_NE(fresh.out.find(fmt::format("OK    slot {}: does not exist; run creates it", name_)),
            std::string::npos)
      << fresh.Describe();

  // With a relay streaming and rows published: the slot is held, the
  // publication is the relay's, the event types' topics exist.
  RelayProcess& relay = StartRelay();
  ASSERT_TRUE(WaitStreaming(relay)) << relay.LogTail();
  Ledger ledger;
  {
    Writer writer(Workload(), &ledger, -1, 9);
    for (int i = 0; i < 5; ++i) ASSERT_TRUE(writer.Transaction({.rows = 3}));
  }
  ASSERT_EQ(WaitAllAcked(seconds(60)), 0) << relay.LogTail();
  CommandResult running = RunRelayCommand(CheckArgs(), Env());
  EXPECT_EQ(running.exit_code, 0) << running.Describe();
  EXPECT_NE(running.out.find("active, held by pid"), std::string::npos) << running.Describe();
  EXPECT_NE(running.out.find(fmt::format("OK    publication {}: FOR TABLE public.{}, publish = "
                                         "insert",
                                         name_, name_)),
            std::string::npos)
      << running.Describe();
  EXPECT_NE(running.out.find(fmt::format("OK    topic {}.review.review: exists", topic_prefix_)),
            std::string::npos)
      << running.Describe();

  CommandResult json = RunRelayCommand(CheckArgs({"--output", "json"}), Env());
  EXPECT_EQ(json.exit_code, 0) << json.Describe();
  EXPECT_EQ(JsonPath(*db_, json.out, "{ok}"), "true") << json.out;
  EXPECT_EQ(JsonPath(*db_, json.out, "{fail}"), "0") << json.out;
  EXPECT_EQ(StatusOf(json.out, "wal_level"), "OK");
  EXPECT_EQ(StatusOf(json.out, "slot " + name_), "OK");
}

TEST_F(OpsCheck, WarnsAboutUpdatesInThePublicationAndAMissingPartialIndex) {
  CreateTables();
  db_->Exec(fmt::format("CREATE PUBLICATION {0} FOR TABLE {0}", QuoteIdent(name_)));
  db_->Exec("DROP INDEX " + QuoteIdent(name_ + "_acked"));
  CommandResult r = RunRelayCommand(CheckArgs({"--output", "json"}), Env());
  EXPECT_EQ(r.exit_code, 0) << r.Describe();
  EXPECT_EQ(StatusOf(r.out, "publication " + name_), "WARN") << r.out;
  EXPECT_EQ(StatusOf(r.out, "unacked index"), "WARN") << r.out;
  EXPECT_EQ(StatusOf(r.out, "marking index"), "OK") << r.out;

  db_->Exec(
      fmt::format("DROP PUBLICATION {0}; CREATE PUBLICATION {0} FOR TABLE {1} WITH "
                  "(publish = 'insert')",
                  QuoteIdent(name_), QuoteIdent(other_table_)));
  r = RunRelayCommand(CheckArgs(), Env());
  EXPECT_EQ(r.exit_code, 1) << r.Describe();
  EXPECT_NE(r.out.find(fmt::format("FAIL  publication {}: exists but does not include", name_)),
            std::string::npos)
      << r.Describe();
  EXPECT_NE(r.out.find("ALTER PUBLICATION"), std::string::npos) << r.Describe();
}

TEST_F(OpsCheck, FailsOnAMissingTable) {
  CommandResult r = RunRelayCommand(CheckArgs(), Env());
  EXPECT_EQ(r.exit_code, 1) << r.Describe();
  EXPECT_NE(r.out.find(fmt::format("FAIL  outbox table: public.{} does not exist", name_)),
            std::string::npos)
      << r.Describe();
}

TEST_F(OpsCheck, FailsOnWalLevelReplicaAndSaysHowToFixIt) {
  std::unique_ptr<ThrowawayPostgres> cluster;
  try {
    cluster = std::make_unique<ThrowawayPostgres>(FreeLocalPort(25499), "-c wal_level=replica");
  } catch (const std::exception& e) {
    FAIL() << "cannot start the throwaway PostgreSQL 15 cluster: " << e.what();
  }
  {
    Pg other(cluster->url());
    other.Exec(OutboxTableDdl("outbox"));
  }
  auto env = Env();
  env["DATABASE_URL"] = cluster->url();
  std::vector<std::string> args = {"check", "--table",     "public.outbox",       "--slot",
                                   name_,   "--dlq-topic", topic_prefix_ + ".dlq"};
  CommandResult r = RunRelayCommand(args, env);
  EXPECT_EQ(r.exit_code, 1) << r.Describe();
  EXPECT_NE(r.out.find("FAIL  wal_level: replica"), std::string::npos) << r.Describe();
  EXPECT_NE(r.out.find("fix: ALTER SYSTEM SET wal_level = logical; then restart PostgreSQL"),
            std::string::npos)
      << r.Describe();
  // Everything else about that server is fine.
  EXPECT_NE(r.out.find("check: 1 FAIL"), std::string::npos) << r.Describe();

  args.insert(args.end(), {"--output", "json"});
  CommandResult json = RunRelayCommand(args, env);
  EXPECT_EQ(json.exit_code, 1) << json.Describe();
  EXPECT_EQ(JsonPath(*db_, json.out, "{ok}"), "false") << json.out;
  EXPECT_EQ(StatusOf(json.out, "wal_level"), "FAIL") << json.out;
}

}  // namespace
}  // namespace outbox_test
