// SIGTERM/SIGINT for the long-running commands (run, replay): the first
// signal asks for a clean stop (the returned flag becomes true), a second one
// exits at once with status 130. SIGPIPE is ignored.
#pragma once

#include <atomic>

namespace outbox_relay::app {

const std::atomic<bool>& InstallStopSignals();

}  // namespace outbox_relay::app
