// The Publisher on the real librdkafka producer, against librdkafka's mock
// cluster: the hand-over between the loop thread and the producer's threads
// under conditions a real broker does not produce on demand.
//
// - A broker refusal while the producer's queue is full (queue of one
//   message): the refused record is dead-lettered by the loop thread. (It
//   was produced on the poller thread, which spun on QUEUE_FULL waiting for
//   space only it could free: nothing was delivered after that.)
// - --create-topics: the first record of a new topic does not hold the loop
//   while the topic is created and described on the admin thread.
#include <gtest/gtest.h>
#include <librdkafka/rdkafka.h>
// After rdkafka.h, as it requires.
#include <librdkafka/rdkafka_mock.h>

#include <chrono>
#include <iostream>
#include <thread>

#include "../pipeline/fakes.h"
#include "outbox_relay/kafka/producer.h"
#include "outbox_relay/pipeline/publisher.h"

namespace outbox_relay::pipeline {
namespace {

using namespace std::chrono_literals;
using pgoutput::TupleData;
using pgoutput::TupleValue;

constexpr int16_t kProduceApiKey = 0;

TupleValue Text(std::string_view s) { return TupleValue{TupleValue::Kind::kText, s}; }

// The seed's columns, in the order of ColumnMap below.
struct Row {
  std::string offset, uuid, payload, metadata, xid;
  TupleData Tuple() const {
    return TupleData{{Text(offset), Text(uuid), Text(payload), Text(metadata), Text(xid)}};
  }
};

outbox::ColumnMap Columns() {
  outbox::ColumnMap m;
  m.offset = 0;
  m.uuid = 1;
  m.payload = 2;
  m.metadata = 3;
  m.transaction_id = 4;
  return m;
}

class PublisherOnMockCluster : public ::testing::Test {
 protected:
  void Start(std::vector<std::pair<std::string, std::string>> properties, bool create_topics) {
    PublisherOptions o;
    o.table = "public.outbox";
    o.mapper.topic_template = "mock.{Event-Type}";
    o.dlq_topic = "mock.dlq";
    o.stop_grace = 1000ms;
    auto publisher = Publisher::Create(o, &tracker_, &stats_, &metrics_, &stop_);
    ASSERT_TRUE(publisher) << publisher.error().message;
    publisher_ = std::move(*publisher);
    kafka::ProducerOptions po;
    po.properties = {{"test.mock.num.brokers", "1"}, {"linger.ms", "1"}};
    for (auto& p : properties) po.properties.push_back(p);
    po.create_topics = create_topics;
    po.topic_partitions = 1;
    po.admin_timeout = 500ms;  // the mock cluster may not answer admin requests
    auto producer = kafka::KafkaProducer::Create(po, publisher_->DeliveryCallback());
    ASSERT_TRUE(producer) << producer.error().message;
    mock_ = rd_kafka_handle_mock_cluster((*producer)->handle());
    ASSERT_NE(mock_, nullptr);
    for (const char* t : {"mock.made", "mock.dlq"}) {
      ASSERT_EQ(rd_kafka_mock_topic_create(mock_, t, 1, 1), RD_KAFKA_RESP_ERR_NO_ERROR);
    }
    publisher_->AttachSink(std::move(*producer));
  }
  void TearDown() override {
    if (publisher_) publisher_->CloseSink();
  }

  // Produces `rows` as one transaction ending at `end`, as the loop does.
  void ProduceTx(const std::vector<Row>& rows, uint64_t end) {
    tracking::Transaction* tx = tracker_.Begin(Lsn(end - 1), PgTimestamp{}, 1);
    for (const Row& r : rows) {
      TupleData t = r.Tuple();
      auto st = publisher_->MapAndProduce(Columns(), t, tx, nullptr);
      ASSERT_TRUE(st) << st.error().message;
    }
    tracker_.Commit(tx, Lsn(end));
  }

  static Row MakeRow(int i, const std::string& event_type, size_t payload_bytes) {
    return Row{std::to_string(i), "uuid-" + std::to_string(i),
               R"({"pad":")" + std::string(payload_bytes, 'x') + R"("})",
               R"({"Event-Type":")" + event_type + R"("})", "77"};
  }

