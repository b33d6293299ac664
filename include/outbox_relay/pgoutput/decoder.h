// Decoder for pgoutput protocol version 1 messages (the payload of XLogData).
#pragma once

#include <string>
#include <string_view>
#include <unordered_map>

#include "outbox_relay/core/result.h"
#include "outbox_relay/pgoutput/messages.h"

namespace outbox_relay::pgoutput {

// Decodes one pgoutput message from `data` into `*out`. Views in the result
// point into `data`. When `*out` already holds the alternative being decoded,
// its storage (the tuple's vector) is reused, so steady-state decoding of
// inserts does not allocate. On error, `*out` is unspecified and the error
// message names the field and the byte offset. Never reads past `data`.
Status Decode(std::string_view data, DecodedMessage* out);

// Encodes a message exactly as pgoutput would send it. Used by tests,
// fixtures and benchmarks; the relay itself only decodes.
std::string Encode(const DecodedMessage& message);

// Relations by OID, replaced whenever the server re-sends a Relation message
// (after a schema change, or after the walsender's cache was invalidated).
class RelationCache {
 public:
  void Put(Relation relation);
  // nullptr when the relation was never sent: a protocol error for the caller.
  const Relation* Find(Oid relation_id) const;
  void Clear() { relations_.clear(); }

 private:
  std::unordered_map<Oid, Relation> relations_;
};

}  // namespace outbox_relay::pgoutput
