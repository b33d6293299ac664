// `outbox-relay check`, its Kafka half: the brokers answer, the topics the
// relay writes exist or will be created (check.h lists the lines).
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <chrono>
#include <map>
#include <optional>
#include <string>

#include "outbox_relay/kafka/admin.h"
#include "outbox_relay/kafka/producer.h"
#include "outbox_relay/kafka/progress_log.h"
#include "outbox_relay/ops/check.h"
#include "outbox_relay/pipeline/kafka_progress.h"

namespace outbox_relay::ops {

namespace {

class KafkaChecker : CheckList {
 public:
  KafkaChecker(const CheckConfig& config, const TopicSample& sample)
      : c_(config), r_(config.relay), sample_(sample) {}

  std::vector<CheckResult> Run() {
    Kafka();
    return std::move(out_);
  }

 private:
  void Kafka() {
    if (r_.sink == app::SinkKind::kNull) {
      Warn("kafka", "--sink null: records go nowhere (benchmarks only)", "use --sink kafka");
      return;
    }
    auto producer =
        kafka::KafkaProducer::Create(app::ProducerOptionsOf(r_), [](const kafka::Delivery&) {});
    if (!producer) {
      Failed("kafka", producer.error().message,
             "fix --kafka-property / OUTBOX_KAFKA_PROPERTIES (librdkafka property names)");
      return;
    }
    rd_kafka_t* rk = (*producer)->handle();
    const std::chrono::milliseconds timeout(c_.kafka_timeout_ms);
    auto cluster = kafka::DescribeCluster(rk, timeout);
    if (!cluster) {
      std::string refused = (*producer)->CredentialsError();
      Failed("kafka",
             fmt::format("no broker of {} answered a metadata request within {} ms: {}{}",
                         r_.kafka_brokers, timeout.count(), cluster.error().message,
                         refused.empty() ? "" : "; the brokers refused the connection: " + refused),
             "check --kafka-brokers (KAFKA_BROKERS), the network, and the TLS/SASL properties "
             "(--kafka-property)");
      return;
    }
    cluster_ = std::move(*cluster);
    Ok("kafka", fmt::format("{} answered: {} broker(s), {} topics", r_.kafka_brokers,
                            cluster_.broker_ids.size(), cluster_.topics.size()));
    if (!cluster_.broker_ids.empty()) {
      if (auto config = kafka::BrokerConfig(rk, cluster_.broker_ids.front(), timeout)) {
        if (auto it = config->find("auto.create.topics.enable"); it != config->end()) {
          auto_create_ = it->second == "true";
        }
      }
    }

    if (r_.on_poison == pipeline::OnPoison::kDeadLetter) {
      Topic(r_.dlq_topic, "dead-letter topic", "");
    }
    if (r_.delivery == app::DeliveryMode::kExactlyOnce) ProgressTopic(timeout);
    if (!sample_.known) return;
    if (sample_.rows == 0) {
      Ok("topics", "the table has no rows yet: no event types to check topics for");
      return;
    }
    if (sample_.poison > 0) {
      Warn("recent rows",
           fmt::format("{} of the newest {} rows cannot be mapped to a topic and would be "
                       "dead-lettered; first: {}",
                       sample_.poison, sample_.rows, sample_.first_poison),
           "fix those rows' metadata, or the --topic-template (OUTBOX_TOPIC_TEMPLATE)");
    }
    size_t shown = 0;
    for (const auto& [topic, entry] : sample_.topics) {
      if (++shown > 20) {
        Ok("topics", fmt::format("… and {} more topics not listed", sample_.topics.size() - 20));
        break;
      }
      std::string types;
      for (const std::string& t : entry.second) {
        if (!types.empty()) types += ", ";
        types += t.empty() ? "(no Event-Type)" : t;
      }
      Topic(topic, "topic",
            fmt::format(" ({} of the newest {} rows: {})", entry.first, sample_.rows, types));
    }
  }

