// pgoutput logical replication messages, protocol version 1.
//
// Field names follow PostgreSQL's own (src/include/replication/logicalproto.h,
// "Logical Replication Message Formats" in the manual). Views (`std::string_view`)
// point into the buffer that was decoded; they are valid only as long as that
// buffer is. Nothing here knows about libpq.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "outbox_relay/core/lsn.h"
#include "outbox_relay/core/pg_time.h"

namespace outbox_relay::pgoutput {

using Oid = uint32_t;
using Xid = uint32_t;  // the 32-bit xid that pgoutput sends

// 'B'
struct Begin {
  Lsn final_lsn;  // LSN of the commit record of this transaction
  PgTimestamp commit_time;
  Xid xid = 0;
};

// 'C'
struct Commit {
  uint8_t flags = 0;
  Lsn commit_lsn;  // LSN of the commit record (equals Begin.final_lsn)
  Lsn end_lsn;     // end of the commit record: where the next transaction may start
  PgTimestamp commit_time;
};

// 'O'
struct Origin {
  Lsn origin_lsn;
  std::string_view name;
};

struct RelationColumn {
  uint8_t flags = 0;  // 1 = part of the replica identity key
  std::string name;
  Oid type_oid = 0;
  int32_t type_modifier = -1;
};

// 'R'. Owned strings: a relation outlives the buffer it was decoded from
// (it goes into the RelationCache).
struct Relation {
  Oid relation_id = 0;
  std::string nspname;
  std::string relname;
  uint8_t replica_identity = 0;
  std::vector<RelationColumn> columns;

  // Index of the column called `name`, or -1.
  int ColumnIndex(std::string_view name) const;
};

// 'Y'
struct Type {
  Oid type_oid = 0;
  std::string_view nspname;
  std::string_view typname;
};

// One column of a TupleData.
struct TupleValue {
  enum class Kind : uint8_t { kNull = 'n', kUnchangedToast = 'u', kText = 't' };
  Kind kind = Kind::kNull;
  std::string_view text;  // set when kind == kText
};

struct TupleData {
  std::vector<TupleValue> values;
};

// 'I'
struct Insert {
  Oid relation_id = 0;
  TupleData new_tuple;
};

// 'U'
struct Update {
  Oid relation_id = 0;
  std::optional<TupleData> old_tuple;  // 'K' (key) or 'O' (old) when sent
  bool old_is_key = false;
  TupleData new_tuple;
};

// 'D'
struct Delete {
  Oid relation_id = 0;
  TupleData old_tuple;
  bool old_is_key = false;
};

// 'T'
struct Truncate {
  uint8_t options = 0;  // 1 = CASCADE, 2 = RESTART IDENTITY
  std::vector<Oid> relation_ids;
};

// 'M' (pg_logical_emit_message)
struct Message {
  uint8_t flags = 0;  // 1 = transactional
  Lsn lsn;
  std::string_view prefix;
  std::string_view content;
};

using DecodedMessage =
    std::variant<Begin, Commit, Origin, Relation, Type, Insert, Update, Delete, Truncate, Message>;

}  // namespace outbox_relay::pgoutput
