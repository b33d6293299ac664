// The confirmation rule, as executable examples.
#include "outbox_relay/tracking/ack_tracker.h"

#include <gtest/gtest.h>

#include <random>
#include <thread>

#include "outbox_relay/core/failpoint.h"

namespace outbox_relay::tracking {
namespace {

using namespace std::chrono_literals;

// A transaction of `rows` messages whose commit record ends at `end`.
Transaction* AddTx(AckTracker& t, uint64_t end, int rows, uint64_t xid8 = 0) {
  Transaction* tx = t.Begin(Lsn(end - 1), PgTimestamp{}, static_cast<uint32_t>(end));
  for (int i = 0; i < rows; ++i) {
    t.AddMessage(tx);
    AckTracker::NoteRow(tx, xid8 ? xid8 : end, i);
  }
  t.Commit(tx, Lsn(end));
  return tx;
}

// Plays the marker: takes everything delivered and marks it.
size_t MarkAll(AckTracker& t) {
  std::vector<Transaction*> batch;
  t.TakeDelivered(&batch, 1000, 0ms);
  t.OnMarked(batch);
  return batch.size();
}

TEST(AckTracker, StartsAtTheGivenPosition) {
  AckTracker t(Lsn(0x100));
  EXPECT_EQ(t.confirmed(), Lsn(0x100));
  EXPECT_TRUE(t.empty());
}

TEST(AckTracker, ConfirmsTransactionOnlyWhenDeliveredAndMarked) {
  AckTracker t(Lsn(1));
  Transaction* a = AddTx(t, 100, 2);
  t.OnDelivered(a);
  EXPECT_EQ(t.confirmed(), Lsn(1)) << "one of two rows acked";
  t.OnDelivered(a);
  EXPECT_EQ(t.confirmed(), Lsn(1)) << "acked but not yet marked";
  EXPECT_EQ(t.awaiting_mark(), 1u);
  EXPECT_EQ(MarkAll(t), 1u);
  EXPECT_EQ(t.confirmed(), Lsn(100));
  EXPECT_TRUE(t.empty());
}

TEST(AckTracker, OutOfOrderAcksConfirmOnlyTheDonePrefix) {
  AckTracker t(Lsn(1));
  Transaction* a = AddTx(t, 100, 1);
  Transaction* b = AddTx(t, 200, 1);
  Transaction* c = AddTx(t, 300, 1);
  t.OnDelivered(c);
  t.OnDelivered(b);
  MarkAll(t);
  EXPECT_EQ(t.confirmed(), Lsn(1)) << "b and c are done but a, committed before them, is not";
  t.OnDelivered(a);
  MarkAll(t);
  EXPECT_EQ(t.confirmed(), Lsn(300));
}

TEST(AckTracker, MarkingOutOfOrderAlsoWaitsForThePrefix) {
  AckTracker t(Lsn(1));
  Transaction* a = AddTx(t, 100, 1);
  Transaction* b = AddTx(t, 200, 1);
  t.OnDelivered(b);
  MarkAll(t);  // b marked first
  EXPECT_EQ(t.confirmed(), Lsn(1));
  t.OnDelivered(a);
  EXPECT_EQ(t.confirmed(), Lsn(1)) << "a delivered but not marked";
  MarkAll(t);
  EXPECT_EQ(t.confirmed(), Lsn(200));
}

TEST(AckTracker, OpenTransactionBlocksConfirmationEvenWhenItsRowsAreAcked) {
  AckTracker t(Lsn(1));
  Transaction* tx = t.Begin(Lsn(99), PgTimestamp{}, 7);
  t.AddMessage(tx);
  t.OnDelivered(tx);
  MarkAll(t);
  EXPECT_EQ(t.confirmed(), Lsn(1)) << "no Commit seen yet";
  EXPECT_FALSE(t.empty());
  t.Commit(tx, Lsn(100));
  MarkAll(t);
  EXPECT_EQ(t.confirmed(), Lsn(100));
}

TEST(AckTracker, TransactionWithoutRowsConfirmsAtCommitWithoutTheMarker) {
  // PostgreSQL 14 sends every transaction, also one that changed nothing the
  // publication holds, as Begin/Commit: among them the marker's own UPDATEs.
  // Handing those to the marker would make it write again for each, and each
  // write comes back as another empty transaction: it must not see them.
  AckTracker t(Lsn(1));
  AddTx(t, 100, 0);
  EXPECT_EQ(t.confirmed(), Lsn(100));
  EXPECT_EQ(t.awaiting_mark(), 0u);
  EXPECT_EQ(MarkAll(t), 0u) << "nothing to mark or index";
  EXPECT_TRUE(t.empty());
}

TEST(AckTracker, TransactionWithoutRowsStillWaitsForTheOnesBeforeIt) {
  AckTracker t(Lsn(1));
  Transaction* a = AddTx(t, 100, 1);
  AddTx(t, 200, 0);
  EXPECT_EQ(t.confirmed(), Lsn(1));
  t.OnDelivered(a);
  EXPECT_EQ(MarkAll(t), 1u);
  EXPECT_EQ(t.confirmed(), Lsn(200));
}

TEST(AckTracker, IdleRuleFollowsServerOnlyWhenNothingIsInFlight) {
  AckTracker t(Lsn(1));
  EXPECT_TRUE(t.FollowServer(Lsn(500)));
  EXPECT_EQ(t.confirmed(), Lsn(500));
  Transaction* a = AddTx(t, 600, 1);
  EXPECT_FALSE(t.FollowServer(Lsn(900))) << "a keepalive must not confirm past an unacked row";
  EXPECT_EQ(t.confirmed(), Lsn(500));
  t.OnDelivered(a);
  MarkAll(t);
  EXPECT_EQ(t.confirmed(), Lsn(900))
      << "the keepalive seen while a was in flight holds once a is confirmed: the server sends "
         "no other while its WAL stays where we reported it";
  EXPECT_FALSE(t.FollowServer(Lsn(800))) << "never backwards";
  EXPECT_EQ(t.confirmed(), Lsn(900));
  Transaction* b = AddTx(t, 1000, 1);
  EXPECT_FALSE(t.FollowServer(Lsn(1100)));
  Transaction* c = AddTx(t, 1200, 1);  // after the keepalive
  t.OnDelivered(b);
  MarkAll(t);
  EXPECT_EQ(t.confirmed(), Lsn(1000)) << "c is still in flight";
  t.OnDelivered(c);
  MarkAll(t);
  EXPECT_EQ(t.confirmed(), Lsn(1200));
}

TEST(AckTracker, KeepaliveSeenBeforeAnAbandonedTransactionIsNotFollowed) {
  AckTracker t(Lsn(1));
  Transaction* a = AddTx(t, 100, 1);
  EXPECT_FALSE(t.FollowServer(Lsn(150)));
  Transaction* open = t.Begin(Lsn(199), PgTimestamp{}, 8);
  t.AddMessage(open);
  t.Abandon(open);  // the stream broke: it comes again from the slot
  t.OnDelivered(open);
  t.OnDelivered(a);
  MarkAll(t);
  EXPECT_EQ(t.confirmed(), Lsn(100)) << "nothing past what comes again";
}

TEST(AckTracker, OpenTransactionWithoutRowsStillBlocksTheIdleRule) {
  AckTracker t(Lsn(1));
  Transaction* tx = t.Begin(Lsn(99), PgTimestamp{}, 7);
  EXPECT_FALSE(t.FollowServer(Lsn(500)));
  t.Commit(tx, Lsn(100));
  MarkAll(t);
  EXPECT_TRUE(t.FollowServer(Lsn(500)));
}

TEST(AckTracker, AbandonedTransactionNeverConfirmsAndIsNotMarked) {
  AckTracker t(Lsn(1));
  Transaction* a = AddTx(t, 100, 1);
  Transaction* open = t.Begin(Lsn(199), PgTimestamp{}, 8);
  t.AddMessage(open);
  t.Abandon(open);  // the stream broke before its Commit
  t.OnDelivered(open);
  t.OnDelivered(a);
  EXPECT_EQ(MarkAll(t), 1u) << "only the committed transaction goes to the marker";
  EXPECT_EQ(t.confirmed(), Lsn(100));
  EXPECT_TRUE(t.empty());
}

TEST(AckTracker, FailedDeliveryStopsConfirmationAtThatTransaction) {
  AckTracker t(Lsn(1));
  Transaction* a = AddTx(t, 100, 1);
  Transaction* b = AddTx(t, 200, 2);
  Transaction* c = AddTx(t, 300, 1);
  t.OnDelivered(a);
  t.OnDelivered(b);
  t.OnFailed(b, "Broker: Message size too large");
  t.OnDelivered(c);
  MarkAll(t);
  EXPECT_EQ(t.confirmed(), Lsn(100));
  ASSERT_TRUE(t.failure().has_value());
  EXPECT_EQ(*t.failure(), "Broker: Message size too large");
  EXPECT_FALSE(t.FollowServer(Lsn(1000)));
  EXPECT_FALSE(t.WaitEmpty(0ms));
}

TEST(AckTracker, MarkingOffConfirmsOnDelivery) {
  AckTracker t(Lsn(1), /*marking=*/false);
  Transaction* a = AddTx(t, 100, 1);
  t.OnDelivered(a);
  EXPECT_EQ(t.confirmed(), Lsn(100));
  EXPECT_EQ(t.awaiting_mark(), 0u);
}

TEST(AckTracker, RowsAreRecordedAsRunsOfConsecutiveOffsetsPerTransactionId) {
  AckTracker t(Lsn(1));
  Transaction* tx = t.Begin(Lsn(99), PgTimestamp{}, 7);
  // Offsets 10..12 of xid 5, then 14 (13 went to another writer, or a row
  // filter kept it from the relay: it must not be covered), then xid 6, then 5 again.
  for (auto [id, off] : std::vector<std::pair<uint64_t, int64_t>>{
           {5, 10}, {5, 11}, {5, 12}, {5, 14}, {6, 15}, {6, 16}, {5, 17}}) {
    AckTracker::NoteRow(tx, id, off);
  }
  EXPECT_EQ(tx->row_ranges,
            (std::vector<RowRange>{{5, 10, 12}, {5, 14, 14}, {6, 15, 16}, {5, 17, 17}}));
  std::vector<uint64_t> ids{9};
  AckTracker::TransactionIds(*tx, &ids);
  EXPECT_EQ(ids, (std::vector<uint64_t>{5, 6}));
  t.Commit(tx, Lsn(100));
}

TEST(AckTracker, ATransactionWithoutRowsIsNeverHandedToTheMarker) {
  // PostgreSQL 14 sends empty transactions (and a shared publication sends
  // other tables' ones): marking one would index it, and that index INSERT
  // would come back as one more empty transaction, for ever.
  AckTracker t(Lsn(1));
  Transaction* empty = t.Begin(Lsn(99), PgTimestamp{}, 7);
  t.Commit(empty, Lsn(100));
  EXPECT_EQ(t.awaiting_mark(), 0u);
  EXPECT_EQ(t.confirmed(), Lsn(100));
  EXPECT_EQ(MarkAll(t), 0u);
}

TEST(AckTracker, RaiseConfirmedNeverLowersAndLaterCommitsStillCount) {
  AckTracker t(Lsn(100));
  t.RaiseConfirmed(Lsn(50));
  EXPECT_EQ(t.confirmed(), Lsn(100));
  Transaction* a = AddTx(t, 300, 1);
  t.RaiseConfirmed(Lsn(200));  // the slot moved on while we had `a` in flight
  EXPECT_EQ(t.confirmed(), Lsn(200));
  t.OnDelivered(a);
  MarkAll(t);
  EXPECT_EQ(t.confirmed(), Lsn(300));
}

TEST(AckTracker, ResetConfirmedOnlyWhenNothingIsInFlight) {
  AckTracker t(Lsn(100));
  EXPECT_TRUE(t.ResetConfirmed(Lsn(50))) << "a new slot may start anywhere";
  EXPECT_EQ(t.confirmed(), Lsn(50));
  Transaction* a = AddTx(t, 300, 1);
  EXPECT_FALSE(t.ResetConfirmed(Lsn(1000)));
  t.OnDelivered(a);
  MarkAll(t);
}

TEST(AckTracker, UnsafeConfirmNewestFaultBreaksThePrefixRule) {
  // The test-only fault the crash tests use to prove they can see loss. The
  // production build (OUTBOX_FAILPOINTS=OFF, scripts/test's build-prod) has it
  // compiled out: there the prefix rule holds whatever is asked.
  AckTracker t(Lsn(1));
  t.EnableUnsafeConfirmNewest();
  Transaction* a = AddTx(t, 100, 1);
  AddTx(t, 200, 1);
  AddTx(t, 300, 1);
  t.OnDelivered(a);
  if constexpr (failpoint::kCompiledIn) {
    EXPECT_EQ(t.confirmed(), Lsn(300))
        << "confirmed past the unacked transactions ending at 200, 300";
  } else {
    MarkAll(t);
    EXPECT_EQ(t.confirmed(), Lsn(100)) << "the fault is in a production build";
  }
}

TEST(AckTracker, DeadLetterFromTheDeliveryThreadKeepsTheTransactionOpen) {
  AckTracker t(Lsn(1));
  Transaction* a = AddTx(t, 100, 1);
  t.AddDeadLetter(a);  // the refused record is replaced by its dead letter
  t.OnDelivered(a);    // the refused original settles
  MarkAll(t);
  EXPECT_EQ(t.confirmed(), Lsn(1)) << "dead letter not acknowledged yet";
  t.OnDelivered(a);  // the dead letter
  MarkAll(t);
  EXPECT_EQ(t.confirmed(), Lsn(100));
}

TEST(AckTracker, CancelledMessageDoesNotHoldTheTransaction) {
  AckTracker t(Lsn(1));
  Transaction* tx = t.Begin(Lsn(99), PgTimestamp{}, 7);
  t.AddMessage(tx);
  t.CancelMessage(tx);  // the sink refused it synchronously
  EXPECT_EQ(tx->rows, 0u);
  EXPECT_EQ(t.rows_in_flight(), 0);
  t.Commit(tx, Lsn(100));
  MarkAll(t);
  EXPECT_EQ(t.confirmed(), Lsn(100));
}

TEST(AckTracker, CountsRowsInFlight) {
  AckTracker t(Lsn(1));
  Transaction* a = AddTx(t, 100, 3);
  EXPECT_EQ(t.rows_in_flight(), 3);
  t.OnDelivered(a);
  EXPECT_EQ(t.rows_in_flight(), 2);
}

// Many transactions, acks in random order from another thread, a marker
// thread: the confirmed position only ever grows, never passes an
// incomplete transaction, and ends at the last commit.
TEST(AckTracker, ConcurrentRandomAcksNeverConfirmPastAnIncompleteTransaction) {
  constexpr int kTx = 2000;
  AckTracker t(Lsn(1));
  std::vector<Transaction*> txs;
  std::vector<std::pair<Transaction*, uint64_t>> messages;  // (tx, its end)
  std::mt19937 rng(42);
  for (int i = 0; i < kTx; ++i) {
    int rows = 1 + static_cast<int>(rng() % 5);
    uint64_t end = 1000 + static_cast<uint64_t>(i) * 10;
    Transaction* tx = AddTx(t, end, rows);
    txs.push_back(tx);
    for (int r = 0; r < rows; ++r) messages.emplace_back(tx, end);
  }
  std::shuffle(messages.begin(), messages.end(), rng);
  // ends of transactions with all their acks; the oracle of what may be confirmed.
  std::vector<std::atomic<int>> acked(kTx);
  std::atomic<bool> stop{false};
  std::thread marker([&] {
    std::vector<Transaction*> batch;
    while (!stop.load()) {
      batch.clear();
      t.TakeDelivered(&batch, 64, 1ms);
      t.OnMarked(batch);
    }
  });
  std::atomic<uint64_t> violations{0};
  std::thread watcher([&] {
    uint64_t last = 0;
    while (!stop.load()) {
      uint64_t c = t.confirmed().value();
      if (c < last) violations++;
      last = c;
    }
  });
  std::vector<int> remaining(kTx);
  for (int i = 0; i < kTx; ++i) remaining[i] = static_cast<int>(txs[i]->rows);
  std::vector<bool> done(kTx, false);
  for (auto& [tx, end] : messages) {
    int idx = static_cast<int>((end - 1000) / 10);
    if (--remaining[idx] == 0) done[idx] = true;
    t.OnDelivered(tx);
    // Everything confirmed must be within the fully-acked prefix.
    uint64_t c = t.confirmed().value();
    int prefix = 0;
    while (prefix < kTx && done[prefix]) ++prefix;
    uint64_t allowed = prefix == 0 ? 1 : 1000 + static_cast<uint64_t>(prefix - 1) * 10;
    ASSERT_LE(c, allowed);
  }
  ASSERT_TRUE(t.WaitEmpty(5s));
  stop = true;
  t.Wake();
  marker.join();
  watcher.join();
  EXPECT_EQ(violations.load(), 0u);
  EXPECT_EQ(t.confirmed(), Lsn(1000 + (kTx - 1) * 10));
}

// Watermill's progress may cover a transaction id only once everything that
// committed before a sampled WAL position is delivered: DeliveredThrough.
TEST(AckTracker, DeliveredThroughIsTheFirstUndeliveredCommitOrWhatWasReceived) {
  AckTracker t(Lsn(50));
  EXPECT_EQ(t.DeliveredThrough(), Lsn(50)) << "nothing received: the confirmed position";
  Transaction* a = AddTx(t, 100, 1);
  Transaction* b = AddTx(t, 200, 1);
  EXPECT_EQ(t.DeliveredThrough(), Lsn(99)) << "a's commit record starts at 99";
  t.OnDelivered(b);
  EXPECT_EQ(t.DeliveredThrough(), Lsn(99)) << "b delivered, a not: nothing past a";
  t.OnDelivered(a);
  EXPECT_EQ(t.DeliveredThrough(), Lsn(200)) << "delivered, not yet marked: still counts";
  MarkAll(t);
  EXPECT_EQ(t.DeliveredThrough(), Lsn(200));
  t.FollowServer(Lsn(300));  // an idle keepalive between transactions
  EXPECT_EQ(t.DeliveredThrough(), Lsn(300));
  Transaction* c = AddTx(t, 400, 1);
  t.FollowServer(Lsn(500));  // seen while c is in flight: nothing past c
  EXPECT_EQ(t.DeliveredThrough(), Lsn(399));
  t.OnDelivered(c);
  EXPECT_EQ(t.DeliveredThrough(), Lsn(500));
}

// Exactly-once: a transaction whose rows are in an open Kafka transaction is
// held until that commits, however long ago Kafka acknowledged its rows.
TEST(AckTracker, HeldTransactionConfirmsOnlyOnceItsKafkaTransactionCommitted) {
  AckTracker t(Lsn(1));
  Transaction* a = AddTx(t, 100, 2);
  t.Hold(a);
  t.OnDelivered(a);
  t.OnDelivered(a);
  EXPECT_EQ(MarkAll(t), 0u) << "not handed to the marker while its Kafka transaction is open";
  EXPECT_EQ(t.confirmed(), Lsn(1));
  t.ReleaseHold(a);  // committed
  EXPECT_EQ(MarkAll(t), 1u);
  EXPECT_EQ(t.confirmed(), Lsn(100));
}

TEST(AckTracker, ATransactionSplitOverKafkaTransactionsWaitsForEveryOne) {
  AckTracker t(Lsn(1));
  Transaction* a = AddTx(t, 100, 4);
  t.Hold(a);  // rows 0-1 in Kafka transaction 1
  t.Hold(a);  // rows 2-3 in Kafka transaction 2
  for (int i = 0; i < 4; ++i) t.OnDelivered(a);
  t.ReleaseHold(a);
  EXPECT_EQ(MarkAll(t), 0u) << "its second Kafka transaction is still open";
  t.ReleaseHold(a);
  EXPECT_EQ(MarkAll(t), 1u);
  EXPECT_EQ(t.confirmed(), Lsn(100));
}

TEST(AckTracker, AbortedKafkaTransactionAbandonsItsTransactionsUnmarked) {
  AckTracker t(Lsn(1));
  Transaction* a = AddTx(t, 100, 1);
  Transaction* b = AddTx(t, 200, 1);
  t.Hold(a);
  t.Hold(b);
  t.OnDelivered(a);
  t.OnDelivered(b);
  t.ReleaseHold(a);    // a's Kafka transaction committed
  t.AbandonHeld({b});  // b's aborted: it comes again from the slot
  EXPECT_TRUE(b->abandoned);
  // (b leaves the tracker, unmarked, once a is marked: not read after this.)
  EXPECT_EQ(MarkAll(t), 1u) << "only a is marked";
  EXPECT_EQ(t.confirmed(), Lsn(100)) << "b never confirms";
}

// An aborted Kafka transaction's PostgreSQL transactions come again from the
// slot, and so does everything after them: a later transaction that needs
// nothing from Kafka (no outbox rows, or rows Kafka already had) must not
// confirm past them. (Found by ExactlyOnce.AnAbortedKafkaTransactionIsSent...:
// PostgreSQL 14 sends empty transactions, and their confirmation lost the
// aborted ones.)
TEST(AckTracker, NothingAfterAnAbortedKafkaTransactionConfirmsPastIt) {
  AckTracker t(Lsn(1));
  Transaction* a = AddTx(t, 100, 1);
  Transaction* b = AddTx(t, 200, 1);
  Transaction* empty = t.Begin(Lsn(300), PgTimestamp{}, 3);
  t.Commit(empty, Lsn(310));  // no rows: done at once
  t.Hold(a);
  t.Hold(b);
  t.OnDelivered(a);
  t.OnDelivered(b);
  t.ReleaseHold(a);
  EXPECT_EQ(MarkAll(t), 1u);
  EXPECT_EQ(t.confirmed(), Lsn(100));
  t.AbandonHeld({b});  // (b and the empty one leave the tracker: not read after this)
  EXPECT_TRUE(t.empty());
  EXPECT_EQ(t.confirmed(), Lsn(100)) << "confirmed past the aborted transaction: it is lost";
}

TEST(AckTracker, WaitDeliveredReturnsAtTheCountTheTimeoutOrAWake) {
  using Clock = std::chrono::steady_clock;
  using std::chrono::milliseconds;
  AckTracker t(Lsn(1));
  Transaction* a = AddTx(t, 100, 1);
  Transaction* b = AddTx(t, 200, 1);
  t.OnDelivered(a);
  auto t0 = Clock::now();
  t.WaitDelivered(1, milliseconds(5000));
  EXPECT_LT(Clock::now() - t0, milliseconds(1000)) << "one is delivered already";
  t0 = Clock::now();
  t.WaitDelivered(2, milliseconds(100));
  EXPECT_GE(Clock::now() - t0, milliseconds(90)) << "only one is delivered: the timeout";
  std::thread deliver([&] {
    std::this_thread::sleep_for(milliseconds(50));
    t.OnDelivered(b);
  });
  t0 = Clock::now();
  t.WaitDelivered(2, milliseconds(5000));
  EXPECT_LT(Clock::now() - t0, milliseconds(2000)) << "the second delivery ends the wait";
  deliver.join();
  std::thread wake([&] {
    std::this_thread::sleep_for(milliseconds(50));
    t.Wake();
  });
  t0 = Clock::now();
  t.WaitDelivered(10, milliseconds(5000));
  EXPECT_LT(Clock::now() - t0, milliseconds(2000)) << "Wake (shutdown) ends the wait";
  wake.join();
  std::vector<Transaction*> taken;
  t.TakeDelivered(&taken, 10, milliseconds(0));
  EXPECT_EQ(taken.size(), 2u) << "waiting moves nothing";
}

// The delivery deadline: measured from the newest message the oldest
// undelivered transaction handed over (all of its messages are that old).
TEST(AckTracker, ExpireOverdueFailsTheOldestUnreportedTransactionRetryably) {
  AckTracker t(Lsn(1));
  Transaction* done = AddTx(t, 100, 1);
  t.OnDelivered(done);
  Transaction* a = AddTx(t, 200, 2);
  t.OnDelivered(a);  // one of its two reported
  const auto handed =
      std::chrono::steady_clock::time_point(std::chrono::nanoseconds(a->last_message_ns.load()));
  EXPECT_EQ(t.ExpireOverdue(handed + 50ms, 100ms), std::nullopt) << "not yet 100 ms old";
  EXPECT_FALSE(t.failure());
  std::optional<std::string> why = t.ExpireOverdue(handed + 150ms, 100ms);
  ASSERT_TRUE(why);
  EXPECT_NE(why->find("1 record(s) of transaction xid 200"), std::string::npos) << *why;
  EXPECT_EQ(t.failure(), why);
  EXPECT_TRUE(t.failure_retryable());
  EXPECT_EQ(t.ExpireOverdue(handed + 10s, 100ms), std::nullopt) << "one failure is reported once";
  // The late acknowledgement does not let the expired transaction confirm.
  t.OnDelivered(a);
  MarkAll(t);
  EXPECT_EQ(t.confirmed(), Lsn(100));
}

TEST(AckTracker, ExpireOverdueIgnoresDeliveredTransactions) {
  AckTracker t(Lsn(1));
  Transaction* a = AddTx(t, 100, 3);
  for (int i = 0; i < 3; ++i) t.OnDelivered(a);
  EXPECT_EQ(t.ExpireOverdue(std::chrono::steady_clock::now() + 1h, 1ms), std::nullopt);
  EXPECT_FALSE(t.failure());
}

TEST(AckTracker, RestartForgetsTheFlightOnceTheMarkerHoldsNothing) {
  AckTracker t(Lsn(1));
  Transaction* a = AddTx(t, 100, 1);
  Transaction* b = AddTx(t, 200, 1);
  t.OnDelivered(a);  // delivered, not yet marked: the marker holds it
  t.OnFailed(b, "broker went away", /*retryable=*/true);
  ASSERT_TRUE(t.failure_retryable());
  EXPECT_FALSE(t.Restart()) << "a is still with the marker";
  EXPECT_FALSE(t.empty());
  EXPECT_EQ(MarkAll(t), 1u);
  EXPECT_EQ(t.confirmed(), Lsn(100)) << "a confirms; the failed b stops confirmation";
  EXPECT_TRUE(t.Restart());
  EXPECT_TRUE(t.empty());
  EXPECT_FALSE(t.failure());
  EXPECT_EQ(t.stats().rows_in_flight, 0);
  EXPECT_EQ(t.confirmed(), Lsn(100)) << "the stream restarts here and sends b again";
  // b again, from the slot: now it goes through.
  Transaction* again = AddTx(t, 200, 1);
  t.OnDelivered(again);
  EXPECT_EQ(MarkAll(t), 1u);
  EXPECT_EQ(t.confirmed(), Lsn(200));
}

TEST(AckTracker, UnmarkableTransactionsConfirmNothingAndLetThePipelineRestart) {
  AckTracker t(Lsn(1));
  Transaction* a = AddTx(t, 100, 1);
  Transaction* b = AddTx(t, 200, 1);
  Transaction* c = AddTx(t, 300, 1);
  t.OnDelivered(a);
  t.OnDelivered(b);
  t.OnDelivered(c);
  std::vector<Transaction*> batch;
  t.TakeDelivered(&batch, 1, 0ms);
  t.OnMarked(batch);  // a, marked before the promotion
  batch.clear();
  t.TakeDelivered(&batch, 10, 0ms);  // b and c: the marker meets another timeline
  ASSERT_EQ(batch.size(), 2u);
  EXPECT_FALSE(t.Restart()) << "the marker holds b and c";
  t.Unmarkable(batch, "timeline 2");
  EXPECT_EQ(t.awaiting_mark(), 0u);
  EXPECT_EQ(t.confirmed(), Lsn(100)) << "b and c are neither marked nor confirmed";
  ASSERT_TRUE(t.failure().has_value());
  EXPECT_TRUE(t.failure_retryable());
  EXPECT_FALSE(t.FollowServer(Lsn(1000)));
  EXPECT_TRUE(t.Restart()) << "nothing is with the marker any more";
  EXPECT_EQ(t.confirmed(), Lsn(100)) << "the stream restarts here and sends b and c again";
}

}  // namespace
}  // namespace outbox_relay::tracking
