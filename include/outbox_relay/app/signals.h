// SIGTERM/SIGINT for the long-running commands (run, replay): the first
// signal asks for a clean stop (the returned flag becomes true), a second one
// exits at once with status 130. SIGPIPE is ignored.
#pragma once

#include <atomic>
#include <chrono>
#include <thread>

#include "outbox_relay/core/mutex.h"

namespace outbox_relay::app {

const std::atomic<bool>& InstallStopSignals();

// Bounds a stop: once `stop` is true, the process exits at most `bound`
// later, whatever the stop still waits on (a statement on a silent
// connection, a Kafka client that does not close). Exiting there is as safe
// as a crash: the slot was only ever confirmed up to what Kafka acknowledged,
// and the next start resumes from it. The line it logs names the step the
// stop was in. Destroying it disarms it.
class StopDeadline {
 public:
  StopDeadline(const std::atomic<bool>& stop, std::chrono::milliseconds bound);
  ~StopDeadline();
  StopDeadline(const StopDeadline&) = delete;
  StopDeadline& operator=(const StopDeadline&) = delete;

  // What the stop does now (a string literal), for that line.
  void Step(const char* what) { step_.store(what); }
  // The exit code the stop decided on: the deadline's exit uses it from then
  // on (before: 1).
  void Decided(int code) { code_.store(code); }

 private:
  void Watch();

  const std::atomic<bool>& stop_;
  const std::chrono::milliseconds bound_;
  std::atomic<const char*> step_{"stopping"};
  std::atomic<int> code_{1};
  StopLatch disarmed_;
  std::thread thread_;
};

}  // namespace outbox_relay::app
