// A tiny OAuth 2.0 / OpenID Connect issuer on 127.0.0.1 for the SASL/
// OAUTHBEARER tests: the two endpoints a Kafka set-up with OIDC uses, served
// over plain HTTP by a thread of the test process.
//
//   POST /token  the client-credentials grant (RFC 6749 §4.4), as librdkafka's
//                sasl.oauthbearer.method=oidc asks for it: HTTP Basic
//                authentication with the client id and secret, a form body
//                with grant_type=client_credentials. Right credentials: 200
//                and {"access_token": <JWT>, "token_type": "bearer",
//                "expires_in": N}; wrong ones: 401 {"error": "invalid_client"}.
//   GET  /jwks   the JSON Web Key Set the broker verifies tokens with
//                (sasl.oauthbearer.jwks.endpoint.url).
//
// The tokens are JWTs signed RS256 with an RSA key made for the issuer
// (OpenSSL), with the claims Kafka's broker validator checks: sub (the
// client id), iat, exp, iss, aud and scope.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <memory>
#include <string>
#include <thread>

namespace outbox_test {

class OidcIssuer {
 public:
  struct Options {
    std::string client_id = "relay";
    std::string client_secret;
    std::string audience = "outbox-relay-test";
    std::chrono::seconds lifetime{3600};
  };
  explicit OidcIssuer(Options options);  // listens on a free port; throws on failure
  ~OidcIssuer();
  OidcIssuer(const OidcIssuer&) = delete;
  OidcIssuer& operator=(const OidcIssuer&) = delete;

  int port() const { return port_; }
  std::string issuer() const;          // "http://127.0.0.1:<port>"
  std::string token_endpoint() const;  // issuer() + "/token"
  std::string jwks_endpoint() const;   // issuer() + "/jwks"
  const std::string& audience() const { return options_.audience; }

  size_t tokens_issued() const { return tokens_issued_.load(); }
  size_t tokens_refused() const { return tokens_refused_.load(); }
  size_t jwks_served() const { return jwks_served_.load(); }

 private:
  struct Key;
  void Serve();
  void Handle(int fd);
  std::string Token();
  std::string Jwks() const;

  Options options_;
  std::unique_ptr<Key> key_;
  int listen_fd_ = -1;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::atomic<size_t> tokens_issued_{0};
  std::atomic<size_t> tokens_refused_{0};
  std::atomic<size_t> jwks_served_{0};
  std::thread thread_;
};

}  // namespace outbox_test