  tracking::AckTracker tracker_{Lsn(1), /*marking=*/true};
  RelayStats stats_;
  metrics::Metrics metrics_{"test"};
  std::atomic<bool> stop_flag_{false};
  StopSignal stop_{stop_flag_};
  fakes::FakeMarker marker_{&tracker_};
  std::unique_ptr<Publisher> publisher_;
  rd_kafka_mock_cluster_t* mock_ = nullptr;
};

TEST_F(PublisherOnMockCluster, ABrokerRefusalWhileTheQueueIsFullIsDeadLetteredByTheLoopThread) {
  // A queue of one message, and batches of one record (each record is larger
  // than batch.size), so the broker's refusal is the record's own.
  Start({{"queue.buffering.max.messages", "1"}, {"batch.size", "1000"}}, false);
  rd_kafka_mock_push_request_errors(mock_, kProduceApiKey, 1, RD_KAFKA_RESP_ERR_MSG_SIZE_TOO_LARGE);
  std::vector<Row> rows;
  for (int i = 1; i <= 8; ++i) rows.push_back(MakeRow(i, "made", 1500));
  ProduceTx(rows, 100);
  // The loop thread's part: dead-letter what was refused, until all is done.
  auto until = std::chrono::steady_clock::now() + 20s;
  while (!tracker_.empty() && std::chrono::steady_clock::now() < until) {
    ASSERT_TRUE(publisher_->DeadLetterRefused(nullptr));
    tracker_.WaitForProgress(10ms);
  }
  EXPECT_TRUE(tracker_.empty()) << "rows in flight: " << tracker_.rows_in_flight();
  EXPECT_EQ(tracker_.confirmed(), Lsn(100));
  EXPECT_EQ(stats_.dead_lettered.load(), 1u);
  EXPECT_EQ(stats_.delivered.load(), rows.size());  // 7 rows + 1 dead letter
}

TEST_F(PublisherOnMockCluster, CreatingANewTopicDoesNotHoldTheLoop) {
  Start({}, /*create_topics=*/true);
  // A topic the cluster does not know yet: created and described on the
  // admin thread while the loop goes on (each offer returns at once).
  auto t0 = std::chrono::steady_clock::now();
  ProduceTx({MakeRow(1, "made", 10)}, 100);
  auto known_topic = std::chrono::steady_clock::now() - t0;
  std::chrono::steady_clock::duration longest{};
  std::chrono::steady_clock::duration total{};
  int touches = 0;
  {
    // The loop keeps talking to the server while the new topic is prepared:
    // count how long one wait step takes at most.
    struct Timer final : KeepAlive {
      std::chrono::steady_clock::time_point last = std::chrono::steady_clock::now();
      std::chrono::steady_clock::duration* longest;
      int touches = 0;
      Status Touch() override {
        auto now = std::chrono::steady_clock::now();
        *longest = std::max(*longest, now - last);
        last = now;
        ++touches;
        return Ok();
      }
    } timer;
    timer.longest = &longest;
    tracking::Transaction* tx = tracker_.Begin(Lsn(199), PgTimestamp{}, 2);
    Row r = MakeRow(2, "brand.new", 10);
    TupleData t = r.Tuple();
    auto call = std::chrono::steady_clock::now();
    auto st = publisher_->MapAndProduce(Columns(), t, tx, &timer);
    auto returned = std::chrono::steady_clock::now();
    ASSERT_TRUE(st) << st.error().message;
    longest = std::max(longest, returned - timer.last);  // the wait after the last step too
    tracker_.Commit(tx, Lsn(200));
    total = returned - call;
    touches = timer.touches;
  }
  EXPECT_TRUE(tracker_.WaitEmpty(20s));
  // The call waited in steps while the admin thread prepared the topic: a
  // produce call holding the loop would show as one gap as long as the call
  // (or no step at all). A loaded machine can stop a thread for a while
  // (166 ms once, under a full test run), so the bound is relative to the
  // call's whole length, with 100 ms as its floor.
  std::cout << "prepared in " << std::chrono::duration<double, std::milli>(total).count() << " ms, "
            << touches << " steps, longest gap "
            << std::chrono::duration<double, std::milli>(longest).count() << " ms\n";
  EXPECT_GE(touches, 5) << "the loop did not wait in steps";
  EXPECT_LT(longest, std::max<std::chrono::steady_clock::duration>(100ms, total / 2))
      << "a produce call held the loop";
  EXPECT_LT(known_topic, 5s);
}

}  // namespace
}  // namespace outbox_relay::pipeline
