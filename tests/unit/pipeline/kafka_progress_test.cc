// Exactly-once progress (pipeline/kafka_progress.h): the record the relay
// commits to Kafka in each Kafka transaction, and the rule that decides which
// re-sent rows Kafka already holds.
#include "outbox_relay/pipeline/kafka_progress.h"

#include <gtest/gtest.h>

namespace outbox_relay::pipeline {
namespace {

Lsn L(uint64_t v) { return Lsn(v); }

TEST(KafkaProgressCodec, RoundTripsWithAndWithoutABackfill) {
  KafkaProgress p;
  p.final_lsn = L(0x16B374D848);
  p.rows = 12;
  p.complete = false;
  std::string json = EncodeProgress(p, "outbox-relay.1.db.slot");
  EXPECT_EQ(json, R"({"v":1,"key":"outbox-relay.1.db.slot","lsn":"16/B374D848","rows":12,)"
                  R"("complete":false})");
  auto back = DecodeProgress(json);
  ASSERT_TRUE(back) << back.error().message;
  EXPECT_EQ(*back, p);

  p.complete = true;
  p.backfill = BackfillCursor{"731:745:", 740, 12345};
  back = DecodeProgress(EncodeProgress(p, "k\"ey"));
  ASSERT_TRUE(back) << back.error().message;
  EXPECT_EQ(*back, p);
}

TEST(KafkaProgressCodec, BadRecordsAreRefusedNamingWhatIsWrong) {
  struct Case {
    const char* json;
    const char* names;
  } cases[] = {
      {"not json", "not JSON"},
      {R"({"v":1,"rows":1,"complete":true})", "\"lsn\""},
      {R"({"v":1,"lsn":"nonsense","rows":1,"complete":true})", "lsn"},
      {R"({"v":1,"lsn":"0/10","complete":true})", "\"rows\""},
      {R"({"v":1,"lsn":"0/10","rows":1})", "\"complete\""},
      {R"({"v":1,"lsn":"0/10","rows":1,"complete":true,"backfill":{"snapshot":"s"}})", "backfill"},
      {R"({"v":1,"lsn":"0/10","rows":1,"complete":true,)"
       R"("backfill":{"snapshot":"s","transaction_id":"x1","offset":"2"}})",
       "transaction_id"},
      {R"({"v":2,"lsn":"0/10","rows":1,"complete":true})", "version"},
  };
  for (const Case& c : cases) {
    auto r = DecodeProgress(c.json);
    ASSERT_FALSE(r) << c.json;
    EXPECT_EQ(r.error().code, ErrorCode::kInvalidArgument) << c.json;
    EXPECT_NE(r.error().message.find(c.names), std::string::npos)
        << c.json << " -> " << r.error().message;
  }
}

TEST(KafkaProgressHolds, TransactionsBeforeTheProgressAreHeldAfterItNot) {
  KafkaProgress p;
  EXPECT_FALSE(p.Holds(L(100), 0)) << "nothing committed yet holds nothing";
  p.final_lsn = L(1000);
  p.complete = true;
  EXPECT_TRUE(p.Holds(L(999), 0));
  EXPECT_TRUE(p.Holds(L(1000), 5000)) << "the whole transaction at the progress";
  EXPECT_FALSE(p.Holds(L(1001), 0));
  EXPECT_FALSE(p.Holds(kInvalidLsn, 0)) << "a backfilled row has no commit LSN";
}

TEST(KafkaProgressHolds, ASplitTransactionIsHeldUpToItsCommittedRows) {
  KafkaProgress p;
  p.final_lsn = L(1000);
  p.rows = 3;
  p.complete = false;  // a 200,000-row transaction split over Kafka transactions
  EXPECT_TRUE(p.Holds(L(1000), 0));
  EXPECT_TRUE(p.Holds(L(1000), 2));
  EXPECT_FALSE(p.Holds(L(1000), 3));
  EXPECT_TRUE(p.Holds(L(999), 1'000'000));
}

TEST(KafkaProgressHolds, BackfilledRowsAreHeldUpToTheCursorOfTheSameSnapshot) {
  KafkaProgress p;
  EXPECT_FALSE(p.HoldsBackfilled("s1", 1, 1));
  p.backfill = BackfillCursor{"s1", 740, 10};
  EXPECT_TRUE(p.HoldsBackfilled("s1", 739, 99));
  EXPECT_TRUE(p.HoldsBackfilled("s1", 740, 10));
  EXPECT_FALSE(p.HoldsBackfilled("s1", 740, 11));
  EXPECT_FALSE(p.HoldsBackfilled("s1", 741, 0));
  EXPECT_FALSE(p.HoldsBackfilled("s2", 1, 1)) << "another backfill's cursor says nothing";
}

TEST(KafkaProgressIdentity, DatabasesAndSlotsNeverShareATransactionalId) {
  EXPECT_EQ(DefaultTransactionalId("7301", "orders", "outbox_relay"),
            "outbox-relay.7301.orders.outbox_relay");
  EXPECT_NE(DefaultTransactionalId("7301", "orders", "s"),
            DefaultTransactionalId("7301", "users", "s"));
  EXPECT_NE(DefaultTransactionalId("7301", "orders", "s"),
            DefaultTransactionalId("7302", "orders", "s"));
}

}  // namespace
}  // namespace outbox_relay::pipeline
