// Admin requests on a client handle: topic creation and the topic settings
// the producer must respect. Every librdkafka object is owned (CHandle).
//
// Blocking: each call waits for the broker's answer up to `timeout` (or until
// `*cancel` turns true), so the producer runs them on its own admin thread,
// never on the replication loop.
#pragma once

#include <librdkafka/rdkafka.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "outbox_relay/core/c_handle.h"
#include "outbox_relay/core/result.h"

namespace outbox_relay::kafka {

using KafkaHandle = CHandle<rd_kafka_t, rd_kafka_destroy>;
using KafkaConfHandle = CHandle<rd_kafka_conf_t, rd_kafka_conf_destroy>;
using TopicHandle = CHandle<rd_kafka_topic_t, rd_kafka_topic_destroy>;
using HeadersHandle = CHandle<rd_kafka_headers_t, rd_kafka_headers_destroy>;
using QueueHandle = CHandle<rd_kafka_queue_t, rd_kafka_queue_destroy>;
using EventHandle = CHandle<rd_kafka_event_t, rd_kafka_event_destroy>;
using AdminOptionsHandle = CHandle<rd_kafka_AdminOptions_t, rd_kafka_AdminOptions_destroy>;
using NewTopicHandle = CHandle<rd_kafka_NewTopic_t, rd_kafka_NewTopic_destroy>;
using ConfigResourceHandle = CHandle<rd_kafka_ConfigResource_t, rd_kafka_ConfigResource_destroy>;
using MetadataHandle = CHandle<const rd_kafka_metadata_t, rd_kafka_metadata_destroy>;
using ErrorHandle = CHandle<rd_kafka_error_t, rd_kafka_error_destroy>;

// What an admin request's error means for the caller: kTransient when asking
// again can succeed (no answer, no connection, a broker or connection torn
// down, a leader or controller moving, a coordinator loading), kPermission for
// an authorization failure, kInvalidArgument otherwise (a setting or a topic
// the relay cannot serve: the relay stops with exit code 2).
ErrorCode AdminErrorCode(rd_kafka_resp_err_t err);

// Creates topic `name`. Ok when it was created or already existed;
// kTransient when the brokers did not answer in time; otherwise the broker's
// reason (kInvalidArgument, kPermission).
Status CreateTopic(rd_kafka_t* rk, const std::string& name, int partitions, int replication_factor,
                   std::chrono::milliseconds timeout, const std::atomic<bool>* cancel = nullptr,
                   const std::map<std::string, std::string>& configs = {});

// A topic's configuration values (DescribeConfigs); nullopt when the topic
// does not exist. Errors as TopicMaxMessageBytes.
Result<std::optional<std::map<std::string, std::string>>> TopicConfig(
    rd_kafka_t* rk, const std::string& name, std::chrono::milliseconds timeout);

// The topic's effective max.message.bytes: the largest record batch the
// broker accepts for it. nullopt when the topic does not exist (yet).
// kTransient when the brokers did not answer in time; kPermission when the
// client may not describe the topic's configuration.
Result<std::optional<int64_t>> TopicMaxMessageBytes(rd_kafka_t* rk, const std::string& name,
                                                    std::chrono::milliseconds timeout,
                                                    const std::atomic<bool>* cancel = nullptr);

// Waits until every partition of topic `name` has a leader that serves it: a
// ListOffsets request for each partition answered by its leader. True once
// they all did. A missing topic is waited for too when it may be on its way:
// `created` (the brokers' metadata may not have it yet), or `rk` allows
// auto-creation (allow.auto.create.topics, a producer's default: the brokers
// create it on the metadata request that finds it missing, when their
// auto.create.topics.enable allows). False when it is missing and nothing
// creates it: at once when `rk` does not allow auto-creation, else after
// `timeout`. kTransient when the topic exists and some partition was not
// served within `timeout` (or on `*cancel`).
//
// Before its first record to a topic the producer waits for this. A broker
// can name itself leader of a new partition (its metadata) a moment before it
// serves it: the idempotent producer's first batch is then refused, while its
// second, sent right after, is accepted as the partition's first (the broker
// accepts any first sequence of a producer it does not know). The retried
// first batch is then reported delivered although the log lacks it, or lands
// after newer records of the same key. An auto-created topic has the same
// window (tests/integration/kafka_topics_test.cc).
Result<bool> WaitPartitionsServed(rd_kafka_t* rk, const std::string& name, bool created,
                                  std::chrono::milliseconds timeout,
                                  const std::atomic<bool>* cancel = nullptr);

// The cluster as a metadata request for every topic sees it.
struct ClusterView {
  std::vector<int32_t> broker_ids;
  std::map<std::string, int> topics;  // name -> partitions (topics without an error)
};
// kTransient with librdkafka's reason when no broker answered within `timeout`.
Result<ClusterView> DescribeCluster(rd_kafka_t* rk, std::chrono::milliseconds timeout);

// A broker's configuration values (DescribeConfigs on the broker). Errors as
// TopicConfig's.
Result<std::map<std::string, std::string>> BrokerConfig(rd_kafka_t* rk, int32_t broker_id,
                                                        std::chrono::milliseconds timeout);

}  // namespace outbox_relay::kafka
