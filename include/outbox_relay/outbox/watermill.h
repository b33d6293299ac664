// Watermill's own tables, decoded the way Watermill's Go code decodes them.
//
// The relay publishes rows of watermill-sql tables in place of Watermill's
// polling forwarder, so every row must become what the Go code makes of it:
//
//   direct table "watermill_<topic>" (watermill-sql DefaultPostgreSQLSchema)
//     topic = <topic>, uuid = the uuid column, metadata = the metadata column
//     (json.Unmarshal into map[string]string: Metadata::Parse), value = payload
//   forwarder table (watermill components/forwarder, default
//     "watermill_forwarder_topic"): the payload column is an envelope,
//       {"destination_topic":..., "uuid":..., "payload":<base64>, "metadata":{...}}
//     json.Unmarshal into the envelope struct, then the inner message is
//     published to destination_topic; the row's own uuid and metadata (the
//     wrapper's) are not.
//
// Go semantics mirrored here (encoding/json, encoding/base64 as of Go 1.2x):
//   - struct fields match keys exactly or case-insensitively (bytes.EqualFold:
//     ASCII case, and U+017F for 's', U+212A for 'k'); unknown keys are
//     ignored; a repeated key: the last value wins, but a repeated object for
//     a map merges into the map (null clears it);
//   - a JSON null for a string field leaves it empty, for []byte leaves it
//     nil (a null Kafka value), for the map leaves it nil (no metadata);
//   - any other type mismatch fails the whole Unmarshal;
//   - []byte is base64.StdEncoding: padding required, '\r' and '\n' ignored
//     anywhere, anything after the padding an error, non-zero trailing bits
//     accepted;
//   - \uXXXX escapes that are unpaired surrogates decode to U+FFFD.
// An envelope that fails any of these, or whose destination_topic is empty
// (the forwarder's validate()) or not a legal Kafka topic name, is poison:
// Watermill's forwarder would retry it forever, the relay dead-letters it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "outbox_relay/core/result.h"
#include "outbox_relay/outbox/record.h"

namespace outbox_relay::outbox {

// Rewrites, in place, every \uXXXX escape in `json` that is a surrogate not
// part of a valid high-low pair into \ufffd (the same length), so a strict
// JSON parser decodes what Go's decoder does. Returns how many it rewrote.
// Backslashes are only meaningful inside strings in valid JSON, so the text
// need not be tokenized.
size_t ReplaceLoneSurrogateEscapes(char* json, size_t size);

// base64.StdEncoding.DecodeString(text) into `out`; kPoison on error.
Status DecodeGoBase64(std::string_view text, std::string* out);

// A legal Kafka topic name: 1..249 of [A-Za-z0-9._-], not "." or "..".
bool IsKafkaTopicName(std::string_view topic);

// PostgreSQL truncates identifiers to 63 bytes (NAMEDATALEN - 1), at a
// character boundary: the name it actually gives `name`.
std::string TruncateIdentifier(std::string_view name);
inline constexpr size_t kMaxIdentifierBytes = 63;

// watermill-sql's default names: "watermill_<topic>" and
// "watermill_offsets_<topic>", as PostgreSQL stores them (truncated).
std::string WatermillMessagesTable(std::string_view topic);
std::string WatermillOffsetsTable(std::string_view topic);
// The topic of a default-named messages table ("watermill_orders" ->
// "orders"); nullopt when the name does not have the prefix, or is 63 bytes
// long (PostgreSQL may have cut the topic short: it cannot be known).
std::optional<std::string> WatermillTopicOfTable(std::string_view table);

// The forwarder's envelope, decoded as forwarder.unwrapMessageFromEnvelope.
// Reuses its storage between calls; views stay valid until the next Parse.
class Envelope {
 public:
  Envelope();
  ~Envelope();
  Envelope(const Envelope&) = delete;
  Envelope& operator=(const Envelope&) = delete;

  // kPoison with the reason for anything the forwarder could not unwrap.
  Status Parse(std::string_view json);

  std::string_view destination_topic() const { return destination_topic_; }
  std::string_view uuid() const { return uuid_; }
  // nullopt: payload null or absent (a null Kafka value).
  std::optional<std::string_view> payload() const {
    return has_payload_ ? std::optional<std::string_view>(payload_) : std::nullopt;
  }
  Metadata& metadata() { return metadata_; }
  const Metadata& metadata() const { return metadata_; }

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;  // simdjson parser and the padded input
  std::string destination_topic_;
  std::string uuid_;
  std::string payload_;
  bool has_payload_ = false;
  Metadata metadata_;
};

}  // namespace outbox_relay::outbox
