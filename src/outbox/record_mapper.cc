// RecordMapper: one inserted outbox row -> the Kafka record the Watermill
// pipeline produced for it (DESIGN §4).
//
//   topic   = TopicTemplate over the metadata
//   key     = metadata[key_field] when non-empty, else metadata[partition_key],
//             else "" (the Go pipeline's partitioning marshaler); null when no key_field
//   value   = payload column text verbatim, SQL NULL -> null
//   headers = _watermill_message_uuid: uuid column
//             every metadata entry, sorted by key (partition_key = key when
//               options.partition_key_header and there is a key)
//             options.commit_lsn_header: commit LSN "X/Y" (when named)
//
// Outcomes are three, because the caller does three different things:
//   - a record: produce it;
//   - poison (Mapped::poison): the row is identified but cannot become a
//     record (no uuid, bad metadata, no topic): dead-letter it and move on;
//   - an error: the row cannot even be identified (transaction_id/offset
//     NULL or not a number) or pgoutput sent something an INSERT never has
//     (an unchanged-TOAST marker, too few columns). Nothing can mark or
//     dead-letter such a row, so the caller stops.
//
// Watermill tables (ColumnMap::kind, watermill.h):
//   kWatermill: topic = the table's topic, uuid and metadata from their
//               columns, value = payload; key null, or
//               metadata[watermill_key_field] ("" when absent)
//   kForwarder: topic, uuid, metadata and value from the payload column's
//               envelope; the row's own uuid and metadata are the wrapper's
//               and are not published
//   both:       headers = _watermill_message_uuid, then the metadata sorted;
//               rows at or before ColumnMap::processed are already_processed
//
// Steady state does not allocate: the record's header vector, the topic and
// LSN strings and the metadata's storage are members reused row after row.
#include <charconv>
#include <iterator>

#include "outbox_relay/outbox/record.h"
#include "outbox_relay/outbox/watermill.h"

namespace outbox_relay::outbox {

namespace {

constexpr std::string_view kEventTypeKey = "Event-Type";
constexpr std::string_view kEventNameKey = "name";  // Watermill CQRS's event name

using pgoutput::TupleValue;

// Byte-wise order, as the metadata is sorted; most keys differ in the first byte.
inline bool KeyLess(std::string_view a, std::string_view b) {
  if (!a.empty() && !b.empty() && a[0] != b[0]) {
    return static_cast<unsigned char>(a[0]) < static_cast<unsigned char>(b[0]);
  }
  return a < b;
}

// The column at `index` of `row`, as needed for `role` ("uuid", "payload"...).
Result<const TupleValue*> Column(const pgoutput::TupleData& row, int index, std::string_view role) {
  if (index < 0 || static_cast<size_t>(index) >= row.values.size()) {
    return Fail(ErrorCode::kProtocol,
                "the {} column is at index {} but the row has {} columns (was the ColumnMap "
                "resolved against this row's Relation?)",
                role, index, row.values.size());
  }
  const TupleValue* value = &row.values[static_cast<size_t>(index)];
  if (value->kind == TupleValue::Kind::kUnchangedToast) {
    return Fail(ErrorCode::kProtocol,
                "the {} column is an unchanged TOAST value, which an INSERT never sends", role);
  }
  return value;
}

}  // namespace

Result<uint64_t> ParseXid8(std::string_view text) {
  uint64_t v = 0;
  auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), v, 10);
  if (text.empty() || ec != std::errc() || ptr != text.data() + text.size()) {
    return Fail(ErrorCode::kInvalidArgument, "invalid xid8 \"{}\": expected a decimal uint64",
                text.substr(0, 64));
  }
  return v;
}

Result<int64_t> ParseInt64(std::string_view text) {
  int64_t v = 0;
  auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), v, 10);
  if (text.empty() || ec != std::errc() || ptr != text.data() + text.size()) {
    return Fail(ErrorCode::kInvalidArgument, "invalid bigint \"{}\": expected a decimal int64",
                text.substr(0, 64));
  }
  return v;
}

