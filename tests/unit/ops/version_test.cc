// `outbox-relay version` and the librdkafka the relay is built with.
//
// The relay links the librdkafka scripts/librdkafka builds (CMakeLists.txt:
// OUTBOX_RDKAFKA_ROOT), not Debian 12's 2.0.2: SCRAM against Kafka 4 needs
// 2.6.1, a producer that re-bootstraps after losing its brokers 2.10/2.11,
// and the users' SASL and compression settings need the features below. A
// build against another library fails here, with what it lacks.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <libpq-fe.h>
#include <librdkafka/rdkafka.h>

#include <string>

#include "outbox_relay/core/failpoint.h"
#include "outbox_relay/ops/commands.h"
#include "outbox_relay/pg/relay_schema.h"
#include "outbox_relay/pipeline/kafka_progress.h"

namespace outbox_relay::ops {
namespace {

std::string BuiltinFeatures() {
  rd_kafka_conf_t* conf = rd_kafka_conf_new();
  char buf[512] = {};
  size_t size = sizeof(buf);
  EXPECT_EQ(rd_kafka_conf_get(conf, "builtin.features", buf, &size), RD_KAFKA_CONF_OK);
  rd_kafka_conf_destroy(conf);
  return buf;
}

TEST(Librdkafka, IsTwoTwelveOrNewerWithEveryFeatureUsersConfigure) {
  // rd_kafka_version(): 0xMMmmrrpp; 2.12.0 is 0x020c00ff as released.
  EXPECT_GE(rd_kafka_version(), 0x020c0000) << "librdkafka " << rd_kafka_version_str();
  // The header the relay was compiled with is the library it runs with.
  EXPECT_EQ(rd_kafka_version(), RD_KAFKA_VERSION);
  const std::string features = "," + BuiltinFeatures() + ",";
  for (const char* f : {"ssl", "sasl", "sasl_plain", "sasl_scram", "sasl_oauthbearer", "oidc",
                        "http", "zstd", "lz4", "snappy", "gzip"}) {
    EXPECT_NE(features.find(std::string(",") + f + ","), std::string::npos)
        << "librdkafka " << rd_kafka_version_str() << " without " << f << ": " << features;
  }
}

TEST(Version, NamesTheRelayAndTheLibrariesItRunsWith) {
  const std::string text = VersionReport("9.8.7", "0123abc-dirty");
  EXPECT_TRUE(text.starts_with("outbox-relay 9.8.7\ncommit: 0123abc-dirty\n")) << text;
  // What it persists, and which newer versions it still runs against (docs/upgrading.md).
  EXPECT_NE(text.find(fmt::format("\nrelay schema: {} (runs against newer schemas that declare "
                                  "themselves readable by {})\n",
                                  pg::kRelaySchemaVersion, pg::kRelaySchemaVersion)),
            std::string::npos)
      << text;
  EXPECT_NE(text.find(fmt::format("\nexactly-once progress record: format {} (reads records "
                                  "readable by format {} or older)\n",
                                  pipeline::kProgressFormat, pipeline::kProgressFormat)),
            std::string::npos)
      << text;
  EXPECT_NE(text.find(std::string("\nlibrdkafka: ") + rd_kafka_version_str() + " ("),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("sasl_scram, "), std::string::npos) << "the features, spaced: " << text;
  const int pq = PQlibVersion();
  EXPECT_NE(
      text.find("\nlibpq: " + std::to_string(pq / 10000) + "." + std::to_string(pq % 10000) + "\n"),
      std::string::npos)
      << text;
  // The unit tests are a test build; the production build's unit tests
  // (build-prod, scripts/test) see the other line.
  if constexpr (failpoint::kCompiledIn) {
    EXPECT_NE(text.find("\nfailpoints: compiled in (OUTBOX_TEST_FAULT)"), std::string::npos)
        << text;
  } else {
    EXPECT_NE(text.find("\nfailpoints: none (a production build)\n"), std::string::npos) << text;
  }
  EXPECT_TRUE(text.ends_with("\n")) << text;
}

}  // namespace
}  // namespace outbox_relay::ops