  // --delivery=exactly-once: the progress topic is compacted and never deleted
  // from (run creates it so when it is missing), and no one else writes it (an
  // open transaction of another producer would hold up every start).
  void ProgressTopic(std::chrono::milliseconds timeout) {
    const std::string& key = sample_.transactional_id;
    if (r_.progress_topic.empty() && key.empty()) {
      Warn("progress topic", "the transactional.id cannot be derived (PostgreSQL not reached)",
           "fix the PostgreSQL checks above, or set --transactional-id");
      return;
    }
    kafka::ProgressLogOptions lo;
    lo.connection = app::ProducerOptionsOf(r_);
    lo.topic = r_.progress_topic.empty() ? pipeline::DefaultProgressTopic(key) : r_.progress_topic;
    lo.timeout = timeout;
    const std::string name = "progress topic " + lo.topic;
    auto log = kafka::KafkaProgressLog::Create(lo);
    if (!log) {
      Failed(name, log.error().message, "fix --kafka-property / OUTBOX_KAFKA_PROPERTIES");
      return;
    }
    auto report = (*log)->Describe(timeout);
    if (!report) {
      Warn(name, fmt::format("cannot be described: {}", report.error().message),
           "grant DescribeConfigs and Read on the topic, or check it by hand: "
           "cleanup.policy=compact, written by this relay alone");
      return;
    }
    if (!report->exists) {
      Ok(name, "does not exist; run creates it (1 partition, cleanup.policy=compact)");
      return;
    }
    if (report->cleanup_policy != "compact") {
      Failed(name,
             fmt::format("cleanup.policy={}: the progress would expire and rows already in "
                         "Kafka be produced again; run refuses it",
                         report->cleanup_policy.empty() ? "(unknown)" : report->cleanup_policy),
             fmt::format("kafka-configs.sh --alter --entity-type topics --entity-name {} "
                         "--add-config cleanup.policy=compact",
                         lo.topic));
      return;
    }
    std::vector<std::string> others;
    for (const std::string& k : report->keys) {
      if (k != key) others.push_back(k);
    }
    if (!others.empty()) {
      Warn(name,
           fmt::format("other producers write it too (keys {}): while one of them has a "
                       "transaction open there, this relay's start waits for it",
                       fmt::join(others, ", ")),
           "give each relay its own progress topic (leave --progress-topic empty: the default "
           "is the relay's own)");
      return;
    }
    Ok(name, fmt::format("exists, compacted, {} partition{}, written by this relay alone",
                         report->partitions, report->partitions == 1 ? "" : "s"));
  }

  void Topic(const std::string& topic, const char* what, const std::string& note) {
    std::string name = fmt::format("{} {}", what, topic);
    auto it = cluster_.topics.find(topic);
    if (it != cluster_.topics.end()) {
      Ok(name, fmt::format("exists, {} partitions{}", it->second, note));
    } else if (r_.create_topics) {
      Ok(name, fmt::format("does not exist; run creates it (--create-topics, {} partitions){}",
                           r_.topic_partitions, note));
    } else if (auto_create_.value_or(false)) {
      Warn(name,
           fmt::format("does not exist; the broker creates it on first use "
                       "(auto.create.topics.enable = true), with its default settings{}",
                       note),
           fmt::format("create it with the partitions and replication you want "
                       "(kafka-topics.sh --create --topic {}), or run with --create-topics",
                       topic));
    } else {
      Failed(name,
             fmt::format("does not exist, and the broker does not create topics{}{}",
                         auto_create_ ? " (auto.create.topics.enable = false)"
                                      : " (auto.create.topics.enable unknown)",
                         note),
             fmt::format("create it (kafka-topics.sh --create --topic {}), or run with "
                         "--create-topics",
                         topic));
    }
  }

  const CheckConfig& c_;
  const app::RelayConfig& r_;
  const TopicSample& sample_;
  kafka::ClusterView cluster_;       // brokers and topics, once they answered
  std::optional<bool> auto_create_;  // broker auto.create.topics.enable; unknown if unreadable
};

}  // namespace

std::vector<CheckResult> CheckKafka(const CheckConfig& config, const TopicSample& sample) {
  return KafkaChecker(config, sample).Run();
}

}  // namespace outbox_relay::ops
