#include "docker.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>

#ifndef OUTBOX_SOURCE_DIR
#error "OUTBOX_SOURCE_DIR must name the repository root"
#endif

namespace outbox_test {

namespace {

// Debian's client, the version of the engine scripts/image starts (see there).
constexpr const char* kDockerBin = "/usr/bin/docker";

int FailureCount() {
  const ::testing::TestInfo* info = ::testing::UnitTest::GetInstance()->current_test_info();
  return info == nullptr ? 0 : info->result()->total_part_count();
}

std::string Trim(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == '\r' || s.back() == ' ')) s.pop_back();
  return s;
}

}  // namespace

CommandResult RunCommand(const std::vector<std::string>& argv, std::chrono::milliseconds timeout) {
  CommandResult result;
  int pipefd[2];
  if (::pipe2(pipefd, O_CLOEXEC) != 0) return result;
  std::vector<std::string> copy = argv;
  std::vector<char*> cargv;
  for (auto& a : copy) cargv.push_back(a.data());
  cargv.push_back(nullptr);
  pid_t pid = ::fork();
  if (pid < 0) {
    ::close(pipefd[0]);
    ::close(pipefd[1]);
    return result;
  }
  if (pid == 0) {
    int devnull = ::open("/dev/null", O_RDONLY);
    if (devnull >= 0) ::dup2(devnull, STDIN_FILENO);
    ::dup2(pipefd[1], STDOUT_FILENO);
    ::dup2(pipefd[1], STDERR_FILENO);
    ::execvp(cargv[0], cargv.data());
    const char msg[] = "[test] exec failed\n";
    (void)!::write(STDERR_FILENO, msg, sizeof(msg) - 1);
    ::_exit(127);
  }
  ::close(pipefd[1]);
  auto deadline = std::chrono::steady_clock::now() + timeout;
  bool killed = false;
  char buf[8192];
  while (true) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0 && !killed) {
      ::kill(pid, SIGKILL);
      killed = true;
      result.output += fmt::format("\n[test] killed after {} ms\n", timeout.count());
    }
    pollfd p{pipefd[0], POLLIN, 0};
    int n = ::poll(&p, 1, killed ? 1000 : static_cast<int>(std::min<long>(left.count(), 1000)));
    if (n < 0 && errno != EINTR) break;
    if (n <= 0) continue;
    ssize_t r = ::read(pipefd[0], buf, sizeof(buf));
    if (r <= 0) break;
    result.output.append(buf, static_cast<size_t>(r));
  }
  ::close(pipefd[0]);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (WIFEXITED(status)) {
    result.status = WEXITSTATUS(status);
  } else if (WIFSIGNALED(status)) {
    result.status = 128 + WTERMSIG(status);
  }
  return result;
}

void UseImageEngine() {
  static std::once_flag once;
  static std::string error;
  std::call_once(once, [] {
    CommandResult env = RunCommand({std::string(OUTBOX_SOURCE_DIR) + "/scripts/image", "env"});
    const std::string prefix = "export DOCKER_HOST=";
    size_t at = env.output.find(prefix);
    if (env.status != 0 || at == std::string::npos) {
      error = "scripts/image env failed: " + env.output;
      return;
    }
    std::string host = Trim(env.output.substr(at + prefix.size()));
    ::setenv("DOCKER_HOST", host.c_str(), 1);
    CommandResult version = RunCommand({kDockerBin, "version", "--format", "{{.Server.Version}}"});
    if (version.status != 0) {
      error = fmt::format(
          "the Docker engine at {} does not answer (start it and build the images with "
          "`scripts/image up --test-images`): {}",
          host, version.output);
    }
  });
  if (!error.empty()) FAIL() << error;
}

CommandResult Docker(const std::vector<std::string>& args, std::chrono::milliseconds timeout) {
  std::vector<std::string> argv = {kDockerBin};
  argv.insert(argv.end(), args.begin(), args.end());
  return RunCommand(argv, timeout);
}

std::string RelayImage() {
  const char* image = std::getenv("OUTBOX_IMAGE");
  return image != nullptr && *image != '\0' ? image : "outbox-relay:local";
}

RelayContainer::RelayContainer(std::string name, std::vector<std::string> docker_options,
                               std::vector<std::string> args)
    : name_(std::move(name)), docker_options_(std::move(docker_options)), args_(std::move(args)) {}

RelayContainer::~RelayContainer() {
  if (!started_) return;
  if (FailureCount() > failures_at_start_) {
    std::fprintf(stderr, "---- container %s log tail ----\n%s\n---- end of container log ----\n",
                 name_.c_str(), LogTail(60).c_str());
  }
  Docker({"rm", "-f", name_});
}

void RelayContainer::Start() {
  failures_at_start_ = FailureCount();
  Docker({"rm", "-f", name_});  // a leftover of an earlier run with this name
  std::vector<std::string> run = {"run", "-d", "--name", name_, "--network", "host", "--read-only"};
  run.insert(run.end(), docker_options_.begin(), docker_options_.end());
  run.push_back(RelayImage());
  run.insert(run.end(), args_.begin(), args_.end());
  CommandResult r = Docker(run);
  if (r.status != 0) throw std::runtime_error("docker run failed: " + r.output);
  started_ = true;
}

bool RelayContainer::Running() {
  CommandResult r = Docker({"inspect", "-f", "{{.State.Running}}", name_});
  return r.status == 0 && Trim(r.output) == "true";
}

int RelayContainer::HostPid() {
  CommandResult r = Docker({"inspect", "-f", "{{.State.Pid}}", name_});
  return r.status == 0 ? std::atoi(r.output.c_str()) : 0;
}

std::optional<int> RelayContainer::ExitCode() {
  CommandResult r = Docker({"inspect", "-f", "{{.State.Running}} {{.State.ExitCode}}", name_});
  if (r.status != 0 || r.output.starts_with("true")) return std::nullopt;
  return std::atoi(r.output.substr(r.output.find(' ') + 1).c_str());
}

std::optional<int> RelayContainer::Wait(std::chrono::milliseconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (true) {
    if (auto code = ExitCode()) return code;
    if (std::chrono::steady_clock::now() >= deadline) return std::nullopt;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

double RelayContainer::Stop(int grace_seconds) {
  auto t0 = std::chrono::steady_clock::now();
  Docker({"stop", "-t", std::to_string(grace_seconds), name_},
         std::chrono::seconds(grace_seconds + 30));
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

void RelayContainer::Kill() { Docker({"kill", name_}); }

std::string RelayContainer::Logs() {
  return Docker({"logs", name_}, std::chrono::seconds(30)).output;
}

std::string RelayContainer::LogTail(size_t lines) {
  return Docker({"logs", "--tail", std::to_string(lines), name_}, std::chrono::seconds(30)).output;
}

bool RelayContainer::WaitForLog(const std::string& needle, std::chrono::milliseconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (true) {
    if (Logs().find(needle) != std::string::npos) return true;
    if (!Running() || std::chrono::steady_clock::now() >= deadline) {
      return Logs().find(needle) != std::string::npos;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
}

}  // namespace outbox_test
