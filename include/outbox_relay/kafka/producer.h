// The librdkafka producer behind the Sink contract.
//
// Configured for no loss: enable.idempotence=true, acks=all and an infinite
// message.timeout.ms, so a record is never given up on because Kafka was
// away for a while; it either gets acknowledged or the producer hits a fatal
// error and the relay stops without confirming it (the slot replays it).
// Any librdkafka property can be passed through (TLS, SASL, compression...);
// the few that would break the guarantees are refused at start.
//
// Topics and batches. A broker judges a whole record batch against the
// topic's max.message.bytes: one batch over it refuses every record in it,
// although each would be accepted alone. So before the first record goes to a
// topic, the producer asks the broker for that limit (and creates the topic
// with --create-topics), on its own admin thread — the replication loop is
// told "not yet" (kQueueFull) meanwhile and keeps answering the walsender. A
// topic whose limit is below the producer's batch.size is bound to a lane: a
// second librdkafka instance whose batch.size fits the limit. Every record of
// a topic goes through the same lane, so per-partition order (the idempotent
// producer's) holds. A refusal for size is then the record's own (poison);
// where the limit could not be read, a refused batch stops the relay with the
// setting to change, and nothing is dead-lettered.
//
// Transactions. A transactional producer is two librdkafka instances, under
// the transactional.id and its twin, taking consecutive transactions in
// turn: the next transaction fills on one while the other's commit waits for
// the coordinator (and, once it answered, for the markers it writes: it
// refuses the same transactional.id's next AddPartitionsToTxn until they are
// written, and librdkafka retries 20 ms later). Each begins after every
// record of the other was acknowledged (FlushTransaction), so partition
// order holds. InitTransactions fences both ids.
//
// Threads: Produce from one thread (the relay's loop); one poller thread per
// lane serves that lane's delivery reports (the DeliveryCallback may run on
// two threads at once when a second lane exists); one admin thread.
#pragma once

#include <librdkafka/rdkafka.h>

#include <atomic>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "outbox_relay/core/mutex.h"
#include "outbox_relay/kafka/admin.h"
#include "outbox_relay/kafka/sink.h"

namespace outbox_relay::kafka {

// librdkafka's own bound on the bytes it queues (queue.buffering.max.kbytes);
// the relay's --max-in-flight-bytes stays within it.
inline constexpr int64_t kMaxQueuedBytes = int64_t{64} << 20;
// The longest linger.ms a transactional producer takes from its interval.
inline constexpr std::chrono::milliseconds kMaxTransactionLinger{100};

struct ProducerOptions {
  std::string brokers;
  // Applied after our defaults, in order; the user's word wins except where
  // it would break delivery guarantees.
  std::vector<std::pair<std::string, std::string>> properties;
  // Create a topic the first time a record goes to it (Admin API).
  bool create_topics = false;
  int topic_partitions = 3;
  int topic_replication_factor = -1;
  // How long a topic's preparation (create, read its max.message.bytes) may
  // wait for the brokers before its records go out with the default batch
  // size anyway.
  std::chrono::milliseconds admin_timeout{10000};
  // Transactional mode (exactly-once): the producer's transactional.id. Two
  // librdkafka instances then, one under this id and one under its twin
  // (TwinTransactionalId), taking consecutive transactions in turn; no lanes
  // by batch size (a transaction is one producer's): a topic whose limit is
  // below batch.size makes Produce fail with RequiredBatchSize() set: start
  // again with that batch_size.
  std::string transactional_id;
  std::chrono::milliseconds transaction_timeout{60000};
  // Transactional: how often the relay commits (--txn-interval-ms). Records
  // are invisible until the commit, which sends what linger holds at once: a
  // linger as long (at most kMaxTransactionLinger) costs no visibility and
  // makes one batch per partition and transaction instead of one every 3 ms.
  std::chrono::milliseconds transaction_interval{20};
  int64_t batch_size = 0;  // 0: the properties' batch.size, else librdkafka's default
};

// Our defaults, then the user's properties. kInvalidArgument names a
// property that is unknown, has a bad value, or breaks the guarantees; the
// message never repeats a value (it may be a secret).
Result<std::map<std::string, std::string>> ProducerConfig(const ProducerOptions& options);

// The second transactional.id of a transactional producer: `transactional_id` + ".2".
std::string TwinTransactionalId(const std::string& transactional_id);

class KafkaProducer final : public TransactionalSink {
 public:
  // Starts the delivery-report and admin threads; reports go to `on_delivery`.
  static Result<std::unique_ptr<KafkaProducer>> Create(const ProducerOptions& options,
                                                       DeliveryCallback on_delivery,
                                                       SinkErrorCallback on_error = {});
  ~KafkaProducer() override;

