// pgoutput, logical replication protocol version 1: one message per XLogData payload.
//
// All integers are big-endian. String = bytes up to a NUL, which is consumed and not part of
// the value. Names in <> are PostgreSQL's own field names.
//
//   message     := begin | commit | origin | relation | type | insert | update | delete
//                | truncate | logical_msg
//   begin       := 'B' <final_lsn>:Int64 <commit_time>:Int64 <xid>:Int32
//   commit      := 'C' <flags>:Int8 <commit_lsn>:Int64 <end_lsn>:Int64 <commit_time>:Int64
//   origin      := 'O' <origin_lsn>:Int64 <name>:String
//   relation    := 'R' <relid>:Int32 <nspname>:String <relname>:String <replident>:Int8
//                  <ncols>:Int16 column{ncols}
//   column      := <flags>:Int8 <name>:String <type_oid>:Int32 <typmod>:Int32
//   type        := 'Y' <type_oid>:Int32 <nspname>:String <typname>:String
//   insert      := 'I' <relid>:Int32 'N' tuple
//   update      := 'U' <relid>:Int32 [('K' | 'O') tuple] 'N' tuple
//   delete      := 'D' <relid>:Int32 ('K' | 'O') tuple
//   truncate    := 'T' <nrelids>:Int32 <options>:Int8 <relid>:Int32{nrelids}
//   logical_msg := 'M' <flags>:Int8 <lsn>:Int64 <prefix>:String <length>:Int32 Byte{length}
//   tuple       := <ncols>:Int16 value{ncols}
//   value       := 'n'                              SQL NULL
//                | 'u'                              unchanged TOASTed value, not sent
//                | 't' <length>:Int32 Byte{length}  the type's text output
//
// Everything else is an error, because a relay that guesses at bytes it does not understand
// can publish garbage or skip rows:
//   - 'b' (binary value) exists only with protocol version 2+ and the binary option;
//   - 'S' 'E' 'c' 'A' (streaming, v2+) and 'b' 'P' 'K' 'r' 'p' (two-phase, v3) message types,
//     and any other leading byte;
//   - bytes after a complete message (one XLogData carries exactly one message);
//   - negative lengths and counts, and counts larger than the bytes left could hold;
//   - a Commit whose flags are not 0 and a Begin without final_lsn (PostgreSQL's own reader
//     rejects both).
// Strings are taken as they are: an empty namespace means pg_catalog, as PostgreSQL writes it.
//
// Errors are kProtocol with "<message type>: <field> at byte <offset>: <what>", tuple columns
// numbered from 0 as in Relation::columns. Decoding is exact: whatever Decode accepts, Encode
// turns back into the same bytes (the tests hold it to that).
#include "outbox_relay/pgoutput/decoder.h"

#include <utility>

#include "outbox_relay/core/bytes.h"

namespace outbox_relay::pgoutput {

namespace {

// "'X' (0x58)" for a printable byte, "0x07" otherwise: readable in a log line either way.
std::string DescribeByte(uint8_t b) {
  if (b >= 0x20 && b < 0x7f) return fmt::format("'{}' (0x{:02X})", static_cast<char>(b), b);
  return fmt::format("0x{:02X}", b);
}

// A ByteReader that remembers the first failure together with where we were in the message
// (which message type, which tuple, which column). The context is only formatted when an
// error happens, so the success path builds no strings.
class Reader {
 public:
  explicit Reader(std::string_view data) : in_(data) {}

  void set_message(std::string_view message) { message_ = message; }
  void EnterTuple(std::string_view tuple) {
    tuple_ = tuple;
    column_ = -1;
  }
  void set_column(int column) { column_ = column; }
  void LeaveTuple() {
    tuple_ = {};
    column_ = -1;
  }

  size_t offset() const { return in_.offset(); }
  size_t remaining() const { return in_.remaining(); }
  bool empty() const { return in_.empty(); }