Status DecodeByteaText(std::string_view text, std::string* out) {
  out->clear();
  auto nibble = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  if (text.starts_with("\\x")) {
    if (text.size() % 2 != 0) {
      return Fail(ErrorCode::kPoison, "bytea payload: odd number of hex digits");
    }
    out->reserve((text.size() - 2) / 2);
    for (size_t i = 2; i < text.size(); i += 2) {
      int hi = nibble(text[i]);
      int lo = nibble(text[i + 1]);
      if (hi < 0 || lo < 0) {
        return Fail(ErrorCode::kPoison, "bytea payload: bad hex digit at byte {}", i);
      }
      out->push_back(static_cast<char>((hi << 4) | lo));
    }
    return Ok();
  }
  // bytea_output = escape: \\ is a backslash, \nnn an octal byte, the rest verbatim.
  out->reserve(text.size());
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] != '\\') {
      out->push_back(text[i]);
    } else if (i + 1 < text.size() && text[i + 1] == '\\') {
      out->push_back('\\');
      ++i;
    } else if (i + 3 < text.size() && text[i + 1] >= '0' && text[i + 1] <= '3' &&
               text[i + 2] >= '0' && text[i + 2] <= '7' && text[i + 3] >= '0' &&
               text[i + 3] <= '7') {
      out->push_back(static_cast<char>(((text[i + 1] - '0') << 6) | ((text[i + 2] - '0') << 3) |
                                       (text[i + 3] - '0')));
      i += 3;
    } else {
      return Fail(ErrorCode::kPoison, "bytea payload: bad escape at byte {}", i);
    }
  }
  return Ok();
}

Result<ColumnMap> ColumnMap::Resolve(const pgoutput::Relation& relation, const ColumnNames& names) {
  ColumnMap map;
  std::string missing;
  auto find = [&](const std::string& name, int* index) {
    *index = relation.ColumnIndex(name);
    if (*index < 0) {
      if (!missing.empty()) missing += ", ";
      missing += fmt::format("\"{}\"", name);
    }
  };
  find(names.uuid, &map.uuid);
  find(names.payload, &map.payload);
  find(names.metadata, &map.metadata);
  find(names.transaction_id, &map.transaction_id);
  find(names.offset, &map.offset);
  if (missing.empty()) {
    constexpr pgoutput::Oid kByteaOid = 17;
    map.payload_is_bytea = relation.columns[static_cast<size_t>(map.payload)].type_oid == kByteaOid;
    return map;
  }

  std::string existing;
  for (const pgoutput::RelationColumn& column : relation.columns) {
    if (!existing.empty()) existing += ", ";
    existing += column.name;
  }
  return Fail(ErrorCode::kInvalidArgument,
              "table {}.{} (relation {}) lacks column(s) {} needed for the outbox; its columns "
              "are: {}",
              relation.nspname, relation.relname, relation.relation_id, missing,
              existing.empty() ? "(none)" : existing);
}

Result<RecordMapper> RecordMapper::Create(MapperOptions options) {
  auto tmpl = TopicTemplate::Compile(options.topic_template);
  if (!tmpl) return std::unexpected(std::move(tmpl.error()));
  return RecordMapper(std::move(options), std::move(*tmpl));
}

RecordMapper::RecordMapper(MapperOptions options, TopicTemplate tmpl)
    : options_(std::move(options)), template_(std::move(tmpl)) {
  lsn_text_.reserve(17);  // "FFFFFFFF/FFFFFFFF"
}

RecordMapper::RecordMapper(RecordMapper&&) noexcept = default;
RecordMapper& RecordMapper::operator=(RecordMapper&&) noexcept = default;
RecordMapper::~RecordMapper() = default;

void RecordMapper::AddCommitLsnHeader(Lsn commit_lsn) {
  if (options_.commit_lsn_header.empty()) return;
  lsn_text_.clear();
  fmt::format_to(std::back_inserter(lsn_text_), "{}", commit_lsn);
  record_.headers.emplace_back(options_.commit_lsn_header, lsn_text_);
}

bool RecordMapper::FillHeaders(std::string_view uuid, const Metadata& metadata, Mapped* mapped) {
  auto& headers = record_.headers;
  headers.clear();
  headers.emplace_back(kUuidHeader, uuid);
  for (const auto& entry : metadata.entries()) {
    if (entry.first == kUuidHeader) {
      // watermill-kafka's marshaler refuses a message whose metadata sets
      // the UUID; an empty one it sends as a second UUID header.
      if (!entry.second.empty()) {
        mapped->poison =
            Error{ErrorCode::kPoison,
                  fmt::format("metadata key \"{}\" is reserved for the message UUID", kUuidHeader)};
        return false;
      }
      if (options_.uuid_in_metadata == UuidInMetadata::kDrop) continue;
    }
    headers.push_back(entry);
  }
  return true;
}

