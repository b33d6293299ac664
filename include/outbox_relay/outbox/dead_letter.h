// Dead letters: the Kafka record that stands in for a row that cannot be
// published as itself — a poison row (RecordMapper's Mapped::poison), or a
// record Kafka refused (e.g. larger than message.max.bytes).
//
// Guarantee 6 (DESIGN §2): a bad row is never dropped silently. Its dead
// letter carries why, and where the row is, so an operator can look at it,
// fix it and replay it:
//
//   topic    the dead-letter topic
//   key      the row's uuid (null when the uuid is empty)
//   value    the payload column verbatim, when the record fits; else null
//   headers  _watermill_message_uuid     the row's uuid
//            outbox_dlq_reason           Error::message
//            outbox_dlq_error_code       ErrorCodeName(Error::code)
//            outbox_dlq_commit_lsn       "X/Y"
//            outbox_dlq_transaction_id   decimal xid8
//            outbox_dlq_offset           decimal offset
//            outbox_dlq_table            "schema.table"
//            outbox_dlq_metadata         the raw metadata JSON (when SQL non-NULL and it fits)
//            outbox_dlq_truncated        "true"        } only when something
//            outbox_dlq_reference        SQL locator   } was left out
//
// Size: the record must stay under `max_record_bytes` as counted by
// EstimateRecordSize (a conservative upper bound of what librdkafka and the
// broker count), or the dead letter itself would be refused and the stream
// would stop. When it does not fit, the larger of payload/metadata is left
// out first, then the other, then the reason is cut (at a UTF-8 boundary).
// The row is still in the table (it is not marked before the dead letter is
// acknowledged), and outbox_dlq_reference says how to select it, e.g.
// "public.outbox transaction_id=123 offset_consumed=45", or, when the offset
// is not known (RowIdentity::offset < 0), "... transaction_id=123 uuid=01H...".
//
// Not thread-safe; the returned record is valid until the next Build() and
// as long as the views passed to Build() (uuid, payload, metadata).
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

#include "outbox_relay/core/lsn.h"
#include "outbox_relay/core/result.h"
#include "outbox_relay/outbox/record.h"

namespace outbox_relay::outbox {

inline constexpr std::string_view kDlqReasonHeader = "outbox_dlq_reason";
inline constexpr std::string_view kDlqErrorCodeHeader = "outbox_dlq_error_code";
inline constexpr std::string_view kDlqCommitLsnHeader = "outbox_dlq_commit_lsn";
inline constexpr std::string_view kDlqTransactionIdHeader = "outbox_dlq_transaction_id";
inline constexpr std::string_view kDlqOffsetHeader = "outbox_dlq_offset";
inline constexpr std::string_view kDlqTableHeader = "outbox_dlq_table";
inline constexpr std::string_view kDlqMetadataHeader = "outbox_dlq_metadata";
inline constexpr std::string_view kDlqTruncatedHeader = "outbox_dlq_truncated";
inline constexpr std::string_view kDlqReferenceHeader = "outbox_dlq_reference";

// An upper bound of the bytes `record` takes in a Kafka v2 record batch:
// key + value + header names and values, plus generous fixed overheads for
// the varints and the batch header. The topic name is not counted (it is
// not part of the record).
size_t EstimateRecordSize(const KafkaRecord& record);

class DeadLetterBuilder {
 public:
  // `columns` names the transaction_id and offset columns in the reference.
  DeadLetterBuilder(std::string topic, size_t max_record_bytes, ColumnNames columns = {});

  const KafkaRecord& Build(const Error& reason, const RowIdentity& identity, std::string_view table,
                           Lsn commit_lsn, std::optional<std::string_view> payload,
                           std::optional<std::string_view> metadata_raw);

  const std::string& topic() const { return topic_; }
  size_t max_record_bytes() const { return max_record_bytes_; }

 private:
  std::string topic_;
  size_t max_record_bytes_;
  ColumnNames columns_;
  // Owned copies, so a temporary Error or table name can be passed in.
  std::string reason_;
  std::string table_;
  std::string lsn_text_;
  std::string xid_text_;
  std::string offset_text_;
  std::string reference_;
  KafkaRecord record_;
};

}  // namespace outbox_relay::outbox
