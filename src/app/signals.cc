#include "outbox_relay/app/signals.h"

#include <unistd.h>

#include <csignal>

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

}  // namespace outbox_relay::app
