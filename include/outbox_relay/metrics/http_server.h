// The HTTP listener: /metrics (Prometheus text format), /healthz, /readyz.
// Health answers come from callbacks so this module knows nothing of the relay.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "outbox_relay/core/result.h"
#include "outbox_relay/metrics/metrics.h"

struct mg_context;

namespace outbox_relay::metrics {

struct Health {
  bool ok = false;
  std::string detail;  // one line for people
};

class HttpServer {
 public:
  using Check = std::function<Health()>;

  // `address` is host:port ("0.0.0.0:9464", "127.0.0.1:0" is not supported).
  // `refresh` runs before each /metrics answer (to set gauges from live state).
  static Result<std::unique_ptr<HttpServer>> Start(const std::string& address, Metrics* metrics,
                                                   Check healthz, Check readyz,
                                                   std::function<void()> refresh = {});
  ~HttpServer();

  // Exposed for the civetweb callbacks.
  Metrics* metrics_ = nullptr;
  Check healthz_;
  Check readyz_;
  std::function<void()> refresh_;

 private:
  HttpServer() = default;
  mg_context* ctx_ = nullptr;
};

}  // namespace outbox_relay::metrics
