// Marking is exact (DESIGN §5): a row gets offset_acked only after Kafka
// acknowledged it, never because another row of its transaction was.
//
// - A backfill page can end inside a transaction. Marking that transaction
//   by transaction_id marked the rows of the next page before they reached
//   Kafka; a kill -9 then lost them (the next backfill skips acked rows).
// - Two instances started together (a hot-standby Deployment) must not both
//   run the backfill: one sets the slot up, the other waits as its standby.
#include <fmt/format.h>

#include <set>
#include <thread>

#include "fixture.h"

namespace outbox_test {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

class ExactMarking : public RelayTest {
 protected:
  // The uuids of the rows the table shows as published.
  std::set<std::string> MarkedUuids() {
    std::set<std::string> out;
    for (const Row& r : db_->Query(fmt::format("SELECT uuid FROM {} WHERE offset_acked IS NOT NULL",
                                               QuoteIdent(name_)))) {
      out.insert(r[0].value_or(""));
    }
    return out;
  }
  static std::set<std::string> KafkaUuids(const std::vector<KafkaRecord>& records) {
    std::set<std::string> out;
    for (const KafkaRecord& rec : records) {
      const KafkaHeader* h = rec.FindHeader("_watermill_message_uuid");
      if (h != nullptr && h->value) out.insert(*h->value);
    }
    return out;
  }
};

TEST_F(ExactMarking, BackfillPageEndingInsideATransactionMarksOnlyWhatKafkaHas) {
  CreateTables();
  // One 5,600-row transaction written before the slot exists: the backfill
  // reads it in pages of 1,000 rows, one row in flight at a time (slow on
  // purpose: the 4,600 rows after the first page take thousands of round
  // trips, a wide window between the first page's marking and the end of the
  // delivery). With pages of 5,000 the window was the last 600 rows, 2.3 s on
  // a loaded machine, and the marker's lag behind the acknowledgements was
  // longer: the kill came after the last row.
  Ledger ledger;
  Writer writer(Workload(), &ledger, -1, 101);
  ASSERT_TRUE(writer.Transaction({.rows = 5600}));
  RelayProcess& relay = StartRelay(
      {"--max-in-flight", "1", "--kafka-property", "linger.ms=0", "--backfill-batch", "1000"});

  // As soon as the first page is marked, stop the relay dead and compare.
  auto deadline = std::chrono::steady_clock::now() + seconds(120);
  while (db_->Int(fmt::format("SELECT count(*) FROM {} WHERE offset_acked IS NOT NULL",
                              QuoteIdent(name_))) < 1000 &&
         std::chrono::steady_clock::now() < deadline && relay.Running()) {
    std::this_thread::sleep_for(milliseconds(20));
  }
  relay.Kill(SIGKILL);
  relay.Wait(seconds(10));
  std::set<std::string> marked = MarkedUuids();
  std::set<std::string> in_kafka = KafkaUuids(ReadTopics());
  size_t marked_not_in_kafka = 0;
  for (const std::string& u : marked) marked_not_in_kafka += in_kafka.contains(u) ? 0 : 1;
  fmt::print("at the kill: {} rows marked, {} in Kafka, {} marked but not in Kafka\n",
             marked.size(), in_kafka.size(), marked_not_in_kafka);
  ASSERT_GE(marked.size(), 1000u) << relay.LogTail();
  EXPECT_LT(in_kafka.size(), 5600u) << "the kill came too late to show anything";
  EXPECT_EQ(marked_not_in_kafka, 0u) << "rows were marked published before Kafka had them";

  // The restart's backfill finds every row not yet marked: nothing lost.
  RelayProcess& again = StartRelay();
  ASSERT_TRUE(WaitStreaming(again, seconds(60))) << again.LogTail();
  EXPECT_EQ(WaitAllAcked(seconds(60)), 0) << DescribeUnacked();
  DeliveryReport report = CheckDelivery(ledger.committed(), ledger.rolled_back(), ReadTopics());
  fmt::print("{}\n", report.Summary());
  EXPECT_EQ(report.lost, 0u) << report.Samples();
  EXPECT_EQ(report.phantom, 0u) << report.Samples();
  EXPECT_EQ(report.order_violations, 0u) << report.Samples();
  EXPECT_EQ(MisackedRows(), 0);
}

TEST_F(ExactMarking, TwoInstancesStartedTogetherBackfillOnce) {
  CreateTables();
  Ledger ledger;
  {
    Writer writer(Workload(), &ledger, -1, 102);
    for (int i = 0; i < 200; ++i) ASSERT_TRUE(writer.Transaction({.rows = 100}));
  }
  // The hot-standby Deployment starts its two replicas together.
  RelayProcess& first = StartRelay();
  std::this_thread::sleep_for(milliseconds(300));
  RelayProcess& second = StartRelay();
  EXPECT_EQ(WaitAllAcked(seconds(120)), 0) << DescribeUnacked();
  ASSERT_TRUE(WaitStreaming(first, seconds(30)) || WaitStreaming(second, seconds(1)))
      << first.LogTail() << second.LogTail();
  DeliveryReport report = CheckDelivery(ledger.committed(), ledger.rolled_back(), ReadTopics());
  fmt::print("{} (two instances, one backlog)\n", report.Summary());
  EXPECT_EQ(report.lost, 0u) << report.Samples();
  EXPECT_EQ(report.duplicates, 0u) << "both instances ran the backfill\n"
                                   << first.LogTail(10) << second.LogTail(10);
  EXPECT_EQ(report.order_violations, 0u) << report.Samples();
  // The instances write one log (the first one's view holds both).
  int backfills = 0;
  std::string log = first.Log();
  for (size_t p = 0; (p = log.find("backfill: publishing", p)) != std::string::npos; ++p) {
    ++backfills;
  }
  EXPECT_EQ(backfills, 1) << first.LogTail(60) << "\n----\n" << second.LogTail(60);
}

}  // namespace
}  // namespace outbox_test
