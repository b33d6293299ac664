// Shows the progress of long work (core/progress.h) where its user looks: a
// live line on a terminal (standard error is one: redrawn every 250 ms), log
// lines every 10 s otherwise (a relay under a supervisor, a Kubernetes Job).
// Used by the backfill, `replay` and `cleanup`. Thread: its owner's.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>

#include "outbox_relay/core/clock.h"
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

}  // namespace outbox_relay::pipeline
