// The relay schema's version rule (pg/relay_schema.h): which recorded versions
// a relay runs against, and the SQL it runs or prints to migrate. The same
// against a real PostgreSQL, with the previous release beside this one:
// tests/upgrade/upgrade_test.cc.
#include "outbox_relay/pg/relay_schema.h"

#include <gtest/gtest.h>

#include <string>

#include "outbox_relay/core/version.h"

namespace outbox_relay::pg {
namespace {

RelaySchemaFound Recorded(int version, int readable_by) {
  return RelaySchemaFound{version, true, readable_by, "at 2026-12-05 by postgres"};
}

size_t Count(const std::string& text, const std::string& needle) {
  size_t n = 0;
  for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) {
    ++n;
  }
  return n;
}

TEST(RelaySchemaVersion, AVersionNoNewerThanTheRelaysRuns) {
  EXPECT_TRUE(CheckRelaySchema(RelaySchemaFound{}, 1));                 // none yet
  EXPECT_TRUE(CheckRelaySchema(RelaySchemaFound{1, false, 0, ""}, 1));  // 0.1.0's tables
  EXPECT_TRUE(CheckRelaySchema(Recorded(1, 1), 1));
  EXPECT_TRUE(CheckRelaySchema(Recorded(1, 1), 2));
}

TEST(RelaySchemaVersion, ANewerVersionRunsOnlyWhenItSaysThisRelayMayReadIt) {
  // Additive changes: relays of version 1 still run against version 3.
  EXPECT_TRUE(CheckRelaySchema(Recorded(3, 1), 1));
  EXPECT_TRUE(CheckRelaySchema(Recorded(3, 2), 2));
  // A change older relays would misread: refused, naming both versions.
  auto refused = CheckRelaySchema(Recorded(3, 2), 1);
  ASSERT_FALSE(refused);
  EXPECT_EQ(refused.error().code, ErrorCode::kInvalidArgument) << "a setting to fix: exit 2";
  const std::string& m = refused.error().message;
  EXPECT_NE(m.find("is of version 3, which relays of schema version 2 or newer can run against"),
            std::string::npos)
      << m;
  EXPECT_NE(m.find("knows schema version 1"), std::string::npos) << m;
  EXPECT_NE(m.find(std::string("outbox-relay ") + std::string(RelayVersion())), std::string::npos)
      << m;
  EXPECT_NE(m.find("nothing is read from the slot, published, marked or deleted"),
            std::string::npos)
      << m;
}

TEST(RelaySchemaVersion, TheSchemaOfANewDatabaseIsEveryStepAndItsRecord) {
  const std::string ddl = RelaySchemaDdl();
  EXPECT_NE(ddl.find("CREATE SCHEMA IF NOT EXISTS outbox_relay;"), std::string::npos) << ddl;
  EXPECT_NE(ddl.find("CREATE TABLE IF NOT EXISTS outbox_relay.schema_version"), std::string::npos);
  for (const RelaySchemaStep& step : kRelaySchemaSteps) {
    EXPECT_NE(ddl.find(step.ddl), std::string::npos) << step.ddl;
  }
  EXPECT_EQ(Count(ddl, "INSERT INTO outbox_relay.schema_version"),
            static_cast<size_t>(kRelaySchemaVersion))
      << ddl;
  EXPECT_NE(ddl.find("VALUES (1, 1, 'outbox-relay " + std::string(RelayVersion()) +
                     "') ON CONFLICT (version) DO NOTHING;"),
            std::string::npos)
      << ddl;
}

TEST(RelaySchemaVersion, TheFirstReleasesTablesGetOnlyTheirRecord) {
  // 0.1.0 made version 1's tables without a version table: what is run on
  // them needs no CREATE on the database and changes none of its tables.
  const std::string ddl = RelaySchemaDdl(1);
  EXPECT_EQ(ddl.find("CREATE SCHEMA"), std::string::npos) << ddl;
  EXPECT_EQ(ddl.find(kRelaySchemaSteps[0].ddl), std::string::npos) << ddl;
  EXPECT_NE(ddl.find("CREATE TABLE IF NOT EXISTS outbox_relay.schema_version"), std::string::npos);
  EXPECT_NE(ddl.find("VALUES (1, 1, "), std::string::npos) << ddl;
}

TEST(RelaySchemaVersion, EveryStepIsIdempotentAndReadableByAnEarlierOrItsOwnVersion) {
  int version = 0;
  for (const RelaySchemaStep& step : kRelaySchemaSteps) {
    ++version;
    EXPECT_GE(step.readable_by, 1) << "version " << version;
    EXPECT_LE(step.readable_by, version) << "version " << version;
    // Run again by a second instance, or over what an administrator ran: no
    // statement may fail on what is there already.
    std::string ddl(step.ddl);
    for (const char* creates : {"CREATE TABLE ", "CREATE INDEX ", "CREATE UNIQUE INDEX "}) {
      EXPECT_EQ(Count(ddl, creates), Count(ddl, std::string(creates) + "IF NOT EXISTS "))
          << "version " << version << ": " << creates << "without IF NOT EXISTS";
    }
    EXPECT_EQ(ddl.find("DROP "), std::string::npos)
        << "version " << version
        << ": destructive steps come a release after the change that made them safe, with "
           "readable_by raised (docs/upgrading.md)";
  }
}

}  // namespace
}  // namespace outbox_relay::pg
