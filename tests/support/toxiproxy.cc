#include "support/toxiproxy.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <thread>
#include <vector>

#include "support/throwaway_pg.h"

#ifndef OUTBOX_SOURCE_DIR
#error "OUTBOX_SOURCE_DIR must name the source tree (for scripts/toxiproxy)"
#endif

namespace outbox_test {

namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

// JSON string literal for names and addresses (no escapes needed beyond these).
std::string Quote(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out.push_back('\\');
    out.push_back(c);
  }
  return out + "\"";
}

// One HTTP/1.1 request to 127.0.0.1:port; the status (0: no answer) and body.
int HttpRequest(int port, const std::string& method, const std::string& path,
                const std::string& body, std::string* response_body) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return 0;
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) return 0;
  std::string request = fmt::format(
      "{} {} HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nConnection: close\r\nContent-Type: "
      "application/json\r\nContent-Length: {}\r\n\r\n{}",
      method, path, port, body.size(), body);
  for (size_t sent = 0; sent < request.size();) {
    ssize_t n = ::send(fd, request.data() + sent, request.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) return 0;
    sent += static_cast<size_t>(n);
  }
  std::string raw;
  auto deadline = Clock::now() + std::chrono::seconds(10);
  char buf[4096];
  while (true) {
    auto left = std::chrono::duration_cast<milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) return 0;
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(left.count())) <= 0) return 0;
    ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
    if (n < 0) return 0;
    if (n == 0) break;
    raw.append(buf, static_cast<size_t>(n));
  }
  // "HTTP/1.1 201 Created\r\n...\r\n\r\nbody"
  if (raw.size() < 12 || raw.compare(0, 5, "HTTP/") != 0) return 0;
  int status = std::atoi(raw.c_str() + raw.find(' ') + 1);
  size_t head_end = raw.find("\r\n\r\n");
  if (response_body != nullptr) {
    *response_body = head_end == std::string::npos ? "" : raw.substr(head_end + 4);
  }
  return status;
}

}  // namespace

std::string ToxiproxyServerBinary() {
  if (const char* env = std::getenv("OUTBOX_TOXIPROXY_SERVER"); env != nullptr && *env != '\0') {
    return env;
  }
  std::string cmd = std::string(OUTBOX_SOURCE_DIR) + "/scripts/toxiproxy server-path 2>&1";
  std::string out;
  if (FILE* p = ::popen(cmd.c_str(), "r")) {
    char buf[4096];
    while (std::fgets(buf, sizeof buf, p) != nullptr) out += buf;
    ::pclose(p);
  }
  while (!out.empty() && (out.back() == '\n' || out.back() == ' ')) out.pop_back();
  std::string last = out.substr(out.rfind('\n') == std::string::npos ? 0 : out.rfind('\n') + 1);
  if (last.empty() || ::access(last.c_str(), X_OK) != 0) {
    throw std::runtime_error("no Toxiproxy server: `" + cmd + "` printed:\n" + out +
                             "\n(scripts/deps builds it; it needs Go and the Go module proxy)");
  }
  return last;
}

