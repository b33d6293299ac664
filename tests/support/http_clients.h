// Hostile clients of the relay's HTTP port, for the tests that show a probe
// still answers: connections that say nothing (kept open, reopened when the
// server closes them) and one that sends its request a byte at a time.
// Each binds to a loopback address of its own (127.0.0.2, ...; Linux routes
// all of 127/8 to lo), so that a per-client cap can be seen at work while
// the probe, from 127.0.0.1, is another client. Header-only.
#pragma once

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace outbox_test {

// Raises this process's descriptor limit to its hard limit (a fresh Debian
// shell gives 1,024: fewer than the idle clients need).
inline void RaiseFileLimit() {
  rlimit lim{};
  if (::getrlimit(RLIMIT_NOFILE, &lim) == 0 && lim.rlim_cur < lim.rlim_max) {
    lim.rlim_cur = lim.rlim_max;
    ::setrlimit(RLIMIT_NOFILE, &lim);
  }
}

// A non-blocking TCP connection from `source` to 127.0.0.1:`port` (its
// connect may still be in progress); -1 on failure.
inline int ConnectFrom(const std::string& source, int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return -1;
  sockaddr_in local{};
  local.sin_family = AF_INET;
  ::inet_pton(AF_INET, source.c_str(), &local.sin_addr);
  sockaddr_in remote{};
  remote.sin_family = AF_INET;
  remote.sin_port = htons(static_cast<uint16_t>(port));
  remote.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&local), sizeof(local)) != 0 ||
      (::connect(fd, reinterpret_cast<sockaddr*>(&remote), sizeof(remote)) != 0 &&
       errno != EINPROGRESS)) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// Whether the server has closed `fd` (end of stream, or an error).
inline bool PeerClosed(int fd) {
  char buf[256];
  ssize_t n = ::recv(fd, buf, sizeof(buf), MSG_DONTWAIT);
  if (n == 0) return true;
  if (n < 0) {
    return errno != EAGAIN && errno != EWOULDBLOCK && errno != EINPROGRESS && errno != ENOTCONN;
  }
  return false;  // the server said something: still open
}

// `count` connections from `source` that never send a byte. A connection
// the server closes is opened again, at most once a second each: a client
// that keeps `count` idle connections open as well as the server lets it.
class IdleClients {
 public:
  IdleClients(int port, std::string source, int count) : port_(port), source_(std::move(source)) {
    RaiseFileLimit();
    slots_.resize(static_cast<size_t>(count));
    thread_ = std::thread([this] { Run(); });
  }
  ~IdleClients() { Stop(); }
  void Stop() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
    for (Slot& s : slots_) {
      if (s.fd >= 0) ::close(s.fd);
      s.fd = -1;
    }
  }
  uint64_t opened() const { return opened_; }
  uint64_t closed_by_server() const { return closed_; }

 private:
  struct Slot {
    int fd = -1;
    std::chrono::steady_clock::time_point opened_at{};
  };
  void Run() {
    std::vector<pollfd> fds;
    while (!stop_) {
      auto now = std::chrono::steady_clock::now();
      for (Slot& s : slots_) {
        if (s.fd >= 0 && PeerClosed(s.fd)) {
          ::close(s.fd);
          s.fd = -1;
          ++closed_;
        }
        if (s.fd < 0 && now - s.opened_at >= std::chrono::seconds(1)) {
          s.fd = ConnectFrom(source_, port_);
          s.opened_at = now;
          if (s.fd >= 0) ++opened_;
        }
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }

  const int port_;
  const std::string source_;
  std::vector<Slot> slots_;
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> opened_{0};
  std::atomic<uint64_t> closed_{0};
  std::thread thread_;
};

// A client from `source` that sends a GET request one byte every
// `interval`, with a header that never ends; when the server closes it, it
// notes how long the connection lived and starts again.
class SlowClient {
 public:
  SlowClient(int port, std::string source,
             std::chrono::milliseconds interval = std::chrono::milliseconds(1000))
      : port_(port), source_(std::move(source)), interval_(interval) {
    thread_ = std::thread([this] { Run(); });
  }
  ~SlowClient() { Stop(); }
  void Stop() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
  }
  // Lifetimes of the connections the server closed.
  std::vector<std::chrono::milliseconds> lifetimes() const {
    std::lock_guard lock(mu_);
    return lifetimes_;
  }
  uint64_t bytes_sent() const { return sent_; }

 private:
  void Run() {
    const std::string header =
        "GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: " + std::string(100000, 'a');
    while (!stop_) {
      int fd = ConnectFrom(source_, port_);
      if (fd < 0) {
        std::this_thread::sleep_for(interval_);
        continue;
      }
      auto opened = std::chrono::steady_clock::now();
      size_t next = 0;
      bool closed = false;
      while (!stop_ && !closed) {
        // One byte, then wait for the interval, watching for the close.
        if (::send(fd, header.data() + next % header.size(), 1, MSG_NOSIGNAL | MSG_DONTWAIT) == 1) {
          ++next;
          ++sent_;
        }
        auto until = std::chrono::steady_clock::now() + interval_;
        while (!stop_ && std::chrono::steady_clock::now() < until) {
          pollfd p{fd, POLLIN | POLLRDHUP, 0};
          if (::poll(&p, 1, 20) > 0 && (p.revents & (POLLIN | POLLRDHUP | POLLHUP | POLLERR)) &&
              PeerClosed(fd)) {
            closed = true;
            break;
          }
        }
      }
      if (closed) {
        std::lock_guard lock(mu_);
        lifetimes_.push_back(std::chrono::duration_cast<std::chrono::milliseconds>(
            std::chrono::steady_clock::now() - opened));
      }
      ::close(fd);
    }
  }

  const int port_;
  const std::string source_;
  const std::chrono::milliseconds interval_;
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> sent_{0};
  mutable std::mutex mu_;
  std::vector<std::chrono::milliseconds> lifetimes_;
  std::thread thread_;
};

}  // namespace outbox_test
