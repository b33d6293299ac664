// Reading back what this relay committed to Kafka: the newest committed value
// of a key in a (compacted) topic, as a read_committed consumer sees it.
//
// Exactly-once delivery keeps its progress in Kafka, written in the same
// Kafka transaction as the records it describes; this reads it at start.
// Aborted and still-open transactions are invisible to it (read_committed),
// so what it returns is exactly what a consumer can see.
#pragma once

#include <chrono>
#include <optional>
#include <string>

#include "outbox_relay/core/result.h"
#include "outbox_relay/kafka/producer.h"

namespace outbox_relay::kafka {

// The value of the last committed record with `key` in `topic` (every
// partition read from the start to its end), nullopt when there is none or
// the topic does not exist. `connection`: brokers and the client properties
// (TLS, SASL) of the producer; producer-only ones are left out.
Result<std::optional<std::string>> ReadLastCommittedValue(const ProducerOptions& connection,
                                                          const std::string& topic,
                                                          const std::string& key,
                                                          std::chrono::milliseconds timeout);

}  // namespace outbox_relay::kafka
