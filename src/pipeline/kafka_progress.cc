#include "outbox_relay/pipeline/kafka_progress.h"

#include <simdjson.h>

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

}  // namespace

std::string EncodeProgress(const KafkaProgress& p, std::string_view key) {
  std::string out = fmt::format(R"({{"v":1,"key":{},"lsn":"{}","rows":{},"complete":{})",
                                Quoted(key), p.final_lsn, p.rows, p.complete ? "true" : "false");
  if (p.backfill) {
    out +=
        fmt::format(R"(,"backfill":{{"snapshot":{},"transaction_id":"{}","offset":"{}"}})",
                    Quoted(p.backfill->snapshot), p.backfill->transaction_id, p.backfill->offset);
  }
  out += '}';
  return out;
}

Result<KafkaProgress> DecodeProgress(std::string_view json) {
  simdjson::dom::parser parser;
  simdjson::padded_string padded(json);
  simdjson::dom::element doc;
  if (auto err = parser.parse(padded).get(doc)) {
    return Fail(ErrorCode::kInvalidArgument, "progress: not JSON: {}",
                simdjson::error_message(err));
  }
  uint64_t version = 0;
  if (doc["v"].get(version) || version != 1) {
    return Fail(ErrorCode::kInvalidArgument,
                "progress: version {} is not 1 (written by a newer relay?)", version);
  }
  KafkaProgress p;
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
  return p;
}

std::string DefaultTransactionalId(std::string_view system_id, std::string_view database,
                                   std::string_view slot) {
  return fmt::format("outbox-relay.{}.{}.{}", system_id, database, slot);
}

}  // namespace outbox_relay::pipeline
