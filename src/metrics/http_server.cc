#include "outbox_relay/metrics/http_server.h"

#include <civetweb.h>
#include <prometheus/text_serializer.h>

#include <sstream>

namespace outbox_relay::metrics {

namespace {

void Reply(mg_connection* conn, int status, const char* content_type, const std::string& body) {
  mg_printf(conn,
            "HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\nConnection: close\r\n"
            "\r\n",
            status, status == 200 ? "OK" : "Service Unavailable", content_type, body.size());
  mg_write(conn, body.data(), body.size());
}

int HandleMetrics(mg_connection* conn, void* data) {
  auto* self = static_cast<HttpServer*>(data);
  if (self->refresh_) self->refresh_();
  prometheus::TextSerializer serializer;
  std::ostringstream out;
  serializer.Serialize(out, self->metrics_->registry().Collect());
  Reply(conn, 200, "text/plain; version=0.0.4; charset=utf-8", out.str());
  return 200;
}

int HandleCheck(mg_connection* conn, const HttpServer::Check& check) {
  Health h = check ? check() : Health{true, "ok"};
  Reply(conn, h.ok ? 200 : 503, "text/plain; charset=utf-8", h.detail + "\n");
  return h.ok ? 200 : 503;
}

int HandleHealthz(mg_connection* conn, void* data) {
  return HandleCheck(conn, static_cast<HttpServer*>(data)->healthz_);
}

int HandleReadyz(mg_connection* conn, void* data) {
  return HandleCheck(conn, static_cast<HttpServer*>(data)->readyz_);
}

}  // namespace

Result<std::unique_ptr<HttpServer>> HttpServer::Start(const std::string& address, Metrics* metrics,
                                                      Check healthz, Check readyz,
                                                      std::function<void()> refresh) {
  size_t colon = address.rfind(':');
  if (colon == std::string::npos || colon + 1 == address.size()) {
    return Fail(ErrorCode::kInvalidArgument,
                "invalid setting --metrics-addr (OUTBOX_METRICS_ADDR): '{}': expected host:port",
                address);
  }
  std::unique_ptr<HttpServer> server(new HttpServer());
  server->metrics_ = metrics;
  server->healthz_ = std::move(healthz);
  server->readyz_ = std::move(readyz);
  server->refresh_ = std::move(refresh);
  mg_init_library(0);
  // civetweb wants "host:port" as listening_ports; 0.0.0.0 means all IPv4.
  const std::string& ports = address;
  // Each connection holds a worker thread until its request arrives or
  // request_timeout_ms passes: with 2 workers, two idle connections (a port
  // scan, a half-open load-balancer check) starved /healthz and a liveness
  // probe restarted the pod. 16 workers, and idle connections let go of
  // theirs within 2 s, keep the probes answered.
  const char* options[] = {"listening_ports",    ports.c_str(), "num_threads", "16",
                           "request_timeout_ms", "2000",        nullptr};
  mg_callbacks callbacks{};
  server->ctx_ = mg_start(&callbacks, nullptr, options);
  if (server->ctx_ == nullptr) {
    return Fail(ErrorCode::kInvalidArgument,
                "invalid setting --metrics-addr (OUTBOX_METRICS_ADDR): cannot listen on {} (in "
                "use, or not a local address)",
                address);
  }
  mg_set_request_handler(server->ctx_, "/metrics", HandleMetrics, server.get());
  mg_set_request_handler(server->ctx_, "/healthz", HandleHealthz, server.get());
  mg_set_request_handler(server->ctx_, "/readyz", HandleReadyz, server.get());
  return server;
}

HttpServer::~HttpServer() {
  if (ctx_ != nullptr) mg_stop(ctx_);
}

}  // namespace outbox_relay::metrics
