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
