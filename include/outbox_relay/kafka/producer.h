// The librdkafka producer behind the Sink contract.
//
// Configured for no loss: enable.idempotence=true, acks=all and an infinite
// message.timeout.ms, so a record is never given up on because Kafka was
// away for a while; it either gets acknowledged or the producer hits a fatal
// error and the relay stops without confirming it (the slot replays it).
// Any librdkafka property can be passed through (TLS, SASL, compression...);
// the few that would break the guarantees are refused at start.
#pragma once

#include <librdkafka/rdkafka.h>

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "outbox_relay/kafka/sink.h"

namespace outbox_relay::kafka {

struct ProducerOptions {
  std::string brokers;
  // Applied after our defaults, in order; the user's word wins except where
  // it would break delivery guarantees.
  std::vector<std::pair<std::string, std::string>> properties;
  // Create a topic the first time a record goes to it (Admin API).
  bool create_topics = false;
  int topic_partitions = 3;
  int topic_replication_factor = -1;
};

// Our defaults, then the user's properties. kInvalidArgument names a
// property that is unknown, has a bad value, or breaks the guarantees.
Result<std::map<std::string, std::string>> ProducerConfig(const ProducerOptions& options);

template <auto Fn>
struct KafkaDeleter {
  template <typename T>
  void operator()(T* p) const {
    Fn(p);
  }
};
using KafkaHandle = std::unique_ptr<rd_kafka_t, KafkaDeleter<rd_kafka_destroy>>;
using TopicHandle = std::unique_ptr<rd_kafka_topic_t, KafkaDeleter<rd_kafka_topic_destroy>>;

class KafkaProducer final : public Sink {
 public:
  // Starts the delivery-report thread, which calls `on_delivery`.
  static Result<std::unique_ptr<KafkaProducer>> Create(const ProducerOptions& options,
                                                       DeliveryCallback on_delivery,
                                                       SinkErrorCallback on_error = {});
  ~KafkaProducer() override;

  Result<Accepted> Produce(const outbox::KafkaRecord& record, void* opaque) override;
  Status Flush(std::chrono::milliseconds timeout) override;
  bool Reachable() const override;

  // Broker metadata request: ok when a broker answered within `timeout`.
  // When the brokers refused the client's credentials or TLS verification
  // failed meanwhile (no retry cures that), kInvalidArgument naming
  // --kafka-property; other failures are kTransient.
  Status CheckConnection(std::chrono::milliseconds timeout);
  // The last authentication or TLS-verification error the brokers gave ("" if none).
  std::string CredentialsError() const;
  rd_kafka_t* handle() const { return rk_.get(); }
  // TEST ONLY: puts the producer in the fatal state an idempotence failure
  // (e.g. an out-of-order sequence) would.
  void InjectFatalErrorForTest();

 private:
  KafkaProducer() = default;
  static void OnDeliveryReport(rd_kafka_t* rk, const rd_kafka_message_t* msg, void* opaque);
  static void OnError(rd_kafka_t* rk, int err, const char* reason, void* opaque);
  static void OnLog(const rd_kafka_t* rk, int level, const char* fac, const char* buf);
  rd_kafka_topic_t* Topic(std::string_view name);
  void CreateTopic(const std::string& name);
  void PollLoop();

  KafkaHandle rk_;
  DeliveryCallback on_delivery_;
  SinkErrorCallback on_error_;
  ProducerOptions options_;
  std::mutex topics_mu_;
  std::unordered_map<std::string, TopicHandle> topics_;
  std::atomic<bool> stop_{false};
  std::atomic<bool> brokers_down_{false};
  mutable std::mutex credentials_mu_;
  std::string credentials_error_;  // guarded by credentials_mu_
  // Callers of Flush waiting: the poller flushes (linger ignored) instead of
  // polling. Only the poller thread may serve delivery reports: rd_kafka_flush
  // on another thread would run them there too, concurrently.
  std::atomic<int> flush_waiters_{0};
  std::thread poller_;
  Delivery scratch_;  // reused by the poller thread only (see flush_waiters_)
};

}  // namespace outbox_relay::kafka