  Result<Accepted> Produce(const outbox::KafkaRecord& record, void* opaque) override;
  Status Flush(std::chrono::milliseconds timeout) override;
  bool Reachable() const override;
  int64_t BytesInFlight() const override {
    return bytes_in_flight_.load(std::memory_order_relaxed);
  }

  // Broker metadata request: ok when a broker answered within `timeout`.
  // When the brokers refused the client's credentials or TLS verification
  // failed meanwhile (no retry cures that), kInvalidArgument naming
  // --kafka-property; other failures are kTransient.
  Status CheckConnection(std::chrono::milliseconds timeout);
  // The last authentication or TLS-verification error the brokers gave ("" if none).
  std::string CredentialsError() const;
  rd_kafka_t* handle() const;
  // TEST ONLY: puts the producer in the fatal state an idempotence failure
  // (e.g. an out-of-order sequence) would.
  void InjectFatalErrorForTest();

  // --- transactional mode (TransactionalSink) --------------------------------
  bool transactional() const { return !options_.transactional_id.empty(); }
  // Fences earlier producers with the same transactional.id and completes
  // (aborts) what they left open.
  Status InitTransactions(std::chrono::milliseconds timeout) override;
  // Begins a transaction on the open lane.
  Status BeginTransaction() override;
  // A transaction ends in two steps, so that the next one can fill while the
  // coordinator commits this one. FlushTransaction waits until every record
  // of the open transaction is acknowledged (kTransient: not within
  // `timeout`; call again). HandOver then makes the other lane the open one
  // and answers the ending transaction's lane, to commit or abort: the next
  // transaction's records go out after every record of this one is written,
  // so partition order holds. Only one transaction may be ending at a time.
  Status FlushTransaction(std::chrono::milliseconds timeout) override;
  int HandOver() override;
  // The lane of the open (or next) transaction.
  int OpenLane() const override;
  Status CommitTransaction(int lane, std::chrono::milliseconds timeout) override;
  Status AbortTransaction(int lane, std::chrono::milliseconds timeout) override;
  // Set when a topic needs smaller batches than this producer makes.
  std::optional<int64_t> RequiredBatchSize() const override;

 private:
  struct Lane;
  struct TopicState;

  KafkaProducer() = default;
  void OnError(Lane& lane, rd_kafka_resp_err_t code, const char* reason);
  static void OnLog(const rd_kafka_t* rk, int level, const char* fac, const char* buf);
  // A lane with this batch.size (created on first use); nullptr on failure.
  Result<Lane*> LaneWithBatchSize(int64_t batch_size);
  // A new lane (lanes_mu_ held); `transactional_id` overrides the setting.
  Result<Lane*> AddLaneLocked(int64_t batch_size, const std::string& transactional_id);
  // Transactional: lane 0 (default) or 1 (twin); the open one by default.
  Lane* TransactionLane(int lane) const;
  Lane* TransactionLane() const { return TransactionLane(OpenLane()); }
  void AdminLoop();
  // Creates (--create-topics) and sizes `name`.
  void PrepareTopic(const std::string& name);
  void Report(Lane& lane, const rd_kafka_message_t* msg);

  DeliveryCallback on_delivery_;
  SinkErrorCallback on_error_;
  ProducerOptions options_;
  std::map<std::string, std::string> settings_;  // librdkafka properties of every lane
  int64_t batch_size_ = 0;                       // the default lane's batch.size

  std::mutex lanes_mu_;  // guards lanes_ growth; lanes are never removed before destruction
  std::vector<std::unique_ptr<Lane>> lanes_;  // [0] is the default lane
  Lane* default_lane_ = nullptr;              // lanes_[0], set once by Create
  // Transactional: lanes_[1], the same producer under the twin
  // transactional.id; consecutive transactions alternate between the two.
  Lane* twin_lane_ = nullptr;
  std::atomic<bool> twin_active_{false};

  Mutex topics_mu_;
  CondVar prepare_cv_;
  std::unordered_map<std::string, std::unique_ptr<TopicState>> topics_ GUARDED_BY(topics_mu_);
  std::deque<std::string> to_prepare_ GUARDED_BY(topics_mu_);
  std::thread admin_;

  std::atomic<bool> stop_{false};
  std::atomic<bool> brokers_down_{false};
  std::atomic<int64_t> bytes_in_flight_{0};  // BytesInFlight(): added by Produce, taken by Report
  std::atomic<int64_t> required_batch_size_{0};  // transactional: 0 = none
  mutable Mutex credentials_mu_;
  std::string credentials_error_ GUARDED_BY(credentials_mu_);
};

}  // namespace outbox_relay::kafka
