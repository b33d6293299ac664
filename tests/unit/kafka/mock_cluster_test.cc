// The producer and the ack tracker under faults a real broker cannot produce
// on demand: librdkafka's mock cluster (rdkafka_mock.h) with request errors,
// a slow broker holding some partitions, and a fatal idempotence error.
//
// The property under test is the confirmation rule: whatever Kafka does, the
// confirmed LSN never passes the oldest transaction with an unacknowledged
// row, and order within a partition survives retries.
#include <gtest/gtest.h>
#include <librdkafka/rdkafka.h>
// After rdkafka.h, as it requires.
#include <librdkafka/rdkafka_mock.h>

#include <atomic>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include "outbox_relay/kafka/producer.h"
#include "outbox_relay/tracking/ack_tracker.h"

namespace outbox_relay::kafka {
namespace {

using namespace std::chrono_literals;

constexpr int kPartitions = 3;
constexpr int16_t kProduceApiKey = 0;  // the Kafka protocol's ApiKey of Produce
constexpr const char* kTopic = "mock.review.review";

// Sarama's hash partitioner (= librdkafka's fnv1a): which partition a key lands on.
int32_t SaramaPartition(std::string_view key) {
  uint32_t h = 0x811C9DC5;
  for (unsigned char c : key) {
    h ^= c;
    h *= 0x01000193;
  }
  auto s = static_cast<int32_t>(h);
  if (s < 0) s = -s;
  return static_cast<int32_t>(static_cast<uint32_t>(s) % kPartitions);
}

// A key for each partition, found by search.
std::string KeyFor(int32_t partition, int n) {
  for (int i = 0;; ++i) {
    std::string k = "agg-" + std::to_string(n) + "-" + std::to_string(i);
    if (SaramaPartition(k) == partition) return k;
  }
}

// One-row transactions produced in order; the test keeps its own oracle of
// which transactions are fully acknowledged to judge the tracker with.
class MockClusterTest : public ::testing::Test {
 protected:
  // The producer's poller threads call OnDelivery until the producer is gone:
  // it goes first, before the members that callback uses.
  ~MockClusterTest() override { producer_.reset(); }

  void Start(std::vector<std::pair<std::string, std::string>> extra = {},
             std::string transactional_id = "") {
    ProducerOptions opts;
    opts.transactional_id = std::move(transactional_id);
    opts.brokers = "";  // the mock cluster provides the bootstrap servers
    opts.properties = {{"test.mock.num.brokers", "3"}, {"linger.ms", "1"}};
    opts.admin_timeout = 300ms;  // the mock cluster does not answer DescribeConfigs
    for (auto& p : extra) opts.properties.push_back(p);
    auto producer = KafkaProducer::Create(opts, [this](const Delivery& d) { OnDelivery(d); });
    ASSERT_TRUE(producer) << producer.error().message;
    producer_ = std::move(*producer);
    mock_ = rd_kafka_handle_mock_cluster(producer_->handle());
    ASSERT_NE(mock_, nullptr);
    ASSERT_EQ(rd_kafka_mock_topic_create(mock_, kTopic, kPartitions, 1),
              RD_KAFKA_RESP_ERR_NO_ERROR);
    // Partition p is led by broker p+1, so one slow broker holds one partition.
    for (int32_t p = 0; p < kPartitions; ++p) {
      rd_kafka_mock_partition_set_leader(mock_, kTopic, p, p + 1);
    }
  }

  // Produces transaction i (end LSN 1000 + 10 i) with one row keyed to `partition`.
  void ProduceTx(int i, int32_t partition) {
    tracking::Transaction* tx =
        tracker_.Begin(Lsn(999 + 10 * static_cast<uint64_t>(i)), PgTimestamp{}, 1);
    keys_.push_back(KeyFor(partition, i));
    record_.topic = kTopic;
    record_.key = keys_.back();
    record_.value = "{\"i\":" + std::to_string(i) + "}";
    {
      std::lock_guard lock(mu_);
      tx_index_[tx] = i;
      acked_.push_back(false);
      partition_of_.push_back(partition);
    }
    tracker_.AddMessage(tx);
    // The first record of a topic waits while the producer prepares the topic.
    auto accepted = producer_->Produce(record_, tx);
    for (int tries = 0; accepted && *accepted == Sink::Accepted::kQueueFull && tries < 5000;
         ++tries) {
      std::this_thread::sleep_for(1ms);
      accepted = producer_->Produce(record_, tx);
    }
    ASSERT_TRUE(accepted) << accepted.error().message;
    ASSERT_EQ(*accepted, Sink::Accepted::kQueued);
    tracker_.Commit(tx, Lsn(1000 + 10 * static_cast<uint64_t>(i)));
  }

