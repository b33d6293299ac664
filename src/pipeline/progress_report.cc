#include "outbox_relay/pipeline/progress_report.h"

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <cstdio>
#include <utility>

namespace outbox_relay::pipeline {

namespace {

constexpr std::chrono::milliseconds kTerminalEvery{250};
constexpr std::chrono::seconds kLogEvery{10};

bool StderrIsTerminal() { return isatty(STDERR_FILENO) == 1; }

}  // namespace

ProgressReport::ProgressReport(std::string what, std::optional<uint64_t> total, bool estimated)
    : what_(std::move(what)),
      total_(total),
      estimated_(estimated),
      terminal_(StderrIsTerminal()),
      started_(Clock::Steady().Now()),
      last_shown_(started_) {}

ProgressReport::~ProgressReport() {
  // A line left open on the terminal is ended, so the next output starts on its own.
  if (shown_on_terminal_ && !finished_) std::fputs("\n", stderr);
}

void ProgressReport::Update(uint64_t done) {
  const auto every = terminal_
                         ? std::chrono::duration_cast<std::chrono::milliseconds>(kTerminalEvery)
                         : std::chrono::duration_cast<std::chrono::milliseconds>(kLogEvery);
  if (Clock::Steady().Now() - last_shown_ < every) return;
  Show(done, false);
}

void ProgressReport::Finish(uint64_t done) {
  if (finished_) return;
  finished_ = true;
  // In the log a short run says nothing here: its caller logs the summary.
  if (terminal_ || logged_) Show(done, true);
}

void ProgressReport::Show(uint64_t done, bool last) {
  const auto now = Clock::Steady().Now();
  last_shown_ = now;
  Progress p;
  p.done = done;
  p.total = total_;
  p.estimated = estimated_;
  p.elapsed = std::chrono::duration<double>(now - started_);
  std::string line = DescribeProgress(what_, p);
  if (terminal_) {
    // Carriage return and erase to the end of the line: redrawn in place.
    std::fprintf(stderr, "\r%s\x1b[K%s", line.c_str(), last ? "\n" : "");
    std::fflush(stderr);
    shown_on_terminal_ = !last;
  } else {
    spdlog::info("{}", line);
    logged_ = true;
  }
}

StepLine::StepLine(std::string what)
    : what_(std::move(what)), terminal_(StderrIsTerminal()), since_(Clock::Steady().Now()) {
  if (terminal_) thread_ = std::thread([this] { Loop(); });
}

StepLine::~StepLine() {
  {
    MutexLock lock(&mu_);
    stop_ = true;
  }
  cv_.NotifyAll();
  if (thread_.joinable()) thread_.join();
}

void StepLine::Begin(std::string step) {
  {
    MutexLock lock(&mu_);
    step_ = std::move(step);
    since_ = Clock::Steady().Now();
  }
  cv_.NotifyAll();
}

void StepLine::Loop() {
  MutexLock lock(&mu_);
  while (!stop_) {
    cv_.WaitFor(&mu_, kTerminalEvery);
    const auto ran = Clock::Steady().Now() - since_;
    if (!stop_ && !step_.empty() && ran >= std::chrono::milliseconds(500)) {
      std::fprintf(stderr, "\r%s: %s: %.1f s\x1b[K", what_.c_str(), step_.c_str(),
                   std::chrono::duration<double>(ran).count());
      std::fflush(stderr);
      shown_ = true;
    } else if (shown_) {
      // A new step (not yet 500 ms old) or the end: the old line goes.
      std::fputs("\r\x1b[K", stderr);
      std::fflush(stderr);
      shown_ = false;
    }
  }
}

}  // namespace outbox_relay::pipeline
