// Kafka judges record batches, not records (DESIGN §2.6: a row the topic
// would accept alone is never dead-lettered).
//
// A topic whose max.message.bytes is below the producer's batch.size refused
// a whole batch of small records as "Message size too large", and the relay
// dead-lettered every row of it. The producer now reads the topic's limit
// before the first record goes there and sizes that topic's batches to fit:
// only a record that is too large alone is poison.
#include <fmt/format.h>

#include <thread>

#include "fixture.h"
#include "resilience_support.h"

namespace outbox_test {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;
using namespace resilience;

class KafkaBatches : public RelayTest {};

TEST_F(KafkaBatches, SmallRecordsOfATopicWithASmallLimitAreDeliveredNotDeadLettered) {
  CreateTables();
  const std::string topic = topic_prefix_ + ".small.small";
  CreateTopic(env_.kafka_brokers, topic, 1, {{"max.message.bytes", "20000"}});
  // 200 rows of ~120 bytes in one transaction: one producer batch of ~24 KB
  // unless the producer sizes it for the topic. Plus one row too large for
  // the topic even alone: that one is poison.
  Pg writer(env_.database_url);
  std::vector<WrittenRow> rows;
  writer.Exec("BEGIN");
  for (int i = 1; i <= 200; ++i) rows.push_back(InsertRow(writer, {.seq = i, .pad = 40}));
  const std::string big_uuid = InsertRow(writer, {.agg = "small-2", .pad = 30000}).uuid;
  writer.Exec("COMMIT");

  RelayProcess& relay = StartRelay();
  ASSERT_TRUE(WaitStreaming(relay)) << relay.LogTail();
  EXPECT_EQ(WaitAllAcked(seconds(60)), 0) << DescribeUnacked() << relay.LogTail();
  std::vector<KafkaRecord> records = ReadTopics();
  std::vector<KafkaRecord> published;
  size_t dead = 0, big_dead = 0;
  for (const KafkaRecord& rec : records) {
    if (rec.topic != topic_prefix_ + ".dlq") {
      published.push_back(rec);
      continue;
    }
    ++dead;
    const KafkaHeader* h = rec.FindHeader("_watermill_message_uuid");
    if (h != nullptr && h->value == big_uuid) ++big_dead;
  }
  DeliveryReport report = CheckDelivery(rows, {}, published);
  fmt::print("{}; dead-lettered {} (the too-large row: {})\n", report.Summary(), dead, big_dead);
  EXPECT_EQ(report.lost, 0u) << report.Samples();
  EXPECT_EQ(report.duplicates, 0u) << report.Samples();
  EXPECT_EQ(report.order_violations, 0u) << report.Samples();
  EXPECT_EQ(dead, 1u) << "rows the topic accepts alone were dead-lettered";
  EXPECT_EQ(big_dead, 1u);
  EXPECT_NE(relay.Log().find("accepts batches of at most 20000 bytes"), std::string::npos)
      << relay.LogTail();
}

}  // namespace
}  // namespace outbox_test
