// DeadLetterBuilder: the dead-letter record for a row that cannot be published
// as itself. The record layout and the size rule are in dead_letter.h.
//
// The dead letter must itself be accepted by Kafka, or the stream stops on the
// very row it was meant to set aside; hence the size estimate errs high and
// everything that can be large is shed, in a fixed order, until it fits.
// Dead letters are rare, so this path may allocate; it never throws or logs.
#include "outbox_relay/outbox/dead_letter.h"

#include <iterator>
#include <utility>

namespace outbox_relay::outbox {

namespace {

// Kafka v2 record batch header (61 bytes) + the record's own length, attributes,
// timestamp and offset deltas, key/value lengths and header count as varints
// (at most 5 or 10 bytes each), rounded up generously.
constexpr size_t kRecordOverhead = 128;
// Name and value length varints of one header (5 bytes each at most).
constexpr size_t kHeaderOverhead = 10;

// The longest prefix of `s` that is at most `max` bytes and does not end in
// the middle of a UTF-8 sequence.
std::string_view Utf8Prefix(std::string_view s, size_t max) {
  if (s.size() <= max) return s;
  size_t n = max;
  while (n > 0 && (static_cast<unsigned char>(s[n]) & 0xC0) == 0x80) --n;
  return s.substr(0, n);
}

}  // namespace

size_t EstimateRecordSize(const KafkaRecord& record) {
  size_t size = kRecordOverhead;
  if (record.key) size += record.key->size();
  if (record.value) size += record.value->size();
  for (const auto& [name, value] : record.headers)
    size += kHeaderOverhead + name.size() + value.size();
  return size;
}

DeadLetterBuilder::DeadLetterBuilder(std::string topic, size_t max_record_bytes,
                                     ColumnNames columns)
    : topic_(std::move(topic)), max_record_bytes_(max_record_bytes), columns_(std::move(columns)) {}

const KafkaRecord& DeadLetterBuilder::Build(const Error& reason, const RowIdentity& identity,
                                            std::string_view table, Lsn commit_lsn,
                                            std::optional<std::string_view> payload,
                                            std::optional<std::string_view> metadata_raw) {
  reason_.assign(reason.message);
  table_.assign(table);
  lsn_text_.clear();
  fmt::format_to(std::back_inserter(lsn_text_), "{}", commit_lsn);
  xid_text_.clear();
  fmt::format_to(std::back_inserter(xid_text_), "{}", identity.transaction_id);
  offset_text_.clear();
  fmt::format_to(std::back_inserter(offset_text_), "{}", identity.offset);
  // A negative offset means the caller does not know it (a record the broker
  // refused after the row left memory): point at the row by uuid instead.
  reference_.clear();
  fmt::format_to(std::back_inserter(reference_), "{} {}={}", table_, columns_.transaction_id,
                 identity.transaction_id);
  if (identity.offset >= 0) {
    fmt::format_to(std::back_inserter(reference_), " {}={}", columns_.offset, identity.offset);
  } else if (!identity.uuid.empty()) {
    fmt::format_to(std::back_inserter(reference_), " {}={}", columns_.uuid,
                   Utf8Prefix(identity.uuid, 64));
  }

  std::string_view uuid = identity.uuid;
  bool with_key = !uuid.empty();
  std::optional<std::string_view> value = payload;
  std::optional<std::string_view> metadata = metadata_raw;
  bool truncated = false;

  auto assemble = [&] {
    record_.topic = topic_;
    record_.key = with_key ? std::optional<std::string_view>(uuid) : std::nullopt;
    record_.value = value;
    record_.event_type = {};
    auto& h = record_.headers;
    h.clear();
    h.emplace_back(kUuidHeader, uuid);
    h.emplace_back(kDlqReasonHeader, reason_);
    h.emplace_back(kDlqErrorCodeHeader, ErrorCodeName(reason.code));
    h.emplace_back(kDlqCommitLsnHeader, lsn_text_);
    h.emplace_back(kDlqTransactionIdHeader, xid_text_);
    h.emplace_back(kDlqOffsetHeader, offset_text_);
    h.emplace_back(kDlqTableHeader, table_);
    if (metadata) h.emplace_back(kDlqMetadataHeader, *metadata);
    if (truncated) {
      h.emplace_back(kDlqTruncatedHeader, "true");
      h.emplace_back(kDlqReferenceHeader, reference_);
    }
    return EstimateRecordSize(record_) <= max_record_bytes_;
  };
  if (assemble()) return record_;

  // Shed the larger of payload and metadata first: that keeps the most.
  truncated = true;
  const size_t value_size = value ? value->size() : 0;
  const size_t metadata_size = metadata ? metadata->size() : 0;
  if (value_size >= metadata_size) {
    value.reset();
  } else {
    metadata.reset();
  }
  if (assemble()) return record_;
  value.reset();
  metadata.reset();
  if (assemble()) return record_;

  // Only a huge reason (or a tiny limit) gets here.
  size_t over = EstimateRecordSize(record_) - max_record_bytes_;
  reason_.resize(Utf8Prefix(reason_, reason_.size() > over ? reason_.size() - over : 0).size());
  if (assemble()) return record_;

  // A uuid this long is not from the seed's VARCHAR(36); keep what fits of it.
  with_key = false;
  if (assemble()) return record_;
  over = EstimateRecordSize(record_) - max_record_bytes_;
  uuid = uuid.substr(0, uuid.size() > over ? uuid.size() - over : 0);
  assemble();
  return record_;
}

}  // namespace outbox_relay::outbox
