// The producer's configuration: defaults that lose nothing, and refusals of
// the overrides that would.
#include <gtest/gtest.h>

#include "outbox_relay/kafka/producer.h"

namespace outbox_relay::kafka {
namespace {

TEST(ProducerConfig, DefaultsAreIdempotentAllAcksNoTimeoutSaramaPartitioner) {
  auto conf = ProducerConfig({"k:9092", {}});
  ASSERT_TRUE(conf);
  EXPECT_EQ(conf->at("bootstrap.servers"), "k:9092");
  EXPECT_EQ(conf->at("enable.idempotence"), "true");
  EXPECT_EQ(conf->at("acks"), "all");
  EXPECT_EQ(conf->at("message.timeout.ms"), "0") << "never give up on a record because of time";
  EXPECT_EQ(conf->at("partitioner"), "fnv1a_random");
  EXPECT_EQ(conf->at("linger.ms"), "3") << "a lone row must not wait 5 ms for company";
}

TEST(ProducerConfig, UserPropertiesOverrideTuning) {
  auto conf = ProducerConfig(
      {"k:9092", {{"compression.type", "lz4"}, {"linger.ms", "20"}, {"security.protocol", "ssl"}}});
  ASSERT_TRUE(conf);
  EXPECT_EQ(conf->at("compression.type"), "lz4");
  EXPECT_EQ(conf->at("linger.ms"), "20");
  EXPECT_EQ(conf->at("security.protocol"), "ssl");
}

TEST(ProducerConfig, TransactionalLingerFollowsTheCommitInterval) {
  // Invisible until the commit, which sends what linger holds: one batch per
  // partition and transaction, not one every 3 ms.
  auto at = [](std::chrono::milliseconds interval,
               std::vector<std::pair<std::string, std::string>> props = {}) {
    ProducerOptions o{"k:9092", std::move(props)};
    o.transactional_id = "t";
    o.transaction_interval = interval;
    auto conf = ProducerConfig(o);
    EXPECT_TRUE(conf);
    return conf ? conf->at("linger.ms") : std::string();
  };
  EXPECT_EQ(at(std::chrono::milliseconds(20)), "20");
  EXPECT_EQ(at(std::chrono::milliseconds(1)), "3");
  EXPECT_EQ(at(std::chrono::milliseconds(5000)), std::to_string(kMaxTransactionLinger.count()));
  EXPECT_EQ(at(std::chrono::milliseconds(20), {{"linger.ms", "7"}}), "7") << "the user's wins";
  EXPECT_EQ(ProducerConfig({"k:9092", {}})->at("linger.ms"), "3") << "at-least-once: unchanged";
}

TEST(ProducerConfig, RefusesAcksBelowAll) {
  for (const char* key : {"acks", "request.required.acks"}) {
    auto conf = ProducerConfig({"k:9092", {{key, "1"}}});
    ASSERT_FALSE(conf) << key;
    EXPECT_EQ(conf.error().code, ErrorCode::kInvalidArgument);
    EXPECT_NE(conf.error().message.find(key), std::string::npos) << conf.error().message;
  }
  EXPECT_TRUE(ProducerConfig({"k:9092", {{"acks", "-1"}}}));
}

TEST(ProducerConfig, RefusesDisablingIdempotence) {
  auto conf = ProducerConfig({"k:9092", {{"enable.idempotence", "false"}}});
  ASSERT_FALSE(conf);
  EXPECT_NE(conf.error().message.find("enable.idempotence"), std::string::npos);
}

TEST(KafkaProducer, UnknownPropertyFailsAtCreateNamingIt) {
  auto producer =
      KafkaProducer::Create({"127.0.0.1:1", {{"no.such.property", "x"}}}, [](const Delivery&) {});
  ASSERT_FALSE(producer);
  EXPECT_EQ(producer.error().code, ErrorCode::kInvalidArgument);
  EXPECT_NE(producer.error().message.find("no.such.property"), std::string::npos);
}

}  // namespace
}  // namespace outbox_relay::kafka
