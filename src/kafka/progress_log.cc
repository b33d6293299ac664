#include "outbox_relay/kafka/progress_log.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <array>
#include <map>
#include <set>
#include <thread>

#include "outbox_relay/kafka/admin.h"

namespace outbox_relay::kafka {

namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

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

int Ms(milliseconds d) { return static_cast<int>(std::max<int64_t>(0, d.count())); }

// A consumer that joins no group (partitions are assigned): read_committed
// reads and the last stable offset; read_uncommitted gives the high
// watermark and serves the admin requests.
Result<ConsumerHandle> MakeConsumer(const ProducerOptions& connection, bool committed) {
  std::array<char, 512> errstr{};
  KafkaConfHandle conf(rd_kafka_conf_new());
  std::map<std::string, std::string> settings = {
      {"bootstrap.servers", connection.brokers},
      {"group.id", "outbox-relay-progress-reader"},
      {"enable.auto.commit", "false"},
      {"enable.partition.eof", "true"},
      {"isolation.level", committed ? "read_committed" : "read_uncommitted"},
      {"client.id", "outbox-relay-progress"},
      // The end of a partition is known from a fetch that finds nothing more;
      // the broker holds such a fetch this long (librdkafka's 500 ms would
      // delay every exactly-once start).
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
  return rk;
}

// Partitions of `topic`; 0 when it does not exist.
Result<int> Partitions(rd_kafka_t* rk, const std::string& topic, milliseconds timeout) {
  TopicHandle rkt(rd_kafka_topic_new(rk, topic.c_str(), nullptr));
  const rd_kafka_metadata_t* md = nullptr;
  rd_kafka_resp_err_t err = rd_kafka_metadata(rk, 0, rkt.get(), &md, Ms(timeout));
  if (err != RD_KAFKA_RESP_ERR_NO_ERROR) {
    return Fail(ErrorCode::kTransient, "progress topic {}: metadata: {}", topic,
                rd_kafka_err2str(err));
  }
  MetadataHandle metadata(md);
  if (md->topic_cnt != 1 || md->topics[0].err == RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART) {
    return 0;
  }
  return md->topics[0].partition_cnt;
}

struct Offsets {
  int64_t low = 0;
  int64_t stable = 0;  // LSO
  int64_t high = 0;    // high watermark
};

Result<Offsets> QueryOffsets(rd_kafka_t* committed, rd_kafka_t* uncommitted,
                             const std::string& topic, int32_t partition, milliseconds timeout) {
  Offsets o;
  int64_t low2 = 0;
  // A read_committed client's ListOffsets answers the last stable offset,
  // a read_uncommitted one's the high watermark (librdkafka ≥ 1.7.1).
  if (auto err = rd_kafka_query_watermark_offsets(committed, topic.c_str(), partition, &o.low,
                                                  &o.stable, Ms(timeout))) {
    return Fail(ErrorCode::kTransient, "progress topic {} [{}]: offsets: {}", topic, partition,
                rd_kafka_err2str(err));
  }
  if (auto err = rd_kafka_query_watermark_offsets(uncommitted, topic.c_str(), partition, &low2,
                                                  &o.high, Ms(timeout))) {
    return Fail(ErrorCode::kTransient, "progress topic {} [{}]: offsets: {}", topic, partition,
                rd_kafka_err2str(err));
  }
  return o;
}

// What a window [start, end) of one partition says of `key`: whether a
// committed record has it, and the newest one's value (nullopt: a tombstone).
struct WindowRead {
  bool hit = false;
  std::optional<std::string> value;
};

Result<WindowRead> ReadWindow(rd_kafka_t* rk, const std::string& topic, int32_t partition,
                              int64_t start, int64_t end, const std::string* key,
                              milliseconds timeout, std::set<std::string>* keys = nullptr) {
  PartitionListHandle assignment(rd_kafka_topic_partition_list_new(1));
  rd_kafka_topic_partition_list_add(assignment.get(), topic.c_str(), partition)->offset = start;
  if (rd_kafka_resp_err_t e = rd_kafka_assign(rk, assignment.get())) {
    return Fail(ErrorCode::kTransient, "progress topic {}: assign: {}", topic, rd_kafka_err2str(e));
  }
  WindowRead out;
  auto deadline = Clock::now() + timeout;
  Status result = Ok();
  while (true) {
    auto left = std::chrono::duration_cast<milliseconds>(deadline - Clock::now());
    if (left <= milliseconds(0)) {
      result = Fail(ErrorCode::kTransient,
                    "progress topic {} [{}]: offsets {} to {} not read within {} ms", topic,
                    partition, start, end, timeout.count());
      break;
    }
    MessageHandle msg(rd_kafka_consumer_poll(rk, Ms(std::min(left, milliseconds(100)))));
    if (!msg) continue;
    if (msg->err == RD_KAFKA_RESP_ERR__PARTITION_EOF) break;
    if (msg->err != RD_KAFKA_RESP_ERR_NO_ERROR) {
      if (msg->err == RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART) break;
      spdlog::debug("progress topic {}: {}", topic, rd_kafka_message_errstr(msg.get()));
      continue;
    }
    if (msg->offset >= end) break;
    std::string_view k(static_cast<const char*>(msg->key), msg->key != nullptr ? msg->key_len : 0);
    if (keys != nullptr && msg->key != nullptr && keys->size() < 100) keys->emplace(k);
    if (key != nullptr && msg->key != nullptr && k == *key) {
      out.hit = true;
      if (msg->payload == nullptr) {
        out.value.reset();
      } else {
        out.value = std::string(static_cast<const char*>(msg->payload), msg->len);
      }
    }
    if (msg->offset >= end - 1) break;
  }
  (void)rd_kafka_assign(rk, nullptr);
  if (!result) return std::unexpected(result.error());
  return out;
}

}  // namespace

bool IsClientProperty(const std::string& key) {
  for (const char* prefix :
       {"security.", "ssl.", "sasl.", "client.", "socket.", "broker.", "metadata.",
        "topic.metadata.", "reconnect.", "api.version", "connections.", "enable.ssl", "resolve."}) {
    if (key.starts_with(prefix)) return true;
  }
  return false;
}

struct KafkaProgressLog::Clients {
  ConsumerHandle committed;
  ConsumerHandle uncommitted;
};

KafkaProgressLog::KafkaProgressLog(ProgressLogOptions options) : options_(std::move(options)) {}

KafkaProgressLog::~KafkaProgressLog() = default;

Result<std::unique_ptr<KafkaProgressLog>> KafkaProgressLog::Create(ProgressLogOptions options) {
  std::unique_ptr<KafkaProgressLog> log(new KafkaProgressLog(std::move(options)));
  if (auto st = log->Renew(); !st) return std::unexpected(st.error());
  return log;
}

Status KafkaProgressLog::Renew() {
  auto committed = MakeConsumer(options_.connection, true);
  if (!committed) return std::unexpected(committed.error());
  auto uncommitted = MakeConsumer(options_.connection, false);
  if (!uncommitted) return std::unexpected(uncommitted.error());
  clients_ = std::make_unique<Clients>(Clients{std::move(*committed), std::move(*uncommitted)});
  return Ok();
}

Status KafkaProgressLog::Prepare() {
  rd_kafka_t* rk = clients_->uncommitted.get();
  const std::string& topic = options_.topic;
  auto config = TopicConfig(rk, topic, options_.timeout);
  if (!config) return std::unexpected(config.error());
  if (!*config) {
    // One partition: one key lives there, read from its end. Small segments:
    // compaction only cleans closed ones.
    if (auto st = CreateTopic(rk, topic, 1, options_.replication_factor, options_.timeout, nullptr,
                              {{"cleanup.policy", "compact"}, {"segment.bytes", "16777216"}});
        !st) {
      return st;
    }
    spdlog::info("created the progress topic {} (compacted, one partition)", topic);
    return Ok();
  }
  auto it = (*config)->find("cleanup.policy");
  std::string policy = it == (*config)->end() ? std::string("(unknown)") : it->second;
  if (policy != "compact") {
    return Fail(ErrorCode::kInvalidArgument,
                "invalid setting --progress-topic (OUTBOX_PROGRESS_TOPIC): topic {} has "
                "cleanup.policy={}; the progress topic must be compacted and never deleted "
                "from (an idle relay's only record would expire, and the relay would produce "
                "again what Kafka has): kafka-configs --alter --entity-type topics "
                "--entity-name {} --add-config cleanup.policy=compact",
                topic, policy, topic);
  }
  return Ok();
}

Result<std::optional<std::string>> KafkaProgressLog::ReadLast(const std::string& key) {
  bool found = false;
  auto value = ReadFrom(options_.topic, key, &found);
  if (!value || found || options_.legacy_topic.empty() || options_.legacy_topic == options_.topic) {
    return value;
  }
  auto legacy = ReadFrom(options_.legacy_topic, key, &found);
  if (legacy && found) {
    spdlog::info(
        "exactly-once: the progress was read from {}, where earlier versions kept it; "
        "it goes to {} from now on",
        options_.legacy_topic, options_.topic);
  }
  return legacy;
}

Result<std::optional<std::string>> KafkaProgressLog::ReadShared(const std::string& key) {
  if (options_.legacy_topic.empty() || options_.legacy_topic == options_.topic) {
    return std::optional<std::string>();
  }
  bool found = false;
  return ReadFrom(options_.legacy_topic, key, &found, false);
}

Result<std::optional<std::string>> KafkaProgressLog::ReadFrom(const std::string& topic,
                                                              const std::string& key, bool* found,
                                                              bool wait) {
  rd_kafka_t* committed = clients_->committed.get();
  rd_kafka_t* uncommitted = clients_->uncommitted.get();
  auto partitions = Partitions(committed, topic, options_.timeout);
  if (!partitions) return std::unexpected(partitions.error());
  std::optional<std::string> last;
  int32_t found_in = -1;
  for (int32_t p = 0; p < *partitions; ++p) {
    // Nothing may be open below the end: wait it out, within a bound.
    auto deadline = Clock::now() + options_.open_wait;
    Offsets o;
    bool said = false;
    while (true) {
      auto q = QueryOffsets(committed, uncommitted, topic, p, options_.timeout);
      if (!q) {
        // The next attempt asks with fresh clients (see Renew).
        if (auto renewed = Renew(); !renewed) spdlog::warn("{}", renewed.error().message);
        return std::unexpected(q.error());
      }
      o = *q;
      if (o.stable >= o.high || !wait) break;
      if (Clock::now() >= deadline) {
        return Fail(ErrorCode::kTransient,
                    "progress topic {} [{}]: a transaction of another producer is open there "
                    "(last stable offset {}, end {}) for over {} s: a read now could miss this "
                    "relay's newest progress. The progress topic should be this relay's alone "
                    "(outbox-relay check lists who writes it)",
                    topic, p, o.stable, o.high, options_.open_wait.count() / 1000);
      }
      if (!said) {
        spdlog::warn(
            "progress topic {} [{}]: another producer's transaction is open (last stable "
            "offset {}, end {}); waiting for it before reading the progress",
            topic, p, o.stable, o.high);
        said = true;
      }
      std::this_thread::sleep_for(milliseconds(100));
    }
    // Backwards from the end in growing windows: the newest record is near it.
    int64_t end = o.stable;
    int64_t window = 64;
    while (end > o.low) {
      int64_t start = std::max(o.low, end - window);
      auto read = ReadWindow(committed, topic, p, start, end, &key, options_.timeout);
      if (!read) return std::unexpected(read.error());
      if (read->hit) {
        if (found_in != -1) {
          spdlog::warn("progress key {} found in partitions {} and {} of {}", key, found_in, p,
                       topic);
        } else {
          last = std::move(read->value);
          found_in = p;
        }
        break;
      }
      end = start;
      window *= 4;
    }
  }
  *found = found_in != -1;
  return last;
}

Result<KafkaProgressLog::TopicReport> KafkaProgressLog::Describe(milliseconds timeout) {
  TopicReport report;
  rd_kafka_t* uncommitted = clients_->uncommitted.get();
  auto config = TopicConfig(uncommitted, options_.topic, timeout);
  if (!config) return std::unexpected(config.error());
  if (!*config) return report;
  report.exists = true;
  if (auto it = (*config)->find("cleanup.policy"); it != (*config)->end()) {
    report.cleanup_policy = it->second;
  }
  auto partitions = Partitions(uncommitted, options_.topic, timeout);
  if (!partitions) return std::unexpected(partitions.error());
  report.partitions = *partitions;
  std::set<std::string> keys;
  for (int32_t p = 0; p < *partitions; ++p) {
    auto o = QueryOffsets(clients_->committed.get(), uncommitted, options_.topic, p, timeout);
    if (!o) return std::unexpected(o.error());
    // Who writes it: the keys of the last 10,000 records of each partition.
    int64_t start = std::max(o->low, o->high - 10000);
    if (start >= o->high) continue;
    auto read = ReadWindow(uncommitted, options_.topic, p, start, o->high, nullptr, timeout, &keys);
    if (!read) return std::unexpected(read.error());
  }
  report.keys.assign(keys.begin(), keys.end());
  return report;
}

}  // namespace outbox_relay::kafka
