// The HTTP listener: /metrics (Prometheus text format), /healthz, /readyz.
// Health answers come from callbacks so this module knows nothing of the relay.
//
// Whoever can reach the port must not be able to starve it: a failed
// liveness probe restarts the pod. So the listener is event-driven (one
// thread and epoll, Boost.Asio with Boost.Beast's HTTP parser), and a
// connection costs a socket and a few KB, never a thread:
//   - every connection must deliver its whole request within
//     `request_timeout` of being accepted (header time and idle time in one
//     bound: a client sending a byte a second is closed like an idle one);
//   - the request line and headers are at most 8 KB, the body empty;
//   - at most `max_connections_per_client` connections per client address
//     and `max_connections` in all. A new connection over either cap closes
//     the oldest one of that client (of all, over the global cap) that has
//     not finished its request, else the oldest at all: the newest
//     connection is served, so a probe gets in however many idle or slow
//     connections are open, and the process's sockets stay bounded;
//   - /metrics is rendered on a thread of its own: a large exposition is
//     never in the way of a probe;
//   - a response is written within `write_timeout` or the connection closed.
//
// Threads: the callbacks `healthz` and `readyz` run on the listener's
// thread, `refresh` and the registry's collection on the /metrics thread;
// all three must be quick and thread-safe. The destructor joins both.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "outbox_relay/core/result.h"
#include "outbox_relay/metrics/metrics.h"

namespace outbox_relay::metrics {

struct Health {
  bool ok = false;
  std::string detail;  // one line for people
};

struct HttpOptions {
  // host:port; host is an IPv4 or IPv6 literal ("0.0.0.0:9464", "[::]:9464",
  // "127.0.0.1:0" for any free port).
  std::string address = "0.0.0.0:9464";
  size_t max_connections = 256;
  size_t max_connections_per_client = 8;
  std::chrono::milliseconds request_timeout{3000};
  std::chrono::milliseconds write_timeout{10000};
};

class HttpServer {
 public:
  using Check = std::function<Health()>;

  // `refresh` runs before each /metrics answer (to set gauges from live state).
  // kInvalidArgument naming --metrics-addr when the address is malformed or
  // cannot be listened on.
  static Result<std::unique_ptr<HttpServer>> Start(const HttpOptions& options, Metrics* metrics,
                                                   Check healthz, Check readyz,
                                                   std::function<void()> refresh = {});
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // The port listened on (the one chosen when the address said 0).
  uint16_t port() const;

  // Connections closed to make room for newer ones (over a cap), and by
  // their deadlines (request not complete, or response not taken).
  uint64_t evicted() const;
  uint64_t timed_out() const;

 private:
  struct Impl;
  HttpServer();
  std::unique_ptr<Impl> impl_;
};

}  // namespace outbox_relay::metrics