  // Hands the producer one record of no transaction the tracker knows.
  Result<Sink::Accepted> HandARecord() {
    outbox::KafkaRecord r;
    r.topic = kTopic;
    r.value = "x";
    return producer_->Produce(r, nullptr);
  }

  // Puts the producer into the fatal state `fatal`, then hands it a record:
  // the error the record is refused with.
  Error RefusedAfterFatal(rd_kafka_resp_err_t fatal) {
    rd_kafka_test_fatal_error(producer_->handle(), fatal, "injected by the test");
    auto refused = HandARecord();
    if (refused) return Error{ErrorCode::kInvalidArgument, "taken after a fatal error"};
    return refused.error();
  }

  void OnDelivery(const Delivery& d) {
    auto* tx = static_cast<tracking::Transaction*>(d.opaque);
    std::lock_guard lock(mu_);
    int i = tx_index_.at(tx);
    report_threads_.insert(std::this_thread::get_id());
    ++reports_[i];
    if (d.error) {
      errors_.push_back(*d.error);
      tracker_.OnFailed(tx, d.error->message);
      return;
    }
    acked_[static_cast<size_t>(i)] = true;
    // Order within a partition: offsets grow in produce order.
    auto [it, first] = last_offset_.try_emplace(d.partition, i, d.offset);
    if (!first) {
      auto& [last_i, last_offset] = it->second;
      if ((i > last_i) != (d.offset > last_offset)) ++order_violations_;
      if (i > last_i) it->second = {i, d.offset};
    }
    tracker_.OnDelivered(tx);
    CheckConfirmedWithinAckedPrefix();
  }

  // The oracle: confirmed may not pass the end of the longest acked prefix.
  void CheckConfirmedWithinAckedPrefix() {
    size_t prefix = 0;
    while (prefix < acked_.size() && acked_[prefix]) ++prefix;
    uint64_t allowed = prefix == 0 ? 1 : 1000 + 10 * (prefix - 1);
    uint64_t confirmed = tracker_.confirmed().value();
    if (confirmed > allowed) ++rule_violations_;
    max_seen_confirmed_ = std::max(max_seen_confirmed_, confirmed);
  }

