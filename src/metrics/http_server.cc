#include "outbox_relay/metrics/http_server.h"

#include <fmt/format.h>
#include <prometheus/text_serializer.h>

#include <atomic>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/thread_pool.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/core/tcp_stream.hpp>
#include <boost/beast/http/empty_body.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/read.hpp>
#include <charconv>
#include <future>
#include <list>
#include <sstream>
#include <thread>
#include <unordered_map>

namespace outbox_relay::metrics {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = boost::beast::http;
using tcp = boost::asio::ip::tcp;

namespace {

constexpr size_t kHeaderLimit = 8 * 1024;

std::string Response(int status, const char* content_type, const std::string& body) {
  const char* reason = status == 200   ? "OK"
                       : status == 404 ? "Not Found"
                       : status == 405 ? "Method Not Allowed"
                       : status == 400 ? "Bad Request"
                                       : "Service Unavailable";
  std::string out = fmt::format(
      "HTTP/1.1 {} {}\r\nContent-Type: {}\r\nContent-Length: {}\r\nConnection: close\r\n", status,
      reason, content_type, body.size());
  if (status == 405) out += "Allow: GET\r\n";
  out += "\r\n";
  out += body;
  return out;
}

Result<tcp::endpoint> ParseAddress(const std::string& address) {
  auto bad = [&](std::string_view why) -> Result<tcp::endpoint> {
    return Fail(ErrorCode::kInvalidArgument,
                "invalid setting --metrics-addr (OUTBOX_METRICS_ADDR): '{}': {}", address, why);
  };
  size_t colon = address.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == address.size()) {
    return bad("expected host:port (0.0.0.0:9464, 127.0.0.1:9464, [::]:9464)");
  }
  std::string host = address.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  std::string_view port_text(address.data() + colon + 1, address.size() - colon - 1);
  unsigned port = 0;
  auto [end, ec] = std::from_chars(port_text.data(), port_text.data() + port_text.size(), port);
  if (ec != std::errc() || end != port_text.data() + port_text.size() || port > 65535) {
    return bad("the port is not a number 0..65535");
  }
  boost::system::error_code error;
  auto ip = asio::ip::make_address(host, error);
  if (error) return bad("the host is not an IP address (a name is not resolved here)");
  return tcp::endpoint(ip, static_cast<uint16_t>(port));
}

}  // namespace

struct HttpServer::Impl {
  struct Session {
    explicit Session(tcp::socket socket) : stream(std::move(socket)) {}
    beast::tcp_stream stream;
    beast::flat_buffer buffer{kHeaderLimit};
    http::request_parser<http::empty_body> parser;
    std::string client;   // the peer's address: the per-client cap's key
    std::string out;      // the response being written
    bool pending = true;  // the request is not complete yet
    bool closed = false;
    std::list<std::shared_ptr<Session>>::iterator position;  // in `sessions`
  };
  using SessionPtr = std::shared_ptr<Session>;

  // Declared first: destroyed last, after everything holding its sockets.
  asio::io_context io{1};
  tcp::acceptor acceptor{io};
  asio::steady_timer accept_retry{io};
  // /metrics bodies, one at a time, off the listener's thread.
  asio::thread_pool render{1};
  std::thread thread;

  HttpOptions options;
  Metrics* metrics = nullptr;
  Check healthz;
  Check readyz;
  std::function<void()> refresh;

  // The listener's thread only.
  std::list<SessionPtr> sessions;  // in accept order: the oldest first
  std::unordered_map<std::string, size_t> per_client;

  uint16_t port = 0;  // set before the thread starts
  std::atomic<uint64_t> evicted{0};
  std::atomic<uint64_t> timed_out{0};

  void Accept() {
    acceptor.async_accept(io, [this](boost::system::error_code ec, tcp::socket socket) {
      if (ec == asio::error::operation_aborted || !acceptor.is_open()) return;
      if (ec) {
        // Out of descriptors (EMFILE) or a transient error: close the oldest
        // unfinished connection to make room, and try again shortly rather
        // than spin on the error.
        EvictOldest(nullptr);
        accept_retry.expires_after(std::chrono::milliseconds(20));
        accept_retry.async_wait([this](boost::system::error_code wait_ec) {
          if (!wait_ec) Accept();
        });
        return;
      }
      Admit(std::move(socket));
      Accept();
    });
  }

  void Admit(tcp::socket socket) {
    boost::system::error_code ec;
    auto peer = socket.remote_endpoint(ec);
    if (ec) return;  // already gone
    std::string client = peer.address().to_string();
    if (per_client[client] >= options.max_connections_per_client) EvictOldest(&client);
    if (sessions.size() >= options.max_connections) EvictOldest(nullptr);
    auto s = std::make_shared<Session>(std::move(socket));
    s->client = std::move(client);
    ++per_client[s->client];
    sessions.push_back(s);
    s->position = std::prev(sessions.end());
    s->parser.header_limit(kHeaderLimit);
    s->parser.body_limit(0);
    // From accept to the end of the request: idle and header time in one bound.
    s->stream.expires_after(options.request_timeout);
    http::async_read(
        s->stream, s->buffer, s->parser,
        [this, s](boost::system::error_code read_ec, size_t) { OnRequest(s, read_ec); });
  }

  // Closes the oldest connection (of `client`, when given) whose request is
  // not complete, else the oldest one at all.
  void EvictOldest(const std::string* client) {
    SessionPtr victim;
    for (const SessionPtr& s : sessions) {
      if (client != nullptr && s->client != *client) continue;
      if (s->pending) {
        victim = s;
        break;
      }
      if (!victim) victim = s;
    }
    if (!victim) return;
    evicted.fetch_add(1, std::memory_order_relaxed);
    if (metrics != nullptr) metrics->CountHttpClosed(HttpClosed::kEvicted);
    Close(victim);
  }

