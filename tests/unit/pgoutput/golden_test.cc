// The decoder against bytes recorded from real PostgreSQL servers, 14 to 18
// (tests/fixtures/pgoutput/stream_v1.hex for 15, stream_v1_pg<major>.hex for the others; workload
// in tests/fixtures/record_fixtures.sh): the sequence of messages, the concrete values the
// workload inserted, the LSN relations between Begin and Commit, and Encode(Decode(bytes)) ==
// bytes for every message. Every test runs on every major's stream.
//
// The one difference between the majors' streams: 14 sends a transaction that changed nothing
// the publication holds as an empty Begin/Commit pair (15 stopped sending those): the DDL
// transactions of the workload and the replication-origin setup. They are set apart here
// (`empty_transactions_`) so that Tx(i) means the same transaction on every major.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "golden_stream.h"
#include "outbox_relay/pgoutput/decoder.h"

namespace outbox_relay::pgoutput {
namespace {

using golden::GoldenLine;
using ::testing::ElementsAre;
using ::testing::StartsWith;

constexpr Oid kTextOid = 25;
constexpr Oid kInt8Oid = 20;
constexpr Oid kVarcharOid = 1043;
constexpr Oid kTimestamptzOid = 1184;
constexpr Oid kJsonOid = 114;
constexpr Oid kXid8Oid = 5069;

// 2024-05-01 12:00:00 UTC, the timestamp the workload gives the replication origin.
constexpr int64_t kOriginCommitTime = 767'880'000'000'000;

// One change (Insert/Update/Delete/Truncate) with the relation in effect when it arrived.
struct Change {
  const DecodedMessage* message;
  Relation relation;
};

struct Transaction {
  const GoldenLine* begin_line = nullptr;
  const Begin* begin = nullptr;
  const GoldenLine* commit_line = nullptr;
  const Commit* commit = nullptr;
  std::string kinds;  // message type bytes from B to C
  std::vector<const Relation*> relations;
  std::vector<const Type*> types;
  std::vector<const Origin*> origins;
  std::vector<const Message*> messages;
  std::vector<Change> changes;
};

// What one major's stream decodes into; loaded once per major.
struct GoldenData {
  std::vector<GoldenLine> lines;
  std::vector<DecodedMessage> decoded;  // views into `lines`
  std::vector<Transaction> transactions;
  std::vector<Transaction> empty_transactions;  // Begin/Commit with nothing between
  struct Standalone {
    const GoldenLine* line;
    const Message* message;
  };
  std::vector<Standalone> standalone_messages;
};

class GoldenStream : public ::testing::TestWithParam<int> {
 protected:
  using Standalone = GoldenData::Standalone;

  void SetUp() override {
    static std::map<int, std::unique_ptr<GoldenData>> loaded;
    auto& data = loaded[GetParam()];
    if (!data) {
      auto lines = golden::LoadGoldenStream(golden::GoldenStreamPath(GetParam()));
      ASSERT_TRUE(lines) << lines.error().message;
      auto d = std::make_unique<GoldenData>();
      d->lines = std::move(*lines);
      // Decoded only once the lines sit at their final address: the views point into them.
      d->decoded.resize(d->lines.size());
      for (size_t i = 0; i < d->lines.size(); ++i) {
        Status st = Decode(d->lines[i].bytes, &d->decoded[i]);
        ASSERT_TRUE(st) << "line " << d->lines[i].line_number << ": " << st.error().message;
      }
      ASSERT_NO_FATAL_FAILURE(Group(d.get()));
      data = std::move(d);
    }
    lines_ = &data->lines;
    decoded_ = &data->decoded;
    transactions_ = &data->transactions;
    empty_transactions_ = &data->empty_transactions;
    standalone_messages_ = &data->standalone_messages;
  }

