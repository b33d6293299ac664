// Exactly-once progress (pipeline/kafka_progress.h): the record the relay
// commits to Kafka in each Kafka transaction, and the rule that decides which
// re-sent rows Kafka already holds.
#include "outbox_relay/pipeline/kafka_progress.h"

#include <gtest/gtest.h>

namespace outbox_relay::pipeline {
namespace {

Lsn L(uint64_t v) { return Lsn(v); }

RelayIdentity Me() { return {"7301", "orders", "outbox_relay"}; }

ProgressRecord Record() {
  ProgressRecord r;
  r.key = "outbox-relay.7301.orders.outbox_relay";
  r.owner = Me();
  r.incarnation = "0/16B3748";
  r.history = WalHistory{2, {{1, L(0x5000148)}}};
  r.progress.final_lsn = L(0x16B374D848);
  r.progress.rows = 12;
  r.progress.complete = false;
  return r;
}

ProgressFacts Facts() {
  ProgressFacts f;
  f.me = Me();
  f.key = "outbox-relay.7301.orders.outbox_relay";
  f.incarnation = "0/16B3748";
  f.history = WalHistory{2, {{1, L(0x5000148)}}};
  return f;
}

TEST(KafkaProgressCodec, RoundTripsWhoseItIsAndTheHistoryItIsOn) {
  ProgressRecord r = Record();
  std::string json = EncodeProgress(r);
  EXPECT_EQ(json, R"({"v":1,"format":2,"key":"outbox-relay.7301.orders.outbox_relay",)"
                  R"("relay":{"system_id":"7301","database":"orders","slot":"outbox_relay",)"
                  R"("incarnation":"0/16B3748"},"timeline":2,"history":[[1,"0/5000148"]],)"
                  R"("lsn":"16/B374D848","rows":12,"complete":false})");
  auto back = DecodeProgress(json);
  ASSERT_TRUE(back) << back.error().message;
  EXPECT_EQ(*back, r);

  r.progress.complete = true;
  r.progress.backfill = BackfillCursor{"731:745:", 740, 12345};
  r.progress.unmarked.Add({L(0x100), 740, 5, 9});
  r.key = "k\"ey";
  back = DecodeProgress(EncodeProgress(r));
  ASSERT_TRUE(back) << back.error().message;
  EXPECT_EQ(*back, r);
}

TEST(KafkaProgressCodec, AFormat1RecordIsReadWithNoOwnerAndNoHistory) {
  auto r = DecodeProgress(
      R"({"v":1,"key":"outbox-relay.1.db.slot","lsn":"16/B374D848","rows":12,"complete":false})");
  ASSERT_TRUE(r) << r.error().message;
  EXPECT_EQ(r->format, 1u);
  EXPECT_FALSE(r->owner);
  EXPECT_EQ(r->history.timeline, 0u);
  EXPECT_EQ(r->progress.final_lsn, L(0x16B374D848));
  EXPECT_EQ(r->progress.rows, 12u);
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
      {R"({"lsn":"0/10","rows":1,"complete":true})", "\"v\""},
      {R"({"v":1,"relay":{"system_id":"1"},"lsn":"0/10","rows":1,"complete":true})", "relay"},
      {R"({"v":1,"timeline":2,"lsn":"0/10","rows":1,"complete":true})", "history"},
      {R"({"v":1,"lsn":"0/10","rows":1,"complete":true,"unmarked":"1,2,3"})", "4 fields"},
      // Written by a relay whose records only format 3 can read.
      {R"({"v":3,"format":3,"lsn":"0/10","rows":1,"complete":true})", "newer relay"},
  };
  for (const Case& c : cases) {
    auto r = DecodeProgress(c.json);
    ASSERT_FALSE(r) << c.json;
    EXPECT_EQ(r.error().code, ErrorCode::kInvalidArgument) << c.json;
    EXPECT_NE(r.error().message.find(c.names), std::string::npos)
        << c.json << " -> " << r.error().message;
  }
}

TEST(KafkaProgressCodec, AFormatAReaderDoesNotKnowIsReadWhenItSaysItMayBe) {
  // A newer writer whose record a format-2 reader can still use (v <= 2):
  // what the reader does not know is left aside.
  auto r = DecodeProgress(
      R"({"v":2,"format":5,"key":"k","future":{"x":1},"lsn":"0/10","rows":1,"complete":true})");
  ASSERT_TRUE(r) << r.error().message;
  EXPECT_EQ(r->format, 5u);
  EXPECT_EQ(r->progress.final_lsn, L(0x10));
}

TEST(KafkaProgressHeldRows, OneRowTransactionsOfOneWriterEncodeAsOneRepeatedItem) {
  HeldRows rows;
  for (int i = 0; i < 40; ++i) {
    rows.Add({L(0x1000 + 0xB0 * static_cast<uint64_t>(i)), 700 + static_cast<uint64_t>(i), 10 + i,
              10 + i});
  }
  std::string text = rows.Encode();
  EXPECT_EQ(text, "4096,700,10,0;176,1,1,0*39");
  auto back = HeldRows::Decode(text);
  ASSERT_TRUE(back) << back.error().message;
  EXPECT_EQ(*back, rows);
}

TEST(KafkaProgressHeldRows, RunsAreFoundByPrimaryKeyWhateverTheirOrder) {
  HeldRows rows;
  rows.Add({L(300), 900, 20, 29});  // commit order is not xid order
  rows.Add({L(400), 800, 1, 3});
  rows.Add({L(400), 800, 7, 7});  // the same transaction, another run
  rows.Add({L(500), 950, 40, 40});
  auto back = HeldRows::Decode(rows.Encode());
  ASSERT_TRUE(back) << back.error().message;
  for (const HeldRows* r : {&rows, &*back}) {
    EXPECT_TRUE(r->Contains(900, 20));
    EXPECT_TRUE(r->Contains(900, 29));
    EXPECT_FALSE(r->Contains(900, 30));
    EXPECT_TRUE(r->Contains(800, 2));
    EXPECT_FALSE(r->Contains(800, 5));
    EXPECT_TRUE(r->Contains(800, 7));
    EXPECT_FALSE(r->Contains(801, 1));
    EXPECT_TRUE(r->Contains(950, 40));
  }
  rows.KeepBelow(L(400));
  EXPECT_TRUE(rows.Contains(900, 25));
  EXPECT_FALSE(rows.Contains(800, 2)) << "committed at the fork: not on the server's history";
}

TEST(KafkaProgressTrust, ARecordOfAnotherRelayIsASettingErrorNamingBoth) {
  ProgressRecord r = Record();
  r.owner = RelayIdentity{"9999", "billing", "outbox_relay"};
  auto t = TrustedProgress(r, Facts());
  ASSERT_FALSE(t);
  EXPECT_EQ(t.error().code, ErrorCode::kInvalidArgument);
  EXPECT_NE(t.error().message.find("--transactional-id"), std::string::npos);
  EXPECT_NE(t.error().message.find("system 9999, database billing"), std::string::npos);
  EXPECT_NE(t.error().message.find("system 7301, database orders"), std::string::npos);
}

TEST(KafkaProgressTrust, AFormat1RecordIsTrustedOnlyUnderTheDefaultKey) {
  ProgressRecord r = Record();
  r.format = 1;
  r.owner.reset();
  r.history = WalHistory{};
  r.incarnation.clear();
  ProgressFacts f = Facts();
  f.history = WalHistory{1, {}};  // never promoted
  auto t = TrustedProgress(r, f);
  ASSERT_TRUE(t) << t.error().message;
  EXPECT_EQ(t->final_lsn, r.progress.final_lsn) << "its key says whose it is";

  r.key = "shared-explicit-id";
  f.key = "shared-explicit-id";
  std::string note;
  t = TrustedProgress(r, f, &note);
  ASSERT_TRUE(t) << t.error().message;
  EXPECT_FALSE(t->final_lsn.valid()) << "nobody can say whose it is: it holds nothing";
  EXPECT_NE(note.find("does not say whose"), std::string::npos) << note;
}

TEST(KafkaProgressTrust, AfterAPromotionAPositionPastTheForkHoldsOnlyWhatTheHistoriesShare) {
  // Published up to 0/9000000 on timeline 2; the standby promoted to
  // timeline 3 had received timeline 2 up to 0/7000000.
  ProgressRecord r = Record();
  r.progress.final_lsn = L(0x9000000);
  r.progress.complete = true;
  r.progress.unmarked.Add({L(0x6000000), 800, 1, 1});
  r.progress.unmarked.Add({L(0x8000000), 801, 2, 2});
  ProgressFacts f = Facts();
  f.history = WalHistory{3, {{1, L(0x5000148)}, {2, L(0x7000000)}}};
  std::string note;
  auto t = TrustedProgress(r, f, &note);
  ASSERT_TRUE(t) << t.error().message;
  EXPECT_TRUE(t->Holds(L(0x6FFFFF0), 0)) << "below the fork: the same transaction";
  EXPECT_FALSE(t->Holds(L(0x7000000), 0)) << "the new timeline's first commit is new";
  EXPECT_FALSE(t->Holds(L(0x8000000), 0)) << "a new transaction at an LSN the old one had";
  EXPECT_TRUE(t->unmarked.Contains(800, 1));
  EXPECT_FALSE(t->unmarked.Contains(801, 2)) << "that row is gone with the old timeline";
  EXPECT_NE(note.find("parts from it"), std::string::npos) << note;

  // A point-in-time restore onto timeline 3 from timeline 1 at 0/4000000.
  f.history = WalHistory{3, {{1, L(0x4000000)}}};
  t = TrustedProgress(r, f);
  ASSERT_TRUE(t) << t.error().message;
  EXPECT_TRUE(t->Holds(L(0x3FFFFF0), 0));
  EXPECT_FALSE(t->Holds(L(0x4000000), 0));
  EXPECT_FALSE(t->Holds(L(0x6000000), 0));
}

TEST(KafkaProgressTrust, APositionBeyondTheServersWalEndHoldsNothing) {
  // Logical decoding sends only flushed WAL: a server behind what the relay
  // published was restored onto the same timeline (a disk snapshot).
  ProgressRecord r = Record();
  ProgressFacts f = Facts();
  f.wal_end = L(0x16B0000000);
  auto t = TrustedProgress(r, f);
  ASSERT_TRUE(t) << t.error().message;
  EXPECT_FALSE(t->Holds(L(0x100), 0));
  f.wal_end = L(0x16C0000000);
  t = TrustedProgress(r, f);
  ASSERT_TRUE(t) << t.error().message;
  EXPECT_TRUE(t->Holds(L(0x100), 0));
}

TEST(KafkaProgressTrust, TheBackfillCursorHoldsOnlyForTheSameIncarnationOfTheSlot) {
  ProgressRecord r = Record();
  r.progress.backfill = BackfillCursor{"731:745:", 740, 10};
  auto t = TrustedProgress(r, Facts());
  ASSERT_TRUE(t) << t.error().message;
  EXPECT_TRUE(t->HoldsBackfilled("731:745:", 740, 10));
  ProgressFacts f = Facts();
  f.incarnation = "0/9000000";  // the slot was recreated since
  t = TrustedProgress(r, f);
  ASSERT_TRUE(t) << t.error().message;
  EXPECT_FALSE(t->HoldsBackfilled("731:745:", 740, 10));
}

TEST(KafkaProgressTopic, EachRelayHasItsOwnProgressTopicWithLegalCharacters) {
  EXPECT_EQ(DefaultProgressTopic("outbox-relay.7301.orders.outbox_relay"),
            "outbox-relay.7301.orders.outbox_relay.progress");
  EXPECT_EQ(DefaultProgressTopic("outbox-relay.7301.заказы$1.s"),
            "outbox-relay.7301._____________1.s.progress");
  EXPECT_NE(DefaultProgressTopic("outbox-relay.1.a.s"), DefaultProgressTopic("outbox-relay.1.b.s"));
  EXPECT_LE(DefaultProgressTopic(std::string(400, 'x')).size(), 249u);
}

TEST(KafkaProgressHolds, APositionIsBeyondAnotherByTransactionThenByRows) {
  KafkaProgress none;
  KafkaProgress early{Lsn(0x100), 0, true, {}, {}};
  KafkaProgress partial{Lsn(0x200), 3, false, {}, {}};
  KafkaProgress more{Lsn(0x200), 5, false, {}, {}};
  KafkaProgress whole{Lsn(0x200), 0, true, {}, {}};
  EXPECT_TRUE(early.Beyond(none));
  EXPECT_FALSE(none.Beyond(early));
  EXPECT_TRUE(partial.Beyond(early));
  EXPECT_TRUE(more.Beyond(partial));
  EXPECT_FALSE(partial.Beyond(more));
  EXPECT_TRUE(whole.Beyond(more));
  EXPECT_FALSE(more.Beyond(whole));
  EXPECT_FALSE(whole.Beyond(whole));
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
