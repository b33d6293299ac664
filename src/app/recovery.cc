#include "outbox_relay/app/recovery.h"

namespace outbox_relay::app {

namespace {

constexpr std::string_view kDbRead = "db_read";
constexpr std::string_view kKafkaUnavailable = "kafka_unavailable";

Recovery Of(Action action, bool reconnect = false, std::string_view metric = {}) {
  return Recovery{action, reconnect, metric};
}

// What every phase shares: a stop, a Kafka that gave up, a fenced producer,
// an error no retry cures, another instance on the slot.
std::optional<Recovery> Common(const Attempt& a, const Error& e) {
  if (a.failure_retryable && !a.stop_requested) {
    // Kafka did not take the records (a delivery deadline, a producer failed
    // for good): a new producer, and the slot sends them again.
    return Of(Action::kRestartPipeline, a.phase == Phase::kStream);
  }
  if (e.code == ErrorCode::kCancelled) return Of(Action::kDone);
  if (e.code == ErrorCode::kFenced && !a.stop_requested) {
    // Exactly-once: another instance initialised the transactional.id. A new
    // producer: if the slot is still this instance's it fences the other,
    // else it waits as the other's standby.
    return Of(Action::kRestartPipeline, a.phase == Phase::kStream);
  }
  return std::nullopt;
}

Recovery DecideAction(const Attempt& a) {
  if (!a.error) {
    if (a.phase == Phase::kStream || a.stop_requested) return Of(Action::kDone);
    return Of(Action::kNextPhase);
  }
  const Error& e = *a.error;
  if (auto common = Common(a, e)) return *common;
  switch (a.phase) {
    case Phase::kSlotSetup:
    case Phase::kCatchUp:
      if (DispositionOf(e) != Disposition::kRetry) return Of(Action::kStop);
      if (e.code == ErrorCode::kSlotInUse) return Of(Action::kStandby);
      return Of(Action::kRetry);
    case Phase::kStream:
      break;
  }
  if (e.code == ErrorCode::kTransient && a.end_requested) {
    return Of(Action::kRejoin);  // asked for: tables join the publication
  }
  if (e.code == ErrorCode::kSlotLost) {
    return a.on_slot_lost == pipeline::OnSlotLost::kReconcile ? Of(Action::kRecreateSlot)
                                                              : Of(Action::kStop);
  }
  if (e.code == ErrorCode::kSlotInUse && a.transactions_ready) {
    // Exactly-once: this instance held the slot and initialised its
    // transactions; another one holds it now. Its producer is done for: a
    // new one, initialised only if this instance takes the slot over again.
    return Of(Action::kRestartPipeline, true);
  }
  if (DispositionOf(e) != Disposition::kRetry) return Of(Action::kStop);
  if (e.code == ErrorCode::kAborted) {
    // Exactly-once: a Kafka transaction aborted; the slot sends it again. A
    // topic that needs smaller batches needs a new producer.
    return Of(a.batch_size_required ? Action::kRestartPipeline : Action::kReconnect, true,
              kKafkaUnavailable);
  }
  if (e.code == ErrorCode::kSlotInUse) return Of(Action::kStandby, true);
  return Of(Action::kReconnect, true, kDbRead);
}

// How the error of an attempt that ends in `r` is told.
Telling TellingOf(const Error& e, const Recovery& r) {
  switch (r.action) {
    case Action::kStop:
      return e.code == ErrorCode::kSlotLost ? Telling::kSlotLost : Telling::kAsIs;
    case Action::kRestartPipeline:
      return e.code == ErrorCode::kFenced || e.code == ErrorCode::kSlotInUse ? Telling::kReplaced
                                                                             : Telling::kAsIs;
    case Action::kReconnect:
      return e.code == ErrorCode::kAborted ? Telling::kAsIs : Telling::kReplication;
    default:
      return Telling::kAsIs;
  }
}

}  // namespace

Recovery Decide(const Attempt& a) {
  Recovery r = DecideAction(a);
  if (a.error) r.telling = TellingOf(*a.error, r);
  return r;
}

}  // namespace outbox_relay::app
