// A tiny HTTP/1.0 GET for the relay's /metrics, /healthz and /readyz on
// 127.0.0.1 (no HTTP library in the tests). Header-only.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

namespace outbox_test {

struct HttpResponse {
  int status = 0;  // 0: no answer (connection refused, timeout, garbage)
  std::string body;
};

inline HttpResponse HttpGet(int port, const std::string& path,
                            std::chrono::milliseconds timeout = std::chrono::seconds(5)) {
  HttpResponse out;
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return out;
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) return out;
  std::string request = "GET " + path + " HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
  for (size_t sent = 0; sent < request.size();) {
    ssize_t n = ::send(fd, request.data() + sent, request.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) return out;
    sent += static_cast<size_t>(n);
  }
  std::string raw;
  auto deadline = std::chrono::steady_clock::now() + timeout;
  char buf[4096];
  while (true) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return out;
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(left.count())) <= 0) return out;
    ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
    if (n < 0) return out;
    if (n == 0) break;
    raw.append(buf, static_cast<size_t>(n));
  }
  // "HTTP/1.1 200 OK\r\n...\r\n\r\nbody"
  size_t sp = raw.find(' ');
  size_t head_end = raw.find("\r\n\r\n");
  if (!raw.starts_with("HTTP/") || sp == std::string::npos || head_end == std::string::npos) {
    return out;
  }
  out.status = std::atoi(raw.substr(sp + 1, 3).c_str());
  out.body = raw.substr(head_end + 4);
  return out;
}

// The value of the first sample of `metric` in a Prometheus text exposition
// whose name matches exactly (any labels); nullopt when absent.
inline std::optional<double> MetricValue(const std::string& exposition, const std::string& metric) {
  size_t pos = 0;
  while (pos < exposition.size()) {
    size_t eol = exposition.find('\n', pos);
    if (eol == std::string::npos) eol = exposition.size();
    std::string line = exposition.substr(pos, eol - pos);
    pos = eol + 1;
    if (!line.starts_with(metric)) continue;
    char next = line.size() > metric.size() ? line[metric.size()] : '\0';
    if (next != '{' && next != ' ') continue;
    size_t value = line.rfind(' ');
    if (value == std::string::npos) continue;
    return std::strtod(line.c_str() + value + 1, nullptr);
  }
  return std::nullopt;
}

// Sum of the samples of metric `name` whose labels contain every entry of
// `labels` (e.g. `reason="marshal"`); nullopt: no such sample.
inline std::optional<double> MetricSum(const std::string& exposition, const std::string& name,
                                       const std::vector<std::string>& labels = {}) {
  std::optional<double> sum;
  std::istringstream in(exposition);
  for (std::string line; std::getline(in, line);) {
    if (line.empty() || line[0] == '#' || !line.starts_with(name)) continue;
    char next = line.size() > name.size() ? line[name.size()] : '\0';
    if (next != '{' && next != ' ') continue;  // a longer name with this prefix
    std::string label_part =
        next == '{' ? line.substr(name.size(), line.find('}') - name.size()) : std::string();
    bool match = true;
    for (const auto& l : labels) match = match && label_part.find(l) != std::string::npos;
    if (match) sum = sum.value_or(0) + std::strtod(line.c_str() + line.rfind(' ') + 1, nullptr);
  }
  return sum;
}

}  // namespace outbox_test
