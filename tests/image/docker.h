// The `docker` command line for the image tests: one call with its output, and a
// container of outbox-relay:local (the image scripts/image builds) that the test
// starts, stops, kills and reads the logs of.
//
// The engine is the private one scripts/image starts (DOCKER_HOST from
// `scripts/image env`); containers use --network host, so the relay reaches the
// test PostgreSQL and Kafka on 127.0.0.1 like the bare binary does.
#pragma once

#include <chrono>
#include <optional>
#include <string>
#include <vector>

namespace outbox_test {

struct CommandResult {
  int status = -1;     // exit status; 128+signal when killed; -1: could not run
  std::string output;  // stdout and stderr together
};

// Runs argv (argv[0] searched in PATH), kills it after `timeout`.
CommandResult RunCommand(const std::vector<std::string>& argv,
                         std::chrono::milliseconds timeout = std::chrono::seconds(60));

// Points DOCKER_HOST at scripts/image's engine (once per process) and returns the
// docker binary to run; a fatal gtest failure when the engine does not answer.
void UseImageEngine();
CommandResult Docker(const std::vector<std::string>& args,
                     std::chrono::milliseconds timeout = std::chrono::seconds(60));

// The image under test: $OUTBOX_IMAGE or outbox-relay:local.
std::string RelayImage();

class RelayContainer {
 public:
  // `docker run -d --name <name> --network host --read-only` + `docker_options` +
  // the image + `args` (the relay's command line).
  RelayContainer(std::string name, std::vector<std::string> docker_options,
                 std::vector<std::string> args);
  ~RelayContainer();  // docker rm -f; prints the log tail if the test failed meanwhile
  RelayContainer(const RelayContainer&) = delete;
  RelayContainer& operator=(const RelayContainer&) = delete;

  void Start();  // throws when docker run fails
  const std::string& name() const { return name_; }

  bool Running();
  // Its main process's pid on this machine (0 when not running).
  int HostPid();
  // The exit code once stopped (docker inspect State.ExitCode), nullopt while running.
  std::optional<int> ExitCode();
  std::optional<int> Wait(std::chrono::milliseconds timeout);

  // `docker stop -t <grace>`: SIGTERM, SIGKILL after the grace period. Returns the
  // seconds `docker stop` took.
  double Stop(int grace_seconds);
  void Kill();  // docker kill: SIGKILL

  std::string Logs();
  std::string LogTail(size_t lines = 40);
  bool WaitForLog(const std::string& needle, std::chrono::milliseconds timeout);

 private:
  std::string name_;
  std::vector<std::string> docker_options_;
  std::vector<std::string> args_;
  int failures_at_start_ = 0;
  bool started_ = false;
};

}  // namespace outbox_test