  bool U8(std::string_view field, uint8_t* v) { return Take(in_.U8(field), v); }
  bool I16(std::string_view field, int16_t* v) { return Take(in_.I16(field), v); }
  bool I32(std::string_view field, int32_t* v) { return Take(in_.I32(field), v); }
  bool U32(std::string_view field, uint32_t* v) { return Take(in_.U32(field), v); }
  bool I64(std::string_view field, int64_t* v) { return Take(in_.I64(field), v); }
  bool ReadLsn(std::string_view field, Lsn* v) {
    uint64_t raw = 0;
    if (!Take(in_.U64(field), &raw)) return false;
    *v = Lsn(raw);
    return true;
  }
  bool Bytes(size_t n, std::string_view field, std::string_view* v) {
    return Take(in_.Bytes(n, field), v);
  }
  bool CString(std::string_view field, std::string_view* v) { return Take(in_.CString(field), v); }
  // Reads a CString into an owned string, reusing its capacity.
  bool CString(std::string_view field, std::string* v) {
    std::string_view view;
    if (!CString(field, &view)) return false;
    v->assign(view);
    return true;
  }

  // A value that was read fine but violates the grammar. `at` is the offset where it starts.
  template <typename... Args>
  bool Invalid(size_t at, std::string_view field, fmt::format_string<Args...> what,
               Args&&... args) {
    Record(fmt::format("{} at byte {}: {}", field, at,
                       fmt::format(what, std::forward<Args>(args)...)));
    return false;
  }

  // Fails when bytes are left over after a complete message.
  bool ExpectEnd() {
    if (in_.empty()) return true;
    return Invalid(in_.offset(), "end of message", "{} trailing bytes after a complete message",
                   in_.remaining());
  }

  std::unexpected<Error> error() const { return std::unexpected(error_); }

 private:
  template <typename T, typename U>
  bool Take(Result<U> r, T* out) {
    if (!r) [[unlikely]] {
      Record(r.error().message);
      return false;
    }
    *out = static_cast<T>(*r);
    return true;
  }

  // Cold and out of line, so that the reads on the success path stay small enough to inline.
  [[gnu::cold, gnu::noinline]] void Record(std::string_view detail) {
    std::string where;
    if (!message_.empty()) where = fmt::format("{}: ", message_);
    if (!tuple_.empty()) {
      where += tuple_;
      where += ' ';
      if (column_ >= 0) where += fmt::format("column {} ", column_);
    }
    error_ = Error{ErrorCode::kProtocol, where + std::string(detail)};
  }

