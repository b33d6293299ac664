// The exactly-once progress record in Kafka (pipeline/kafka_progress.h): one
// value under the relay's key in a compacted topic, written inside the relay's
// Kafka transactions, read back at every start.
//
// A read must see this relay's newest committed record (DESIGN §2.8). A
// read_committed consumer reads a partition up to its last stable offset
// (LSO): the first offset of the oldest transaction still open there. Any
// producer's open transaction — another relay frozen inside its commit — stops
// the read below this relay's newer records, and a stale progress means rows
// published twice. So:
// - each relay has a topic of its own by default (DefaultProgressTopic), which
//   no other producer writes; the relay fences its own earlier producers
//   before it reads (InitTransactions), so nothing of its own is open either;
// - every read compares the LSO with the high watermark: while another
//   producer's transaction is open below the end (a shared topic, a topic
//   another producer writes by mistake), the read waits for it, up to a bound,
//   then fails (kTransient) naming the topic, the partition and the offsets.
//
// The newest record is found by reading backwards from the LSO in growing
// windows: a start reads a few records, not the whole log (the active segment
// is never compacted).
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "outbox_relay/core/result.h"
#include "outbox_relay/kafka/producer.h"
#include "outbox_relay/kafka/sink.h"

namespace outbox_relay::kafka {

struct ProgressLogOptions {
  // Brokers and the client properties (TLS, SASL) of the producer; the
  // producer-only ones are left out.
  ProducerOptions connection;
  std::string topic;
  // Where relays before 0.2 kept their progress ("": none): read when `topic`
  // holds no record under the key, and by ReadShared.
  std::string legacy_topic;
  int replication_factor = -1;  // when the relay creates the topic (-1: the broker's default)
  std::chrono::milliseconds timeout{30000};    // each request to the brokers
  std::chrono::milliseconds open_wait{75000};  // another producer's open transaction
};

class KafkaProgressLog final : public ProgressLog {
 public:
  static Result<std::unique_ptr<KafkaProgressLog>> Create(ProgressLogOptions options);
  ~KafkaProgressLog() override;

  // Creates the topic (one partition, compacted, small segments) or checks it:
  // cleanup.policy must be "compact" alone (with "delete" an idle relay's only
  // record expires, and rows Kafka has would be produced again).
  Status Prepare() override;
  Result<std::optional<std::string>> ReadLast(const std::string& key) override;
  Result<std::optional<std::string>> ReadShared(const std::string& key) override;
  const std::string& topic() const override { return options_.topic; }

  // For `check`: the topic's settings and who writes it.
  struct TopicReport {
    bool exists = false;
    std::string cleanup_policy;
    int partitions = 0;
    std::vector<std::string> keys;  // distinct keys of the records there (at most 100)
  };
  Result<TopicReport> Describe(std::chrono::milliseconds timeout);

 private:
  explicit KafkaProgressLog(ProgressLogOptions options);
  // `wait`: for another producer's open transaction below the end (else
  // only what is stable is read).
  Result<std::optional<std::string>> ReadFrom(const std::string& topic, const std::string& key,
                                              bool* found, bool wait = true);
  // New consumer clients: a client that learnt of the topic before it had
  // its partition (another instance created it meanwhile) kept answering
  // "Unknown partition" from its cached metadata for minutes.
  Status Renew();
  ProgressLogOptions options_;
  struct Clients;
  std::unique_ptr<Clients> clients_;
};

// Client properties a consumer understands too (security, addressing);
// producer tuning would only draw warnings.
bool IsClientProperty(const std::string& key);

}  // namespace outbox_relay::kafka
