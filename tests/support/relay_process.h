// The relay binary as a child process: started with arguments and an
// environment, its stdout/stderr appended to a per-test log file, signalled
// (SIGKILL, SIGTERM, SIGSTOP/SIGCONT) and waited for with a timeout.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <csignal>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace outbox_test {

// The relay executable the tests run: $OUTBOX_IT_RELAY_BIN if set (to test
// another build), else the one built with the tests (OUTBOX_RELAY_BIN).
std::string RelayBinary();

class RelayProcess {
 public:
  // `env` entries override the inherited environment; nullopt removes a variable.
  RelayProcess(std::vector<std::string> args,
               std::map<std::string, std::optional<std::string>> env = {},
               std::string log_path = "");
  ~RelayProcess();  // SIGKILL if still running; the log tail if the test failed meanwhile
  RelayProcess(const RelayProcess&) = delete;
  RelayProcess& operator=(const RelayProcess&) = delete;

  // Another relay executable than RelayBinary() (the previous release, in the upgrade tests).
  void set_binary(std::string path) { binary_ = std::move(path); }
  const std::string& binary() const { return binary_; }

  void Start();  // throws if fork/exec fails
  bool Running();
  pid_t pid() const { return pid_; }

  void Kill(int sig = SIGKILL);
  void Terminate() { Kill(SIGTERM); }
  void Pause() { Kill(SIGSTOP); }
  void Resume() { Kill(SIGCONT); }

  // The exit code (128+signal when killed by one), or nullopt after `timeout`.
  std::optional<int> Wait(std::chrono::milliseconds timeout);
  std::optional<int> exit_code() const { return exit_code_; }

  // Waits until this instance's log contains `needle` (false: timeout or exited first).
  bool WaitForLog(const std::string& needle, std::chrono::milliseconds timeout);

  // The log written by this instance (since its Start), and its last `lines` lines.
  std::string Log() const;
  std::string LogTail(size_t lines = 40) const;
  const std::string& log_path() const { return log_path_; }

 private:
  bool Reap(bool block);

  std::vector<std::string> args_;
  std::string binary_ = RelayBinary();
  std::map<std::string, std::optional<std::string>> env_;
  std::string log_path_;
  long log_start_ = 0;
  int failures_at_start_ = 0;  // the test's failure count when this instance started
  pid_t pid_ = -1;
  std::optional<int> exit_code_;
};

}  // namespace outbox_test
