// Shows the progress of long work (core/progress.h) where its user looks: a
// live line on a terminal (standard error is one: redrawn every 250 ms), log
// lines every 10 s otherwise (a relay under a supervisor, a Kubernetes Job).
// Used by the backfill, `replay` and `cleanup`. Thread: its owner's.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <thread>

#include "outbox_relay/core/clock.h"
#include "outbox_relay/core/mutex.h"
#include "outbox_relay/core/progress.h"

namespace outbox_relay::pipeline {

class ProgressReport {
 public:
  ProgressReport(std::string what, std::optional<uint64_t> total, bool estimated);
  ~ProgressReport();
  ProgressReport(const ProgressReport&) = delete;
  ProgressReport& operator=(const ProgressReport&) = delete;

  // Rows done so far: shown when the interval has passed.
  void Update(uint64_t done);
  // The last figures, shown now (on a terminal, the line is ended).
  void Finish(uint64_t done);
  bool terminal() const { return terminal_; }

 private:
  void Show(uint64_t done, bool last);

  const std::string what_;
  const std::optional<uint64_t> total_;
  const bool estimated_;
  const bool terminal_;
  const Clock::time_point started_;
  Clock::time_point last_shown_;
  bool shown_on_terminal_ = false;
  bool finished_ = false;
  bool logged_ = false;
};

// What a command is waiting for, and for how long, on a terminal only (standard
// error is one): "check: Kafka at host:9092 (up to 5 s): 2.3 s", redrawn every
// 250 ms by a thread of its own once a step has taken 500 ms, erased when the
// next step begins and at the end. Elsewhere nothing: each step's result is
// printed anyway. Used by `check`, whose steps wait on servers. Begin: any thread.
class StepLine {
 public:
  explicit StepLine(std::string what);
  ~StepLine();  // erases the line
  StepLine(const StepLine&) = delete;
  StepLine& operator=(const StepLine&) = delete;

  void Begin(std::string step);
  bool terminal() const { return terminal_; }

 private:
  void Loop();

  const std::string what_;
  const bool terminal_;
  Mutex mu_;
  CondVar cv_;
  std::string step_ GUARDED_BY(mu_);
  Clock::time_point since_ GUARDED_BY(mu_);
  bool stop_ GUARDED_BY(mu_) = false;
  bool shown_ GUARDED_BY(mu_) = false;  // the loop's own
  std::thread thread_;
};

}  // namespace outbox_relay::pipeline