  void Close(const SessionPtr& s) {
    if (s->closed) return;
    s->closed = true;
    boost::system::error_code ignored;
    (void)s->stream.socket().shutdown(tcp::socket::shutdown_both, ignored);
    (void)s->stream.socket().close(ignored);  // its pending operation ends with operation_aborted
    sessions.erase(s->position);
    auto it = per_client.find(s->client);
    if (it != per_client.end() && --it->second == 0) per_client.erase(it);
  }

  void OnRequest(const SessionPtr& s, boost::system::error_code ec) {
    if (s->closed) return;
    if (ec) {
      if (ec == beast::error::timeout) {
        timed_out.fetch_add(1, std::memory_order_relaxed);
        if (metrics != nullptr) metrics->CountHttpClosed(HttpClosed::kTimeout);
      }
      Close(s);
      return;
    }
    s->pending = false;
    const auto& req = s->parser.get();
    if (req.method() != http::verb::get) {
      Write(s, Response(405, "text/plain; charset=utf-8", "only GET\n"));
      return;
    }
    std::string_view target(req.target().data(), req.target().size());
    if (size_t q = target.find('?'); q != std::string_view::npos) target = target.substr(0, q);
    if (target == "/healthz" || target == "/readyz") {
      const Check& check = target == "/healthz" ? healthz : readyz;
      Health h = check ? check() : Health{true, "ok"};
      Write(s, Response(h.ok ? 200 : 503, "text/plain; charset=utf-8", h.detail + "\n"));
      return;
    }
    if (target == "/metrics" && metrics != nullptr) {
      asio::post(render, [this, s] {
        if (refresh) refresh();
        prometheus::TextSerializer serializer;
        std::ostringstream body;
        serializer.Serialize(body, metrics->registry().Collect());
        std::string response =
            Response(200, "text/plain; version=0.0.4; charset=utf-8", std::move(body).str());
        asio::post(io, [this, s, r = std::move(response)]() mutable { Write(s, std::move(r)); });
      });
      return;
    }
    Write(s,
          Response(404, "text/plain; charset=utf-8", "not found: /metrics, /healthz, /readyz\n"));
  }

  void Write(const SessionPtr& s, std::string response) {
    if (s->closed) return;
    s->out = std::move(response);
    s->stream.expires_after(options.write_timeout);
    asio::async_write(s->stream, asio::buffer(s->out),
                      [this, s](boost::system::error_code ec, size_t) {
                        if (ec == beast::error::timeout) {
                          timed_out.fetch_add(1, std::memory_order_relaxed);
                          if (metrics != nullptr) metrics->CountHttpClosed(HttpClosed::kTimeout);
                        }
                        Close(s);
                      });
  }

  void Shutdown() {
    // The renderer first: a /metrics body being made finishes, and its
    // answer is posted to a loop that no longer runs.
    render.stop();
    render.join();
    // Then every socket, on the listener's thread (the only one that
    // touches them); the loop is stopped once that is done, or after a
    // second whatever is left.
    std::promise<void> closed;
    asio::post(io, [this, &closed] {
      boost::system::error_code ignored;
      (void)acceptor.close(ignored);
      accept_retry.cancel();
      while (!sessions.empty()) Close(sessions.front());
      closed.set_value();
    });
    if (thread.joinable()) {
      closed.get_future().wait_for(std::chrono::seconds(1));
      io.stop();
      thread.join();
    }
    sessions.clear();
  }
};

HttpServer::HttpServer() : impl_(std::make_unique<Impl>()) {}

Result<std::unique_ptr<HttpServer>> HttpServer::Start(const HttpOptions& options, Metrics* metrics,
                                                      Check healthz, Check readyz,
                                                      std::function<void()> refresh) {
  auto endpoint = ParseAddress(options.address);
  if (!endpoint) return std::unexpected(endpoint.error());
  if (options.max_connections < 1 || options.max_connections_per_client < 1 ||
      options.request_timeout.count() <= 0 || options.write_timeout.count() <= 0) {
    return Fail(ErrorCode::kInvalidArgument, "HTTP listener: caps and timeouts must be positive");
  }
  std::unique_ptr<HttpServer> server(new HttpServer());
  Impl& impl = *server->impl_;
  impl.options = options;
  impl.metrics = metrics;
  impl.healthz = std::move(healthz);
  impl.readyz = std::move(readyz);
  impl.refresh = std::move(refresh);
  boost::system::error_code ec;
  // (The error-code overloads also return it: `ec` is what is checked.)
  (void)impl.acceptor.open(endpoint->protocol(), ec);
  if (!ec) (void)impl.acceptor.set_option(tcp::acceptor::reuse_address(true), ec);
  if (!ec) (void)impl.acceptor.bind(*endpoint, ec);
  if (!ec) (void)impl.acceptor.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) {
    return Fail(ErrorCode::kInvalidArgument,
                "invalid setting --metrics-addr (OUTBOX_METRICS_ADDR): cannot listen on {}: {} "
                "(in use, or not a local address)",
                options.address, ec.message());
  }
  impl.port = impl.acceptor.local_endpoint(ec).port();
  impl.Accept();
  impl.thread = std::thread([&impl] { impl.io.run(); });
  return server;
}

HttpServer::~HttpServer() {
  if (impl_) impl_->Shutdown();
}

uint16_t HttpServer::port() const { return impl_->port; }

uint64_t HttpServer::evicted() const { return impl_->evicted.load(); }
uint64_t HttpServer::timed_out() const { return impl_->timed_out.load(); }

}  // namespace outbox_relay::metrics