void RecordMapper::MapWatermill(const ColumnMap& columns, const TupleValue& uuid_value,
                                const TupleValue& payload, const TupleValue& metadata_value,
                                Lsn commit_lsn, Mapped* mapped) {
  const bool text_uuid = uuid_value.kind == TupleValue::Kind::kText;
  if (text_uuid) mapped->identity.uuid = uuid_value.text;
  std::string_view uuid;
  std::optional<std::string_view> value;
  const Metadata* metadata = &metadata_;
  auto payload_bytes = [&](std::string_view* out) -> bool {
    *out = payload.text;
    if (!columns.payload_is_bytea) return true;
    if (auto st = DecodeByteaText(payload.text, &payload_bytes_); !st) {
      mapped->poison = std::move(st.error());
      return false;
    }
    *out = payload_bytes_;
    return true;
  };

  if (columns.kind == TableKind::kWatermill) {
    if (!text_uuid) {
      mapped->poison = Error{ErrorCode::kPoison, "the uuid column is NULL"};
      return;
    }
    uuid = uuid_value.text;  // may be empty: Watermill publishes it so
    if (auto st = metadata_.Parse(metadata_value.kind == TupleValue::Kind::kText
                                      ? std::optional<std::string_view>(metadata_value.text)
                                      : std::nullopt);
        !st) {
      mapped->poison = std::move(st.error());
      return;
    }
    topic_.assign(columns.topic);
    if (payload.kind == TupleValue::Kind::kText) {
      std::string_view bytes;
      if (!payload_bytes(&bytes)) return;
      value = bytes;
    }
  } else {
    // The forwarder table: the payload column holds the envelope.
    if (payload.kind != TupleValue::Kind::kText) {
      mapped->poison =
          Error{ErrorCode::kPoison, "the forwarder envelope (the payload column) is NULL"};
      return;
    }
    std::string_view text;
    if (!payload_bytes(&text)) return;
    if (!envelope_) envelope_ = std::make_unique<Envelope>();
    if (auto st = envelope_->Parse(text); !st) {
      mapped->poison =
          Error{ErrorCode::kPoison, fmt::format("forwarder envelope: {}", st.error().message)};
      return;
    }
    topic_.assign(envelope_->destination_topic());
    uuid = envelope_->uuid();
    value = envelope_->payload();
    metadata = &envelope_->metadata();
  }

  std::optional<std::string_view> key;
  if (!options_.watermill_key_field.empty()) {
    key = metadata->Get(options_.watermill_key_field).value_or(std::string_view(""));
  }
  record_.topic = topic_;
  record_.key = key;
  record_.value = value;
  record_.event_type = metadata->Get(kEventTypeKey)
                           .value_or(metadata->Get(kEventNameKey).value_or(std::string_view()));
  if (!FillHeaders(uuid, *metadata, mapped)) return;
  AddCommitLsnHeader(commit_lsn);
  mapped->record = &record_;
}