  // Splits the stream into transactions (Begin .. Commit) and the messages outside any.
  static void Group(GoldenData* data) {
    RelationCache cache;
    Transaction* tx = nullptr;
    for (size_t i = 0; i < data->lines.size(); ++i) {
      const GoldenLine& line = data->lines[i];
      const DecodedMessage& m = data->decoded[i];
      if (const auto* b = std::get_if<Begin>(&m)) {
        ASSERT_EQ(tx, nullptr) << "Begin inside a transaction, line " << line.line_number;
        tx = &data->transactions.emplace_back();
        tx->begin_line = &line;
        tx->begin = b;
      }
      if (tx == nullptr) {
        const auto* msg = std::get_if<Message>(&m);
        ASSERT_NE(msg, nullptr) << "only a Message may stand outside a transaction, line "
                                << line.line_number;
        data->standalone_messages.push_back({&line, msg});
        continue;
      }
      tx->kinds.push_back(line.bytes[0]);
      ASSERT_EQ(line.xid, tx->begin->xid) << "line " << line.line_number;
      if (const auto* r = std::get_if<Relation>(&m)) {
        cache.Put(*r);
        tx->relations.push_back(r);
      } else if (const auto* t = std::get_if<Type>(&m)) {
        tx->types.push_back(t);
      } else if (const auto* o = std::get_if<Origin>(&m)) {
        tx->origins.push_back(o);
      } else if (const auto* msg = std::get_if<Message>(&m)) {
        tx->messages.push_back(msg);
      } else if (const auto* c = std::get_if<Commit>(&m)) {
        tx->commit_line = &line;
        tx->commit = c;
        if (tx->kinds == "BC") {
          data->empty_transactions.push_back(std::move(*tx));
          data->transactions.pop_back();
        }
        tx = nullptr;
      } else if (!std::holds_alternative<Begin>(m)) {
        Oid relid = 0;
        if (const auto* ins = std::get_if<Insert>(&m)) relid = ins->relation_id;
        if (const auto* upd = std::get_if<Update>(&m)) relid = upd->relation_id;
        if (const auto* del = std::get_if<Delete>(&m)) relid = del->relation_id;
        if (const auto* tr = std::get_if<Truncate>(&m)) relid = tr->relation_ids.at(0);
        const Relation* rel = cache.Find(relid);
        ASSERT_NE(rel, nullptr) << "change before its Relation, line " << line.line_number;
        tx->changes.push_back({&m, *rel});
      }
    }
    ASSERT_EQ(tx, nullptr) << "stream ends inside a transaction";
  }

  static const TupleValue& Value(const Relation& rel, const TupleData& tuple,
                                 std::string_view column) {
    static const TupleValue kMissing{TupleValue::Kind::kNull, "<no such column>"};
    int i = rel.ColumnIndex(column);
    EXPECT_GE(i, 0) << column;
    EXPECT_EQ(tuple.values.size(), rel.columns.size());
    if (i < 0 || static_cast<size_t>(i) >= tuple.values.size()) return kMissing;
    return tuple.values[static_cast<size_t>(i)];
  }
  // The text of `column`, or "<null>" / "<unchanged>" so that one EXPECT_EQ checks both.
  static std::string Text(const Relation& rel, const TupleData& tuple, std::string_view column) {
    const TupleValue& v = Value(rel, tuple, column);
    switch (v.kind) {
      case TupleValue::Kind::kNull:
        return "<null>";
      case TupleValue::Kind::kUnchangedToast:
        return "<unchanged>";
      case TupleValue::Kind::kText:
        return std::string(v.text);
    }
    return {};
  }
  static const Insert& InsertOf(const Change& c) { return std::get<Insert>(*c.message); }
  static const Update& UpdateOf(const Change& c) { return std::get<Update>(*c.message); }
  static const Delete& DeleteOf(const Change& c) { return std::get<Delete>(*c.message); }
  static std::string InsertText(const Change& c, std::string_view column) {
    return Text(c.relation, InsertOf(c).new_tuple, column);
  }
  static std::vector<std::string> ColumnNames(const Relation& r) {
    std::vector<std::string> names;
    for (const RelationColumn& c : r.columns) names.push_back(c.name);
    return names;
  }

