// The streaming pipeline on a recorded stream: the real walproto, pgoutput
// decoder, RecordMapper, Publisher, StreamSession and AckTracker, with a fake
// walsender, sink and marker. What is produced, and what is confirmed to the
// server, after each thing Kafka and the connection can do.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>

#include "fakes.h"

namespace outbox_relay::pipeline {
namespace {

using namespace std::chrono_literals;
using fakes::Eventually;
using fakes::FakeSource;
using fakes::FakeWalSender;
using fakes::Pipeline;
using ::testing::ElementsAre;
using ::testing::Pair;

// The recorded workload's outbox rows (tests/fixtures/record_fixtures.sh):
// uuid and payload, in commit order.
const std::vector<std::pair<std::string, std::optional<std::string>>> kRows = {
    {"01HZX3K4M5N6P7Q8R9S0T1V2W3", R"({"review_id":"r-1","rating":5})"},
    {"01HZX3K4M5N6P7Q8R9S0T1V2W4", R"({"review_id":"r-2"})"},
    {"01HZX3K4M5N6P7Q8R9S0T1V2W5", std::nullopt},
    {"01HZX3K4M5N6P7Q8R9S0T1V2W6", std::nullopt},
    {"01HZX3K4M5N6P7Q8R9S0T1V2W7", R"({"text":"Отличное кафе ☕"})"},
    {"01HZX3K4M5N6P7Q8R9S0T1V2W8", R"({"n":1})"},
    {"01HZX3K4M5N6P7Q8R9S0T1V2W9", R"({"n":3})"},
    {"01HZX3K4M5N6P7Q8R9S0T1V2WA", R"({"n":4})"},
    {"01HZX3K4M5N6P7Q8R9S0T1V2WB", std::nullopt},  // 3000 bytes (TOAST): checked by size
    {"01HZX3K4M5N6P7Q8R9S0T1V2WC", R"({"n":5})"},
    {"01HZX3K4M5N6P7Q8R9S0T1V2WD", R"({"n":6})"},
};

std::vector<std::string> Uuids(const std::vector<fakes::Produced>& records) {
  std::vector<std::string> out;
  for (const auto& r : records) out.push_back(r.Header("_watermill_message_uuid"));
  return out;
}

std::vector<std::string> AllUuids() {
  std::vector<std::string> out;
  for (const auto& [uuid, payload] : kRows) out.push_back(uuid);
  return out;
}

Lsn LastEnd(const FakeWalSender& w) { return w.transactions().back().end_lsn; }

std::vector<int64_t> MarkedOffsets(fakes::FakeMarker& marker) {
  std::vector<int64_t> offsets;
  for (const auto& run : marker.marked()) {
    for (int64_t o = run.first; o <= run.last; ++o) offsets.push_back(o);
  }
  std::sort(offsets.begin(), offsets.end());
  return offsets;
}

// The recordings of every supported major (tests/fixtures/record_fixtures.sh):
// the same workload; 14 also sends the transactions that published nothing.
constexpr int kMajors[] = {14, 15, 16, 17, 18};

FakeWalSender RecordingOf(int major) {
  return FakeWalSender::Recorded(pgoutput::golden::GoldenStreamPath(major));
}

TEST(Pipeline, RecordedStreamBecomesTheExactRecordsAndIsConfirmedToItsEnd) {
  for (int major : kMajors) {
    SCOPED_TRACE(fmt::format("PostgreSQL {}", major));
    FakeWalSender wal = RecordingOf(major);
    if (major != 14) {
      ASSERT_EQ(wal.transactions().size(), 14u);
    }
    Pipeline p(Pipeline::Stepped{});
    FakeSource& source = p.Open(wal.From(Lsn(1)));
    p.RunUntilIdle();
    ASSERT_EQ(p.tracker().confirmed(), LastEnd(wal)) << p.tracker().confirmed().ToString();
    // Told to the server within the throttle (10 ms), without a stop.
    p.Advance(10ms);
    ASSERT_EQ(source.flushes().back(), LastEnd(wal));
    ASSERT_TRUE(p.Stop());

    auto records = p.sink().produced();
    ASSERT_EQ(Uuids(records), AllUuids());
    for (size_t i = 0; i < records.size(); ++i) {
      SCOPED_TRACE(kRows[i].first);
      EXPECT_EQ(records[i].topic, "events");
      if (kRows[i].first.ends_with("WB")) {
        ASSERT_TRUE(records[i].value.has_value());
        EXPECT_GT(records[i].value->size(), 2900u);  // the TOAST value, whole
      } else {
        EXPECT_EQ(records[i].value, kRows[i].second);
      }
    }
    // The first row's metadata: key = Aggregate-Id, headers sorted, partition_key added.
    EXPECT_EQ(records[0].key, "review-1");
    EXPECT_THAT(records[0].headers,
                ElementsAre(Pair("_watermill_message_uuid", "01HZX3K4M5N6P7Q8R9S0T1V2W3"),
                            Pair("Aggregate-Id", "review-1"), Pair("Event-Type", "review.created"),
                            Pair("Source-Service", "review"), Pair("partition_key", "review-1")));
    // No metadata: no headers but the uuid, the empty key (the Go pipeline's).
    EXPECT_EQ(records[1].key, "");
    EXPECT_EQ(records[1].headers.size(), 1u);

    // Marked exactly the rows produced, by key; the transactions without
    // outbox rows need nothing.
    EXPECT_THAT(MarkedOffsets(p.marker()), ElementsAre(1, 2, 3, 4, 5, 7, 9, 10, 11, 12, 13));

    // What the server heard: never backwards, only transaction ends (or the
    // start), ending at the last one.
    std::set<Lsn> ends = {Lsn(1)};
    for (const auto& tx : wal.transactions()) ends.insert(tx.end_lsn);
    auto flushes = source.flushes();
    ASSERT_FALSE(flushes.empty());
    EXPECT_TRUE(std::is_sorted(flushes.begin(), flushes.end()));
    for (Lsn f : flushes) EXPECT_TRUE(ends.contains(f)) << f.ToString();
    EXPECT_EQ(flushes.back(), LastEnd(wal));
  }
}

TEST(Pipeline, OutOfOrderAcksConfirmOnlyTheDonePrefix) {
  FakeWalSender wal = FakeWalSender::Recorded();
  Pipeline p(Pipeline::Stepped{});
  p.sink().auto_ack = false;
  FakeSource& source = p.Open(wal.From(Lsn(1)));
  p.RunUntilIdle();
  ASSERT_EQ(p.sink().size(), kRows.size());
  // Everything but the first transaction's row is acknowledged (another
  // partition was faster): nothing may be confirmed, however long it waits.
  for (size_t i = 1; i < kRows.size(); ++i) p.sink().Ack(i);
  p.Advance(100ms);
  EXPECT_EQ(p.tracker().confirmed(), Lsn(1));
  for (Lsn f : source.flushes()) EXPECT_EQ(f, Lsn(1));
  // The first one: now everything is, and the server hears it.
  p.sink().Ack(0);
  p.Advance(30ms);
  EXPECT_EQ(p.tracker().confirmed(), LastEnd(wal));
  EXPECT_EQ(source.flushes().back(), LastEnd(wal));
}

TEST(Pipeline, NothingIsConfirmedBeforeItIsMarked) {
  FakeWalSender wal = FakeWalSender::Recorded();
  Pipeline p(Pipeline::Stepped{});
  p.marker().Pause(true);
  p.Open(wal.From(Lsn(1)));
  p.RunUntilIdle();
  ASSERT_EQ(p.sink().size(), kRows.size());
  p.Advance(100ms);
  // Transactions without outbox rows need no marking: confirmed up to the
  // first one that has rows, no further.
  EXPECT_LT(p.tracker().confirmed(), wal.transactions()[0].end_lsn);
  p.marker().Pause(false);
  p.RunUntilIdle();
  EXPECT_EQ(p.tracker().confirmed(), LastEnd(wal));
}

TEST(Pipeline, AFatalDeliveryErrorStopsTheSessionAndConfirmsNothingFromThere) {
  FakeWalSender wal = FakeWalSender::Recorded();
  Pipeline p;
  p.sink().auto_ack = false;
  FakeSource& source = p.Connect(wal.From(Lsn(1)));
  ASSERT_TRUE(Eventually([&] { return p.sink().size() == kRows.size(); }));
  p.sink().Ack(0);  // the first transaction
  ASSERT_TRUE(Eventually([&] { return p.tracker().confirmed() == wal.transactions()[0].end_lsn; }));
  p.sink().Settle(1, Error{ErrorCode::kFatal, "Kafka producer fatal error: injected"});
  for (size_t i = 2; i < kRows.size(); ++i) p.sink().Ack(i);
  Status st = p.WaitSession();
  ASSERT_FALSE(st);
  EXPECT_EQ(st.error().code, ErrorCode::kFatal);
  EXPECT_FALSE(p.tracker().failure_retryable()) << "a fatal error stops the relay";
  EXPECT_EQ(p.tracker().confirmed(), wal.transactions()[0].end_lsn);
  for (Lsn f : source.flushes()) EXPECT_LE(f, wal.transactions()[0].end_lsn);
}

// At-least-once, a producer that failed for good (an idempotence error) is
// replaced: the failure is one the relay restarts the pipeline for, and
// nothing from the failed record on is confirmed.
TEST(Pipeline, AFailedProducerIsReplacedAndConfirmsNothingFromThere) {
  FakeWalSender wal = FakeWalSender::Recorded();
  Pipeline p;
  p.sink().auto_ack = false;
  FakeSource& source = p.Connect(wal.From(Lsn(1)));
  ASSERT_TRUE(Eventually([&] { return p.sink().size() == kRows.size(); }));
  p.sink().Ack(0);
  ASSERT_TRUE(Eventually([&] { return p.tracker().confirmed() == wal.transactions()[0].end_lsn; }));
  p.sink().Settle(1, Error{ErrorCode::kAborted, "Kafka producer failed: injected"});
  for (size_t i = 2; i < kRows.size(); ++i) p.sink().Ack(i);
  Status st = p.WaitSession();
  ASSERT_FALSE(st);
  EXPECT_TRUE(p.tracker().failure_retryable()) << st.error().message;
  EXPECT_EQ(p.tracker().confirmed(), wal.transactions()[0].end_lsn);
  for (Lsn f : source.flushes()) EXPECT_LE(f, wal.transactions()[0].end_lsn);
}

// The same when the failed producer refuses the next record outright.
TEST(Pipeline, AProducerFailedAtProduceIsReplacedToo) {
  FakeWalSender wal = FakeWalSender::Recorded();
  Pipeline p;
  p.sink().auto_ack = false;
  p.sink().failed = Error{ErrorCode::kAborted, "Kafka producer failed: injected"};
  FakeSource& source = p.Connect(wal.From(Lsn(1)));
  Status st = p.WaitSession();
  ASSERT_FALSE(st);
  EXPECT_TRUE(p.tracker().failure_retryable()) << st.error().message;
  EXPECT_EQ(p.sink().size(), 0u);
  EXPECT_LT(p.tracker().confirmed(), wal.transactions()[0].end_lsn);
  for (Lsn f : source.flushes()) EXPECT_LT(f, wal.transactions()[0].end_lsn);
}

TEST(Pipeline, PoisonRowsAreDeadLetteredInTheirPlaceAndMarked) {
  FakeWalSender wal = FakeWalSender::Recorded();
  PublisherOptions options = Pipeline::DefaultOptions();
  options.mapper.topic_template = "kazmaps.{Source-Service}.{Event-Type:aggregate}";
  Pipeline p(options);
  p.Connect(wal.From(Lsn(1)));
  ASSERT_TRUE(Eventually([&] { return p.tracker().confirmed() == LastEnd(wal); }));
  auto records = p.sink().produced();
  // Still one record per row, in order. Only the first row has what the
  // topic needs; the others lack Source-Service (no metadata, or none of
  // it), or name a topic Kafka does not allow ("kazmaps.отзывы.review").
  ASSERT_EQ(Uuids(records), AllUuids());
  EXPECT_EQ(records[0].topic, "kazmaps.review.review");
  for (size_t i = 1; i < records.size(); ++i) {
    EXPECT_EQ(records[i].topic, "dlq") << kRows[i].first;
    EXPECT_EQ(records[i].Header("outbox_dlq_error_code"), "poison");
    EXPECT_NE(records[i].Header("outbox_dlq_reason"), "<none>");
  }
  EXPECT_NE(records[4].Header("outbox_dlq_reason").find("topic"), std::string::npos);
  // Dead-lettered rows are marked too: they are dealt with.
  EXPECT_THAT(MarkedOffsets(p.marker()), ElementsAre(1, 2, 3, 4, 5, 7, 9, 10, 11, 12, 13));
}

// The topic comes from the row: past --max-topics distinct topics, a row
// whose topic would be one more is dead-lettered, and known topics go on.
TEST(Pipeline, ARowWhoseTopicWouldBeOneTooManyIsDeadLettered) {
  FakeWalSender wal = FakeWalSender::Recorded();
  PublisherOptions options = Pipeline::DefaultOptions();
  options.mapper.topic_template = "t.{Event-Type}";
  options.max_topics = 1;
  Pipeline p(options);
  p.Connect(wal.From(Lsn(1)));
  ASSERT_TRUE(Eventually([&] { return p.tracker().confirmed() == LastEnd(wal); }));
  auto records = p.sink().produced();
  ASSERT_EQ(Uuids(records), AllUuids());
  EXPECT_EQ(records[0].topic, "t.review.created");
  EXPECT_EQ(records[2].topic, "dlq");  // review.deleted: a second topic
  EXPECT_NE(records[2].Header("outbox_dlq_reason").find("--max-topics"), std::string::npos)
      << records[2].Header("outbox_dlq_reason");
  EXPECT_EQ(records[4].topic, "t.review.created");
  EXPECT_THAT(MarkedOffsets(p.marker()), ElementsAre(1, 2, 3, 4, 5, 7, 9, 10, 11, 12, 13));
}

TEST(LogBudget, AllowsABurstPerWindowAndCountsWhatItLeftOut) {
  LogBudget budget(3, std::chrono::seconds(3600));
  uint64_t left_out = 99;
  for (int i = 0; i < 3; ++i) {
    EXPECT_TRUE(budget.Allow(&left_out));
    EXPECT_EQ(left_out, 0u);
  }
  for (int i = 0; i < 1000; ++i) EXPECT_FALSE(budget.Allow(&left_out));
  LogBudget next_window(1, std::chrono::seconds(0));  // every call opens a new window
  EXPECT_TRUE(next_window.Allow(&left_out));
  EXPECT_TRUE(next_window.Allow(&left_out));
}

TEST(Pipeline, ARecordTheProducerRefusesIsDeadLetteredInItsPlace) {
  FakeWalSender wal = FakeWalSender::Recorded();
  Pipeline p;
  // Larger than the producer takes (message.max.bytes): the TOAST row.
  p.sink().refuse_at_produce = [](const outbox::KafkaRecord& r) {
    return r.topic != "dlq" && r.value && r.value->size() > 2000;
  };
  p.Connect(wal.From(Lsn(1)));
  ASSERT_TRUE(Eventually([&] { return p.tracker().confirmed() == LastEnd(wal); }));
  auto records = p.sink().produced();
  ASSERT_EQ(Uuids(records), AllUuids());
  EXPECT_EQ(records[8].topic, "dlq");
  EXPECT_NE(records[8].Header("outbox_dlq_reason").find("too large"), std::string::npos);
  EXPECT_EQ(records[9].topic, "events");
  EXPECT_THAT(MarkedOffsets(p.marker()), ElementsAre(1, 2, 3, 4, 5, 7, 9, 10, 11, 12, 13));
}

TEST(Pipeline, ARecordTheBrokerRefusesIsDeadLetteredByTheLoopThread) {
  FakeWalSender wal = FakeWalSender::Recorded();
  Pipeline p;
  p.sink().auto_ack = false;
  p.Connect(wal.From(Lsn(1)));
  ASSERT_TRUE(Eventually([&] { return p.sink().size() == kRows.size(); }));
  // Refused by the broker, reported on the sink's thread (this one).
  p.sink().Settle(0, Error{ErrorCode::kPoison, "Kafka refused the record: too large"});
  ASSERT_TRUE(Eventually([&] { return p.sink().size() == kRows.size() + 1; }));
  auto records = p.sink().produced();
  EXPECT_EQ(records.back().topic, "dlq");
  EXPECT_EQ(records.back().Header("_watermill_message_uuid"), kRows[0].first);
  EXPECT_EQ(p.tracker().confirmed(), Lsn(1));  // the dead letter is not acknowledged yet
  for (size_t i = 1; i < records.size(); ++i) p.sink().Ack(i);
  EXPECT_TRUE(Eventually([&] { return p.tracker().confirmed() == LastEnd(wal); }));
}

TEST(Pipeline, AStalledSinkHoldsTheReadingAtMaxInFlightButNotTheStatusUpdates) {
  FakeWalSender wal = FakeWalSender::Recorded();
  PublisherOptions options = Pipeline::DefaultOptions();
  options.max_in_flight = 3;
  Pipeline p(Pipeline::Stepped{}, options);
  p.sink().auto_ack = false;
  FakeSource& source = p.Open(wal.From(Lsn(1)));
  p.RunUntilIdle();
  ASSERT_EQ(p.sink().size(), 3u);
  size_t read = source.read();
  size_t statuses = source.statuses().size();
  p.Advance(200ms);
  EXPECT_EQ(p.sink().size(), 3u);
  EXPECT_EQ(source.read(), read) << "the loop read on while Kafka took nothing";
  EXPECT_GE(source.statuses().size(), statuses + 9) << "status updates stopped (20 ms interval)";
  for (size_t i = 0; i < 3; ++i) p.sink().Ack(i);
  p.RunUntilIdle();
  EXPECT_EQ(p.sink().size(), 6u);
}

TEST(Pipeline, AfterTheInFlightBoundTheReadingWaitsForAQuarterOfTheWindowNotOneRecord) {
  FakeWalSender wal = FakeWalSender::Recorded();
  ASSERT_GE(kRows.size(), 11u);
  PublisherOptions options = Pipeline::DefaultOptions();
  options.max_in_flight = 8;  // reading again at 6
  Pipeline p(Pipeline::Stepped{}, options);
  p.sink().auto_ack = false;
  p.Open(wal.From(Lsn(1)));
  p.RunUntilIdle();
  ASSERT_EQ(p.sink().size(), 8u);
  p.sink().Ack(0);
  p.Advance(200ms);
  EXPECT_EQ(p.sink().size(), 8u) << "one acknowledgement let one more record out";
  p.sink().Ack(1);
  p.RunUntilIdle();
  EXPECT_EQ(p.sink().size(), 10u);
  p.Advance(100ms);
  EXPECT_EQ(p.sink().size(), 10u);
}

TEST(Pipeline, TheBytesInFlightHoldTheReadingTooAndARecordLargerThanTheBoundStillGoesAlone) {
  FakeWalSender wal = FakeWalSender::Recorded();
  PublisherOptions options = Pipeline::DefaultOptions();
  options.max_in_flight_bytes = 1;  // smaller than any record
  Pipeline p(Pipeline::Stepped{}, options);
  p.sink().auto_ack = false;
  FakeSource& source = p.Open(wal.From(Lsn(1)));
  p.RunUntilIdle();
  ASSERT_EQ(p.sink().size(), 1u);
  EXPECT_GT(p.sink().BytesInFlight(), 1);
  size_t read = source.read();
  p.Advance(200ms);
  EXPECT_EQ(p.sink().size(), 1u) << "a second record went out past the bytes bound";
  EXPECT_EQ(source.read(), read) << "the loop read on while the bytes bound was reached";
  for (size_t acked = 0; acked < kRows.size(); ++acked) {
    p.RunUntilIdle();
    ASSERT_EQ(p.sink().size(), acked + 1) << "not exactly one record in flight";
    p.sink().Ack(acked);
  }
  p.RunUntilIdle();
  EXPECT_EQ(p.tracker().confirmed(), LastEnd(wal));
}

TEST(Pipeline, AFullProducerQueueIsWaitedOutWithStatusUpdates) {
  FakeWalSender wal = FakeWalSender::Recorded();
  Pipeline p;
  p.sink().auto_ack = false;
  p.sink().queue_limit = 2;
  FakeSource& source = p.Connect(wal.From(Lsn(1)));
  ASSERT_TRUE(Eventually([&] { return p.sink().size() == 2 && p.sink().queue_full() > 10; }));
  size_t statuses = source.statuses().size();
  std::this_thread::sleep_for(100ms);
  EXPECT_GE(source.statuses().size(), statuses + 2);
  for (size_t acked = 0; acked < kRows.size(); ++acked) {
    ASSERT_TRUE(Eventually([&] { return p.sink().size() > acked; }));
    p.sink().Ack(acked);
  }
  EXPECT_TRUE(Eventually([&] { return p.tracker().confirmed() == LastEnd(wal); }));
}

TEST(Pipeline, ConnectionCutAfterEveryMessageResumesFromTheConfirmedPositionAndLosesNothing) {
  for (int major : kMajors) {
    FakeWalSender wal = RecordingOf(major);
    size_t total = wal.From(Lsn(1)).size();
    for (size_t cut = 0; cut <= total; ++cut) {
      SCOPED_TRACE(fmt::format("PostgreSQL {}: cut after message {} of {}", major, cut, total));
      Pipeline p(Pipeline::Stepped{});
      std::set<std::string> seen;
      std::vector<Lsn> flushes;
      // First connection: cut after `cut` messages; then reconnect from what
      // is confirmed, as the supervisor does, until a connection runs dry.
      FakeSource& first = p.Open(wal.From(Lsn(1)), cut);
      p.RunUntilIdle();
      if (cut < total) {
        ASSERT_TRUE(p.done());
        ASSERT_FALSE(p.result());
        EXPECT_EQ(p.result().error().code, ErrorCode::kTransient);
      }
      for (Lsn f : first.flushes()) flushes.push_back(f);
      // What was produced of the cut transaction is delivered, never confirmed.
      p.MarkAll();
      ASSERT_TRUE(p.tracker().empty());
      Lsn resume = p.tracker().confirmed();
      FakeSource& second = p.Open(wal.From(resume));
      p.Advance(30ms, 10ms);
      ASSERT_EQ(p.tracker().confirmed(), LastEnd(wal)) << "resumed at " << resume.ToString();
      ASSERT_TRUE(p.Stop());
      for (Lsn f : second.flushes()) flushes.push_back(f);
      for (const auto& u : Uuids(p.sink().produced())) seen.insert(u);
      std::vector<std::string> uuids = AllUuids();
      std::set<std::string> all(uuids.begin(), uuids.end());
      EXPECT_EQ(seen, all);  // lost 0
      EXPECT_TRUE(std::is_sorted(flushes.begin(), flushes.end()));
    }
  }
}

TEST(Pipeline, KeepalivesAreAnsweredAndMoveAnIdleSlotOnlyOutsideTransactions) {
  FakeWalSender wal = FakeWalSender::Recorded();
  Pipeline p(Pipeline::Stepped{});
  auto frames = wal.From(Lsn(1));
  // The first transaction's Begin and row, then a reply-requested keepalive
  // in the middle of it, far ahead of anything sent.
  std::vector<std::string> head(frames.begin(), frames.begin() + 3);
  FakeSource& source = p.Open(head);
  p.RunUntilIdle();
  ASSERT_EQ(p.sink().size(), 1u);
  size_t before = source.statuses().size();
  source.Push(FakeWalSender::Keepalive(Lsn(0xFFFF0000), /*reply_requested=*/true));
  p.RunUntilIdle();
  ASSERT_GT(source.statuses().size(), before) << "not answered at once (no time passed)";
  // Answered at once, and the write position is the server's end, but
  // inside a transaction nothing is confirmed past the open transaction.
  EXPECT_EQ(source.statuses().back().write, Lsn(0xFFFF0000));
  p.Advance(50ms);
  EXPECT_EQ(p.tracker().confirmed(), Lsn(1));
  // The rest of the stream, then an idle keepalive: confirmed follows it.
  for (size_t i = 3; i < frames.size(); ++i) source.Push(frames[i]);
  p.RunUntilIdle();
  ASSERT_EQ(p.tracker().confirmed(), LastEnd(wal));
  source.Push(FakeWalSender::Keepalive(Lsn(0xFFFF1000), /*reply_requested=*/false));
  p.RunUntilIdle();
  EXPECT_EQ(p.tracker().confirmed(), Lsn(0xFFFF1000));
  p.Advance(30ms);
  EXPECT_EQ(source.flushes().back(), Lsn(0xFFFF1000));
}

TEST(Pipeline, ARelationThatChangesColumnsMidStreamIsReadByName) {
  // Transaction 5 of the recording adds a column (trace_id) before its row,
  // transaction 12 another (kind): the rows after them map the same way.
  FakeWalSender wal = FakeWalSender::Recorded();
  Pipeline p;
  p.Connect(wal.From(Lsn(1)));
  ASSERT_TRUE(Eventually([&] { return p.tracker().confirmed() == LastEnd(wal); }));
  auto records = p.sink().produced();
  ASSERT_EQ(records.size(), kRows.size());
  EXPECT_EQ(records[7].value, R"({"n":4})");  // first row with trace_id
  EXPECT_EQ(records[9].value, R"({"n":5})");  // first row with kind
  EXPECT_EQ(records[10].value, R"({"n":6})");
}

TEST(Pipeline, AStopEndsTheSessionBetweenTransactionsOrGivesUpAnOpenOneAfterTheGrace) {
  FakeWalSender wal = FakeWalSender::Recorded();
  Pipeline p(Pipeline::Stepped{});
  auto frames = wal.From(Lsn(1));
  // Begin, Relation, Insert of the first transaction: its Commit never comes.
  p.Open(std::vector<std::string>(frames.begin(), frames.begin() + 3));
  p.RunUntilIdle();
  ASSERT_EQ(p.sink().size(), 1u);
  auto t0 = p.clock().Now();
  Status st = p.Stop();
  auto waited = p.clock().Now() - t0;
  ASSERT_FALSE(st);
  EXPECT_EQ(st.error().code, ErrorCode::kCancelled);
  EXPECT_GE(waited, 1000ms);  // the stop grace: time for the Commit to come
  EXPECT_LE(waited, 1001ms);  // and no more
  EXPECT_EQ(p.tracker().confirmed(), Lsn(1));

  // Between transactions a stop ends the session at once.
  Pipeline q(Pipeline::Stepped{});
  q.Open(wal.From(Lsn(1)));
  q.RunUntilIdle();
  t0 = q.clock().Now();
  EXPECT_TRUE(q.Stop());
  EXPECT_EQ(q.clock().Now(), t0);
}

}  // namespace
}  // namespace outbox_relay::pipeline