  tracking::AckTracker tracker_{Lsn(1), /*marking=*/false};
  std::unique_ptr<KafkaProducer> producer_;
  rd_kafka_mock_cluster_t* mock_ = nullptr;
  outbox::KafkaRecord record_;
  std::vector<std::string> keys_;
  std::mutex mu_;
  std::map<tracking::Transaction*, int> tx_index_;
  std::vector<bool> acked_;
  std::vector<int32_t> partition_of_;
  std::map<int32_t, std::pair<int, int64_t>> last_offset_;
  std::vector<Error> errors_;
  std::set<std::thread::id> report_threads_;
  std::map<int, int> reports_;  // delivery reports per transaction
  int rule_violations_ = 0;
  int order_violations_ = 0;
  uint64_t max_seen_confirmed_ = 0;
};

TEST_F(MockClusterTest, SlowBrokerHoldingOnePartitionHoldsConfirmationAtItsOldestTransaction) {
  Start();
  // Warm up metadata and the producer id so the delay below is the broker's.
  ProduceTx(0, 0);
  ASSERT_TRUE(producer_->Flush(10s));
  rd_kafka_mock_broker_set_rtt(mock_, /*broker_id=*/2, /*rtt_ms=*/4000);
  constexpr int kTx = 60;
  for (int i = 1; i < kTx; ++i) ProduceTx(i, i % kPartitions);
  // While partition 1 (broker 2) is slow, partitions 0 and 2 ack; transaction
  // 1 (the first on partition 1) must hold the confirmed position below it.
  auto acked_on_fast_partitions = [&] {
    std::lock_guard lock(mu_);
    int n = 0;
    for (int i = 2; i < kTx; ++i) n += acked_[static_cast<size_t>(i)] && i % 3 != 1;
    return n;
  };
  auto deadline = std::chrono::steady_clock::now() + 3s;
  while (acked_on_fast_partitions() < 30 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(20ms);
  }
  {
    std::lock_guard lock(mu_);
    ASSERT_FALSE(acked_[1]) << "the slow partition answered too early for this test to mean much";
  }
  EXPECT_GE(acked_on_fast_partitions(), 30) << "the fast partitions should have acked meanwhile";
  EXPECT_LT(tracker_.confirmed(), Lsn(1000 + 10 * 1)) << "passed the oldest unacked transaction";
  ASSERT_TRUE(producer_->Flush(20s));
  ASSERT_TRUE(tracker_.WaitEmpty(5s));
  EXPECT_EQ(rule_violations_, 0);
  EXPECT_EQ(order_violations_, 0);
  EXPECT_EQ(tracker_.confirmed(), Lsn(1000 + 10 * (kTx - 1)));
  std::printf("slow broker: %d transactions, rule violations %d, order violations %d\n", kTx,
              rule_violations_, order_violations_);
}

// Flush while rows are in flight (what a SIGTERM does): the reports are served
// by the poller thread alone, each exactly once. (rd_kafka_flush on the caller's
// thread served some there, concurrently with the poller, through one shared
// report buffer: a transaction got two reports and another none, and the relay
// waited out its shutdown timeout.)
TEST_F(MockClusterTest, FlushWhileReportsArriveServesEachReportOnceOnOneThread) {
  Start();
  constexpr int kTx = 3000;
  for (int i = 0; i < kTx; ++i) {
    ProduceTx(i, i % kPartitions);
    if (i % 100 == 99) (void)producer_->Flush(2ms);
  }
  ASSERT_TRUE(producer_->Flush(20s));
  ASSERT_TRUE(tracker_.WaitEmpty(5s));
  std::lock_guard lock(mu_);
  EXPECT_EQ(report_threads_.size(), 1u) << "delivery reports served on more than one thread";
  int twice = 0;
  for (int i = 0; i < kTx; ++i) twice += reports_[i] != 1;
  EXPECT_EQ(twice, 0) << "transactions without exactly one delivery report";
  EXPECT_EQ(rule_violations_, 0);
  EXPECT_EQ(tracker_.confirmed(), Lsn(1000 + 10 * (kTx - 1)));
}

TEST_F(MockClusterTest, RetriableProduceErrorsLoseNothingAndKeepPartitionOrder) {
  Start();
  ProduceTx(0, 0);
  ASSERT_TRUE(producer_->Flush(10s));
  rd_kafka_mock_push_request_errors(
      mock_, kProduceApiKey, 6, RD_KAFKA_RESP_ERR_NOT_LEADER_FOR_PARTITION,
      RD_KAFKA_RESP_ERR_REQUEST_TIMED_OUT, RD_KAFKA_RESP_ERR_NOT_ENOUGH_REPLICAS,
      RD_KAFKA_RESP_ERR_LEADER_NOT_AVAILABLE, RD_KAFKA_RESP_ERR_NOT_ENOUGH_REPLICAS_AFTER_APPEND,
      RD_KAFKA_RESP_ERR_REQUEST_TIMED_OUT);
  constexpr int kTx = 300;
  for (int i = 1; i < kTx; ++i) ProduceTx(i, i % kPartitions);
  ASSERT_TRUE(producer_->Flush(30s));
  ASSERT_TRUE(tracker_.WaitEmpty(5s));
  EXPECT_TRUE(errors_.empty()) << errors_.front().message;
  EXPECT_EQ(rule_violations_, 0);
  EXPECT_EQ(order_violations_, 0);
  EXPECT_EQ(tracker_.confirmed(), Lsn(1000 + 10 * (kTx - 1)));
  std::printf("retriable errors: %d transactions delivered, 0 lost, order violations %d\n", kTx,
              order_violations_);
}

// What an out-of-order sequence does to an idempotent producer (librdkafka
// before 2.3.0 also did it after broker failovers that lost nothing,
// confluentinc/librdkafka#4438). At-least-once, the producer is replaced:
// new records and the ones in flight fail as kAborted (sent again from the
// slot), and nothing past them is confirmed.
TEST_F(MockClusterTest, FatalIdempotenceErrorFailsTheProducerForReplacement) {
  Start();
  ProduceTx(0, 0);
  ASSERT_TRUE(producer_->Flush(10s));
  ASSERT_TRUE(tracker_.WaitEmpty(5s));
  // Take partition 1's leader away so its rows are queued when the producer dies.
  rd_kafka_mock_broker_set_down(mock_, 2);
  for (int i = 1; i < 30; ++i) ProduceTx(i, i % kPartitions);
  std::this_thread::sleep_for(300ms);
  // New records are refused...
  Error refused = RefusedAfterFatal(RD_KAFKA_RESP_ERR_OUT_OF_ORDER_SEQUENCE_NUMBER);
  EXPECT_EQ(refused.code, ErrorCode::kAborted) << refused.message;
  EXPECT_NE(refused.message.find("OUT_OF_ORDER_SEQUENCE_NUMBER"), std::string::npos)
      << refused.message;
  // ...and the ones in flight fail the same way, so the tracker records the
  // failure and never confirms past them.
  (void)producer_->Flush(10s);
  std::this_thread::sleep_for(500ms);
  ASSERT_TRUE(tracker_.failure().has_value());
  EXPECT_LT(tracker_.confirmed(), Lsn(1000 + 10 * 1));
  EXPECT_EQ(rule_violations_, 0);
  std::lock_guard lock(mu_);
  ASSERT_FALSE(errors_.empty());
  for (const Error& e : errors_) EXPECT_EQ(e.code, ErrorCode::kAborted) << e.message;
  std::printf(
      "fatal idempotence error: %zu records failed for replacement, confirmed stayed at %s\n",
      errors_.size(), tracker_.confirmed().ToString().c_str());
}

// Refused the right to write: a new producer would be refused too, so the
// error stays fatal.
TEST_F(MockClusterTest, AFatalAuthorizationErrorStaysFatal) {
  Start();
  ProduceTx(0, 0);
  ASSERT_TRUE(producer_->Flush(10s));
  Error refused = RefusedAfterFatal(RD_KAFKA_RESP_ERR_CLUSTER_AUTHORIZATION_FAILED);
  EXPECT_EQ(refused.code, ErrorCode::kFatal) << refused.message;
  EXPECT_NE(refused.message.find("CLUSTER_AUTHORIZATION_FAILED"), std::string::npos)
      << refused.message;
}

// A record of a Kafka transaction failed for good, which puts the
// transactional producer in a state that takes no record until the
// transaction is aborted ("Producing not allowed in transactional state
// AbortableError"). A record handed over before that failure's report was
// handled must make the transaction abort (kAborted: the slot sends its rows
// again), not stop the relay as a fatal error. Seen in
// ExactlyOnce.BrokerRestartAndPostgresImmediateRestartDuringOpenTransactions:
// the progress record was refused with "Local: Erroneous state" after a broker
// restart, and the relay exited with 4,306 rows unacked.
TEST_F(MockClusterTest, ARecordRefusedBecauseItsTransactionFailedAbortsItInsteadOfStopping) {
  Start({}, "mock-txn");
  ASSERT_TRUE(producer_->InitTransactions(10s));
  ASSERT_TRUE(producer_->BeginTransaction());
  ProduceTx(0, 0);  // prepares the topic
  ASSERT_TRUE(producer_->Flush(10s));
  rd_kafka_mock_push_request_errors(mock_, kProduceApiKey, 1, RD_KAFKA_RESP_ERR_MSG_SIZE_TOO_LARGE);
  ProduceTx(1, 0);
  (void)producer_->Flush(10s);
  {
    std::lock_guard lock(mu_);
    ASSERT_EQ(reports_[1], 1);
    ASSERT_EQ(errors_.size(), 1u) << "the second record was not refused";
  }
  auto refused = HandARecord();
  ASSERT_FALSE(refused) << "a record taken into a failed Kafka transaction";
  EXPECT_EQ(refused.error().code, ErrorCode::kAborted) << refused.error().message;
}

}  // namespace
}  // namespace outbox_relay::kafka