  const Transaction& Tx(size_t i) const { return transactions_->at(i); }
  // The empty Begin/Commit pairs 14 sends (the DDL transactions of the workload).
  size_t ExpectedEmptyTransactions() const { return GetParam() == 14 ? 5 : 0; }

  const std::vector<GoldenLine>* lines_ = nullptr;
  const std::vector<DecodedMessage>* decoded_ = nullptr;
  const std::vector<Transaction>* transactions_ = nullptr;
  const std::vector<Transaction>* empty_transactions_ = nullptr;
  const std::vector<Standalone>* standalone_messages_ = nullptr;
};

TEST_P(GoldenStream, EveryMessageReencodesToTheRecordedBytes) {
  ASSERT_EQ(lines_->size(), 55u + 2 * ExpectedEmptyTransactions());
  for (size_t i = 0; i < lines_->size(); ++i) {
    EXPECT_EQ(Encode((*decoded_)[i]), (*lines_)[i].bytes) << "line " << (*lines_)[i].line_number;
  }
}

TEST_P(GoldenStream, DecodesIntoOneReusedMessage) {
  DecodedMessage out;
  for (const GoldenLine& line : *lines_) {
    Status s = Decode(line.bytes, &out);
    ASSERT_TRUE(s) << "line " << line.line_number << ": " << s.error().message;
    EXPECT_EQ(Encode(out), line.bytes) << "line " << line.line_number;
  }
}

TEST_P(GoldenStream, EveryTruncatedPrefixOfARealMessageIsAnError) {
  for (const GoldenLine& line : *lines_) {
    for (size_t len = 0; len < line.bytes.size(); ++len) {
      // Exactly `len` bytes on the heap: AddressSanitizer reports a read one past the end.
      std::unique_ptr<char[]> exact(new char[len]);
      std::memcpy(exact.get(), line.bytes.data(), len);
      DecodedMessage out;
      ASSERT_FALSE(Decode(std::string_view(exact.get(), len), &out))
          << "line " << line.line_number << ", prefix of " << len << " bytes";
    }
  }
}

TEST_P(GoldenStream, HasTheWorkloadsSequenceOfMessages) {
  std::string kinds;
  for (const Transaction& tx : *transactions_) kinds += tx.kinds + " ";
  // The rolled-back transaction and the rolled-back savepoint send nothing.
  EXPECT_EQ(kinds, "BRIC BIIIC BIC BIIC BRIC BMC BIC BUC BUC BDC BRUDC BYRIC BOIC BYRTC ");
  ASSERT_EQ(transactions_->size(), 14u);
  ASSERT_EQ(standalone_messages_->size(), 1u);
  // DDL transactions send nothing from 15 on; 14 sends them as an empty Begin/Commit.
  EXPECT_EQ(empty_transactions_->size(), ExpectedEmptyTransactions());
}

TEST_P(GoldenStream, EmptyTransactionsOf14StandInCommitOrder) {
  // 14's empty pairs are ordinary transactions to the decoder: Begin and Commit agree, and
  // they sit between their neighbours in commit order (the relay confirms past them).
  std::vector<const Transaction*> all;
  for (const Transaction& tx : *transactions_) all.push_back(&tx);
  for (const Transaction& tx : *empty_transactions_) all.push_back(&tx);
  std::sort(all.begin(), all.end(), [](const Transaction* a, const Transaction* b) {
    return a->begin_line->line_number < b->begin_line->line_number;
  });
  Lsn previous_end;
  for (const Transaction* tx : all) {
    ASSERT_NE(tx->commit, nullptr);
    EXPECT_EQ(tx->begin->final_lsn, tx->commit->commit_lsn);
    EXPECT_GT(tx->commit->commit_lsn, previous_end);
    previous_end = tx->commit->end_lsn;
  }
}

TEST_P(GoldenStream, BeginAndCommitAgreeOnLsnTimeAndXid) {
  Lsn previous_end;
  for (const Transaction& tx : *transactions_) {
    SCOPED_TRACE(
        fmt::format("transaction {} at line {}", tx.begin->xid, tx.begin_line->line_number));
    ASSERT_NE(tx.commit, nullptr);
    EXPECT_EQ(tx.begin->final_lsn, tx.commit->commit_lsn);
    EXPECT_GT(tx.commit->end_lsn, tx.commit->commit_lsn);
    EXPECT_EQ(tx.commit->flags, 0);
    EXPECT_EQ(tx.begin->commit_time, tx.commit->commit_time);
    EXPECT_EQ(tx.begin_line->xid, tx.begin->xid);
    // The SQL interface reports a commit at its end_lsn and a Begin at the transaction's
    // first change, which is at or before the commit record.
    EXPECT_EQ(tx.commit_line->lsn, tx.commit->end_lsn);
    EXPECT_LE(tx.begin_line->lsn, tx.begin->final_lsn);
    EXPECT_GT(tx.commit->commit_lsn, previous_end) << "commit order";
    previous_end = tx.commit->end_lsn;
  }
}

TEST_P(GoldenStream, FirstRelationDescribesTheSeedsOutboxTable) {
  ASSERT_EQ(Tx(0).relations.size(), 1u);
  const Relation& r = *Tx(0).relations[0];
  EXPECT_EQ(r.nspname, "public");
  EXPECT_EQ(r.relname, "outbox");
  EXPECT_EQ(r.replica_identity, 'd');
  EXPECT_THAT(ColumnNames(r), ElementsAre("offset_acked", "offset_consumed", "uuid", "created_at",
                                          "payload", "metadata", "transaction_id"));
  std::vector<Oid> types;
  std::vector<uint8_t> key_flags;
  for (const RelationColumn& c : r.columns) {
    types.push_back(c.type_oid);
    key_flags.push_back(c.flags);
  }
  EXPECT_THAT(types, ElementsAre(kInt8Oid, kInt8Oid, kVarcharOid, kTimestamptzOid, kJsonOid,
                                 kJsonOid, kXid8Oid));
  // The primary key (transaction_id, offset_consumed) is the default replica identity.
  EXPECT_THAT(key_flags, ElementsAre(0, 1, 0, 0, 0, 0, 1));
  EXPECT_EQ(r.columns[static_cast<size_t>(r.ColumnIndex("uuid"))].type_modifier, 36 + 4);
}

TEST_P(GoldenStream, OneRowTransaction) {
  const Transaction& tx = Tx(0);
  ASSERT_EQ(tx.changes.size(), 1u);
  const Change& c = tx.changes[0];
  EXPECT_EQ(InsertOf(c).relation_id, tx.relations[0]->relation_id);
  EXPECT_EQ(InsertText(c, "offset_acked"), "<null>");
  EXPECT_EQ(InsertText(c, "offset_consumed"), "1");
  EXPECT_EQ(InsertText(c, "uuid"), "01HZX3K4M5N6P7Q8R9S0T1V2W3");
  EXPECT_EQ(InsertText(c, "created_at"), "2024-05-01 12:00:00+00");
  EXPECT_EQ(InsertText(c, "payload"), R"({"review_id":"r-1","rating":5})");
  EXPECT_EQ(
      InsertText(c, "metadata"),
      R"({"Aggregate-Id":"review-1","Event-Type":"review.created","Source-Service":"review"})");
  // xid8 prints as the full transaction id; in a fresh cluster (epoch 0) that is the xid.
  EXPECT_EQ(InsertText(c, "transaction_id"), std::to_string(tx.begin->xid));
}

TEST_P(GoldenStream, ThreeRowTransactionWithNullPayloadAndMetadata) {
  const Transaction& tx = Tx(1);
  ASSERT_EQ(tx.changes.size(), 3u);
  EXPECT_EQ(InsertText(tx.changes[0], "uuid"), "01HZX3K4M5N6P7Q8R9S0T1V2W4");
  EXPECT_EQ(InsertText(tx.changes[0], "payload"), R"({"review_id":"r-2"})");
  EXPECT_EQ(InsertText(tx.changes[0], "metadata"), "<null>");
  EXPECT_EQ(InsertText(tx.changes[1], "uuid"), "01HZX3K4M5N6P7Q8R9S0T1V2W5");
  EXPECT_EQ(InsertText(tx.changes[1], "payload"), "<null>");
  EXPECT_EQ(InsertText(tx.changes[1], "metadata"), R"({"Event-Type":"review.deleted"})");
  EXPECT_EQ(InsertText(tx.changes[2], "uuid"), "01HZX3K4M5N6P7Q8R9S0T1V2W6");
  EXPECT_EQ(Value(tx.changes[2].relation, InsertOf(tx.changes[2]).new_tuple, "payload").kind,
            TupleValue::Kind::kNull);
  EXPECT_EQ(Value(tx.changes[2].relation, InsertOf(tx.changes[2]).new_tuple, "metadata").kind,
            TupleValue::Kind::kNull);
  // Insert order within the transaction.
  EXPECT_EQ(InsertText(tx.changes[0], "offset_consumed"), "2");
  EXPECT_EQ(InsertText(tx.changes[2], "offset_consumed"), "4");
}

TEST_P(GoldenStream, UnicodeMetadataArrivesAsUtf8Bytes) {
  const Transaction& tx = Tx(2);
  ASSERT_EQ(tx.changes.size(), 1u);
  EXPECT_EQ(InsertText(tx.changes[0], "payload"), R"({"text":"Отличное кафе ☕"})");
  EXPECT_EQ(InsertText(tx.changes[0], "metadata"),
            R"({"Event-Type":"review.created","Source-Service":"отзывы","Title":"café ☕ 😀"})");
}

TEST_P(GoldenStream, RolledBackTransactionsAndSavepointsNeverAppear) {
  for (const GoldenLine& line : *lines_) {
    EXPECT_EQ(line.bytes.find("ROLLED-BACK"), std::string::npos) << "line " << line.line_number;
    EXPECT_EQ(line.bytes.find("phantom"), std::string::npos) << "line " << line.line_number;
  }
  const Transaction& tx = Tx(3);
  ASSERT_EQ(tx.changes.size(), 2u);
  EXPECT_EQ(InsertText(tx.changes[0], "uuid"), "01HZX3K4M5N6P7Q8R9S0T1V2W8");
  EXPECT_EQ(InsertText(tx.changes[1], "uuid"), "01HZX3K4M5N6P7Q8R9S0T1V2W9");
}

TEST_P(GoldenStream, AddedColumnResendsTheRelation) {
  const Transaction& tx = Tx(4);
  ASSERT_EQ(tx.relations.size(), 1u);
  const Relation& r = *tx.relations[0];
  EXPECT_EQ(r.relation_id, Tx(0).relations[0]->relation_id);
  ASSERT_EQ(r.columns.size(), 8u);
  EXPECT_EQ(r.columns.back().name, "trace_id");
  EXPECT_EQ(r.columns.back().type_oid, kTextOid);
  EXPECT_EQ(r.ColumnIndex("trace_id"), 7);
  EXPECT_EQ(r.ColumnIndex("uuid"), 2);  // existing columns keep their place
  ASSERT_EQ(tx.changes.size(), 1u);
  EXPECT_EQ(InsertOf(tx.changes[0]).new_tuple.values.size(), 8u);
  EXPECT_EQ(InsertText(tx.changes[0], "trace_id"),
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01");
}

TEST_P(GoldenStream, LogicalMessagesTransactionalAndNot) {
  const Transaction& tx = Tx(5);
  ASSERT_EQ(tx.messages.size(), 1u);
  const Message& m = *tx.messages[0];
  EXPECT_EQ(m.flags, 1);  // transactional
  EXPECT_EQ(m.prefix, "prefix");
  EXPECT_EQ(m.content, "content");
  // Message.lsn is the end of the message's WAL record; with nothing else in the transaction
  // that is where its commit record starts.
  EXPECT_EQ(m.lsn, tx.begin->final_lsn);

  const Standalone& s = standalone_messages_->at(0);
  EXPECT_EQ(s.message->flags, 0);
  EXPECT_EQ(s.message->prefix, "outbox-relay");
  EXPECT_EQ(s.message->content, "heartbeat");
  EXPECT_EQ(s.message->lsn, s.line->lsn);
  EXPECT_EQ(s.line->xid, 0u);
  // It was emitted after transaction 6 committed and before transaction 7.
  EXPECT_GT(s.message->lsn, Tx(5).commit->end_lsn);
  EXPECT_LT(s.message->lsn, Tx(6).begin->final_lsn);
}

TEST_P(GoldenStream, UpdateOfAToastedRowSendsItsPayloadAsUnchanged) {
  const Transaction& insert = Tx(6);
  ASSERT_EQ(insert.changes.size(), 1u);
  std::string payload = InsertText(insert.changes[0], "payload");
  EXPECT_THAT(payload, StartsWith(R"({"blob" : ")"));
  EXPECT_GT(payload.size(), 2048u);  // stored out of line

  const Transaction& update = Tx(7);
  ASSERT_EQ(update.changes.size(), 1u);
  const Update& u = UpdateOf(update.changes[0]);
  const Relation& rel = update.changes[0].relation;
  EXPECT_FALSE(u.old_tuple.has_value());  // no key column changed
  EXPECT_EQ(Value(rel, u.new_tuple, "payload").kind, TupleValue::Kind::kUnchangedToast);
  EXPECT_EQ(Text(rel, u.new_tuple, "uuid"), "01HZX3K4M5N6P7Q8R9S0T1V2WB");
  EXPECT_EQ(Text(rel, u.new_tuple, "offset_acked"), Text(rel, u.new_tuple, "offset_consumed"));
}

TEST_P(GoldenStream, UpdateOfAKeyColumnSendsTheOldKey) {
  const Transaction& tx = Tx(8);
  ASSERT_EQ(tx.changes.size(), 1u);
  const Update& u = UpdateOf(tx.changes[0]);
  const Relation& rel = tx.changes[0].relation;
  ASSERT_TRUE(u.old_tuple.has_value());
  EXPECT_TRUE(u.old_is_key);
  EXPECT_EQ(Text(rel, *u.old_tuple, "offset_consumed"), "1");
  EXPECT_EQ(Text(rel, *u.old_tuple, "transaction_id"), std::to_string(Tx(0).begin->xid));
  EXPECT_EQ(Text(rel, *u.old_tuple, "uuid"), "<null>");  // not part of the key
  EXPECT_EQ(Text(rel, u.new_tuple, "offset_consumed"), "1001");
  EXPECT_EQ(Text(rel, u.new_tuple, "uuid"), "01HZX3K4M5N6P7Q8R9S0T1V2W3");
}

TEST_P(GoldenStream, DeleteWithDefaultReplicaIdentitySendsTheKeyOnly) {
  const Transaction& tx = Tx(9);
  ASSERT_EQ(tx.changes.size(), 1u);
  const Delete& d = DeleteOf(tx.changes[0]);
  const Relation& rel = tx.changes[0].relation;
  EXPECT_TRUE(d.old_is_key);
  EXPECT_EQ(Text(rel, d.old_tuple, "offset_consumed"), "2");
  EXPECT_EQ(Text(rel, d.old_tuple, "transaction_id"), std::to_string(Tx(1).begin->xid));
  EXPECT_EQ(Text(rel, d.old_tuple, "uuid"), "<null>");
}

TEST_P(GoldenStream, ReplicaIdentityFullSendsOldTuples) {
  const Transaction& tx = Tx(10);
  ASSERT_EQ(tx.relations.size(), 1u);
  EXPECT_EQ(tx.relations[0]->replica_identity, 'f');
  for (const RelationColumn& c : tx.relations[0]->columns) EXPECT_EQ(c.flags, 1) << c.name;

  ASSERT_EQ(tx.changes.size(), 2u);
  const Update& u = UpdateOf(tx.changes[0]);
  const Relation& rel = tx.changes[0].relation;
  ASSERT_TRUE(u.old_tuple.has_value());
  EXPECT_FALSE(u.old_is_key);
  EXPECT_EQ(Text(rel, *u.old_tuple, "uuid"), "01HZX3K4M5N6P7Q8R9S0T1V2W5");
  EXPECT_EQ(Text(rel, *u.old_tuple, "offset_acked"), "<null>");
  EXPECT_EQ(Text(rel, u.new_tuple, "offset_acked"), "42");

  const Delete& d = DeleteOf(tx.changes[1]);
  EXPECT_FALSE(d.old_is_key);
  EXPECT_EQ(Text(rel, d.old_tuple, "uuid"), "01HZX3K4M5N6P7Q8R9S0T1V2W6");
  EXPECT_EQ(Text(rel, d.old_tuple, "payload"), "<null>");
  EXPECT_EQ(Text(rel, d.old_tuple, "metadata"), "<null>");
}

TEST_P(GoldenStream, UserDefinedTypeIsAnnouncedBeforeTheRelationThatUsesIt) {
  const Transaction& tx = Tx(11);
  ASSERT_EQ(tx.types.size(), 1u);
  const Type& t = *tx.types[0];
  EXPECT_EQ(t.nspname, "public");
  EXPECT_EQ(t.typname, "outbox_kind");
  ASSERT_EQ(tx.relations.size(), 1u);
  const Relation& r = *tx.relations[0];
  ASSERT_EQ(r.columns.size(), 9u);
  EXPECT_EQ(r.columns.back().name, "kind");
  EXPECT_EQ(r.columns.back().type_oid, t.type_oid);
  ASSERT_EQ(tx.changes.size(), 1u);
  EXPECT_EQ(InsertText(tx.changes[0], "kind"), "command");
  EXPECT_EQ(InsertText(tx.changes[0], "trace_id"), "<null>");
}

TEST_P(GoldenStream, ReplicationOriginIsSentAfterBegin) {
  const Transaction& tx = Tx(12);
  EXPECT_EQ(tx.kinds, "BOIC");
  ASSERT_EQ(tx.origins.size(), 1u);
  EXPECT_EQ(tx.origins[0]->name, "fixture_origin");
  EXPECT_EQ(tx.origins[0]->origin_lsn.ToString(), "0/1234ABCD");
  // pg_replication_origin_xact_setup also sets the commit timestamp.
  EXPECT_EQ(tx.begin->commit_time.micros, kOriginCommitTime);
  ASSERT_EQ(tx.changes.size(), 1u);
  EXPECT_EQ(InsertText(tx.changes[0], "uuid"), "01HZX3K4M5N6P7Q8R9S0T1V2WD");
}

TEST_P(GoldenStream, TruncateRestartIdentity) {
  const Transaction& tx = Tx(13);
  ASSERT_EQ(tx.changes.size(), 1u);
  const Truncate& t = std::get<Truncate>(*tx.changes[0].message);
  EXPECT_EQ(t.options, 2);  // RESTART IDENTITY, no CASCADE
  EXPECT_THAT(t.relation_ids, ElementsAre(Tx(0).relations[0]->relation_id));
}

TEST_P(GoldenStream, EveryTupleHasAValueForEveryColumnOfItsRelation) {
  for (const Transaction& tx : *transactions_) {
    for (const Change& c : tx.changes) {
      const DecodedMessage& m = *c.message;
      size_t ncols = c.relation.columns.size();
      if (const auto* i = std::get_if<Insert>(&m)) {
        EXPECT_EQ(i->new_tuple.values.size(), ncols);
      }
      if (const auto* u = std::get_if<Update>(&m)) {
        EXPECT_EQ(u->new_tuple.values.size(), ncols);
        if (u->old_tuple) {
          EXPECT_EQ(u->old_tuple->values.size(), ncols);
        }
      }
      if (const auto* d = std::get_if<Delete>(&m)) {
        EXPECT_EQ(d->old_tuple.values.size(), ncols);
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(PostgreSQL, GoldenStream, ::testing::Values(14, 15, 16, 17, 18),
                         [](const ::testing::TestParamInfo<int>& param) {
                           return "pg" + std::to_string(param.param);
                         });

}  // namespace
}  // namespace outbox_relay::pgoutput
