// The relay under a least-privilege role, as docs/deploy and docker/compose
// set it up: LOGIN REPLICATION, SELECT and UPDATE on the outbox table, the
// relay's schema prepared by an administrator, no CREATE on the database, the
// publication created by the table's owner. It must start, stream, publish and
// mark without asking for more.
#include <fmt/format.h>

#include "fixture.h"
#include "outbox_relay/pg/relay_schema.h"

namespace outbox_test {
namespace {

using std::chrono::seconds;

class LeastPrivilege : public RelayTest {
 protected:
  void TearDown() override {
    RelayTest::TearDown();
    if (!role_.empty() && db_) {
      db_->Exec(fmt::format("DROP OWNED BY {0}; DROP ROLE IF EXISTS {0}", QuoteIdent(role_)));
    }
  }
  std::string role_;
};

TEST_F(LeastPrivilege, RelayRoleWithoutCreateRightsStreamsAndMarks) {
  CreateTables();
  const std::string table = "public." + QuoteIdent(name_);
  role_ = name_ + "_role";
  const std::string role = QuoteIdent(role_);
  db_->Exec(outbox_relay::pg::RelaySchemaDdl());
  db_->Exec(fmt::format(
      "CREATE PUBLICATION {pub} FOR TABLE {table} WITH (publish = 'insert');"
      "CREATE ROLE {role} LOGIN REPLICATION;"
      "REVOKE CREATE ON DATABASE {db} FROM {role};"
      "GRANT SELECT, UPDATE ON {table} TO {role};"
      "GRANT USAGE ON SCHEMA outbox_relay TO {role};"
      "GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA outbox_relay TO {role};",
      fmt::arg("pub", QuoteIdent(name_)), fmt::arg("table", table), fmt::arg("role", role),
      fmt::arg("db", QuoteIdent(*db_->Scalar("SELECT current_database()")))));
  EXPECT_EQ(db_->Scalar(fmt::format(
                "SELECT has_database_privilege('{}', current_database(), 'CREATE')", role_)),
            std::optional<std::string>("f"));

  // postgresql://user@host:port/db -> the same with the relay's role.
  std::string url = env_.database_url;
  size_t scheme = url.find("://");
  ASSERT_NE(scheme, std::string::npos) << url;
  size_t at = url.find('@', scheme);
  ASSERT_NE(at, std::string::npos) << "DATABASE_URL without a user: " << url;
  url = url.substr(0, scheme + 3) + role_ + url.substr(at);

  RelayProcess& relay = StartRelay({"--database-url", url});
  ASSERT_TRUE(WaitStreaming(relay)) << relay.LogTail();
  Ledger ledger;
  Writer writer(Workload(), &ledger, 0, 7);
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(writer.Transaction({.rows = 4}));
  EXPECT_EQ(WaitAllAcked(seconds(60)), 0) << DescribeUnacked() << relay.LogTail();
  EXPECT_EQ(MisackedRows(), 0);
  std::vector<KafkaRecord> records = ReadTopics();
  DeliveryReport delivery = CheckDelivery(ledger.committed(), ledger.rolled_back(), records);
  fmt::print("least privilege: {}\n", delivery.Summary());
  EXPECT_EQ(delivery.lost, 0u) << delivery.Samples();
  EXPECT_EQ(delivery.phantom, 0u) << delivery.Samples();
  EXPECT_EQ(delivery.duplicates, 0u) << delivery.Samples();
  relay.Terminate();
  EXPECT_EQ(relay.Wait(seconds(40)), std::optional<int>(0)) << relay.LogTail();
}

}  // namespace
}  // namespace outbox_test
