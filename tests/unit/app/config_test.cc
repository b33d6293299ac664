// RelayConfig: the Kafka property list and its secrets.
#include "outbox_relay/app/config.h"

#include <gtest/gtest.h>

#include <CLI/CLI.hpp>
#include <cstdlib>
#include <string>
#include <vector>

namespace outbox_relay::app {
namespace {

using Props = std::vector<std::string>;

TEST(SplitPropertyList, SemicolonsSeparateAndEscapedOnesStayInTheValue) {
  EXPECT_EQ(SplitPropertyList("a=1;b=2; c=3 ;"), (Props{"a=1", "b=2", "c=3"}));
  EXPECT_EQ(SplitPropertyList(R"(sasl.password=ab\;cd\\;linger.ms=5)"),
            (Props{R"(sasl.password=ab;cd\)", "linger.ms=5"}));
  // A backslash before anything else is kept as it is.
  EXPECT_EQ(SplitPropertyList(R"(ssl.ca.location=C:\x)"), (Props{R"(ssl.ca.location=C:\x)"}));
}

TEST(SplitPropertyList, OnePerLineTakesValuesVerbatim) {
  EXPECT_EQ(SplitPropertyList("sasl.password=a;b\\;c\r\nacks=all\n\n"),
            (Props{"sasl.password=a;b\\;c", "acks=all"}));
}

TEST(Validate, APropertyThatIsNotKeyValueIsRefusedWithoutRepeatingIt) {
  RelayConfig c;
  c.database_url = "postgresql://x@localhost/db";
  c.kafka_brokers = "localhost:9092";
  c.kafka_properties = {"linger.ms=5", "hunter2-the-password"};
  auto st = Validate(c);
  ASSERT_FALSE(st.has_value());
  EXPECT_NE(st.error().message.find("--kafka-property"), std::string::npos);
  EXPECT_NE(st.error().message.find("property 2 of 2"), std::string::npos) << st.error().message;
  EXPECT_EQ(st.error().message.find("hunter2"), std::string::npos) << st.error().message;
}

RelayConfig Minimal() {
  RelayConfig c;
  c.database_url = "postgresql://x@localhost/db";
  c.kafka_brokers = "localhost:9092";
  return c;
}

TEST(Validate, TheInFlightBytesBoundStaysWithinLibrdkafkasQueueAndNamesTheSetting) {
  for (int64_t bad : {int64_t{0}, int64_t{1023}, kafka::kMaxQueuedBytes + 1}) {
    RelayConfig c = Minimal();
    c.max_in_flight_bytes = bad;
    auto st = Validate(c);
    ASSERT_FALSE(st.has_value()) << bad;
    EXPECT_NE(st.error().message.find("--max-in-flight-bytes (OUTBOX_MAX_IN_FLIGHT_BYTES)"),
              std::string::npos)
        << st.error().message;
  }
  for (int64_t good : {int64_t{1024}, RelayConfig{}.max_in_flight_bytes, kafka::kMaxQueuedBytes}) {
    RelayConfig c = Minimal();
    c.max_in_flight_bytes = good;
    auto st = Validate(c);
    EXPECT_TRUE(st.has_value()) << good << ": " << st.error().message;
  }
}

TEST(Validate, WatermillModeParsesTablesPatternAndMaps) {
  RelayConfig c = Minimal();
  c.watermill_flags.table_mode = TableMode::kWatermill;
  c.watermill_flags.tables = R"(watermill_orders, app."watermill_Orders.v1" ,)";
  c.watermill_flags.forwarder_tables = "watermill_forwarder_topic";
  c.watermill_flags.pattern = "public.watermill_*";
  c.watermill_flags.topic_map = "public.outbox=outbox,app.t=a=b";
  c.watermill_flags.offsets_map = "outbox=app.offsets";
  c.watermill_consumer_group = "fwd";
  auto st = Validate(c);
  ASSERT_TRUE(st.has_value()) << st.error().message;
  ASSERT_TRUE(c.watermill);
  const auto& w = c.watermill_settings;
  ASSERT_EQ(w.tables.size(), 2u);
  EXPECT_EQ(w.tables[0].ToString(), "public.watermill_orders");
  EXPECT_EQ(w.tables[1].ToString(), "app.watermill_Orders.v1");
  ASSERT_EQ(w.forwarder_tables.size(), 1u);
  ASSERT_TRUE(w.pattern.has_value());
  EXPECT_EQ(w.pattern->name, "watermill_*");
  EXPECT_EQ(w.topics.at("public.outbox"), "outbox");
  EXPECT_EQ(w.topics.at("app.t=a"), "b");  // the last '=' separates (topics hold no '=')
  EXPECT_EQ(w.offsets.at("public.outbox").ToString(), "app.offsets");
  EXPECT_EQ(w.consumer_group, "fwd");
}

TEST(Validate, WatermillModeNeedsTablesAndWellFormedMaps) {
  RelayConfig c = Minimal();
  c.watermill_flags.table_mode = TableMode::kWatermill;
  auto st = Validate(c);
  ASSERT_FALSE(st.has_value());
  EXPECT_NE(st.error().message.find("--watermill-tables"), std::string::npos);
  c.watermill_flags.tables = "watermill_orders";
  c.watermill_flags.topic_map = "no-equals-sign";
  st = Validate(c);
  ASSERT_FALSE(st.has_value());
  EXPECT_NE(st.error().message.find("--watermill-topic-map"), std::string::npos);
}

TEST(Validate, SeedModeIsTheDefaultAndUuidInMetadataIsParsed) {
  RelayConfig c = Minimal();
  ASSERT_TRUE(Validate(c).has_value());
  EXPECT_FALSE(c.watermill);
  EXPECT_EQ(c.mapper.uuid_in_metadata, outbox::UuidInMetadata::kWatermill);
}

// The choice flags of `run` are enums parsed by CLI11: the names map to
// their values, and anything else fails the parse naming the flag and its
// variable (main exits 2).
TEST(RunFlags, ChoiceFlagsAreEnumsAndABadValueNamesTheFlagAndVariable) {
  {
    CLI::App app;
    RelayConfig c;
    AddRunFlags(app, c);
    app.parse("", false);
    EXPECT_EQ(c.sink, SinkKind::kKafka);
    EXPECT_EQ(c.delivery, DeliveryMode::kAtLeastOnce);
    EXPECT_EQ(c.on_poison, pipeline::OnPoison::kDeadLetter);
    EXPECT_EQ(c.on_slot_lost, pipeline::OnSlotLost::kReconcile);
    EXPECT_EQ(c.mapper.uuid_in_metadata, outbox::UuidInMetadata::kWatermill);
    EXPECT_EQ(c.watermill_flags.table_mode, TableMode::kSeed);
    app.parse(
        "--sink null --delivery exactly-once --on-poison halt --on-slot-lost fail "
        "--uuid-in-metadata drop --table-mode watermill",
        false);
    EXPECT_EQ(c.sink, SinkKind::kNull);
    EXPECT_EQ(c.delivery, DeliveryMode::kExactlyOnce);
    EXPECT_EQ(c.on_poison, pipeline::OnPoison::kHalt);
    EXPECT_EQ(c.on_slot_lost, pipeline::OnSlotLost::kFail);
    EXPECT_EQ(c.mapper.uuid_in_metadata, outbox::UuidInMetadata::kDrop);
    EXPECT_EQ(c.watermill_flags.table_mode, TableMode::kWatermill);
  }
  struct Bad {
    const char* args;
    const char* message;
  };
  for (const Bad& b : {
           Bad{"--sink file", "invalid setting --sink (OUTBOX_SINK): 'file': use kafka or null"},
           Bad{"--delivery exactly-twice",
               "--delivery (OUTBOX_DELIVERY): 'exactly-twice': use at-least-once or exactly-once"},
           Bad{"--on-poison skip", "--on-poison (OUTBOX_ON_POISON): 'skip': use dlq or halt"},
           Bad{"--on-slot-lost ignore", "--on-slot-lost (OUTBOX_ON_SLOT_LOST): 'ignore'"},
           Bad{"--uuid-in-metadata keep", "--uuid-in-metadata (OUTBOX_UUID_IN_METADATA): 'keep'"},
           Bad{"--table-mode neither",
               "--table-mode (OUTBOX_TABLE_MODE): 'neither': use seed or watermill"},
       }) {
    CLI::App app;
    RelayConfig c;
    AddRunFlags(app, c);
    try {
      app.parse(b.args, false);
      ADD_FAILURE() << b.args << " was accepted";
    } catch (const CLI::ParseError& e) {
      EXPECT_NE(std::string(e.what()).find(b.message), std::string::npos) << e.what();
    }
  }
}

TEST(Validate, ExactlyOnceIsParsedAndItsSettingsAreCheckedByName) {
  RelayConfig c = Minimal();
  ASSERT_TRUE(Validate(c).has_value());
  EXPECT_EQ(c.delivery, DeliveryMode::kAtLeastOnce);
  c.delivery = DeliveryMode::kExactlyOnce;
  ASSERT_TRUE(Validate(c).has_value());
  EXPECT_EQ(c.delivery, DeliveryMode::kExactlyOnce);

  auto refused = [](RelayConfig config, const char* names) {
    auto st = Validate(config);
    ASSERT_FALSE(st.has_value()) << names;
    EXPECT_EQ(st.error().code, ErrorCode::kInvalidArgument);
    EXPECT_NE(st.error().message.find(names), std::string::npos) << st.error().message;
  };
  RelayConfig bad = c;
  bad.sink = SinkKind::kNull;
  refused(bad, "--delivery");
  bad = c;
  bad.txn_interval_ms = 0;
  refused(bad, "--txn-interval-ms");
  bad = c;
  bad.txn_max_rows = 0;
  refused(bad, "--txn-max-rows");
  bad = c;
  bad.transaction_timeout_ms = 999;
  refused(bad, "--transaction-timeout-ms");
  bad = c;
  bad.txn_interval_ms = 20000;  // a quarter of the 60 s transaction timeout is the most
  refused(bad, "--txn-interval-ms");
  bad = c;
  bad.watermill_flags.table_mode = TableMode::kWatermill;
  bad.watermill_flags.tables = "watermill_orders";
  refused(bad, "--table-mode=watermill");
}

}  // namespace
}  // namespace outbox_relay::app