Toxiproxy::Toxiproxy() {
  std::string binary = ToxiproxyServerBinary();
  char tmpl[] = "/tmp/outbox-it-toxiproxy-XXXXXX";
  if (::mkdtemp(tmpl) == nullptr) throw std::runtime_error("mkdtemp failed");
  dir_ = tmpl;
  api_port_ = FreeLocalPort(28400 + static_cast<int>(::getpid() % 400));
  std::string port = std::to_string(api_port_);
  int fd = ::open((dir_ + "/server.log").c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) throw std::runtime_error("open server.log: " + std::string(std::strerror(errno)));
  pid_t parent = ::getpid();
  pid_t pid = ::fork();
  if (pid < 0) {
    ::close(fd);
    throw std::runtime_error(std::string("fork: ") + std::strerror(errno));
  }
  if (pid == 0) {
    ::setsid();
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);  // never outlives the test process
    if (::getppid() != parent) ::_exit(1);
    int devnull = ::open("/dev/null", O_RDONLY);
    if (devnull >= 0) ::dup2(devnull, STDIN_FILENO);
    ::dup2(fd, STDOUT_FILENO);
    ::dup2(fd, STDERR_FILENO);
    std::vector<std::string> args = {binary, "-host", "127.0.0.1", "-port", port};
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  ::close(fd);
  pid_ = pid;
  auto deadline = Clock::now() + std::chrono::seconds(20);
  while (true) {
    std::string body;
    if (HttpRequest(api_port_, "GET", "/version", "", &body) == 200) break;
    int status = 0;
    if (::waitpid(pid_, &status, WNOHANG) == pid_ || Clock::now() > deadline) {
      pid_ = -1;
      throw std::runtime_error(fmt::format("toxiproxy-server did not start on port {}:\n{}",
                                           api_port_, ReadFile(dir_ + "/server.log")));
    }
    std::this_thread::sleep_for(milliseconds(50));
  }
}

Toxiproxy::~Toxiproxy() {
  if (pid_ > 0) {
    ::kill(pid_, SIGKILL);
    int status = 0;
    while (::waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
    }
  }
  std::error_code ec;
  if (!dir_.empty()) std::filesystem::remove_all(dir_, ec);
}

std::string Toxiproxy::Request(const std::string& method, const std::string& path,
                               const std::string& body, int* status) {
  std::string response;
  *status = HttpRequest(api_port_, method, path, body, &response);
  return response;
}

void Toxiproxy::Call(const std::string& method, const std::string& path, const std::string& body,
                     int expected_status) {
  int status = 0;
  std::string response = Request(method, path, body, &status);
  if (status != expected_status) {
    throw std::runtime_error(fmt::format("toxiproxy {} {} {}: HTTP {} (expected {}): {}", method,
                                         path, body, status, expected_status, response));
  }
}

std::string Toxiproxy::CreateProxy(const std::string& name, int listen_port,
                                   const std::string& upstream) {
  std::string listen = fmt::format("127.0.0.1:{}", listen_port);
  Call("POST", "/proxies",
       fmt::format(R"({{"name":{},"listen":{},"upstream":{},"enabled":true}})", Quote(name),
                   Quote(listen), Quote(upstream)),
       201);
  return listen;
}

void Toxiproxy::AddToxic(const std::string& proxy, const Toxic& toxic) {
  std::string attributes;
  for (const auto& [k, v] : toxic.attributes) {
    attributes += fmt::format("{}{}:{}", attributes.empty() ? "" : ",", Quote(k), v);
  }
  Call("POST", "/proxies/" + proxy + "/toxics",
       fmt::format(R"({{"name":{},"type":{},"stream":{},"toxicity":{},"attributes":{{{}}}}})",
                   Quote(toxic.name), Quote(toxic.type), Quote(toxic.stream), toxic.toxicity,
                   attributes),
       200);
}

void Toxiproxy::RemoveToxic(const std::string& proxy, const std::string& toxic) {
  Call("DELETE", "/proxies/" + proxy + "/toxics/" + toxic, "", 204);
}

void Toxiproxy::SetEnabled(const std::string& proxy, bool enabled) {
  Call("POST", "/proxies/" + proxy, fmt::format(R"({{"enabled":{}}})", enabled), 200);
}

void Toxiproxy::Reset() { Call("POST", "/reset", "", 204); }

void Toxiproxy::BlackHole(const std::string& proxy) {
  AddToxic(proxy, {proxy + "_hole_down", "timeout", "downstream", 1.0, {{"timeout", 0}}});
  AddToxic(proxy, {proxy + "_hole_up", "timeout", "upstream", 1.0, {{"timeout", 0}}});
}

void Toxiproxy::Heal(const std::string& proxy) {
  RemoveToxic(proxy, proxy + "_hole_down");
  RemoveToxic(proxy, proxy + "_hole_up");
}

}  // namespace outbox_test
