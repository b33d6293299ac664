#include <spdlog/spdlog.h>

#include <thread>

#include "outbox_relay/app/commands.h"
#include "outbox_relay/app/relay.h"

// How the relay stops: draining what is in flight, then the shutdown.
namespace outbox_relay::app {

namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

}  // namespace

void Relay::Drain(milliseconds bound) {
  auto until = bound == milliseconds::max() ? Clock::time_point::max() : Clock::now() + bound;
  while (!tracker_->empty() && !tracker_->failure() && Clock::now() < until &&
         !stop_->requested()) {
    stats_.Beat();
    if (auto dl = publisher_->DeadLetterRefused(nullptr); !dl) break;
    // The marker met a promotion: nothing is marked before the next stream
    // follows it, so a bounded wait here would only hold that stream back.
    if (bound != milliseconds::max() && marker_ && marker_->timeline_refused()) break;
    tracker_->WaitForProgress(milliseconds(100));
  }
}

int Relay::Shutdown(pipeline::StreamSession* session, bool failed) {
  // The timeout counts from the stop request as the loop first saw it: time
  // spent finishing (or giving up) the open transaction is part of it.
  auto deadline = stop_->since() + milliseconds(config_.shutdown_timeout_ms);
  auto remaining = [&] {
    return std::max(milliseconds(0),
                    std::chrono::duration_cast<milliseconds>(deadline - Clock::now()));
  };
  bool drained = false;
  bool followed = false;      // a promotion the marker met, followed by the stop itself
  bool follow_tried = false;  // one replication connection per stop, not one per wait
  if (!failed) {
    spdlog::info("stopping: flushing {} rows in flight", tracker_->rows_in_flight());
    // Flush sends what linger holds back; deliveries then drain the tracker
    // and the marker marks. Keep talking to the walsender meanwhile.
    if (publisher_->transactional()) {
      if (auto st = publisher_->FinishTransaction(remaining(), session); !st) {
        spdlog::warn("{}", st.error().message);
      }
    } else if (auto st = publisher_->Flush(std::min(remaining(), milliseconds(1000))); !st) {
      spdlog::debug("{}", st.error().message);
    }
    while (!(drained = tracker_->WaitEmpty(milliseconds(200))) && !tracker_->failure() &&
           remaining() > milliseconds(0)) {
      if (!follow_tried && marker_ && marker_->timeline_refused()) {
        follow_tried = true;
        followed = FollowPromotionAtStop();
      }
      (void)publisher_->DeadLetterRefused(session);
      if (session != nullptr) {
        if (auto st = session->SendStatus(false); !st) session = nullptr;
      }
    }
  }
  StopDeadline& deadline_exit = *stop_deadline_;
  if (watermill_) watermill_->StopDiscovery();
  deadline_exit.Step("stopping the marker");
  if (marker_) marker_->Stop(remaining());
  if (session != nullptr) {
    deadline_exit.Step("sending the final status update");
    // The final word: everything confirmed, so the next start sends nothing twice.
    if (auto st = session->SendStatus(true); !st) {
      spdlog::warn("final status update: {}", st.error().message);
    }
    (void)session->source().Finish(std::min(remaining(), milliseconds(2000)) + milliseconds(100));
  }
  deadline_exit.Step("closing the Kafka producer");
  if constexpr (failpoint::kCompiledIn) {
    if (auto secs = failpoint::Active("stall-stop")) {
      std::this_thread::sleep_for(std::chrono::seconds(std::stoi(std::string(*secs))));
    }
  }
  publisher_->CloseSink();  // joins the delivery threads
  deadline_exit.Step("stopping the metrics sampler");
  if (sampler_) sampler_->Stop();
  deadline_exit.Step("closing the clients");
  auto failure = tracker_->failure();
  if (!failed && failure && followed && tracker_->failure_retryable()) {
    // Given back by the marker after the promotion: re-sent from this
    // server's slot after the restart, as a running relay would have.
    spdlog::warn("stopped after following a promotion: {}; confirmed {}", *failure,
                 tracker_->confirmed());
    deadline_exit.Decided(kExitOk);
    return kExitOk;
  }
  if (failed || failure) {
    if (failure) spdlog::error("stopped after a delivery failure: {}", *failure);
    spdlog::error("stopped without confirming past {}; a restart resumes there",
                  tracker_->confirmed());
    return kExitFailure;
  }
  if (!drained) {
    auto s = tracker_->stats();
    spdlog::error(
        "shutdown timeout: {} transactions in flight ({} rows unacknowledged by Kafka, {} "
        "transactions delivered but not marked); confirmed {}",
        s.transactions, s.rows_in_flight, s.awaiting_mark, s.confirmed);
    return kExitFailure;
  }
  spdlog::info("stopped cleanly: confirmed {}, {} rows delivered", tracker_->confirmed(),
               stats_.delivered.load());
  deadline_exit.Decided(kExitOk);
  return kExitOk;
}

}  // namespace outbox_relay::app
