// Reading what the relay produced, straight from the broker: a librdkafka
// consumer with an explicit assignment of every partition from the beginning
// (no group membership, no committed offsets), so each read sees the topics
// in full and in partition order.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <optional>
#include <string>
#include <vector>

namespace outbox_test {

struct KafkaHeader {
  std::string name;
  std::optional<std::string> value;  // nullopt: a null header (distinct from 0 bytes)
  bool operator==(const KafkaHeader&) const = default;
};

struct KafkaRecord {
  std::string topic;
  int32_t partition = -1;
  int64_t offset = -1;
  std::optional<std::string> key;
  std::optional<std::string> value;
  std::vector<KafkaHeader> headers;  // in record order

  // The first header named `name`.
  const KafkaHeader* FindHeader(const std::string& name) const;
};

struct ReadOptions {
  // Stop once this many records were read.
  size_t max_records = std::numeric_limits<size_t>::max();
  // Stop once every partition was read up to its high watermark and the
  // watermarks have not moved for this long.
  std::chrono::milliseconds stable_for{2000};
  // Give up (returning what was read) after this long.
  std::chrono::milliseconds timeout{60000};
  // isolation.level=read_committed: only records of committed transactions
  // (what exactly-once delivery promises a consumer). A partition then counts
  // as read once the consumer reports its end (the commit markers are never
  // returned, so offsets do not reach the high watermark).
  bool read_committed = false;
  // Keep only each record's position and its _watermill_message_uuid header
  // (no key, value or other headers): what the set checks need, for reads of
  // millions of records (the fault campaign's long run).
  bool ids_only = false;
  // When set, each record is handed to it as it is read, and none is kept
  // (Read returns nothing): the records of a partition in offset order, the
  // partitions interleaved. For reads too large to hold.
  std::function<void(KafkaRecord&&)> each;
};

class KafkaReader {
 public:
  explicit KafkaReader(std::string brokers);

  // Every record of the named topics and of all topics starting with
  // `prefix` (empty: none), including topics that appear while reading.
  // Records come out in (topic, partition, offset) order.
  std::vector<KafkaRecord> Read(const std::vector<std::string>& topics, const std::string& prefix,
                                const ReadOptions& options = {});

  // Topic names starting with `prefix`, from the cluster metadata.
  std::vector<std::string> TopicsWithPrefix(const std::string& prefix);
  // Partition count of `topic` (nullopt: unknown topic).
  std::optional<int> PartitionCount(const std::string& topic);
  // Deletes the topics (best effort, errors printed).
  void DeleteTopics(const std::vector<std::string>& topics);

 private:
  std::string brokers_;
};

// A transaction of another producer, left open: a transactional producer
// (its own transactional.id) that begins, writes one record to `topic` and
// waits until Commit or Abort (the destructor aborts). While it is open, a
// read_committed consumer reads that partition no further than its record:
// another relay frozen inside its commit.
class OpenKafkaTransaction {
 public:
  OpenKafkaTransaction(const std::string& brokers, const std::string& transactional_id,
                       const std::string& topic, const std::string& key);
  ~OpenKafkaTransaction();
  OpenKafkaTransaction(const OpenKafkaTransaction&) = delete;
  OpenKafkaTransaction& operator=(const OpenKafkaTransaction&) = delete;
  void Commit();
  void Abort();

 private:
  void* rk_ = nullptr;  // rd_kafka_t
  bool open_ = false;
};

// Sarama's NewHashPartitioner (what librdkafka's fnv1a partitioners copy):
// FNV-1a 32 of the key, as int32 modulo the partition count, negated if negative.
int32_t SaramaHashPartition(const std::string& key, int32_t partitions);

}  // namespace outbox_test
