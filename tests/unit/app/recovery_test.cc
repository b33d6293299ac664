// Recovery as data (app/recovery.h): every way an attempt of `run` can end,
// and what the supervisor does then. One row per case.
#include "outbox_relay/app/recovery.h"

#include <gtest/gtest.h>

#include <vector>

namespace outbox_relay::app {
namespace {

Error E(ErrorCode code) { return Error{code, "x"}; }

// For the failure messages.
std::string_view ActionName(Action action) {
  switch (action) {
    case Action::kNextPhase:
      return "next phase";
    case Action::kDone:
      return "done";
    case Action::kStop:
      return "stop";
    case Action::kRestartPipeline:
      return "restart the pipeline";
    case Action::kReconnect:
      return "reconnect";
    case Action::kStandby:
      return "standby";
    case Action::kRecreateSlot:
      return "recreate the slot";
    case Action::kRejoin:
      return "let tables join";
    case Action::kRetry:
      return "retry";
  }
  return "?";
}

struct Row {
  const char* what;
  Attempt attempt;
  Action want;
  bool reconnect = false;
  std::string_view metric = {};
  Telling tell = Telling::kAsIs;
};

Attempt At(Phase phase, std::optional<Error> error = std::nullopt) {
  Attempt a;
  a.phase = phase;
  a.error = std::move(error);
  return a;
}

template <typename F>
Attempt With(Attempt a, F change) {
  change(a);
  return a;
}

TEST(Recovery, EveryWayAnAttemptEndsHasOneRecovery) {
  using enum Phase;
  using enum ErrorCode;
  const std::vector<Row> table = {
      // The slot's setup and the Watermill catch-up.
      {"setup done", At(kSlotSetup), Action::kNextPhase},
      {"setup done, stop asked", With(At(kSlotSetup), [](Attempt& a) { a.stop_requested = true; }),
       Action::kDone},
      {"another instance sets the slot up", At(kSlotSetup, E(kSlotInUse)), Action::kStandby},
      {"database away during setup", At(kSlotSetup, E(kTransient)), Action::kRetry},
      {"a setting", At(kSlotSetup, E(kInvalidArgument)), Action::kStop},
      {"a privilege", At(kSlotSetup, E(kPermission)), Action::kStop},
      {"stop inside the backfill", At(kSlotSetup, E(kCancelled)), Action::kDone},
      {"Kafka gave up under the backfill",
       With(At(kSlotSetup, E(kFatal)), [](Attempt& a) { a.failure_retryable = true; }),
       Action::kRestartPipeline},
      {"fenced under the backfill",
       At(kSlotSetup, E(kFenced)),
       Action::kRestartPipeline,
       false,
       {},
       Telling::kReplaced},
      {"fenced while stopping",
       With(At(kSlotSetup, E(kFenced)), [](Attempt& a) { a.stop_requested = true; }),
       Action::kStop},
      {"catch-up done", At(kCatchUp), Action::kNextPhase},
      {"Kafka gave up under a catch-up",
       With(At(kCatchUp, E(kAborted)), [](Attempt& a) { a.failure_retryable = true; }),
       Action::kRestartPipeline},
      {"catch-up: database away", At(kCatchUp, E(kTransient)), Action::kRetry},
      {"catch-up: slot in use", At(kCatchUp, E(kSlotInUse)), Action::kStandby},
      {"catch-up: a table that cannot be served", At(kCatchUp, E(kInvalidArgument)), Action::kStop},
      // The stream.
      {"stopped between transactions", At(kStream), Action::kDone},
      {"stop gave up an open transaction", At(kStream, E(kCancelled)), Action::kDone},
      {"connection broke", At(kStream, E(kTransient)), Action::kReconnect, true, "db_read",
       Telling::kReplication},
      {"connection broke, tables wait to join",
       With(At(kStream, E(kTransient)), [](Attempt& a) { a.end_requested = true; }),
       Action::kRejoin},
      {"the server sent nonsense", At(kStream, E(kProtocol)), Action::kStop},
      {"slot lost, reconcile", At(kStream, E(kSlotLost)), Action::kRecreateSlot},
      {"slot lost, fail",
       With(At(kStream, E(kSlotLost)),
            [](Attempt& a) { a.on_slot_lost = pipeline::OnSlotLost::kFail; }),
       Action::kStop,
       false,
       {},
       Telling::kSlotLost},
      {"another instance streams", At(kStream, E(kSlotInUse)), Action::kStandby, true},
      {"exactly-once: another instance took the slot over",
       With(At(kStream, E(kSlotInUse)), [](Attempt& a) { a.transactions_ready = true; }),
       Action::kRestartPipeline,
       true,
       {},
       Telling::kReplaced},
      {"exactly-once: fenced",
       At(kStream, E(kFenced)),
       Action::kRestartPipeline,
       true,
       {},
       Telling::kReplaced},
      {"exactly-once: a Kafka transaction aborted", At(kStream, E(kAborted)), Action::kReconnect,
       true, "kafka_unavailable"},
      {"exactly-once: aborted, a topic needs smaller batches",
       With(At(kStream, E(kAborted)), [](Attempt& a) { a.batch_size_required = true; }),
       Action::kRestartPipeline, true, "kafka_unavailable"},
      {"Kafka gave up (delivery deadline)",
       With(At(kStream, E(kFatal)), [](Attempt& a) { a.failure_retryable = true; }),
       Action::kRestartPipeline, true},
      {"Kafka gave up, but a stop was asked: no new producer",
       With(At(kStream, E(kFatal)),
            [](Attempt& a) {
              a.failure_retryable = true;
              a.stop_requested = true;
            }),
       Action::kStop},
      {"poison row with --on-poison=halt", At(kStream, E(kFatal)), Action::kStop},
      {"a duplicate key", At(kStream, E(kDuplicateKey)), Action::kStop},
  };
  for (const Row& row : table) {
    Recovery r = Decide(row.attempt);
    EXPECT_EQ(r.action, row.want) << row.what << ": " << ActionName(r.action);
    EXPECT_EQ(r.reconnect, row.reconnect) << row.what;
    EXPECT_EQ(r.metric_reason, row.metric) << row.what;
    EXPECT_EQ(r.telling, row.tell) << row.what;
  }
}

}  // namespace
}  // namespace outbox_relay::app
