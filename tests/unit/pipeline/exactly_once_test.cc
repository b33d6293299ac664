// Exactly-once delivery (pipeline/exactly_once.h) on the recorded stream, in
// milliseconds: the real StreamSession, Publisher, ExactlyOnce and AckTracker
// on a fake walsender, a fake Kafka cluster with transactions and producer
// epochs, and a fake marker. A "process" is one Pipeline; a crash is the state
// a prefix of the durable steps leaves (fake_kafka.h's Journal), on which the
// next process starts. After every cut, whatever follows: every row in Kafka
// once, as a read_committed consumer sees it.
#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <map>

#include "fakes.h"
#include "outbox_relay/outbox/record.h"

namespace outbox_relay::pipeline {
namespace {

using namespace std::chrono_literals;
using fakes::DurableState;
using fakes::Eventually;
using fakes::FakeKafka;
using fakes::FakeWalSender;
using fakes::Journal;
using fakes::Pipeline;

constexpr const char* kKey = "outbox-relay.7301.outbox.slot";

ProgressFacts Facts(WalHistory history = WalHistory{1, {}}, std::string incarnation = "0/1") {
  ProgressFacts f;
  f.me = RelayIdentity{"7301", "outbox", "slot"};
  f.key = kKey;
  f.incarnation = std::move(incarnation);
  f.history = std::move(history);
  return f;
}

TransactionOptions Txn(int64_t max_rows) {
  TransactionOptions t;
  t.interval = 5ms;
  t.max_rows = max_rows;
  return t;
}

Lsn LastEnd(const FakeWalSender& w) { return w.transactions().back().end_lsn; }

std::map<std::string, int> Copies(const std::vector<fakes::Produced>& records) {
  std::map<std::string, int> n;
  for (const auto& r : records) ++n[r.Header("_watermill_message_uuid")];
  return n;
}

// Every recorded row's uuid.
std::vector<std::string> RecordedUuids(const FakeWalSender& wal) {
  Pipeline p(Pipeline::Stepped{});
  p.Open(wal.From(Lsn(1)));
  p.RunUntilIdle();
  std::vector<std::string> out;
  for (const auto& r : p.sink().produced()) out.push_back(r.Header("_watermill_message_uuid"));
  return out;
}

// Lost 0, duplicates 0.
void ExpectEachOnce(const std::vector<fakes::Produced>& committed,
                    const std::vector<std::string>& uuids, const std::string& where) {
  auto copies = Copies(committed);
  for (const auto& u : uuids) {
    EXPECT_EQ(copies[u], 1) << where << ": row " << u;
  }
  EXPECT_EQ(committed.size(), uuids.size()) << where;
}

// One process: starts exactly-once on `kafka` as `facts` says, streams from
// `start` to the end of the recording, and stops gracefully. Stepped on a
// manual clock; `paced`: one message per millisecond, so that Kafka
// transactions (a 5 ms interval), marks and confirmations interleave.
// `standby_rounds`: the primary has a standby with the marks of that many
// mark rounds (FakeMarker::SetStandby).
void RunProcess(FakeKafka* kafka, const FakeWalSender& wal, Lsn start, int64_t max_rows,
                const ProgressFacts& facts = Facts(), Journal* journal = nullptr,
                bool paced = false, std::optional<uint64_t> standby_rounds = std::nullopt,
                std::function<Result<Lsn>()> wal_end_now = {}) {
  Pipeline p(Pipeline::Stepped{}, Pipeline::DefaultOptions(), start, kafka, Txn(max_rows), journal);
  p.marker().SetStandby(standby_rounds);
  if (wal_end_now) p.eos().ReadWalEndWith(std::move(wal_end_now));
  ASSERT_TRUE(p.StartTransactions(facts));
  if (paced) {
    fakes::FakeSource& source = p.Open({});
    for (std::string& frame : wal.From(start)) {
      source.Push(std::move(frame));
      p.Advance(1ms);
    }
  } else {
    p.Open(wal.From(start));
    p.RunUntilIdle();
  }
  p.CommitAll();
  p.Advance(30ms);  // the last marks, and the status update that confirms them
  ASSERT_EQ(p.tracker().confirmed(), LastEnd(wal));
  Status st = p.Stop();
  ASSERT_TRUE(st) << st.error().message;
  ASSERT_TRUE(p.EndTransactions(st));
}

// The journal of one uninterrupted run.
std::vector<fakes::Durable> JournalOfARun(const FakeWalSender& wal, int64_t max_rows) {
  Journal journal;
  FakeKafka kafka("relay.progress", &journal);
  kafka.set_key(kKey);
  RunProcess(&kafka, wal, Lsn(1), max_rows, Facts(), &journal, /*paced=*/true);
  return journal.events();
}

// A cut after every durable step of a run (a Kafka commit, a mark, a
// confirmation); the next process resumes from the slot's confirmed position
// on what Kafka and the table hold. With one row per Kafka transaction the
// recording's multi-row PostgreSQL transactions are split across Kafka
// transactions, and some cuts fall inside one.
TEST(ExactlyOnce, ACutAfterEveryDurableStepThenARestartPublishesEachRowOnce) {
  FakeWalSender wal = FakeWalSender::Recorded();
  const std::vector<std::string> uuids = RecordedUuids(wal);
  for (int64_t max_rows : {1, 3}) {
    std::vector<fakes::Durable> events = JournalOfARun(wal, max_rows);
    ASSERT_GT(events.size(), 10u);
    for (size_t cut = 0; cut <= events.size(); ++cut) {
      SCOPED_TRACE(fmt::format("{} rows per Kafka transaction, cut after step {} of {}", max_rows,
                               cut, events.size()));
      DurableState state = DurableState::After(events, cut);
      FakeKafka kafka("relay.progress");
      kafka.set_key(kKey);
      kafka.Restore(state);
      RunProcess(&kafka, wal, state.confirmed, max_rows);
      ExpectEachOnce(kafka.committed(), uuids, "after the restart");
      if (HasFailure()) return;
    }
  }
}

// The rows of the recording as a backfill reads them from the table.
struct TableRow {
  outbox::ColumnMap columns;
  pgoutput::TupleData tuple;
  uint64_t transaction_id = 0;
  int64_t offset = 0;
  std::string uuid;
};
std::vector<TableRow> TableRows(const FakeWalSender& wal) {
  std::vector<TableRow> rows;
  pgoutput::RelationCache relations;
  auto mapper = outbox::RecordMapper::Create(Pipeline::DefaultOptions().mapper);
  EXPECT_TRUE(mapper.has_value());
  for (const auto& tx : wal.transactions()) {
    for (size_t i : tx.lines) {
      pgoutput::DecodedMessage m;
      EXPECT_TRUE(pgoutput::Decode(wal.line(i).bytes, &m).has_value());
      if (auto* r = std::get_if<pgoutput::Relation>(&m)) relations.Put(*r);
      auto* ins = std::get_if<pgoutput::Insert>(&m);
      if (ins == nullptr) continue;
      const pgoutput::Relation* rel = relations.Find(ins->relation_id);
      if (rel == nullptr || rel->relname != "outbox") continue;
      auto columns = outbox::ColumnMap::Resolve(*rel, outbox::ColumnNames{});
      EXPECT_TRUE(columns.has_value());
      auto mapped = mapper->Map(*columns, ins->new_tuple, Lsn(1));
      EXPECT_TRUE(mapped.has_value());
      rows.push_back(TableRow{*columns, ins->new_tuple, mapped->identity.transaction_id,
                              mapped->identity.offset, std::string(mapped->identity.uuid)});
    }
  }
  std::sort(rows.begin(), rows.end(), [](const TableRow& a, const TableRow& b) {
    return a.transaction_id != b.transaction_id ? a.transaction_id < b.transaction_id
                                                : a.offset < b.offset;
  });
  return rows;
}

// The relay's reconcile after a lost slot (SlotSetup::Backfill on the fake
// pipeline): a new slot past everything, and the unmarked rows of the table,
// in keyset order, through the publisher.
void Backfill(Pipeline& p, const std::vector<TableRow>& rows, const DurableState& state) {
  p.publisher().SetBackfill("900:900:");
  tracking::Transaction* tx = nullptr;
  uint64_t tx_id = 0;
  for (const TableRow& row : rows) {
    if (state.Marked(row.transaction_id, row.offset)) continue;  // offset_acked IS NULL
    if (tx == nullptr || row.transaction_id != tx_id) {
      if (tx != nullptr) p.tracker().Commit(tx, kInvalidLsn);
      tx = p.tracker().Begin(kInvalidLsn, PgTimestamp{}, 0);
      tx_id = row.transaction_id;
    }
    ASSERT_TRUE(p.publisher().MapAndProduce(row.columns, row.tuple, tx, nullptr));
    ASSERT_TRUE(p.publisher().Tick());
  }
  if (tx != nullptr) p.tracker().Commit(tx, kInvalidLsn);
  ASSERT_TRUE(p.publisher().FinishTransaction(5000ms, nullptr));
  ASSERT_TRUE(p.tracker().WaitEmpty(5000ms));
  p.publisher().SetBackfill(std::nullopt);
}

// Issue 36, #4: the slot is lost after the cut (invalidated while the relay
// was down). Kafka committed rows the marker had not marked; the reconcile
// backfill finds them unacked and must not publish them again: the progress
// record lists them.
TEST(ExactlyOnce, ACutThenALostSlotsBackfillPublishesEachRowOnce) {
  FakeWalSender wal = FakeWalSender::Recorded();
  const std::vector<std::string> uuids = RecordedUuids(wal);
  const std::vector<TableRow> rows = TableRows(wal);
  ASSERT_EQ(rows.size(), uuids.size());
  std::vector<fakes::Durable> events = JournalOfARun(wal, 2);
  size_t in_doubt = 0;  // cuts with rows in Kafka not yet marked
  for (size_t cut = 0; cut <= events.size(); ++cut) {
    SCOPED_TRACE(fmt::format("cut after step {} of {}", cut, events.size()));
    DurableState state = DurableState::After(events, cut);
    auto in_kafka = Copies(state.committed);
    for (const TableRow& row : rows) {
      if (in_kafka.contains(row.uuid) && !state.Marked(row.transaction_id, row.offset)) {
        ++in_doubt;
        break;
      }
    }
    FakeKafka kafka("relay.progress");
    kafka.set_key(kKey);
    kafka.Restore(state);
    {
      Pipeline p(&kafka, Txn(2), LastEnd(wal));
      // A new slot: a new incarnation.
      ASSERT_TRUE(p.StartTransactions(Facts(WalHistory{1, {}}, "0/FFFF0000")));
      Backfill(p, rows, state);
    }
    ExpectEachOnce(kafka.committed(), uuids, "after the backfill");
    if (HasFailure()) return;
  }
  EXPECT_GT(in_doubt, 0u) << "no cut left rows in Kafka unmarked: the test proves nothing";
}

// Issue 36, #1: a promotion of an asynchronous standby. The relay published
// the whole recording on timeline 1; the standby had received it only up to
// the end of transaction `k`, and its new timeline writes new transactions at
// the LSNs the old one had (here: the same recorded transactions again, as new
// ones). They are past the fork: produced, not skipped as already in Kafka.
TEST(ExactlyOnce, AfterAPromotionTransactionsPastTheForkAreProducedNotSkipped) {
  FakeWalSender wal = FakeWalSender::Recorded();
  const std::vector<std::string> uuids = RecordedUuids(wal);
  FakeKafka kafka("relay.progress");
  kafka.set_key(kKey);
  RunProcess(&kafka, wal, Lsn(1), 3);
  ASSERT_EQ(kafka.committed().size(), uuids.size());

  const size_t k = 5;  // the standby received transactions 0..4
  const Lsn fork = wal.transactions()[k - 1].end_lsn;
  std::set<std::string> past_fork;
  {
    Pipeline probe(Pipeline::Stepped{});
    probe.Open(wal.From(fork));
    probe.RunUntilIdle();
    for (const auto& r : probe.sink().produced())
      past_fork.insert(r.Header("_watermill_message_uuid"));
  }
  ASSERT_FALSE(past_fork.empty());
  ASSERT_LT(past_fork.size(), uuids.size());
  // The promoted server: timeline 2, forked from 1 at `fork`; its copy of
  // the slot (a failover slot) was confirmed up to the fork at most.
  RunProcess(&kafka, wal, fork, 3, Facts(WalHistory{2, {{1, fork}}}));
  auto copies = Copies(kafka.committed());
  for (const auto& u : uuids) {
    EXPECT_EQ(copies[u], past_fork.contains(u) ? 2 : 1)
        << u
        << (past_fork.contains(u) ? ": a new row on the new timeline, skipped (lost)"
                                  : ": a row both timelines share, published twice");
  }
}

// The same without the history: the old relay's rule. Shows the test above
// would see the loss.
TEST(ExactlyOnce, WithoutTheHistoryTheNewTimelinesRowsWouldBeSkipped) {
  FakeWalSender wal = FakeWalSender::Recorded();
  FakeKafka kafka("relay.progress");
  kafka.set_key(kKey);
  RunProcess(&kafka, wal, Lsn(1), 3);
  const size_t before = kafka.committed().size();
  const Lsn fork = wal.transactions()[4].end_lsn;
  // The promoted server's history unknown to the record (format 1, no
  // timeline), and the server never promoted as far as the facts say: the
  // old trust, which holds everything up to the old position.
  RunProcess(&kafka, wal, fork, 3, Facts(WalHistory{1, {}}));
  EXPECT_EQ(kafka.committed().size(), before) << "every re-sent row skipped as already in Kafka";
}

// Issue 36, #2: two relays given the same --transactional-id. The second
// finds the first one's record: a setting error before anything is produced
// or marked.
TEST(ExactlyOnce, AProgressRecordOfAnotherRelayIsRefusedAndNothingIsMarked) {
  FakeWalSender wal = FakeWalSender::Recorded();
  FakeKafka kafka("relay.progress");
  kafka.set_key(kKey);
  ProgressFacts other = Facts();
  other.me.database = "billing";
  RunProcess(&kafka, wal, Lsn(1), 3, other);
  const size_t before = kafka.committed().size();

  Pipeline p(&kafka, Txn(3), Lsn(1));
  Status st = p.StartTransactions(Facts());
  ASSERT_FALSE(st);
  EXPECT_EQ(st.error().code, ErrorCode::kInvalidArgument);
  EXPECT_NE(st.error().message.find("database billing"), std::string::npos) << st.error().message;
  EXPECT_NE(st.error().message.find("database outbox"), std::string::npos) << st.error().message;
  EXPECT_EQ(kafka.committed().size(), before);
  EXPECT_TRUE(p.marker().marked().empty());
}

TEST(ExactlyOnce, ARecordOnlyANewerRelayCanReadIsRefusedAtStart) {
  FakeKafka kafka("relay.progress");
  kafka.PutProgress(kKey, R"({"v":3,"format":3,"key":"k","lsn":"0/10","rows":1,"complete":true})");
  Pipeline p(&kafka, Txn(3), Lsn(1));
  Status st = p.StartTransactions(Facts());
  ASSERT_FALSE(st);
  EXPECT_EQ(st.error().code, ErrorCode::kInvalidArgument);
  EXPECT_NE(st.error().message.find("newer relay"), std::string::npos) << st.error().message;
}

// Issue 40: relays before 0.2 kept every relay's record in one shared topic
// (outbox-relay.progress). After a rollback to one and forward again, the
// relay's own topic holds the record it wrote before the rollback, the shared
// one what 0.1.0 published since: the record that holds more is trusted,
// whichever topic it is in.
TEST(ExactlyOnce, AfterARollbackAndForwardAgainTheRecordThatHoldsMoreIsTrusted) {
  FakeWalSender wal = FakeWalSender::Recorded();
  const std::vector<std::string> uuids = RecordedUuids(wal);
  const Lsn before_rollback = wal.transactions()[4].end_lsn;
  auto format1 = [](Lsn lsn) {
    return fmt::format(R"({{"v":1,"key":"{}","lsn":"{}","rows":0,"complete":true}})", kKey, lsn);
  };
  {
    FakeKafka kafka("relay.progress");
    kafka.set_key(kKey);
    RunProcess(&kafka, wal, Lsn(1), 3);  // this release, then 0.1.0: everything in Kafka
    ASSERT_EQ(kafka.committed().size(), uuids.size());
    kafka.PutProgress(kKey, format1(before_rollback));  // this release's, before the rollback
    kafka.PutShared(kKey, format1(LastEnd(wal)));       // 0.1.0's, at the end
    // 0.1.0 stopped (a crash) before the slot was confirmed past the rollback.
    RunProcess(&kafka, wal, before_rollback, 3);
    ExpectEachOnce(kafka.committed(), uuids, "the shared topic's record further");
  }
  {
    FakeKafka kafka("relay.progress");
    kafka.set_key(kKey);
    RunProcess(&kafka, wal, Lsn(1), 3);               // this release's own record at the end
    kafka.PutShared(kKey, format1(before_rollback));  // 0.1.0's, from before the upgrade
    RunProcess(&kafka, wal, before_rollback, 3);
    ExpectEachOnce(kafka.committed(), uuids, "the relay's own record further");
  }
}

// A Kafka transaction whose commit fails is aborted with everything after
// it; the session ends, the slot sends its transactions again, and they are
// produced once.
TEST(ExactlyOnce, AnAbortedKafkaTransactionIsSentAgainAndPublishedOnce) {
  FakeWalSender wal = FakeWalSender::Recorded();
  const std::vector<std::string> uuids = RecordedUuids(wal);
  FakeKafka kafka("relay.progress");
  kafka.set_key(kKey);
  Lsn resume;
  {
    Pipeline p(Pipeline::Stepped{}, Pipeline::DefaultOptions(), Lsn(1), &kafka, Txn(3));
    ASSERT_TRUE(p.StartTransactions(Facts()));
    p.txn_sink().commit_fault = Error{ErrorCode::kAborted, "injected: the coordinator aborted it"};
    p.Open(wal.From(Lsn(1)));
    p.Advance(10ms);
    ASSERT_TRUE(p.done());
    Status st = p.result();
    ASSERT_FALSE(st);
    EXPECT_EQ(st.error().code, ErrorCode::kAborted) << st.error().message;
    ASSERT_TRUE(p.EndTransactions(st));
    EXPECT_GE(p.txn_sink().aborts(), 1);
    p.MarkAll();
    ASSERT_TRUE(p.tracker().empty());
    resume = p.tracker().confirmed();
    // The session goes on from the confirmed position, on the same producer.
    p.Open(wal.From(resume));
    p.RunUntilIdle();
    p.CommitAll();
    p.Advance(30ms);
    ASSERT_EQ(p.tracker().confirmed(), LastEnd(wal));
    Status stopped = p.Stop();
    ASSERT_TRUE(stopped) << stopped.error().message;
    ASSERT_TRUE(p.EndTransactions(stopped));
  }
  ExpectEachOnce(kafka.committed(), uuids, "after the abort");
}

// A frozen old instance thaws after a new one initialised the
// transactional.id: its commit is fenced, it publishes nothing, and the new
// one publishes every row once.
TEST(Fencing, AnInstanceFencedByANewerOnePublishesNothingAndTheNewerOneEverythingOnce) {
  FakeWalSender wal = FakeWalSender::Recorded();
  const std::vector<std::string> uuids = RecordedUuids(wal);
  FakeKafka kafka("relay.progress");
  kafka.set_key(kKey);
  TransactionOptions slow = Txn(1000);
  slow.interval = 1h;  // the old one's Kafka transaction stays open
  Pipeline old_one(Pipeline::Stepped{}, Pipeline::DefaultOptions(), Lsn(1), &kafka, slow);
  ASSERT_TRUE(old_one.StartTransactions(Facts()));
  old_one.Open(wal.From(Lsn(1)));
  old_one.RunUntilIdle();
  ASSERT_EQ(old_one.txn_sink().size(), uuids.size());

  RunProcess(&kafka, wal, Lsn(1), 3);  // the new one: fences the old one at its start
  Status stopped = old_one.Stop();
  ASSERT_TRUE(stopped);
  Status ended = old_one.EndTransactions(stopped);
  ASSERT_FALSE(ended);
  EXPECT_EQ(ended.error().code, ErrorCode::kFenced) << ended.error().message;
  EXPECT_EQ(old_one.tracker().confirmed(), Lsn(1)) << "the fenced one confirmed nothing";
  ExpectEachOnce(kafka.committed(), uuids, "after the fencing");
}

// The frames of a connection from the start through the k-th Commit.
std::vector<std::string> FramesThrough(const FakeWalSender& wal, size_t k) {
  std::vector<std::string> out;
  size_t commits = 0;
  for (std::string& frame : wal.From(Lsn(1))) {
    auto m = walproto::DecodeServerMessage(frame);
    EXPECT_TRUE(m.has_value());
    bool commit = m && std::get<walproto::XLogData>(*m).data.front() == 'C';
    out.push_back(std::move(frame));
    if (commit && ++commits == k) break;
  }
  return out;
}

// The progress record lists what Kafka holds and the table may not show
// marked (the rows a lost slot's backfill must not publish again), and stops
// listing them once they are marked.
TEST(ExactlyOnce, TheProgressListsTheRowsKafkaHoldsUntilTheyAreMarked) {
  FakeWalSender wal = FakeWalSender::Recorded();
  FakeKafka kafka("relay.progress");
  kafka.set_key(kKey);
  Pipeline p(Pipeline::Stepped{}, Pipeline::DefaultOptions(), Lsn(1), &kafka, Txn(1000));
  ASSERT_TRUE(p.StartTransactions(Facts()));
  const size_t k = 6;
  const Lsn first_part_end = wal.transactions()[k - 1].end_lsn;
  p.marker().Pause(true);
  fakes::FakeSource& source = p.Open(FramesThrough(wal, k));
  p.RunUntilIdle();
  p.CommitAll();
  ASSERT_GE(kafka.commits(), 1);
  ASSERT_GT(p.tracker().awaiting_mark(), 0u);
  ASSERT_GE(p.tracker().DeliveredThrough(), first_part_end)
      << "every row of the first part committed";
  auto record = DecodeProgress(kafka.progress(kKey).value_or("{}"));
  ASSERT_TRUE(record) << record.error().message;
  EXPECT_EQ(record->owner, Facts().me);
  EXPECT_EQ(record->history.timeline, 1u);
  ASSERT_FALSE(record->progress.unmarked.empty()) << "nothing is marked yet";
  for (const HeldRun& run : record->progress.unmarked.runs()) {
    EXPECT_LT(run.final_lsn, first_part_end);
  }
  const int commits = kafka.commits();
  p.marker().Pause(false);
  p.RunUntilIdle();
  ASSERT_EQ(p.tracker().confirmed(), first_part_end);
  // The rest of the stream: the next records no longer list the first part.
  for (std::string& frame : wal.From(first_part_end)) source.Push(std::move(frame));
  p.RunUntilIdle();
  p.CommitAll();
  p.RunUntilIdle();
  ASSERT_EQ(p.tracker().confirmed(), LastEnd(wal));
  ASSERT_GT(kafka.commits(), commits);
  record = DecodeProgress(kafka.progress(kKey).value_or("{}"));
  ASSERT_TRUE(record) << record.error().message;
  for (const HeldRun& run : record->progress.unmarked.runs()) {
    EXPECT_GT(run.final_lsn, first_part_end) << "a marked row still listed";
  }
}

// The hour-long campaign's loss (38 rows of one transaction): rows read while
// a Kafka transaction flushed are held back and produced into the next one at
// the hand-over, but the progress counts them at once. A stop past its grace
// with the producer's queue full gave up all but the first; the stop's second
// Finish (Relay::Shutdown after Relay::Stream) then committed the next Kafka
// transaction with a record saying it held them all, and they were marked.
TEST(ExactlyOnce, RecordsHeldBackDuringAFlushAndNotTakenAreNeverCountedAsInKafka) {
  FakeWalSender wal = FakeWalSender::Recorded();
  const std::vector<std::string> uuids = RecordedUuids(wal);
  FakeKafka kafka("relay.progress");
  kafka.set_key(kKey);
  const size_t k = 3;
  Lsn confirmed;
  {
    Pipeline p(Pipeline::Stepped{}, Pipeline::DefaultOptions(), Lsn(1), &kafka, Txn(1000));
    ASSERT_TRUE(p.StartTransactions(Facts()));
    p.txn_sink().auto_ack = false;  // the first Kafka transaction's flush waits
    fakes::FakeSource& source = p.Open(FramesThrough(wal, k));
    p.RunUntilIdle();
    p.clock().Advance(10ms);  // its interval: the commit starts, the flush waits
    ASSERT_TRUE(p.eos().Tick(false));
    ASSERT_TRUE(p.eos().deferring());
    const size_t first = p.txn_sink().size();
    ASSERT_GT(first, 0u);
    // The rest of the stream is read meanwhile: held back for the next one.
    for (std::string& frame : wal.From(wal.transactions()[k - 1].end_lsn)) {
      source.Push(std::move(frame));
    }
    p.RunUntilIdle(/*wait_for_commit=*/false);
    ASSERT_EQ(p.txn_sink().size(), first) << "nothing of the next transaction produced yet";
    // Kafka takes one more record, then nothing; a stop, past its grace.
    p.txn_sink().full_at = first + 1;
    p.RequestStop();
    p.clock().Advance(5000ms);
    for (size_t i = 0; i < first; ++i) p.txn_sink().Settle(i);
    // As the relay ends a session, then stops.
    Status ended = p.eos().Finish(5000ms, nullptr);
    EXPECT_FALSE(ended) << "the records not taken";
    // Kafka takes and acknowledges records again: what the next Finish
    // commits, it commits (without the abort, a record saying it holds rows
    // it never took).
    p.txn_sink().full_at.reset();
    p.txn_sink().auto_ack = true;
    for (size_t i = 0; i < p.txn_sink().size(); ++i) p.txn_sink().Settle(i);
    (void)p.eos().Finish(5000ms, nullptr);
    p.MarkAll();
    confirmed = p.tracker().confirmed();
  }
  // The next process, from what Kafka and the slot say.
  RunProcess(&kafka, wal, confirmed, 1000);
  ExpectEachOnce(kafka.committed(), uuids, "after a stop that gave up records held back");
}

// Issue 36, the hour-long campaign's 295 + 100 duplicates: an instance that
// takes over gathers its facts (the server's WAL end among them) when it
// connects, and judges the progress record later, after the fencing. The
// instance it takes over from may publish past that WAL end meanwhile (a
// hot standby's facts were 30 s old there, held by a pipeline restart). Its
// record then looked "beyond the server's WAL end (a restore?)", was trusted
// for nothing, and everything Kafka held but the slot had not confirmed went
// out again. The WAL end is read again after the fencing.
std::vector<fakes::Produced> TakeOverWithFactsFromBefore(const FakeWalSender& wal,
                                                         bool read_again) {
  FakeKafka kafka("relay.progress");
  kafka.set_key(kKey);
  ProgressFacts early = Facts();
  early.wal_end = wal.transactions().front().end_lsn;  // before the rest was written
  {
    // The instance taken over from: every row in Kafka, none confirmed (killed).
    Pipeline p(Pipeline::Stepped{}, Pipeline::DefaultOptions(), Lsn(1), &kafka, Txn(1000));
    EXPECT_TRUE(p.StartTransactions(Facts()));
    p.Open(wal.From(Lsn(1)));
    p.RunUntilIdle();
    p.CommitAll();
  }
  const Lsn now = LastEnd(wal);
  std::function<Result<Lsn>()> wal_end_now;
  if (read_again) wal_end_now = [now]() -> Result<Lsn> { return now; };
  RunProcess(&kafka, wal, Lsn(1), 1000, early, nullptr, /*paced=*/false, std::nullopt,
             std::move(wal_end_now));
  return kafka.committed();
}

TEST(ExactlyOnce, AnInstanceThatTakesOverJudgesTheRecordOnTheServersWalEndOfThen) {
  FakeWalSender wal = FakeWalSender::Recorded();
  const std::vector<std::string> uuids = RecordedUuids(wal);
  ExpectEachOnce(TakeOverWithFactsFromBefore(wal, /*read_again=*/true), uuids,
                 "the WAL end read after the fencing");
}

TEST(ExactlyOnce, WithTheWalEndOfItsFactsATakeOverPublishesAgainWhatKafkaHolds) {
  FakeWalSender wal = FakeWalSender::Recorded();
  const std::vector<std::string> uuids = RecordedUuids(wal);
  auto copies = Copies(TakeOverWithFactsFromBefore(wal, /*read_again=*/false));
  size_t twice = 0;
  for (const auto& u : uuids) twice += copies[u] == 2 ? 1 : 0;
  EXPECT_EQ(twice, uuids.size()) << "the stale WAL end distrusts the record: every row twice";
}

// Issue 36: a promotion of an asynchronous standby that has every row but not
// the last marks. The table there shows rows unmarked that Kafka holds; its
// slot is made anew and the backfill meets them. They are still in the
// progress record's unmarked rows: marks are kept there until the primary's
// standbys have them (tracking::StandbyMarks).
DurableState PromotedStandby(const FakeWalSender& wal, std::optional<uint64_t> standby_rounds,
                             size_t* rounds) {
  Journal journal;
  FakeKafka kafka("relay.progress", &journal);
  kafka.set_key(kKey);
  RunProcess(&kafka, wal, Lsn(1), 2, Facts(), &journal, /*paced=*/true, standby_rounds);
  // Kafka as it is; the table as the standby has it: the marks of the first
  // rounds only.
  DurableState state;
  *rounds = 0;
  for (const fakes::Durable& d : journal.events()) {
    if (d.kind == fakes::Durable::Kind::kCommit) {
      state.committed.insert(state.committed.end(), d.records.begin(), d.records.end());
      if (d.progress) state.progress = d.progress;
    } else if (d.kind == fakes::Durable::Kind::kMark && (*rounds)++ < standby_rounds.value_or(1)) {
      state.marked.insert(state.marked.end(), d.marked.begin(), d.marked.end());
    }
  }
  return state;
}

// The backfill on the promoted standby: timeline 2, forked after the last
// transaction (before the marks' WAL), a new slot. What Kafka holds in the end.
std::vector<fakes::Produced> BackfillOnThePromotedStandby(const FakeWalSender& wal,
                                                          const DurableState& state) {
  FakeKafka kafka("relay.progress");
  kafka.set_key(kKey);
  kafka.Restore(state);
  {
    Pipeline p(&kafka, Txn(2), LastEnd(wal));
    EXPECT_TRUE(p.StartTransactions(Facts(WalHistory{2, {{1, LastEnd(wal)}}}, "0/FFFF0000")));
    Backfill(p, TableRows(wal), state);
  }
  return kafka.committed();
}

TEST(ExactlyOnce, APromotedStandbyLackingTheLastMarksBackfillsNothingKafkaHolds) {
  FakeWalSender wal = FakeWalSender::Recorded();
  const std::vector<std::string> uuids = RecordedUuids(wal);
  size_t rounds = 0;
  DurableState standby = PromotedStandby(wal, /*standby_rounds=*/1, &rounds);
  ASSERT_GE(rounds, 3u) << "too few mark rounds for a standby to lag behind";
  ASSERT_EQ(Copies(standby.committed).size(), uuids.size());
  size_t unmarked_there = 0;
  for (const TableRow& row : TableRows(wal)) {
    if (!standby.Marked(row.transaction_id, row.offset)) ++unmarked_there;
  }
  ASSERT_GT(unmarked_there, 0u) << "the standby lacks no mark: the test proves nothing";
  ExpectEachOnce(BackfillOnThePromotedStandby(wal, standby), uuids,
                 fmt::format("a standby with 1 of {} mark rounds, {} rows unmarked there", rounds,
                             unmarked_there));
}

// The same when the primary knows of no standby (it has none, or one it
// cannot see: stopped, without a physical slot): the rows marked after the
// last Kafka commit's record are published again. Shows the test above would
// see the duplicates.
TEST(ExactlyOnce, WithoutTheStandbysPositionItsUnmarkedRowsWouldComeTwice) {
  FakeWalSender wal = FakeWalSender::Recorded();
  size_t rounds = 0;
  DurableState standby = PromotedStandby(wal, std::nullopt, &rounds);
  auto copies = Copies(BackfillOnThePromotedStandby(wal, standby));
  size_t twice = 0;
  for (const auto& [uuid, n] : copies) twice += n > 1 ? 1 : 0;
  EXPECT_GT(twice, 0u);
}

TEST(StandbyMarks, AMarkIsKeptUntilEveryStandbyHasItAndNothingWithoutStandbys) {
  tracking::StandbyMarks marks;
  marks.Keep(Lsn(0x10), {7, 0, 3});
  EXPECT_EQ(marks.size(), 0u) << "kept before exactly-once enabled it";
  marks.Enable();
  marks.Keep(Lsn(0x10), {7, 0, 3});
  marks.Keep(Lsn(0x20), {8, 0, 0});
  // Read at 0x100: both marks are below it; the standby has WAL below 0x80.
  marks.Read({.written = Lsn(0x100), .lowest = Lsn(0x80)});
  EXPECT_EQ(marks.size(), 2u);
  marks.SetBackfilledBefore(Lsn(0x50));
  marks.Keep(kInvalidLsn, {9, 0, 0});  // a backfilled row
  marks.Read({.written = Lsn(0x200), .lowest = Lsn(0x100)});
  EXPECT_EQ(marks.size(), 1u) << "the standby has the first two marks";
  marks.Read({.written = Lsn(0x300), .lowest = Lsn(0x100), .unknown = true});
  EXPECT_EQ(marks.size(), 1u) << "a standby whose position is hidden keeps every mark";
  std::vector<Lsn> dated;
  marks.ForEach([&](Lsn lsn, const tracking::RowRange&) { dated.push_back(lsn); });
  EXPECT_EQ(dated, std::vector<Lsn>{Lsn(0x50)});
  marks.KeepBelow(Lsn(0x50));
  EXPECT_EQ(marks.size(), 0u) << "a row of a timeline the server left is forgotten";
  marks.Keep(Lsn(0x60), {10, 0, 0});
  // (A minute after the last standby was seen: see the test below.)
  marks.Read({.written = Lsn(0x400), .lowest = std::nullopt},
             std::chrono::steady_clock::now() + tracking::StandbyMarks::kAway);
  EXPECT_EQ(marks.size(), 0u) << "no standby: nothing to keep";
  EXPECT_FALSE(marks.keeping());
  marks.Keep(Lsn(0x70), {11, 0, 0});
  EXPECT_EQ(marks.size(), 0u);
}

// A standby that was there and is gone now (reconnecting after a restart of
// the primary) is waited for a minute as one whose position is unknown; the
// progress record says it was seen, so that the next instance waits too.
TEST(StandbyMarks, AStandbySeenLatelyAndGoneNowIsWaitedForAMinute) {
  using Clock = std::chrono::steady_clock;
  const Clock::time_point t0 = Clock::now();
  tracking::StandbyMarks marks;
  marks.Enable();
  marks.Keep(Lsn(0x10), {7, 0, 0});
  marks.Read({.written = Lsn(0x100), .lowest = Lsn(0x80)}, t0);
  EXPECT_TRUE(marks.SeenLately(t0));
  marks.Keep(Lsn(0x20), {8, 0, 0});
  marks.Read({.written = Lsn(0x200), .lowest = std::nullopt}, t0 + 5s);
  EXPECT_EQ(marks.size(), 2u) << "a standby away for 5 s is taken for none";
  EXPECT_TRUE(marks.keeping());
  marks.Read({.written = Lsn(0x300), .lowest = Lsn(0x100)}, t0 + 8s);
  EXPECT_EQ(marks.size(), 1u) << "back, it has the first mark";
  marks.Read({.written = Lsn(0x400), .lowest = std::nullopt}, t0 + 69s);
  EXPECT_EQ(marks.size(), 0u) << "away for over a minute: no longer waited for";
  EXPECT_FALSE(marks.SeenLately(t0 + 69s));

  // The next instance, told by the record that a standby was seen.
  tracking::StandbyMarks next;
  next.Enable();
  next.SeenAt(t0);
  next.Keep(Lsn(0x30), {9, 0, 0});
  next.Read({.written = Lsn(0x500), .lowest = std::nullopt}, t0 + 1s);
  EXPECT_EQ(next.size(), 1u);
}

// The hour-long exactly-once campaign's duplicates (216, 237 and 1,069 rows): a
// relay restarted just after an immediate restart of the primary, whose
// standby reconnects only seconds later. The new instance's marker read the
// positions (no standby) before the instance had read its record (a standby
// seen 2 s ago); the record's unmarked rows, moved to the kept marks once the
// slot was confirmed past them, were dropped as "no standby", and the
// promotion that followed backfilled them again.
TEST(StandbyMarks, ANewInstanceWhoseMarkerReadNoStandbyBeforeTheRecordKeepsItsMarks) {
  using Clock = std::chrono::steady_clock;
  const Clock::time_point t0 = Clock::now();
  tracking::StandbyMarks marks;
  marks.Enable();
  marks.Read({.written = Lsn(0x100), .lowest = std::nullopt}, t0);  // the marker, first
  EXPECT_FALSE(marks.keeping());
  marks.SeenAt(t0 + 1s);  // then the record: a standby was seen
  EXPECT_TRUE(marks.keeping());
  marks.Keep(Lsn(0x30), {9, 0, 4});
  EXPECT_EQ(marks.size(), 1u) << "the record's rows were dropped: a promotion publishes them again";
  marks.Read({.written = Lsn(0x200), .lowest = std::nullopt}, t0 + 2s);
  EXPECT_EQ(marks.size(), 1u) << "the standby, away for a second, is waited for";
}

TEST(KafkaProgressCodec, WhetherAStandbyWasSeenRoundTrips) {
  ProgressRecord r;
  r.key = kKey;
  r.owner = Facts().me;
  r.history = WalHistory{1, {}};
  r.progress.final_lsn = Lsn(0x100);
  r.progress.standbys = true;
  std::string text = EncodeProgress(r);
  EXPECT_NE(text.find(R"("standbys":true)"), std::string::npos) << text;
  auto back = DecodeProgress(text);
  ASSERT_TRUE(back) << back.error().message;
  EXPECT_EQ(*back, r);
  r.progress.standbys = false;
  text = EncodeProgress(r);
  EXPECT_EQ(text.find("standbys"), std::string::npos) << text;
  back = DecodeProgress(text);
  ASSERT_TRUE(back) << back.error().message;
  EXPECT_FALSE(back->progress.standbys);
}

TEST(KafkaProgress, AHeldRunListedTwiceStillHoldsEveryRowOfTheLongerOne) {
  HeldRows rows;
  rows.Add(HeldRun{Lsn(0x10), 5, 0, 9});
  rows.Add(HeldRun{Lsn(0x20), 6, 0, 0});
  rows.Add(HeldRun{Lsn(0x10), 5, 3, 4});  // the same transaction's rows, listed again
  for (int64_t offset = 0; offset <= 9; ++offset) {
    EXPECT_TRUE(rows.Contains(5, offset)) << offset;
  }
  EXPECT_FALSE(rows.Contains(5, 10));
}

}  // namespace
}  // namespace outbox_relay::pipeline