  ByteReader in_;
  std::string_view message_;
  std::string_view tuple_;
  int column_ = -1;
  Error error_{ErrorCode::kProtocol, {}};
};

// Returns the alternative T of *out, creating it only when *out holds another one, so that
// a decoder reusing one DecodedMessage keeps the vectors and strings it already allocated.
template <typename T>
T& Reuse(DecodedMessage* out) {
  if (T* existing = std::get_if<T>(out)) return *existing;
  return out->emplace<T>();
}

// A count read from the wire, checked against the bytes left: each element takes at least
// `min_size` bytes, so a larger count is corrupt. Checking before the loop also keeps a
// corrupt count from reserving memory.
bool CheckCount(Reader& r, size_t at, std::string_view field, int64_t count, size_t min_size) {
  if (count < 0) return r.Invalid(at, field, "negative count {}", count);
  if (static_cast<uint64_t>(count) > r.remaining() / min_size) {
    return r.Invalid(at, field, "count {} needs at least {} bytes, {} left", count,
                     static_cast<uint64_t>(count) * min_size, r.remaining());
  }
  return true;
}

// The per-column loop is the decoder's hot path. Flattening inlines the ByteReader calls into
// it, which GCC's -O2 heuristics do not: ~1200 -> ~680 instructions for a 7-column outbox row
// (callgrind).
[[gnu::flatten]] bool ReadTuple(Reader& r, std::string_view name, TupleData* tuple) {
  r.EnterTuple(name);
  size_t at = r.offset();
  int16_t ncols = 0;
  if (!r.I16("column count", &ncols)) return false;
  if (!CheckCount(r, at, "column count", ncols, 1)) return false;
  // resize() within the capacity neither allocates nor frees: the steady state (the same
  // table, row after row) allocates nothing here.
  tuple->values.resize(static_cast<size_t>(ncols));
  for (int i = 0; i < ncols; ++i) {
    r.set_column(i);
    TupleValue& value = tuple->values[static_cast<size_t>(i)];
    size_t kind_at = r.offset();
    uint8_t kind = 0;
    if (!r.U8("kind", &kind)) return false;
    switch (kind) {
      case 'n':
        value = {TupleValue::Kind::kNull, {}};
        break;
      case 'u':
        value = {TupleValue::Kind::kUnchangedToast, {}};
        break;
      case 't': {
        size_t len_at = r.offset();
        int32_t len = 0;
        if (!r.I32("length", &len)) return false;
        if (len < 0) return r.Invalid(len_at, "length", "negative length {}", len);
        value.kind = TupleValue::Kind::kText;
        if (!r.Bytes(static_cast<size_t>(len), "text", &value.text)) return false;
        break;
      }
      case 'b':
        return r.Invalid(kind_at, "kind",
                         "binary value 'b' needs protocol version 2+ with binary 'true'; this "
                         "decoder speaks version 1 (text values only)");
      default:
        return r.Invalid(kind_at, "kind", "unknown value kind {} (expected 'n', 'u' or 't')",
                         DescribeByte(kind));
    }
  }
  r.LeaveTuple();
  return true;
}

// Reads the one-byte tuple marker that precedes a TupleData ('N', 'K' or 'O').
bool ReadMarker(Reader& r, uint8_t* marker, size_t* at) {
  *at = r.offset();
  return r.U8("tuple marker", marker);
}

bool DecodeBegin(Reader& r, Begin* m) {
  size_t at = r.offset();
  if (!r.ReadLsn("final_lsn", &m->final_lsn) || !r.I64("commit_time", &m->commit_time.micros) ||
      !r.U32("xid", &m->xid)) {
    return false;
  }
  if (!m->final_lsn.valid()) return r.Invalid(at, "final_lsn", "not set (0/0)");
  return true;
}

bool DecodeCommit(Reader& r, Commit* m) {
  size_t at = r.offset();
  if (!r.U8("flags", &m->flags)) return false;
  if (m->flags != 0) return r.Invalid(at, "flags", "unrecognized flags 0x{:02X}", m->flags);
  return r.ReadLsn("commit_lsn", &m->commit_lsn) && r.ReadLsn("end_lsn", &m->end_lsn) &&
         r.I64("commit_time", &m->commit_time.micros);
}

bool DecodeOrigin(Reader& r, Origin* m) {
  return r.ReadLsn("origin_lsn", &m->origin_lsn) && r.CString("name", &m->name);
}

bool DecodeRelation(Reader& r, Relation* m) {
  if (!r.U32("relation id", &m->relation_id) || !r.CString("namespace", &m->nspname) ||
      !r.CString("relation name", &m->relname) || !r.U8("replica identity", &m->replica_identity)) {
    return false;
  }
  size_t at = r.offset();
  int16_t ncols = 0;
  if (!r.I16("column count", &ncols)) return false;
  // flags + name's NUL + type oid + typmod
  if (!CheckCount(r, at, "column count", ncols, 1 + 1 + 4 + 4)) return false;
  // resize() keeps the existing columns' strings, so their capacity is reused too.
  m->columns.resize(static_cast<size_t>(ncols));
  for (int i = 0; i < ncols; ++i) {
    RelationColumn& c = m->columns[static_cast<size_t>(i)];
    if (!r.U8("column flags", &c.flags) || !r.CString("column name", &c.name) ||
        !r.U32("column type oid", &c.type_oid) ||
        !r.I32("column type modifier", &c.type_modifier)) {
      return false;
    }
  }
  return true;
}

bool DecodeType(Reader& r, Type* m) {
  return r.U32("type oid", &m->type_oid) && r.CString("namespace", &m->nspname) &&
         r.CString("type name", &m->typname);
}

bool DecodeInsert(Reader& r, Insert* m) {
  if (!r.U32("relation id", &m->relation_id)) return false;
  uint8_t marker = 0;
  size_t at = 0;
  if (!ReadMarker(r, &marker, &at)) return false;
  if (marker != 'N') {
    return r.Invalid(at, "tuple marker", "expected 'N', got {}", DescribeByte(marker));
  }
  return ReadTuple(r, "new tuple", &m->new_tuple);
}

bool DecodeUpdate(Reader& r, Update* m) {
  if (!r.U32("relation id", &m->relation_id)) return false;
  uint8_t marker = 0;
  size_t at = 0;
  if (!ReadMarker(r, &marker, &at)) return false;
  if (marker == 'K' || marker == 'O') {
    m->old_is_key = marker == 'K';
    if (!m->old_tuple) m->old_tuple.emplace();
    if (!ReadTuple(r, m->old_is_key ? "key tuple" : "old tuple", &*m->old_tuple)) return false;
    if (!ReadMarker(r, &marker, &at)) return false;
  } else {
    m->old_tuple.reset();
    m->old_is_key = false;
  }
  if (marker != 'N') {
    return r.Invalid(at, "tuple marker", "expected {}'N', got {}",
                     m->old_tuple ? "" : "'K', 'O' or ", DescribeByte(marker));
  }
  return ReadTuple(r, "new tuple", &m->new_tuple);
}

bool DecodeDelete(Reader& r, Delete* m) {
  if (!r.U32("relation id", &m->relation_id)) return false;
  uint8_t marker = 0;
  size_t at = 0;
  if (!ReadMarker(r, &marker, &at)) return false;
  if (marker != 'K' && marker != 'O') {
    return r.Invalid(at, "tuple marker", "expected 'K' or 'O', got {}", DescribeByte(marker));
  }
  m->old_is_key = marker == 'K';
  return ReadTuple(r, m->old_is_key ? "key tuple" : "old tuple", &m->old_tuple);
}

bool DecodeTruncate(Reader& r, Truncate* m) {
  size_t at = r.offset();
  int32_t nrelids = 0;
  if (!r.I32("relation count", &nrelids) || !r.U8("options", &m->options)) return false;
  if (!CheckCount(r, at, "relation count", nrelids, 4)) return false;
  m->relation_ids.clear();
  m->relation_ids.reserve(static_cast<size_t>(nrelids));
  for (int32_t i = 0; i < nrelids; ++i) {
    Oid relid = 0;
    if (!r.U32("relation id", &relid)) return false;
    m->relation_ids.push_back(relid);
  }
  return true;
}

bool DecodeMessage(Reader& r, Message* m) {
  if (!r.U8("flags", &m->flags) || !r.ReadLsn("lsn", &m->lsn) || !r.CString("prefix", &m->prefix)) {
    return false;
  }
  size_t at = r.offset();
  int32_t len = 0;
  if (!r.I32("content length", &len)) return false;
  if (len < 0) return r.Invalid(at, "content length", "negative length {}", len);
  return r.Bytes(static_cast<size_t>(len), "content", &m->content);
}

// Message types pgoutput sends only with features this v1 decoder does not speak; naming
// them turns "unknown byte" into "you started replication with the wrong options".
std::string_view NewerMessageName(uint8_t type) {
  switch (type) {
    case 'S':
      return "Stream Start (protocol version 2+, streaming)";
    case 'E':
      return "Stream Stop (protocol version 2+, streaming)";
    case 'c':
      return "Stream Commit (protocol version 2+, streaming)";
    case 'A':
      return "Stream Abort (protocol version 2+, streaming)";
    case 'b':
      return "Begin Prepare (protocol version 3, two_phase)";
    case 'P':
      return "Prepare (protocol version 3, two_phase)";
    case 'K':
      return "Commit Prepared (protocol version 3, two_phase)";
    case 'r':
      return "Rollback Prepared (protocol version 3, two_phase)";
    case 'p':
      return "Stream Prepare (protocol version 3, two_phase)";
    default:
      return {};
  }
}

}  // namespace

Status Decode(std::string_view data, DecodedMessage* out) {
  Reader r(data);
  uint8_t type = 0;
  if (!r.U8("message type", &type)) return r.error();
  bool ok = false;
  switch (type) {
    case 'B':
      r.set_message("Begin");
      ok = DecodeBegin(r, &Reuse<Begin>(out));
      break;
    case 'C':
      r.set_message("Commit");
      ok = DecodeCommit(r, &Reuse<Commit>(out));
      break;
    case 'O':
      r.set_message("Origin");
      ok = DecodeOrigin(r, &Reuse<Origin>(out));
      break;
    case 'R':
      r.set_message("Relation");
      ok = DecodeRelation(r, &Reuse<Relation>(out));
      break;
    case 'Y':
      r.set_message("Type");
      ok = DecodeType(r, &Reuse<Type>(out));
      break;
    case 'I':
      r.set_message("Insert");
      ok = DecodeInsert(r, &Reuse<Insert>(out));
      break;
    case 'U':
      r.set_message("Update");
      ok = DecodeUpdate(r, &Reuse<Update>(out));
      break;
    case 'D':
      r.set_message("Delete");
      ok = DecodeDelete(r, &Reuse<Delete>(out));
      break;
    case 'T':
      r.set_message("Truncate");
      ok = DecodeTruncate(r, &Reuse<Truncate>(out));
      break;
    case 'M':
      r.set_message("Message");
      ok = DecodeMessage(r, &Reuse<Message>(out));
      break;
    default:
      if (std::string_view newer = NewerMessageName(type); !newer.empty()) {
        r.Invalid(0, "message type", "{} is {}; this decoder speaks protocol version 1",
                  DescribeByte(type), newer);
      } else {
        r.Invalid(0, "message type", "unknown message type {}", DescribeByte(type));
      }
      return r.error();
  }
  if (!ok || !r.ExpectEnd()) return r.error();
  return Ok();
}

namespace {

void EncodeTuple(ByteWriter& w, const TupleData& tuple) {
  w.I16(static_cast<int16_t>(tuple.values.size()));
  for (const TupleValue& v : tuple.values) {
    w.U8(static_cast<uint8_t>(v.kind));
    if (v.kind == TupleValue::Kind::kText) {
      w.I32(static_cast<int32_t>(v.text.size()));
      w.Bytes(v.text);
    }
  }
}

struct Encoder {
  ByteWriter& w;

