// Toxiproxy (github.com/Shopify/toxiproxy) for the network fault tests: a
// server of the test's own on a free 127.0.0.1 port, and its HTTP API.
//
// A proxy listens on 127.0.0.1:<port> and forwards every connection to its
// upstream; toxics change what passes, per direction ("downstream": upstream
// to client, "upstream": client to upstream), for every connection of the
// proxy, present and future:
//   timeout (timeout 0)   a black hole: data is dropped, nothing is closed;
//                         removing it closes the connections it held
//   reset_peer            TCP RST after `timeout` ms of data
//   slicer                data cut into `average_size`-byte writes
//   latency               `latency` ± `jitter` ms per chunk
//   bandwidth             `rate` KB/s
// The server binary comes from `scripts/toxiproxy server-path` (built once
// from the Go module proxy), or $OUTBOX_TOXIPROXY_SERVER. It dies with the
// test process (PR_SET_PDEATHSIG). Every call throws on an unexpected answer.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <string>

namespace outbox_test {

// The toxiproxy-server binary (throws when it cannot be found or built).
std::string ToxiproxyServerBinary();

struct Toxic {
  std::string name;
  std::string type;                   // timeout, reset_peer, slicer, latency, bandwidth, ...
  std::string stream = "downstream";  // or "upstream"
  double toxicity = 1.0;              // the share of connections it applies to
  std::map<std::string, int64_t> attributes;
};

class Toxiproxy {
 public:
  Toxiproxy();  // starts the server, waits for its API
  ~Toxiproxy();
  Toxiproxy(const Toxiproxy&) = delete;
  Toxiproxy& operator=(const Toxiproxy&) = delete;

  int api_port() const { return api_port_; }

  // A proxy `name` on 127.0.0.1:`listen_port` to `upstream` ("host:port");
  // returns "127.0.0.1:<listen_port>".
  std::string CreateProxy(const std::string& name, int listen_port, const std::string& upstream);
  void AddToxic(const std::string& proxy, const Toxic& toxic);
  void RemoveToxic(const std::string& proxy, const std::string& toxic);
  // Disabled: the listener and every connection closed (a refused port).
  void SetEnabled(const std::string& proxy, bool enabled);
  // Every proxy enabled, every toxic removed.
  void Reset();

  // Both directions black-holed (toxics "<proxy>_hole_down", "_hole_up").
  void BlackHole(const std::string& proxy);
  void Heal(const std::string& proxy);

  // "status body" of a request to the API (for messages).
  std::string Request(const std::string& method, const std::string& path, const std::string& body,
                      int* status);

 private:
  void Call(const std::string& method, const std::string& path, const std::string& body,
            int expected_status);

  std::string dir_;
  int api_port_ = 0;
  pid_t pid_ = -1;
};

}  // namespace outbox_test
