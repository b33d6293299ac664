#include "outbox_relay/pipeline/kafka_progress.h"

#include <simdjson.h>

#include <algorithm>
#include <charconv>

#include "outbox_relay/core/json.h"

namespace outbox_relay::pipeline {

namespace {

std::string Quoted(std::string_view text) {
  std::string out = "\"";
  AppendJsonEscaped(text, out);
  out += '"';
  return out;
}

template <typename T>
Result<T> Number(std::string_view text, std::string_view field) {
  T v{};
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (text.empty() || ec != std::errc() || end != text.data() + text.size()) {
    return Fail(ErrorCode::kInvalidArgument, "progress: {} '{}' is not a number", field, text);
  }
  return v;
}

// A run as the differences from the one before it (HeldRows::Encode).
struct Delta {
  int64_t lsn = 0, xid = 0, first = 0, len = 0;
  bool operator==(const Delta&) const = default;
};

Delta DeltaOf(const HeldRun& r, const HeldRun& prev) {
  return Delta{static_cast<int64_t>(r.final_lsn.value() - prev.final_lsn.value()),
               static_cast<int64_t>(r.transaction_id - prev.transaction_id), r.first - prev.last,
               r.last - r.first};
}

HeldRun Apply(const Delta& d, const HeldRun& prev) {
  HeldRun r;
  r.final_lsn = Lsn(prev.final_lsn.value() + static_cast<uint64_t>(d.lsn));
  r.transaction_id = prev.transaction_id + static_cast<uint64_t>(d.xid);
  r.first = prev.last + d.first;
  r.last = r.first + d.len;
  return r;
}

bool Less(const HeldRun& a, const HeldRun& b) {
  return a.transaction_id != b.transaction_id ? a.transaction_id < b.transaction_id
                                              : a.first < b.first;
}

}  // namespace

std::string RelayIdentity::ToString() const {
  return fmt::format("system {}, database {}, slot {}", system_id, database, slot);
}

void HeldRows::Add(HeldRun run) {
  if (!runs_.empty()) {
    HeldRun& back = runs_.back();
    // The next row of the same run (a transaction read row by row).
    if (back.final_lsn == run.final_lsn && back.transaction_id == run.transaction_id &&
        back.last + 1 == run.first) {
      back.last = run.last;
      indexed_ = false;
      return;
    }
  }
  if (runs_.size() >= kMaxRuns) return;  // forgotten: published again at worst, never lost
  runs_.push_back(run);
  indexed_ = false;
}

void HeldRows::Clear() {
  runs_.clear();
  sorted_.clear();
  indexed_ = false;
}

void HeldRows::KeepBelow(Lsn lsn) {
  std::erase_if(runs_, [&](const HeldRun& r) { return r.final_lsn >= lsn; });
  indexed_ = false;
}

Lsn HeldRows::max_lsn() const {
  Lsn out;
  for (const HeldRun& r : runs_) out = std::max(out, r.final_lsn);
  return out;
}

void HeldRows::Index() const {
  if (indexed_) return;
  sorted_ = runs_;
  std::sort(sorted_.begin(), sorted_.end(), Less);
  indexed_ = true;
}

bool HeldRows::Contains(uint64_t transaction_id, int64_t offset) const {
  if (runs_.empty()) return false;
  Index();
  // The last run starting at or before (transaction_id, offset).
  HeldRun probe{Lsn(), transaction_id, offset, offset};
  auto it = std::upper_bound(sorted_.begin(), sorted_.end(), probe, Less);
  while (it != sorted_.begin()) {
    --it;
    if (it->transaction_id != transaction_id) return false;
    if (offset <= it->last) return true;
    // A run listed twice (its rows unmarked in one place, kept for the
    // standbys in another) may overlap a longer one that starts earlier.
  }
  return false;
}

std::string HeldRows::Encode() const {
  std::string out;
  HeldRun prev;
  Delta last;
  int repeat = 0;
  auto flush = [&] {
    if (repeat == 0) return;
    if (!out.empty()) out += ';';
    fmt::format_to(std::back_inserter(out), "{},{},{},{}", last.lsn, last.xid, last.first,
                   last.len);
    if (repeat > 1) fmt::format_to(std::back_inserter(out), "*{}", repeat);
    repeat = 0;
  };
  for (const HeldRun& r : runs_) {
    Delta d = DeltaOf(r, prev);
    if (repeat > 0 && d == last) {
      ++repeat;
    } else {
      flush();
      last = d;
      repeat = 1;
    }
    prev = r;
  }
  flush();
  return out;
}

Result<HeldRows> HeldRows::Decode(std::string_view text) {
  HeldRows rows;
  HeldRun prev;
  while (!text.empty()) {
    size_t end = text.find(';');
    std::string_view item = text.substr(0, end);
    text.remove_prefix(end == std::string_view::npos ? text.size() : end + 1);
    int64_t repeat = 1;
    if (size_t star = item.find('*'); star != std::string_view::npos) {
      auto n = Number<int64_t>(item.substr(star + 1), "unmarked repeat");
      if (!n || *n < 1) return Fail(ErrorCode::kInvalidArgument, "progress: bad unmarked item");
      repeat = *n;
      item = item.substr(0, star);
    }
    int64_t f[4];
    for (int i = 0; i < 4; ++i) {
      size_t comma = item.find(',');
      if ((comma == std::string_view::npos) != (i == 3)) {
        return Fail(ErrorCode::kInvalidArgument, "progress: unmarked item '{}' needs 4 fields",
                    item);
      }
      auto v = Number<int64_t>(item.substr(0, comma), "unmarked field");
      if (!v) return std::unexpected(v.error());
      f[i] = *v;
      item.remove_prefix(comma == std::string_view::npos ? item.size() : comma + 1);
    }
    if (f[3] < 0 || repeat > static_cast<int64_t>(kMaxRuns)) {
      return Fail(ErrorCode::kInvalidArgument, "progress: bad unmarked run");
    }
    Delta d{f[0], f[1], f[2], f[3]};
    for (int64_t i = 0; i < repeat; ++i) {
      HeldRun r = Apply(d, prev);
      if (rows.runs_.size() < kMaxRuns) rows.runs_.push_back(r);
      prev = r;
    }
  }
  return rows;
}

std::string EncodeProgress(const ProgressRecord& r) {
  const KafkaProgress& p = r.progress;
  std::string out = fmt::format(R"({{"v":1,"format":{},"key":{})", kProgressFormat, Quoted(r.key));
  if (r.owner) {
    out += fmt::format(R"(,"relay":{{"system_id":{},"database":{},"slot":{},"incarnation":{}}})",
                       Quoted(r.owner->system_id), Quoted(r.owner->database), Quoted(r.owner->slot),
                       Quoted(r.incarnation));
  }
  if (r.history.timeline != 0) {
    out += fmt::format(R"(,"timeline":{},"history":[)", r.history.timeline);
    for (size_t i = 0; i < r.history.ancestors.size(); ++i) {
      const TimelineFork& f = r.history.ancestors[i];
      out += fmt::format(R"({}[{},"{}"])", i == 0 ? "" : ",", f.timeline, f.end);
    }
    out += ']';
  }
  out += fmt::format(R"(,"lsn":"{}","rows":{},"complete":{})", p.final_lsn, p.rows,
                     p.complete ? "true" : "false");
  if (p.backfill) {
    out +=
        fmt::format(R"(,"backfill":{{"snapshot":{},"transaction_id":"{}","offset":"{}"}})",
                    Quoted(p.backfill->snapshot), p.backfill->transaction_id, p.backfill->offset);
  }
  if (!p.unmarked.empty()) out += fmt::format(R"(,"unmarked":"{}")", p.unmarked.Encode());
  if (p.standbys) out += R"(,"standbys":true)";
  out += '}';
  return out;
}

Result<ProgressRecord> DecodeProgress(std::string_view json) {
  simdjson::dom::parser parser;
  simdjson::padded_string padded(json);
  simdjson::dom::element doc;
  if (auto err = parser.parse(padded).get(doc)) {
    return Fail(ErrorCode::kInvalidArgument, "progress: not JSON: {}",
                simdjson::error_message(err));
  }
  ProgressRecord r;
  uint64_t readable_by = 0;
  if (doc["v"].get(readable_by) || readable_by == 0) {
    return Fail(ErrorCode::kInvalidArgument, "progress: no \"v\"");
  }
  uint64_t format = 1;
  if (auto f = doc["format"]; f.error() != simdjson::NO_SUCH_FIELD && f.get(format)) {
    return Fail(ErrorCode::kInvalidArgument, "progress: \"format\" is not a number");
  }
  if (readable_by > kProgressFormat) {
    return Fail(ErrorCode::kInvalidArgument,
                "progress: the record is of format {} and needs a reader of format {} or newer; "
                "this relay reads format {} (the record was written by a newer relay: run that "
                "version or a newer one)",
                format, readable_by, kProgressFormat);
  }
  r.format = static_cast<uint32_t>(format);
  std::string_view key;
  if (!doc["key"].get(key)) r.key = std::string(key);

  simdjson::dom::object relay;
  if (!doc["relay"].get(relay)) {
    std::string_view system_id, database, slot, incarnation;
    if (relay["system_id"].get(system_id) || relay["database"].get(database) ||
        relay["slot"].get(slot)) {
      return Fail(ErrorCode::kInvalidArgument, "progress: incomplete \"relay\"");
    }
    r.owner = RelayIdentity{std::string(system_id), std::string(database), std::string(slot)};
    if (!relay["incarnation"].get(incarnation)) r.incarnation = std::string(incarnation);
  }
  uint64_t timeline = 0;
  if (!doc["timeline"].get(timeline)) {
    r.history.timeline = static_cast<uint32_t>(timeline);
    simdjson::dom::array history;
    if (doc["history"].get(history)) {
      return Fail(ErrorCode::kInvalidArgument, "progress: \"timeline\" without \"history\"");
    }
    for (simdjson::dom::element fork : history) {
      uint64_t tli = 0;
      std::string_view end;
      if (fork.at(0).get(tli) || fork.at(1).get(end)) {
        return Fail(ErrorCode::kInvalidArgument, "progress: bad \"history\" entry");
      }
      auto lsn = Lsn::Parse(end);
      if (!lsn) return Fail(ErrorCode::kInvalidArgument, "progress: history: {}", end);
      r.history.ancestors.push_back(TimelineFork{static_cast<uint32_t>(tli), *lsn});
    }
  }

  KafkaProgress& p = r.progress;
  std::string_view lsn;
  if (doc["lsn"].get(lsn)) return Fail(ErrorCode::kInvalidArgument, "progress: no \"lsn\"");
  auto parsed = Lsn::Parse(lsn);
  if (!parsed)
    return Fail(ErrorCode::kInvalidArgument, "progress: lsn: {}", parsed.error().message);
  p.final_lsn = *parsed;
  uint64_t rows = 0;
  if (doc["rows"].get(rows)) return Fail(ErrorCode::kInvalidArgument, "progress: no \"rows\"");
  p.rows = rows;
  bool complete = true;
  if (doc["complete"].get(complete)) {
    return Fail(ErrorCode::kInvalidArgument, "progress: no \"complete\"");
  }
  p.complete = complete;
  simdjson::dom::object backfill;
  if (!doc["backfill"].get(backfill)) {
    BackfillCursor c;
    std::string_view snapshot, xid, offset;
    if (backfill["snapshot"].get(snapshot) || backfill["transaction_id"].get(xid) ||
        backfill["offset"].get(offset)) {
      return Fail(ErrorCode::kInvalidArgument, "progress: incomplete \"backfill\"");
    }
    c.snapshot = std::string(snapshot);
    auto x = Number<uint64_t>(xid, "backfill transaction_id");
    if (!x) return std::unexpected(x.error());
    auto o = Number<int64_t>(offset, "backfill offset");
    if (!o) return std::unexpected(o.error());
    c.transaction_id = *x;
    c.offset = *o;
    p.backfill = std::move(c);
  }
  std::string_view unmarked;
  if (!doc["unmarked"].get(unmarked)) {
    auto held = HeldRows::Decode(unmarked);
    if (!held) return std::unexpected(held.error());
    p.unmarked = std::move(*held);
  }
  bool standbys = false;
  if (!doc["standbys"].get(standbys)) p.standbys = standbys;
  return r;
}

Result<KafkaProgress> TrustedProgress(const ProgressRecord& record, const ProgressFacts& facts,
                                      std::string* note) {
  auto say = [&](std::string text) {
    if (note != nullptr) *note += (note->empty() ? "" : "; ") + text;
  };
  if (record.owner && *record.owner != facts.me) {
    return Fail(ErrorCode::kInvalidArgument,
                "invalid setting --transactional-id (OUTBOX_TRANSACTIONAL_ID): the progress "
                "record under {} belongs to another relay ({}), not to this one ({}). Two relays "
                "must never share a transactional.id: each would skip the other's rows as "
                "already in Kafka. Give this relay its own (or leave the setting empty: the "
                "default is derived from the system identifier, database and slot)",
                record.key, record.owner->ToString(), facts.me.ToString());
  }
  if (!record.owner &&
      record.key != DefaultTransactionalId(facts.me.system_id, facts.me.database, facts.me.slot)) {
    say(
        fmt::format("a format-{} record under {} does not say whose it is: nothing of it is "
                    "trusted (what the slot sends again is produced again)",
                    record.format, record.key));
    return KafkaProgress{};
  }
  KafkaProgress p = record.progress;
  Lsn fork = DivergencePoint(record.history, facts.history);
  if (p.final_lsn.valid() && p.final_lsn >= fork) {
    say(
        fmt::format("the record's position {} on timeline {} lies past the point {} where the "
                    "server's history (timeline {}) parts from it: trusted below {} only",
                    p.final_lsn, record.history.timeline, fork, facts.history.timeline, fork));
    p.final_lsn = fork;
    p.rows = 0;
    p.complete = false;
  }
  if (facts.wal_end.valid() && p.final_lsn > facts.wal_end) {
    // Logical decoding sends only flushed WAL: a server that has less than
    // the relay published, on the same history, was restored onto it.
    say(
        fmt::format("the record's position {} lies beyond the server's WAL end {} (a restore?): "
                    "nothing of it is trusted",
                    p.final_lsn, facts.wal_end));
    return KafkaProgress{};
  }
  size_t before = p.unmarked.size();
  p.unmarked.KeepBelow(fork);
  if (p.unmarked.size() != before) {
    say(fmt::format("{} of {} unmarked runs lie past the fork", before - p.unmarked.size(),
                    before));
  }
  if (p.backfill && !record.incarnation.empty()) {
    // The cursor is of one backfill (its stored snapshot, which HoldsBackfilled
    // compares): of another incarnation of the slot, or of rows the server's
    // history may not share, it proves nothing.
    auto incarnation = Lsn::Parse(record.incarnation);
    if (record.incarnation != facts.incarnation || !incarnation || *incarnation >= fork) {
      p.backfill.reset();
    }
  }
  return p;
}

std::string DefaultTransactionalId(std::string_view system_id, std::string_view database,
                                   std::string_view slot) {
  return fmt::format("outbox-relay.{}.{}.{}", system_id, database, slot);
}

std::string DefaultProgressTopic(std::string_view transactional_id) {
  std::string topic = std::string(transactional_id) + ".progress";
  for (char& c : topic) {
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '.' || c == '_' || c == '-';
    if (!ok) c = '_';
  }
  // Kafka's limit is 249 characters; the prefix stays (prefixed ACLs).
  if (topic.size() > 249) topic.resize(249);
  return topic;
}

}  // namespace outbox_relay::pipeline
