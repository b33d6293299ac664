// Where records go, and how the relay learns that they are durable.
//
// Contract ("accepted" is not "durable"):
// - `Produce` hands over one record. Returning kQueued means the sink has
//   copied it and will deliver it; it is NOT durable yet. The relay must not
//   count it as delivered until the sink's DeliveryCallback reports it
//   without error (for Kafka: acknowledged by all in-sync replicas).
// - kQueueFull is backpressure: nothing was taken, offer the same record
//   again later. An error means this record can never be taken (kPoison:
//   e.g. larger than the broker accepts) or the sink is broken (kFatal).
// - Records produced from one thread reach each partition in the order they
//   were produced, across retries (the idempotent producer guarantees it).
// - The DeliveryCallback runs on the sink's own thread, once per accepted
//   record, in no particular order across partitions.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string_view>
#include <utility>
#include <vector>

#include "outbox_relay/core/result.h"
#include "outbox_relay/outbox/record.h"

namespace outbox_relay::kafka {

// The outcome of one accepted record, with its content for dead-lettering.
struct Delivery {
  void* opaque = nullptr;
  std::optional<Error> error;  // kPoison: this record can never be delivered; kFatal: stop
  std::string_view topic;
  std::string_view event_type;  // the record's Event-Type header, "" when absent
  int32_t partition = -1;
  int64_t offset = -1;
  std::optional<std::string_view> key;
  std::optional<std::string_view> value;
  std::vector<std::pair<std::string_view, std::string_view>> headers;
  size_t size_bytes = 0;  // key + value + headers
  // Time from Produce to this report.
  std::chrono::microseconds latency{0};
};

using DeliveryCallback = std::function<void(const Delivery&)>;
// Errors of the sink itself, not of one record (e.g. all brokers down).
using SinkErrorCallback = std::function<void(const Error&)>;

class Sink {
 public:
  enum class Accepted { kQueued, kQueueFull };

  virtual ~Sink() = default;
  virtual Result<Accepted> Produce(const outbox::KafkaRecord& record, void* opaque) = 0;
  // Sends everything queued now (ignoring linger) and waits for the reports.
  virtual Status Flush(std::chrono::milliseconds timeout) = 0;
  // Whether the sink can reach its destination now (for /readyz).
  virtual bool Reachable() const = 0;
  // Bytes (key + value + header names and values) of the records accepted and
  // not yet reported: what the sink holds in memory for them.
  virtual int64_t BytesInFlight() const { return 0; }
};

// A sink that writes in Kafka transactions (exactly-once), as the
// transactional KafkaProducer does and the pipeline tests' fake Kafka.
//
// Errors: kTransient (retriable: call again, a commit or abort resumes),
// kAborted (the transaction must be aborted), kFenced (another producer took
// the transactional.id over), kFatal (the producer is done).
//
// A transaction ends in two steps, so that the next one can fill while this
// one commits: FlushTransaction waits until every record of the open one is
// acknowledged; HandOver then makes the other lane the open one and answers
// the ending transaction's lane, to Commit or Abort. The next transaction's
// records go out after every record of this one was written, so partition
// order holds. Only one transaction may be ending at a time.
class TransactionalSink : public Sink {
 public:
  // Fences every earlier producer of the transactional.id and completes (aborts)
  // what it left open.
  virtual Status InitTransactions(std::chrono::milliseconds timeout) = 0;
  // Begins a transaction on the open lane.
  virtual Status BeginTransaction() = 0;
  virtual Status FlushTransaction(std::chrono::milliseconds timeout) = 0;
  virtual int HandOver() = 0;
  // The lane of the open (or next) transaction.
  virtual int OpenLane() const = 0;
  virtual Status CommitTransaction(int lane, std::chrono::milliseconds timeout) = 0;
  virtual Status AbortTransaction(int lane, std::chrono::milliseconds timeout) = 0;
  // Set when a topic needs smaller batches than this producer makes: the
  // pipeline starts again with a producer of that batch.size.
  virtual std::optional<int64_t> RequiredBatchSize() const { return std::nullopt; }
};

// Where exactly-once delivery keeps its progress record (one value under the
// relay's key in a compacted topic), as the KafkaProgressLog keeps it in
// Kafka and the pipeline tests' fake Kafka in memory.
class ProgressLog {
 public:
  virtual ~ProgressLog() = default;
  // The topic is there as the relay needs it; kInvalidArgument when it cannot
  // serve (a cleanup policy that deletes, say), naming the setting.
  virtual Status Prepare() = 0;
  // The newest committed value under `key` (nullopt: none). Never a stale
  // one: when another producer's open transaction could hide a newer one,
  // kTransient (after waiting for it, within a bound), naming the topic.
  virtual Result<std::optional<std::string>> ReadLast(const std::string& key) = 0;
  // The value under `key` in the topic every relay shared before each had
  // its own (0.1.0's outbox-relay.progress), when this log reads one: after a
  // rollback to such a release and forward again, it can be newer than
  // ReadLast's. Read up to what is stable there, without waiting: a record
  // only ever adds to what the relay's own proves (ExactlyOnce::Start takes
  // the furthest), so an older one costs duplicates at worst. nullopt: none.
  virtual Result<std::optional<std::string>> ReadShared(const std::string& key) {
    (void)key;
    return std::optional<std::string>();
  }
  virtual const std::string& topic() const = 0;
};

// Accepts every record and reports it delivered at once, on the caller's
// thread. For benchmarks of everything but Kafka.
class NullSink final : public Sink {
 public:
  explicit NullSink(DeliveryCallback on_delivery) : on_delivery_(std::move(on_delivery)) {}
  Result<Accepted> Produce(const outbox::KafkaRecord& record, void* opaque) override;
  Status Flush(std::chrono::milliseconds) override { return Ok(); }
  bool Reachable() const override { return true; }

 private:
  DeliveryCallback on_delivery_;
  Delivery delivery_;
};

}  // namespace outbox_relay::kafka