Result<Mapped> RecordMapper::Map(const ColumnMap& columns, const pgoutput::TupleData& row,
                                 Lsn commit_lsn) {
  // Everything that makes the row unidentifiable or the stream suspect comes
  // first, so such a row is never half-reported as poison.
  auto xid_col = Column(row, columns.transaction_id, "transaction_id");
  if (!xid_col) return std::unexpected(std::move(xid_col.error()));
  auto offset_col = Column(row, columns.offset, "offset");
  if (!offset_col) return std::unexpected(std::move(offset_col.error()));
  auto uuid_col = Column(row, columns.uuid, "uuid");
  if (!uuid_col) return std::unexpected(std::move(uuid_col.error()));
  auto payload_col = Column(row, columns.payload, "payload");
  if (!payload_col) return std::unexpected(std::move(payload_col.error()));
  auto metadata_col = Column(row, columns.metadata, "metadata");
  if (!metadata_col) return std::unexpected(std::move(metadata_col.error()));

  if ((*xid_col)->kind == TupleValue::Kind::kNull) {
    return Fail(ErrorCode::kFatal, "the transaction_id column is NULL: the row cannot be marked");
  }
  if ((*offset_col)->kind == TupleValue::Kind::kNull) {
    return Fail(ErrorCode::kFatal, "the offset column is NULL: the row cannot be marked");
  }
  auto xid = ParseXid8((*xid_col)->text);
  if (!xid) {
    return Fail(ErrorCode::kFatal, "the transaction_id column: {}", xid.error().message);
  }
  auto offset = ParseInt64((*offset_col)->text);
  if (!offset) return Fail(ErrorCode::kFatal, "the offset column: {}", offset.error().message);

  Mapped mapped;
  mapped.identity.transaction_id = *xid;
  mapped.identity.offset = *offset;

  // From here on the row is identified: whatever is wrong with it is poison.
  if (columns.kind != TableKind::kSeed) {
    if (columns.processed && TablePosition{*xid, *offset} <= *columns.processed) {
      mapped.already_processed = true;
      return mapped;
    }
    MapWatermill(columns, **uuid_col, **payload_col, **metadata_col, commit_lsn, &mapped);
    return mapped;
  }
  const TupleValue& uuid = **uuid_col;
  if (uuid.kind == TupleValue::Kind::kNull) {
    mapped.poison = Error{ErrorCode::kPoison, "the uuid column is NULL"};
    return mapped;
  }
  mapped.identity.uuid = uuid.text;
  if (uuid.text.empty()) {
    mapped.poison = Error{ErrorCode::kPoison, "the uuid column is empty"};
    return mapped;
  }

  const TupleValue& metadata = **metadata_col;
  if (auto st = metadata_.Parse(metadata.kind == TupleValue::Kind::kText
                                    ? std::optional<std::string_view>(metadata.text)
                                    : std::nullopt);
      !st) {
    mapped.poison = std::move(st.error());
    return mapped;
  }
  if (auto st = template_.Render(metadata_, &topic_); !st) {
    mapped.poison = std::move(st.error());
    return mapped;
  }

  // The Go pipeline's partitioning marshaler keys by the metadata's
  // partition_key, which the seed's middleware sets to Aggregate-Id when
  // that is non-empty; absent, it is the empty key (hashed: one fixed
  // partition), not a null one. No key field: a null key, as watermill-kafka's
  // DefaultMarshaler.
  std::optional<std::string_view> key;
  bool key_from_field = false;
  if (!options_.key_field.empty()) {
    key = metadata_.Get(options_.key_field);
    key_from_field = key && !key->empty();
    if (!key_from_field) key = metadata_.Get(kPartitionKeyHeader).value_or(std::string_view(""));
  }
  record_.topic = topic_;
  record_.key = key;
  const TupleValue& payload = **payload_col;
  record_.value = payload.kind == TupleValue::Kind::kText
                      ? std::optional<std::string_view>(payload.text)
                      : std::nullopt;
  if (record_.value && columns.payload_is_bytea) {
    if (auto st = DecodeByteaText(*record_.value, &payload_bytes_); !st) {
      mapped.poison = std::move(st.error());
      return mapped;
    }
    record_.value = payload_bytes_;
  }
  record_.event_type = metadata_.Get(kEventTypeKey).value_or(std::string_view());

  // partition_key = key is merged into the sorted headers here, replacing one
  // the metadata may carry: the same bytes as Metadata::Set would give,
  // without touching the metadata's storage.
  auto& headers = record_.headers;
  headers.clear();
  headers.emplace_back(kUuidHeader, uuid.text);
  bool partition_key_pending = key_from_field && options_.partition_key_header;
  for (const auto& entry : metadata_.entries()) {
    if (partition_key_pending && !KeyLess(entry.first, kPartitionKeyHeader)) {
      headers.emplace_back(kPartitionKeyHeader, *key);
      partition_key_pending = false;
      if (entry.first == kPartitionKeyHeader) continue;
    }
    if (entry.first == kUuidHeader) {
      // watermill-kafka's marshaler refuses a message whose metadata sets the
      // UUID header; so do we. An empty one it sends as a second UUID header,
      // which its consumers then read as the message's UUID: so do we, unless
      // told to drop it (UuidInMetadata).
      if (!entry.second.empty()) {
        mapped.poison =
            Error{ErrorCode::kPoison,
                  fmt::format("metadata key \"{}\" is reserved for the message UUID", kUuidHeader)};
        return mapped;
      }
      if (options_.uuid_in_metadata == UuidInMetadata::kDrop) continue;
    }
    headers.push_back(entry);
  }
  if (partition_key_pending) headers.emplace_back(kPartitionKeyHeader, *key);
  AddCommitLsnHeader(commit_lsn);

  mapped.record = &record_;
  return mapped;
}

}  // namespace outbox_relay::outbox