  void operator()(const Begin& m) {
    w.U8('B');
    w.U64(m.final_lsn.value());
    w.I64(m.commit_time.micros);
    w.U32(m.xid);
  }
  void operator()(const Commit& m) {
    w.U8('C');
    w.U8(m.flags);
    w.U64(m.commit_lsn.value());
    w.U64(m.end_lsn.value());
    w.I64(m.commit_time.micros);
  }
  void operator()(const Origin& m) {
    w.U8('O');
    w.U64(m.origin_lsn.value());
    w.CString(m.name);
  }
  void operator()(const Relation& m) {
    w.U8('R');
    w.U32(m.relation_id);
    w.CString(m.nspname);
    w.CString(m.relname);
    w.U8(m.replica_identity);
    w.I16(static_cast<int16_t>(m.columns.size()));
    for (const RelationColumn& c : m.columns) {
      w.U8(c.flags);
      w.CString(c.name);
      w.U32(c.type_oid);
      w.I32(c.type_modifier);
    }
  }
  void operator()(const Type& m) {
    w.U8('Y');
    w.U32(m.type_oid);
    w.CString(m.nspname);
    w.CString(m.typname);
  }
  void operator()(const Insert& m) {
    w.U8('I');
    w.U32(m.relation_id);
    w.U8('N');
    EncodeTuple(w, m.new_tuple);
  }
  void operator()(const Update& m) {
    w.U8('U');
    w.U32(m.relation_id);
    if (m.old_tuple) {
      w.U8(m.old_is_key ? 'K' : 'O');
      EncodeTuple(w, *m.old_tuple);
    }
    w.U8('N');
    EncodeTuple(w, m.new_tuple);
  }
  void operator()(const Delete& m) {
    w.U8('D');
    w.U32(m.relation_id);
    w.U8(m.old_is_key ? 'K' : 'O');
    EncodeTuple(w, m.old_tuple);
  }
  void operator()(const Truncate& m) {
    w.U8('T');
    w.I32(static_cast<int32_t>(m.relation_ids.size()));
    w.U8(m.options);
    for (Oid relid : m.relation_ids) w.U32(relid);
  }
  void operator()(const Message& m) {
    w.U8('M');
    w.U8(m.flags);
    w.U64(m.lsn.value());
    w.CString(m.prefix);
    w.I32(static_cast<int32_t>(m.content.size()));
    w.Bytes(m.content);
  }
};

}  // namespace

std::string Encode(const DecodedMessage& message) {
  std::string out;
  ByteWriter w(&out);
  std::visit(Encoder{w}, message);
  return out;
}

int Relation::ColumnIndex(std::string_view name) const {
  for (size_t i = 0; i < columns.size(); ++i) {
    if (columns[i].name == name) return static_cast<int>(i);
  }
  return -1;
}

void RelationCache::Put(Relation relation) {
  Oid relation_id = relation.relation_id;
  relations_.insert_or_assign(relation_id, std::move(relation));
}

const Relation* RelationCache::Find(Oid relation_id) const {
  auto it = relations_.find(relation_id);
  return it == relations_.end() ? nullptr : &it->second;
}

}  // namespace outbox_relay::pgoutput
