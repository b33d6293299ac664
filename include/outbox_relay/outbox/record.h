// From an inserted outbox row to the Kafka record the Watermill pipeline expects.
//
// The contract (DESIGN §4): topic from a template over the metadata, key from
// the metadata's Aggregate-Id, value = the payload column verbatim,
// headers = `_watermill_message_uuid` then every metadata entry sorted by key
// (plus `partition_key` = Aggregate-Id when present, as the Go middleware set it).
//
// watermill-sql's own tables (TableKind::kWatermill) and the forwarder's
// envelope table (kForwarder) are mapped as watermill-kafka's marshalers do
// (docs/migration.md; watermill.h has the Go decoding rules).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "outbox_relay/core/result.h"
#include "outbox_relay/pgoutput/messages.h"

namespace outbox_relay::outbox {

inline constexpr std::string_view kUuidHeader = "_watermill_message_uuid";
inline constexpr std::string_view kPartitionKeyHeader = "partition_key";

// Metadata: a JSON object of strings, as Go's json.Marshal(map[string]string)
// writes it. Entries are kept sorted by key (byte order), duplicates resolved
// last-wins, every JSON escape decoded (\uXXXX, surrogate pairs, \/ ...), a
// JSON null value becomes "". An unpaired surrogate escape ("\ud83d", which
// PostgreSQL's json type accepts and JavaScript's JSON.stringify writes)
// becomes U+FFFD, as Go's decoder makes it. SQL NULL or a JSON `null`
// document = no entries. Anything else (not an object, a non-string non-null
// value, invalid JSON or UTF-8) is a kPoison error that says what is wrong.
class Metadata {
 public:
  Metadata();
  ~Metadata();
  Metadata(Metadata&&) noexcept;
  Metadata& operator=(Metadata&&) noexcept;

  // Reuses internal storage between calls; previous views become invalid.
  Status Parse(std::optional<std::string_view> json);
  // Sets or replaces an entry (keeps the order). The arguments may be views
  // of this Metadata's own entries. Views taken before may become invalid
  // (the storage can grow); take them again after Set().
  void Set(std::string_view key, std::string_view value);

  std::optional<std::string_view> Get(std::string_view key) const;
  // Sorted by key, unique keys.
  const std::vector<std::pair<std::string_view, std::string_view>>& entries() const {
    return entries_;
  }

 private:
  struct Impl;
  Impl* impl_;  // simdjson parser and the storage for unescaped strings
  std::vector<std::pair<std::string_view, std::string_view>> entries_;
};

// "kazmaps.{Source-Service}.{Event-Type:aggregate}": literal text and
// {Key} / {Key:aggregate} placeholders over metadata keys. `:aggregate` takes
// the part before the first '.'. The rendered name must be a legal Kafka
// topic ([A-Za-z0-9._-], 1..249 chars, not "." or "..").
class TopicTemplate {
 public:
  // kInvalidArgument for a malformed template (unbalanced braces, empty key,
  // unknown modifier, literal characters illegal in a topic name).
  static Result<TopicTemplate> Compile(std::string_view text);

  // kPoison when a key is missing or empty, or the result is not a legal topic.
  Status Render(const Metadata& metadata, std::string* out) const;

  // The metadata keys the template reads.
  std::vector<std::string> keys() const;
  const std::string& text() const { return text_; }

 private:
  struct Part {
    bool is_key = false;
    bool aggregate = false;
    std::string text;  // literal text or metadata key
  };
  std::string text_;
  std::vector<Part> parts_;
};

// Which kind of table a row comes from (--table-mode).
enum class TableKind {
  kSeed,       // the house outbox table: topic from the template, key Aggregate-Id
  kWatermill,  // watermill-sql's "watermill_<topic>": topic from the table, null key
  kForwarder,  // watermill's forwarder table: everything from the row's envelope
};

// A position in a Watermill table's (transaction_id, "offset") order: what
// the polling subscriber's offsets row holds (last_processed_transaction_id,
// offset_acked).
struct TablePosition {
  uint64_t transaction_id = 0;  // xid8
  int64_t offset = 0;

  auto operator<=>(const TablePosition&) const = default;
};

// Configurable column names (the seed's schema is the default).
struct ColumnNames {
  std::string uuid = "uuid";
  std::string payload = "payload";
  std::string metadata = "metadata";
  std::string transaction_id = "transaction_id";
  std::string offset = "offset_consumed";
};

// Positions of the needed columns in a Relation, found by name.
struct ColumnMap {
  int uuid = -1;
  int payload = -1;
  int metadata = -1;
  int transaction_id = -1;
  int offset = -1;
  // The payload column is bytea: PostgreSQL sends its text form (\x hex),
  // the record carries the bytes themselves, as watermill-sql's BYTEA
  // payloads are published.
  bool payload_is_bytea = false;

