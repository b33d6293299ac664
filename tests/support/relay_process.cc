#include "support/relay_process.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <thread>

#include "support/env.h"

extern char** environ;

#ifndef OUTBOX_RELAY_BIN
#error "OUTBOX_RELAY_BIN must name the outbox-relay executable"
#endif

namespace outbox_test {

std::string RelayBinary() {
  const char* other = std::getenv("OUTBOX_IT_RELAY_BIN");
  return other != nullptr && *other != '\0' ? other : OUTBOX_RELAY_BIN;
}

namespace {

int TestFailureCount() {
  const ::testing::TestInfo* info = ::testing::UnitTest::GetInstance()->current_test_info();
  return info == nullptr ? 0 : info->result()->total_part_count();
}

}  // namespace

RelayProcess::RelayProcess(std::vector<std::string> args,
                           std::map<std::string, std::optional<std::string>> env,
                           std::string log_path)
    : args_(std::move(args)),
      env_(std::move(env)),
      log_path_(log_path.empty() ? TestLogPath() : std::move(log_path)) {}

RelayProcess::~RelayProcess() {
  if (pid_ > 0 && !exit_code_) {
    ::kill(pid_, SIGCONT);
    ::kill(pid_, SIGKILL);
    Reap(true);
  }
  if (pid_ > 0 && TestFailureCount() > failures_at_start_) {
    std::fprintf(stderr, "---- relay pid %d log tail (%s) ----\n%s\n---- end of relay log ----\n",
                 static_cast<int>(pid_), log_path_.c_str(), LogTail(40).c_str());
  }
}

void RelayProcess::Start() {
  if (pid_ > 0 && !exit_code_) throw std::logic_error("relay already running");
  exit_code_.reset();
  failures_at_start_ = TestFailureCount();
  int fd = ::open(log_path_.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) throw std::runtime_error("open " + log_path_ + ": " + std::strerror(errno));
  struct stat st {};
  ::fstat(fd, &st);
  std::string cmdline = binary_;
  for (const auto& a : args_) cmdline += " '" + a + "'";
  std::string banner = fmt::format("\n==== [test] starting relay: {}\n", cmdline);
  (void)!::write(fd, banner.data(), banner.size());
  log_start_ = static_cast<long>(st.st_size);

  // Build argv and envp before fork: only async-signal-safe calls in the child.
  std::vector<std::string> argv_s;
  argv_s.push_back(binary_);
  argv_s.insert(argv_s.end(), args_.begin(), args_.end());
  std::vector<char*> argv;
  for (auto& s : argv_s) argv.push_back(s.data());
  argv.push_back(nullptr);
  std::vector<std::string> env_s;
  for (char** e = environ; *e != nullptr; ++e) {
    std::string_view kv(*e);
    std::string key(kv.substr(0, kv.find('=')));
    if (env_.contains(key)) continue;
    env_s.emplace_back(kv);
  }
  for (const auto& [k, v] : env_) {
    if (v) env_s.push_back(k + "=" + *v);
  }
  std::vector<char*> envp;
  for (auto& s : env_s) envp.push_back(s.data());
  envp.push_back(nullptr);

  pid_t pid = ::fork();
  if (pid < 0) {
    ::close(fd);
    throw std::runtime_error(std::string("fork: ") + std::strerror(errno));
  }
  if (pid == 0) {
    ::setpgid(0, 0);  // its own group: a terminal's ^C reaches only the test
    int devnull = ::open("/dev/null", O_RDONLY);
    if (devnull >= 0) ::dup2(devnull, STDIN_FILENO);
    ::dup2(fd, STDOUT_FILENO);
    ::dup2(fd, STDERR_FILENO);
    ::execve(argv[0], argv.data(), envp.data());
    const char msg[] = "[test] execve of the relay failed\n";
    (void)!::write(STDERR_FILENO, msg, sizeof(msg) - 1);
    ::_exit(127);
  }
  ::close(fd);
  pid_ = pid;
}

bool RelayProcess::Reap(bool block) {
  if (pid_ <= 0) return true;
  if (exit_code_) return true;
  int status = 0;
  pid_t r;
  do {
    r = ::waitpid(pid_, &status, block ? 0 : WNOHANG);
  } while (r < 0 && errno == EINTR);
  if (r == 0) return false;
  if (r < 0) {
    exit_code_ = -1;
    return true;
  }
  if (WIFEXITED(status)) {
    exit_code_ = WEXITSTATUS(status);
  } else if (WIFSIGNALED(status)) {
    exit_code_ = 128 + WTERMSIG(status);
  } else {
    return false;
  }
  return true;
}

bool RelayProcess::Running() { return pid_ > 0 && !Reap(false); }

void RelayProcess::Kill(int sig) {
  if (pid_ > 0 && !Reap(false)) ::kill(pid_, sig);
}

std::optional<int> RelayProcess::Wait(std::chrono::milliseconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!Reap(false)) {
    if (std::chrono::steady_clock::now() >= deadline) return std::nullopt;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return exit_code_;
}

bool RelayProcess::WaitForLog(const std::string& needle, std::chrono::milliseconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (true) {
    if (Log().find(needle) != std::string::npos) return true;
    if (!Running() || std::chrono::steady_clock::now() >= deadline) {
      return Log().find(needle) != std::string::npos;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(25));
  }
}

std::string RelayProcess::Log() const {
  std::ifstream in(log_path_, std::ios::binary);
  if (!in) return "";
  in.seekg(log_start_);
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

std::string RelayProcess::LogTail(size_t lines) const {
  std::string log = Log();
  size_t end = log.size();
  if (end > 0 && log[end - 1] == '\n') --end;
  size_t pos = end;
  size_t count = 0;
  while (pos > 0) {
    size_t nl = log.rfind('\n', pos - 1);
    if (nl == std::string::npos) {
      pos = 0;
      break;
    }
    if (++count == lines) {
      pos = nl + 1;
      break;
    }
    pos = nl;
  }
  return log.substr(pos);
}

}  // namespace outbox_test
