// What the supervisor does after an attempt: recovery as data.
//
// `outbox-relay run` is a loop of attempts (set up the slot, catch Watermill
// tables up, stream) and recoveries. Every way an attempt can end — an error
// of some code in some phase, with the facts around it (a retryable Kafka
// failure in the tracker, exactly-once transactions initialised, a stop
// asked for) — maps to one Recovery in one function, Decide, table-tested in
// tests/unit/app/recovery_test.cc. Relay::Run applies it; it decides nothing
// itself. (Supabase etl's error policy and apply loop are the model.)
#pragma once

#include <optional>
#include <string_view>

#include "outbox_relay/core/result.h"
#include "outbox_relay/pipeline/slot_setup.h"

namespace outbox_relay::app {

// The phases of an attempt, in order.
enum class Phase {
  kSlotSetup,  // the slot: check, create or recreate it, run a pending backfill
  kCatchUp,    // --table-mode=watermill: tables that joined, their catch-ups
  kStream,     // one replication connection, START_REPLICATION to its end
};

struct Attempt {
  Phase phase = Phase::kStream;
  std::optional<Error> error;  // nullopt: the phase ended well (a stop between transactions)
  bool stop_requested = false;
  bool failure_retryable = false;  // the tracker's failure: Kafka gave up (a new producer cures it)
  bool transactions_ready = false;   // exactly-once: this instance initialised its transactions
  bool batch_size_required = false;  // exactly-once: a topic needs smaller batches
  bool end_requested = false;        // watermill: tables wait to join the publication
  pipeline::OnSlotLost on_slot_lost = pipeline::OnSlotLost::kReconcile;
};

enum class Action {
  kNextPhase,        // on to the next phase (after the slot's setup: catch up, then stream)
  kDone,             // stop cleanly: drain, final status update, exit 0
  kStop,             // stop with the error: exit by its code (ExitCodeOf)
  kRestartPipeline,  // a new Kafka producer; the slot sends again what was not confirmed
  kReconnect,        // a new replication connection after a backoff
  kStandby,          // another instance holds the slot: wait, and try again
  kRecreateSlot,     // the slot is lost: recreate it and backfill (--on-slot-lost=reconcile)
  kRejoin,           // watermill: let tables join, then stream again at once
  kRetry,            // the same phase again after a backoff
};

// How the error is told, beside its own message.
enum class Telling {
  kAsIs,         // the message alone
  kReplication,  // prefixed "replication: " (the stream's connection broke)
  kSlotLost,     // with what --on-slot-lost=reconcile would do, and that nothing is lost
  kReplaced,     // this instance was replaced: a new producer, maybe a standby
};

struct Recovery {
  Action action = Action::kStop;
  // Counted as a reconnect (outbox_relay_reconnects_total).
  bool reconnect = false;
  // Counted as an error of the replication connection (db_read) or of Kafka
  // (kafka_unavailable); "" none.
  std::string_view metric_reason;
  Telling telling = Telling::kAsIs;
  bool operator==(const Recovery&) const = default;
};

Recovery Decide(const Attempt& attempt);

}  // namespace outbox_relay::app
