#include "outbox_relay/app/signals.h"

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <csignal>
#include <cstdlib>

namespace outbox_relay::app {

namespace {

std::atomic<bool> g_stop{false};

void OnSignal(int) {
  if (g_stop.exchange(true)) {
    // A second signal: the operator does not want to wait for the drain.
    constexpr char kMsg[] = "second signal: exiting without draining\n";
    (void)!write(STDERR_FILENO, kMsg, sizeof(kMsg) - 1);
    _exit(130);
  }
}

}  // namespace

const std::atomic<bool>& InstallStopSignals() {
  struct sigaction sa {};
  sa.sa_handler = OnSignal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
  std::signal(SIGPIPE, SIG_IGN);
  return g_stop;
}

StopDeadline::StopDeadline(const std::atomic<bool>& stop, std::chrono::milliseconds bound)
    : stop_(stop), bound_(bound), thread_([this] { Watch(); }) {}

StopDeadline::~StopDeadline() {
  disarmed_.Set();
  if (thread_.joinable()) thread_.join();
}

void StopDeadline::Watch() {
  // The stop flag is set by a signal handler, which cannot notify: look
  // every 100 ms.
  while (!stop_.load()) {
    if (disarmed_.SleepFor(std::chrono::milliseconds(100))) return;
  }
  if (disarmed_.SleepFor(bound_)) return;
  spdlog::error(
      "stopping: still {} {} ms after the stop request: exiting now without it (nothing Kafka "
      "did not acknowledge was confirmed; the next start resumes from the slot)",
      step_.load(), bound_.count());
  spdlog::default_logger()->flush();
  std::_Exit(code_.load());
}

}  // namespace outbox_relay::app
