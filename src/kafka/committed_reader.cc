#include "outbox_relay/kafka/committed_reader.h"

#include <spdlog/spdlog.h>

#include <array>
#include <set>

namespace outbox_relay::kafka {

namespace {

// No group was joined (partitions are assigned): nothing to leave on close,
// and a close must not wait for brokers that may be away.
void DestroyConsumer(rd_kafka_t* rk) {
  rd_kafka_destroy_flags(rk, RD_KAFKA_DESTROY_F_NO_CONSUMER_CLOSE);
}
using ConsumerHandle = CHandle<rd_kafka_t, DestroyConsumer>;
using MessageHandle = CHandle<rd_kafka_message_t, rd_kafka_message_destroy>;
using PartitionListHandle =
    CHandle<rd_kafka_topic_partition_list_t, rd_kafka_topic_partition_list_destroy>;

void LogToDebug(const rd_kafka_t*, int level, const char* fac, const char* buf) {
  if (level <= 3) {
    spdlog::warn("kafka progress reader {}: {}", fac, buf);
  } else {
    spdlog::debug("kafka progress reader {}: {}", fac, buf);
  }
}

// Client properties a consumer understands too (security, addressing);
// producer tuning would only draw warnings.
bool IsClientProperty(const std::string& key) {
  for (const char* prefix :
       {"security.", "ssl.", "sasl.", "client.", "socket.", "broker.", "metadata.",
        "topic.metadata.", "reconnect.", "api.version", "connections.", "enable.ssl", "resolve."}) {
    if (key.starts_with(prefix)) return true;
  }
  return false;
}

}  // namespace

Result<std::optional<std::string>> ReadLastCommittedValue(const ProducerOptions& connection,
                                                          const std::string& topic,
                                                          const std::string& key,
                                                          std::chrono::milliseconds timeout) {
  std::array<char, 512> errstr{};
  KafkaConfHandle conf(rd_kafka_conf_new());
  std::map<std::string, std::string> settings = {
      {"bootstrap.servers", connection.brokers},
      {"group.id", "outbox-relay-progress-reader"},
      {"enable.auto.commit", "false"},
      {"enable.partition.eof", "true"},
      {"isolation.level", "read_committed"},
      {"client.id", "outbox-relay-progress"},
      // The end of a partition is known from a fetch that finds nothing more;
      // the broker holds such a fetch this long (librdkafka's 500 ms would
      // delay every exactly-once start, even on an empty progress topic).
      {"fetch.wait.max.ms", "10"},
  };
  for (const auto& [k, v] : connection.properties) {
    if (IsClientProperty(k)) settings[k] = v;
  }
  for (const auto& [k, v] : settings) {
    if (rd_kafka_conf_set(conf.get(), k.c_str(), v.c_str(), errstr.data(), errstr.size()) !=
        RD_KAFKA_CONF_OK) {
      return Fail(ErrorCode::kInvalidArgument, "kafka property {} (progress reader): {}", k,
                  errstr.data());
    }
  }
  rd_kafka_conf_set_log_cb(conf.get(), &LogToDebug);
  ConsumerHandle rk(rd_kafka_new(RD_KAFKA_CONSUMER, conf.get(), errstr.data(), errstr.size()));
  if (!rk) return Fail(ErrorCode::kInvalidArgument, "progress reader: {}", errstr.data());
  (void)conf.release();

  auto deadline = std::chrono::steady_clock::now() + timeout;
  auto left = [&] {
    return static_cast<int>(std::max<int64_t>(
        0, std::chrono::duration_cast<std::chrono::milliseconds>(deadline -
                                                                 std::chrono::steady_clock::now())
               .count()));
  };
  TopicHandle rkt(rd_kafka_topic_new(rk.get(), topic.c_str(), nullptr));
  const rd_kafka_metadata_t* md = nullptr;
  rd_kafka_resp_err_t err = rd_kafka_metadata(rk.get(), 0, rkt.get(), &md, left());
  if (err != RD_KAFKA_RESP_ERR_NO_ERROR) {
    return Fail(ErrorCode::kTransient, "read progress from {}: metadata: {}", topic,
                rd_kafka_err2str(err));
  }
  MetadataHandle metadata(md);
  if (md->topic_cnt != 1 || md->topics[0].err == RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART ||
      md->topics[0].partition_cnt == 0) {
    return std::optional<std::string>();
  }
  int partitions = md->topics[0].partition_cnt;
  PartitionListHandle assignment(rd_kafka_topic_partition_list_new(partitions));
  for (int p = 0; p < partitions; ++p) {
    rd_kafka_topic_partition_list_add(assignment.get(), topic.c_str(), p)->offset =
        RD_KAFKA_OFFSET_BEGINNING;
  }
  if (rd_kafka_resp_err_t e = rd_kafka_assign(rk.get(), assignment.get())) {
    return Fail(ErrorCode::kTransient, "read progress from {}: assign: {}", topic,
                rd_kafka_err2str(e));
  }
  std::optional<std::string> last;
  int64_t last_offset = -1;
  int32_t last_partition = -1;
  std::set<int32_t> at_end;
  while (static_cast<int>(at_end.size()) < partitions) {
    if (left() == 0) {
      (void)rd_kafka_assign(rk.get(), nullptr);
      return Fail(ErrorCode::kTransient,
                  "read progress from {}: {} of {} partitions read to their end within {} ms",
                  topic, at_end.size(), partitions, timeout.count());
    }
    MessageHandle msg(rd_kafka_consumer_poll(rk.get(), std::min(left(), 100)));
    if (!msg) continue;
    if (msg->err == RD_KAFKA_RESP_ERR__PARTITION_EOF) {
      at_end.insert(msg->partition);
      continue;
    }
    if (msg->err != RD_KAFKA_RESP_ERR_NO_ERROR) {
      if (msg->err == RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART) break;
      spdlog::debug("read progress from {}: {}", topic, rd_kafka_message_errstr(msg.get()));
      continue;
    }
    at_end.erase(msg->partition);
    std::string_view k(static_cast<const char*>(msg->key), msg->key != nullptr ? msg->key_len : 0);
    if (msg->key == nullptr || k != key) continue;
    // One key stays in one partition; the newest offset there is the newest value.
    if (last_partition != -1 && last_partition != msg->partition) {
      spdlog::warn("progress key {} found in partitions {} and {} of {}", key, last_partition,
                   msg->partition, topic);
    }
    if (msg->offset > last_offset || msg->partition != last_partition) {
      last_offset = msg->offset;
      last_partition = msg->partition;
      if (msg->payload == nullptr) {
        last.reset();  // a tombstone
      } else {
        last = std::string(static_cast<const char*>(msg->payload), msg->len);
      }
    }
  }
  (void)rd_kafka_assign(rk.get(), nullptr);
  return last;
}

}  // namespace outbox_relay::kafka