  // Set by whoever resolves the table (the pipeline's table router), not by
  // Resolve:
  TableKind kind = TableKind::kSeed;
  std::string table;  // "schema.name" for dead letters ("": the publisher's own)
  std::string topic;  // kWatermill: the Kafka topic of every row
  // kWatermill/kForwarder: rows at or before this position were processed
  // already (the consumer group's offsets row when the stream started) and
  // are skipped, as the polling subscriber would skip them.
  std::optional<TablePosition> processed;

  // kInvalidArgument naming the missing column and the columns the table has.
  static Result<ColumnMap> Resolve(const pgoutput::Relation& relation, const ColumnNames& names);
};

// What identifies a row in the table: used for marking and dead letters.
struct RowIdentity {
  uint64_t transaction_id = 0;  // xid8
  int64_t offset = 0;
  std::string_view uuid;
};

struct KafkaRecord {
  std::string_view topic;
  std::optional<std::string_view> key;
  std::optional<std::string_view> value;
  std::vector<std::pair<std::string_view, std::string_view>> headers;
  std::string_view event_type;  // metadata Event-Type or "" (for metrics)
};

// A metadata entry named `_watermill_message_uuid` (kUuidHeader). A non-empty
// one is always poison: watermill-kafka's marshaler refuses the message.
enum class UuidInMetadata {
  // As watermill-kafka's marshaler: an empty one is sent as a second UUID
  // header after the row's, which watermill-kafka's subscriber then reads as
  // the message's UUID (so consumers see an empty UUID).
  kWatermill,
  // An empty one is left out: consumers see the row's UUID.
  kDrop,
};

struct MapperOptions {
  std::string topic_template = "kazmaps.{Source-Service}.{Event-Type:aggregate}";
  std::string key_field = "Aggregate-Id";  // metadata key for the record key; "" = null key
  bool partition_key_header = true;        // add partition_key = key, as the Go middleware
  UuidInMetadata uuid_in_metadata = UuidInMetadata::kWatermill;
  // Watermill tables (kWatermill, kForwarder): the metadata key whose value is
  // the record key, as NewWithPartitioningMarshaler with
  // msg.Metadata.Get(field) ("" when absent: the empty key, hashed); empty
  // name = a null key, as DefaultMarshaler.
  std::string watermill_key_field;
  // Extra header carrying the commit LSN ("X/Y"), empty name = none.
  std::string commit_lsn_header;
};

// Outcome of mapping one row.
struct Mapped {
  RowIdentity identity;
  // Set on success; points into the row and the mapper's storage, valid until the next Map().
  const KafkaRecord* record = nullptr;
  // Set when the row is poison: why (the identity is still filled as far as it could be read).
  std::optional<Error> poison;
  // The row is at or before ColumnMap::processed: neither produced nor marked.
  bool already_processed = false;
};

class Envelope;  // watermill.h

class RecordMapper {
 public:
  RecordMapper(RecordMapper&&) noexcept;
  RecordMapper& operator=(RecordMapper&&) noexcept;
  ~RecordMapper();

  static Result<RecordMapper> Create(MapperOptions options);

  // Maps one inserted row. Returns an error only when the row cannot even be
  // identified (transaction_id or offset column NULL or not a number):
  // then it cannot be marked either and the caller must stop.
  // `commit_lsn` is the transaction's commit LSN (Begin.final_lsn).
  Result<Mapped> Map(const ColumnMap& columns, const pgoutput::TupleData& row, Lsn commit_lsn);

 private:
  explicit RecordMapper(MapperOptions options, TopicTemplate tmpl);
  // The rest of Map for the Watermill tables, once the row is identified.
  void MapWatermill(const ColumnMap& columns, const pgoutput::TupleValue& uuid,
                    const pgoutput::TupleValue& payload, const pgoutput::TupleValue& metadata,
                    Lsn commit_lsn, Mapped* mapped);
  // Headers: the UUID header, then `metadata`'s entries (UuidInMetadata
  // rules). False (and `mapped->poison` set) for a non-empty reserved entry.
  bool FillHeaders(std::string_view uuid, const Metadata& metadata, Mapped* mapped);
  void AddCommitLsnHeader(Lsn commit_lsn);

  MapperOptions options_;
  TopicTemplate template_;
  Metadata metadata_;
  std::string topic_;
  std::string lsn_text_;
  std::string payload_bytes_;           // a bytea payload, decoded
  std::unique_ptr<Envelope> envelope_;  // kForwarder rows (made on first use)
  KafkaRecord record_;
};

// The bytes of a bytea value from its text form: hex (`\x4142`, the default
// bytea_output) or escape (`AB\101\\`). kPoison when it is neither.
Status DecodeByteaText(std::string_view text, std::string* out);

// Parses the text form of xid8 / bigint columns.
Result<uint64_t> ParseXid8(std::string_view text);
Result<int64_t> ParseInt64(std::string_view text);

}  // namespace outbox_relay::outbox
