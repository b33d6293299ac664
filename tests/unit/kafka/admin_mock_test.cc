// WaitPartitionsServed (kafka/admin.h) against librdkafka's mock cluster: the
// producer's wait before its first record to a topic ends when every partition
// answers at its leader, and gives up in time, naming what it waited for, while
// a partition has no leader. (The mock cluster creates any topic asked for: a
// missing topic is ResilienceKafka.UnknownTopicStopsThenCreateTopicsDelivers's,
// on a real broker.)
#include <gtest/gtest.h>
#include <librdkafka/rdkafka.h>
// After rdkafka.h, as it requires.
#include <librdkafka/rdkafka_mock.h>

#include <array>
#include <atomic>
#include <chrono>

#include "outbox_relay/kafka/admin.h"

namespace outbox_relay::kafka {
namespace {

using namespace std::chrono_literals;

class AdminMockTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::array<char, 256> err{};
    rd_kafka_conf_t* conf = rd_kafka_conf_new();
    for (auto [k, v] : {std::pair{"test.mock.num.brokers", "3"}, std::pair{"log_level", "0"},
                        std::pair{"allow.auto.create.topics", "false"}}) {
      ASSERT_EQ(rd_kafka_conf_set(conf, k, v, err.data(), err.size()), RD_KAFKA_CONF_OK)
          << err.data();
    }
    rk_.reset(rd_kafka_new(RD_KAFKA_PRODUCER, conf, err.data(), err.size()));
    ASSERT_TRUE(rk_) << err.data();
    mock_ = rd_kafka_handle_mock_cluster(rk_.get());
    ASSERT_NE(mock_, nullptr);
    ASSERT_EQ(rd_kafka_mock_topic_create(mock_, "served", 3, 1), RD_KAFKA_RESP_ERR_NO_ERROR);
  }

  KafkaHandle rk_;
  rd_kafka_mock_cluster_t* mock_ = nullptr;
};

TEST_F(AdminMockTest, EveryPartitionAnsweringAtItsLeaderEndsTheWait) {
  auto served = WaitPartitionsServed(rk_.get(), "served", /*created=*/false, 5000ms);
  ASSERT_TRUE(served) << served.error().message;
  EXPECT_TRUE(*served);
}

TEST_F(AdminMockTest, APartitionWithoutALeaderIsWaitedForUntilTheTimeout) {
  rd_kafka_mock_partition_set_leader(mock_, "served", 1, -1);
  auto started = std::chrono::steady_clock::now();
  auto served = WaitPartitionsServed(rk_.get(), "served", /*created=*/false, 600ms);
  auto took = std::chrono::steady_clock::now() - started;
  ASSERT_FALSE(served);
  EXPECT_EQ(served.error().code, ErrorCode::kTransient);
  EXPECT_NE(served.error().message.find("topic served: 1 of its 3 partitions not served"),
            std::string::npos)
      << served.error().message;
  EXPECT_GE(took, 600ms);
  EXPECT_LT(took, 3000ms);
}

TEST_F(AdminMockTest, AStopEndsTheWait) {
  rd_kafka_mock_partition_set_leader(mock_, "served", 0, -1);
  std::atomic<bool> cancel = true;
  auto served = WaitPartitionsServed(rk_.get(), "served", /*created=*/false, 5000ms, &cancel);
  ASSERT_FALSE(served);
  EXPECT_NE(served.error().message.find("cancelled"), std::string::npos) << served.error().message;
}

// A relay exited with code 2 (a setting error) in the fault campaign when a
// broker's connection was torn down under its request ("Local: Broker handle
// destroyed without termination"): that, and a leader, controller or
// coordinator moving, are asked again; a setting is not.
TEST(AdminErrorCode, ATornDownConnectionOrAMovingLeaderIsTransientASettingIsNot) {
  for (rd_kafka_resp_err_t err :
       {RD_KAFKA_RESP_ERR__DESTROY_BROKER, RD_KAFKA_RESP_ERR__TRANSPORT,
        RD_KAFKA_RESP_ERR__TIMED_OUT, RD_KAFKA_RESP_ERR__ALL_BROKERS_DOWN,
        RD_KAFKA_RESP_ERR_NOT_CONTROLLER, RD_KAFKA_RESP_ERR_NOT_LEADER_FOR_PARTITION,
        RD_KAFKA_RESP_ERR_BROKER_NOT_AVAILABLE, RD_KAFKA_RESP_ERR_NETWORK_EXCEPTION,
        RD_KAFKA_RESP_ERR_COORDINATOR_LOAD_IN_PROGRESS, RD_KAFKA_RESP_ERR_NOT_COORDINATOR}) {
    EXPECT_EQ(AdminErrorCode(err), ErrorCode::kTransient) << rd_kafka_err2name(err);
  }
  EXPECT_EQ(AdminErrorCode(RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED), ErrorCode::kPermission);
  EXPECT_EQ(AdminErrorCode(RD_KAFKA_RESP_ERR_INVALID_CONFIG), ErrorCode::kInvalidArgument);
  EXPECT_EQ(AdminErrorCode(RD_KAFKA_RESP_ERR_POLICY_VIOLATION), ErrorCode::kInvalidArgument);
}

}  // namespace
}  // namespace outbox_relay::kafka
