// Failpoints: faults the tests switch on so that they can show what they
// would catch (a broken confirmation rule, a fatal producer error, exactly-once
// producing again what Kafka has). One switch, the environment variable
//
//   OUTBOX_TEST_FAULT = name [ ":" argument ]
//
//   confirm-newest     the tracker confirms the newest received position,
//                      delivered or not (tests/integration/resilience_crash_test)
//   fatal-after:N      the producer turns fatal after N records
//                      (tests/integration/resilience_kafka_test)
//   eos-no-skip        exactly-once produces again what Kafka already has
//                      (tests/integration/exactly_once_test)
//   stall-stop:S       a stop hangs S seconds before closing the Kafka
//                      producer (tests/integration/shutdown_test)
//   stall-before-init:S  exactly-once: the first stream hangs S seconds after
//                      START_REPLICATION, before it fences anyone
//                      (tests/integration/exactly_once_test)
//   stall-backfill:S   the first backfill hangs S seconds after storing the
//                      slot's snapshot, before its first row (the setup lock
//                      held; tests/integration/resilience_slot_test)
//   no-restream        after its first session the stream never connects
//                      again (tests/integration/failover_test: a stop follows
//                      a promotion itself)
//
// Compiled in only where the build says so: CMake's OUTBOX_FAILPOINTS (ON for
// development and test builds, OFF for the shipped image, docker/Dockerfile).
// Without it kCompiledIn is false, every guarded branch is removed, and the
// variable is only reported as ignored.
#pragma once

#include <cstdlib>
#include <optional>
#include <string_view>

#ifndef OUTBOX_FAILPOINTS
#define OUTBOX_FAILPOINTS 0
#endif

namespace outbox_relay::failpoint {

inline constexpr bool kCompiledIn = OUTBOX_FAILPOINTS != 0;
inline constexpr const char* kVariable = "OUTBOX_TEST_FAULT";

struct Fault {
  std::string_view name;
  std::string_view argument;  // after the colon; empty when there is none
};

// "name" or "name:argument"; nullopt for an empty text.
inline std::optional<Fault> Parse(std::string_view text) {
  if (text.empty()) return std::nullopt;
  size_t colon = text.find(':');
  if (colon == std::string_view::npos) return Fault{text, {}};
  return Fault{text.substr(0, colon), text.substr(colon + 1)};
}

// What the environment asks for, whether or not this build can do it.
inline std::optional<Fault> Requested() {
  const char* text = std::getenv(kVariable);
  return text == nullptr ? std::nullopt : Parse(text);
}

// The argument of failpoint `name` when it is switched on and compiled in.
inline std::optional<std::string_view> Active(std::string_view name) {
  if constexpr (!kCompiledIn) {
    return std::nullopt;
  } else {
    std::optional<Fault> fault = Requested();
    if (!fault || fault->name != name) return std::nullopt;
    return fault->argument;
  }
}

}  // namespace outbox_relay::failpoint
