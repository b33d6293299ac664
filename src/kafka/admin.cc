#include "outbox_relay/kafka/admin.h"

#include <algorithm>
#include <array>
#include <charconv>
#include <set>
#include <string_view>
#include <thread>
#include <utility>

namespace outbox_relay::kafka {

namespace {

// Sends nothing itself: waits for the result event of a request queued on `queue`.
Result<EventHandle> Await(rd_kafka_queue_t* queue, std::chrono::milliseconds timeout,
                          const std::atomic<bool>* cancel, std::string_view what) {
  // The request carries its own timeout; wait a little longer for its answer,
  // in slices, so that a stopping producer does not wait for it.
  auto deadline = std::chrono::steady_clock::now() + timeout + std::chrono::seconds(1);
  EventHandle ev;
  while (!ev && std::chrono::steady_clock::now() < deadline) {
    if (cancel != nullptr && cancel->load()) {
      return Fail(ErrorCode::kTransient, "{}: cancelled", what);
    }
    ev.reset(rd_kafka_queue_poll(queue, 100));
  }
  if (!ev) return Fail(ErrorCode::kTransient, "{}: no answer within {} ms", what, timeout.count());
  if (rd_kafka_resp_err_t err = rd_kafka_event_error(ev.get()); err) {
    return Fail(AdminErrorCode(err), "{}: {}", what, rd_kafka_event_error_string(ev.get()));
  }
  return ev;
}

AdminOptionsHandle Options(rd_kafka_t* rk, rd_kafka_admin_op_t op,
                           std::chrono::milliseconds timeout) {
  std::array<char, 256> errstr{};
  AdminOptionsHandle opts(rd_kafka_AdminOptions_new(rk, op));
  (void)rd_kafka_AdminOptions_set_request_timeout(opts.get(), static_cast<int>(timeout.count()),
                                                  errstr.data(), errstr.size());
  if (op == RD_KAFKA_ADMIN_OP_CREATETOPICS) {
    (void)rd_kafka_AdminOptions_set_operation_timeout(opts.get(), static_cast<int>(timeout.count()),
                                                      errstr.data(), errstr.size());
  }
  return opts;
}

}  // namespace

Status CreateTopic(rd_kafka_t* rk, const std::string& name, int partitions, int replication_factor,
                   std::chrono::milliseconds timeout, const std::atomic<bool>* cancel,
                   const std::map<std::string, std::string>& configs) {
  std::array<char, 512> errstr{};
  NewTopicHandle topic(rd_kafka_NewTopic_new(name.c_str(), partitions, replication_factor,
                                             errstr.data(), errstr.size()));
  if (!topic) {
    return Fail(ErrorCode::kInvalidArgument, "create topic {}: {}", name, errstr.data());
  }
  for (const auto& [key, value] : configs) {
    if (rd_kafka_resp_err_t err =
            rd_kafka_NewTopic_set_config(topic.get(), key.c_str(), value.c_str())) {
      return Fail(ErrorCode::kInvalidArgument, "create topic {}: config {}: {}", name, key,
                  rd_kafka_err2str(err));
    }
  }
  QueueHandle queue(rd_kafka_queue_new(rk));
  AdminOptionsHandle opts = Options(rk, RD_KAFKA_ADMIN_OP_CREATETOPICS, timeout);
  rd_kafka_NewTopic_t* topics[] = {topic.get()};
  rd_kafka_CreateTopics(rk, topics, 1, opts.get(), queue.get());
  auto ev = Await(queue.get(), timeout, cancel, "create topic " + name);
  if (!ev) return std::unexpected(ev.error());
  const rd_kafka_CreateTopics_result_t* result = rd_kafka_event_CreateTopics_result(ev->get());
  size_t count = 0;
  const rd_kafka_topic_result_t** results =
      result != nullptr ? rd_kafka_CreateTopics_result_topics(result, &count) : nullptr;
  for (size_t i = 0; i < count; ++i) {
    rd_kafka_resp_err_t err = rd_kafka_topic_result_error(results[i]);
    if (err != RD_KAFKA_RESP_ERR_NO_ERROR && err != RD_KAFKA_RESP_ERR_TOPIC_ALREADY_EXISTS) {
      return Fail(AdminErrorCode(err), "create topic {}: {}", name,
                  rd_kafka_topic_result_error_string(results[i]));
    }
  }
  return Ok();
}

// DescribeConfigs of one resource (a topic or a broker); nullopt when it does not exist.
Result<std::optional<std::map<std::string, std::string>>> DescribeConfigs(
    rd_kafka_t* rk, rd_kafka_ResourceType_t type, const std::string& name,
    std::chrono::milliseconds timeout, const std::atomic<bool>* cancel) {
  using Config = std::map<std::string, std::string>;
  const std::string what =
      fmt::format("describe {} {}", type == RD_KAFKA_RESOURCE_BROKER ? "broker" : "topic", name);
  ConfigResourceHandle resource(rd_kafka_ConfigResource_new(type, name.c_str()));
  QueueHandle queue(rd_kafka_queue_new(rk));
  AdminOptionsHandle opts = Options(rk, RD_KAFKA_ADMIN_OP_DESCRIBECONFIGS, timeout);
  rd_kafka_ConfigResource_t* resources[] = {resource.get()};
  rd_kafka_DescribeConfigs(rk, resources, 1, opts.get(), queue.get());
  auto ev = Await(queue.get(), timeout, cancel, what);
  if (!ev) return std::unexpected(ev.error());
  const rd_kafka_DescribeConfigs_result_t* result =
      rd_kafka_event_DescribeConfigs_result(ev->get());
  size_t count = 0;
  const rd_kafka_ConfigResource_t** described =
      result != nullptr ? rd_kafka_DescribeConfigs_result_resources(result, &count) : nullptr;
  if (count == 0) return Fail(ErrorCode::kTransient, "{}: empty answer", what);
  rd_kafka_resp_err_t err = rd_kafka_ConfigResource_error(described[0]);
  if (err == RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART) return std::optional<Config>();
  if (err != RD_KAFKA_RESP_ERR_NO_ERROR) {
    return Fail(AdminErrorCode(err), "{}: {}", what,
                rd_kafka_ConfigResource_error_string(described[0]));
  }
  Config out;
  size_t entries = 0;
  const rd_kafka_ConfigEntry_t** configs = rd_kafka_ConfigResource_configs(described[0], &entries);
  for (size_t i = 0; i < entries; ++i) {
    const char* value = rd_kafka_ConfigEntry_value(configs[i]);
    out[rd_kafka_ConfigEntry_name(configs[i])] = value != nullptr ? value : "";
  }
  return std::optional<Config>(std::move(out));
}

Result<std::optional<std::map<std::string, std::string>>> TopicConfig(
    rd_kafka_t* rk, const std::string& name, std::chrono::milliseconds timeout,
    const std::atomic<bool>* cancel) {
  return DescribeConfigs(rk, RD_KAFKA_RESOURCE_TOPIC, name, timeout, cancel);
}

Result<std::optional<std::map<std::string, std::string>>> TopicConfig(
    rd_kafka_t* rk, const std::string& name, std::chrono::milliseconds timeout) {
  return TopicConfig(rk, name, timeout, nullptr);
}

Result<std::optional<int64_t>> TopicMaxMessageBytes(rd_kafka_t* rk, const std::string& name,
                                                    std::chrono::milliseconds timeout,
                                                    const std::atomic<bool>* cancel) {
  auto config = TopicConfig(rk, name, timeout, cancel);
  if (!config) return std::unexpected(config.error());
  if (!*config) return std::optional<int64_t>();
  auto it = (*config)->find("max.message.bytes");
  if (it == (*config)->end()) {
    return Fail(ErrorCode::kInvalidArgument,
                "topic {}: the broker did not say its max.message.bytes", name);
  }
  int64_t v = 0;
  auto [end, ec] = std::from_chars(it->second.data(), it->second.data() + it->second.size(), v);
  if (ec != std::errc() || end != it->second.data() + it->second.size()) {
    return Fail(ErrorCode::kInvalidArgument, "topic {}: max.message.bytes '{}' is not a number",
                name, it->second);
  }
  return std::optional<int64_t>(v);
}

Result<bool> WaitPartitionsServed(rd_kafka_t* rk, const std::string& name, bool created,
                                  std::chrono::milliseconds timeout,
                                  const std::atomic<bool>* cancel) {
  using Clock = std::chrono::steady_clock;
  const auto deadline = Clock::now() + timeout;
  auto slice = [&] {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    return static_cast<int>(std::clamp<int64_t>(left.count(), 1, 1000));
  };
  TopicHandle rkt(rd_kafka_topic_new(rk, name.c_str(), nullptr));
  if (!rkt) {
    return Fail(ErrorCode::kInvalidArgument, "topic {}: {}", name,
                rd_kafka_err2str(rd_kafka_last_error()));
  }
  std::set<int32_t> served;
  std::string waiting_for = "metadata";
  bool seen_missing = false;
  // A metadata request for a missing topic makes the brokers create it when
  // both sides allow it (allow.auto.create.topics here, librdkafka's default
  // for a producer; auto.create.topics.enable there, Kafka's default).
  std::array<char, 16> auto_create{};
  size_t auto_create_size = auto_create.size();
  const bool may_be_created =
      rd_kafka_conf_get(rd_kafka_conf(rk), "allow.auto.create.topics", auto_create.data(),
                        &auto_create_size) == RD_KAFKA_CONF_OK &&
      std::string_view(auto_create.data()) == "true";
  while (Clock::now() < deadline) {
    if (cancel != nullptr && cancel->load()) {
      return Fail(ErrorCode::kTransient, "topic {}: cancelled", name);
    }
    const rd_kafka_metadata_t* raw = nullptr;
    rd_kafka_resp_err_t err = rd_kafka_metadata(rk, 0, rkt.get(), &raw, slice());
    MetadataHandle md(raw);
    if (err == RD_KAFKA_RESP_ERR_NO_ERROR && md->topic_cnt == 1) {
      const rd_kafka_metadata_topic_t& topic = md->topics[0];
      // Missing: just created and not yet in this broker's metadata, or
      // being created by the brokers on this very request: either way it is
      // waited for, as the partitions of a new topic are (an auto-created
      // topic is named in the metadata while its first partition still
      // refuses requests). Otherwise nothing will create it: said at once.
      if (topic.err == RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART) {
        if (!created && !may_be_created) return false;
        seen_missing = true;
      }
      if (topic.err == RD_KAFKA_RESP_ERR_NO_ERROR && topic.partition_cnt > 0) {
        for (int i = 0; i < topic.partition_cnt; ++i) {
          const rd_kafka_metadata_partition_t& p = topic.partitions[i];
          if (served.contains(p.id)) continue;
          int64_t low = 0;
          int64_t high = 0;
          if (p.err == RD_KAFKA_RESP_ERR_NO_ERROR && p.leader >= 0 &&
              rd_kafka_query_watermark_offsets(rk, name.c_str(), p.id, &low, &high, slice()) ==
                  RD_KAFKA_RESP_ERR_NO_ERROR) {
            served.insert(p.id);
          }
        }
        if (std::cmp_equal(served.size(), topic.partition_cnt)) return true;
        waiting_for = fmt::format("{} of its {} partitions", topic.partition_cnt - served.size(),
                                  topic.partition_cnt);
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  // Never there: the brokers neither have nor create it. Its records go out
  // and wait in librdkafka, which names the topic when it gives up on them.
  if (seen_missing && waiting_for == "metadata") return false;
  return Fail(ErrorCode::kTransient, "topic {}: {} not served by a leader within {} ms", name,
              waiting_for, timeout.count());
}

Result<ClusterView> DescribeCluster(rd_kafka_t* rk, std::chrono::milliseconds timeout) {
  const rd_kafka_metadata_t* raw = nullptr;
  rd_kafka_resp_err_t err =
      rd_kafka_metadata(rk, 1, nullptr, &raw, static_cast<int>(timeout.count()));
  MetadataHandle md(raw);
  if (err != RD_KAFKA_RESP_ERR_NO_ERROR) {
    return Fail(ErrorCode::kTransient, "{}", rd_kafka_err2str(err));
  }
  ClusterView view;
  for (int i = 0; i < md->broker_cnt; ++i) view.broker_ids.push_back(md->brokers[i].id);
  for (int i = 0; i < md->topic_cnt; ++i) {
    if (md->topics[i].err == RD_KAFKA_RESP_ERR_NO_ERROR) {
      view.topics[md->topics[i].topic] = md->topics[i].partition_cnt;
    }
  }
  return view;
}

Result<std::map<std::string, std::string>> BrokerConfig(rd_kafka_t* rk, int32_t broker_id,
                                                        std::chrono::milliseconds timeout) {
  auto config =
      DescribeConfigs(rk, RD_KAFKA_RESOURCE_BROKER, std::to_string(broker_id), timeout, nullptr);
  if (!config) return std::unexpected(config.error());
  if (!*config) return Fail(ErrorCode::kTransient, "describe broker {}: unknown", broker_id);
  return std::move(**config);
}

ErrorCode AdminErrorCode(rd_kafka_resp_err_t err) {
  switch (err) {
    case RD_KAFKA_RESP_ERR__TIMED_OUT:
    case RD_KAFKA_RESP_ERR__TIMED_OUT_QUEUE:
    case RD_KAFKA_RESP_ERR_REQUEST_TIMED_OUT:
    case RD_KAFKA_RESP_ERR__TRANSPORT:
    case RD_KAFKA_RESP_ERR__ALL_BROKERS_DOWN:
    case RD_KAFKA_RESP_ERR__DESTROY_BROKER:  // a broker's connection torn down (a broker left)
    case RD_KAFKA_RESP_ERR__NODE_UPDATE:
    case RD_KAFKA_RESP_ERR__RESOLVE:
    case RD_KAFKA_RESP_ERR__WAIT_COORD:
    case RD_KAFKA_RESP_ERR_NOT_CONTROLLER:
    case RD_KAFKA_RESP_ERR_LEADER_NOT_AVAILABLE:
    case RD_KAFKA_RESP_ERR_NOT_LEADER_FOR_PARTITION:
    case RD_KAFKA_RESP_ERR_BROKER_NOT_AVAILABLE:
    case RD_KAFKA_RESP_ERR_NETWORK_EXCEPTION:
    case RD_KAFKA_RESP_ERR_COORDINATOR_LOAD_IN_PROGRESS:
    case RD_KAFKA_RESP_ERR_COORDINATOR_NOT_AVAILABLE:
    case RD_KAFKA_RESP_ERR_NOT_COORDINATOR:
    case RD_KAFKA_RESP_ERR_THROTTLING_QUOTA_EXCEEDED:
      return ErrorCode::kTransient;
    case RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED:
    case RD_KAFKA_RESP_ERR_CLUSTER_AUTHORIZATION_FAILED:
      return ErrorCode::kPermission;
    default:
      return ErrorCode::kInvalidArgument;
  }
}

}  // namespace outbox_relay::kafka
