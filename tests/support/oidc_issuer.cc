#include "support/oidc_issuer.h"

#include <arpa/inet.h>
#include <fmt/format.h>
#include <netinet/in.h>
#include <openssl/bn.h>
#include <openssl/core_names.h>
#include <openssl/evp.h>
#include <openssl/rsa.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <stdexcept>
#include <string_view>
#include <vector>

namespace outbox_test {

namespace {

std::string Base64(std::string_view in, bool url) {
  static constexpr char kStd[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  static constexpr char kUrl[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
  const char* table = url ? kUrl : kStd;
  std::string out;
  size_t i = 0;
  for (; i + 2 < in.size(); i += 3) {
    uint32_t v = (static_cast<uint8_t>(in[i]) << 16) | (static_cast<uint8_t>(in[i + 1]) << 8) |
                 static_cast<uint8_t>(in[i + 2]);
    for (int s : {18, 12, 6, 0}) out.push_back(table[(v >> s) & 63]);
  }
  if (size_t rest = in.size() - i; rest > 0) {
    uint32_t v = static_cast<uint8_t>(in[i]) << 16;
    if (rest == 2) v |= static_cast<uint8_t>(in[i + 1]) << 8;
    out.push_back(table[(v >> 18) & 63]);
    out.push_back(table[(v >> 12) & 63]);
    if (rest == 2) out.push_back(table[(v >> 6) & 63]);
    if (!url) out.append(rest == 2 ? "=" : "==");  // base64url in JWTs: no padding
  }
  return out;
}

std::string BigEndian(const BIGNUM* n) {
  std::string out(static_cast<size_t>(BN_num_bytes(n)), '\0');
  BN_bn2bin(n, reinterpret_cast<unsigned char*>(out.data()));
  return out;
}

std::string OpenSslError(const char* what) { return fmt::format("OidcIssuer: {} failed", what); }

}  // namespace

// The issuer's RSA key pair and its JWK fields.
struct OidcIssuer::Key {
  EVP_PKEY* pkey = nullptr;
  std::string n;  // modulus, base64url
  std::string e;  // public exponent, base64url
  ~Key() { EVP_PKEY_free(pkey); }

  std::string SignRs256(std::string_view data) const {
    EVP_MD_CTX* ctx = EVP_MD_CTX_new();
    if (ctx == nullptr) throw std::runtime_error(OpenSslError("EVP_MD_CTX_new"));
    size_t size = 0;
    std::string sig;
    bool ok = EVP_DigestSignInit(ctx, nullptr, EVP_sha256(), nullptr, pkey) == 1 &&
              EVP_DigestSign(ctx, nullptr, &size,
                             reinterpret_cast<const unsigned char*>(data.data()), data.size()) == 1;
    if (ok) {
      sig.resize(size);
      ok = EVP_DigestSign(ctx, reinterpret_cast<unsigned char*>(sig.data()), &size,
                          reinterpret_cast<const unsigned char*>(data.data()), data.size()) == 1;
      sig.resize(size);
    }
    EVP_MD_CTX_free(ctx);
    if (!ok) throw std::runtime_error(OpenSslError("EVP_DigestSign"));
    return sig;
  }
};

OidcIssuer::OidcIssuer(Options options) : options_(std::move(options)), key_(new Key) {
  key_->pkey = EVP_RSA_gen(2048);
  if (key_->pkey == nullptr) throw std::runtime_error(OpenSslError("EVP_RSA_gen"));
  BIGNUM* n = nullptr;
  BIGNUM* e = nullptr;
  if (EVP_PKEY_get_bn_param(key_->pkey, OSSL_PKEY_PARAM_RSA_N, &n) != 1 ||
      EVP_PKEY_get_bn_param(key_->pkey, OSSL_PKEY_PARAM_RSA_E, &e) != 1) {
    BN_free(n);
    throw std::runtime_error(OpenSslError("EVP_PKEY_get_bn_param"));
  }
  key_->n = Base64(BigEndian(n), true);
  key_->e = Base64(BigEndian(e), true);
  BN_free(n);
  BN_free(e);

  listen_fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (listen_fd_ < 0)
    throw std::runtime_error("OidcIssuer: socket: " + std::string(strerror(errno)));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;  // any free port
  socklen_t len = sizeof(addr);
  if (::bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      ::listen(listen_fd_, 16) != 0 ||
      ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    std::string why = strerror(errno);
    ::close(listen_fd_);
    throw std::runtime_error("OidcIssuer: listen on 127.0.0.1: " + why);
  }
  port_ = ntohs(addr.sin_port);
  thread_ = std::thread([this] { Serve(); });
}

OidcIssuer::~OidcIssuer() {
  stop_.store(true);
  if (thread_.joinable()) thread_.join();
  ::close(listen_fd_);
}

std::string OidcIssuer::issuer() const { return fmt::format("http://127.0.0.1:{}", port_); }
std::string OidcIssuer::token_endpoint() const { return issuer() + "/token"; }
std::string OidcIssuer::jwks_endpoint() const { return issuer() + "/jwks"; }

void OidcIssuer::Serve() {
  while (!stop_.load()) {
    pollfd p{listen_fd_, POLLIN, 0};
    if (::poll(&p, 1, 100) <= 0) continue;
    int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) continue;
    Handle(fd);
    ::close(fd);
  }
}

// One request per connection (the answers say Connection: close): the
// request line, the headers, and a body as long as Content-Length says.
void OidcIssuer::Handle(int fd) {
  std::string request;
  size_t header_end = std::string::npos;
  size_t body_size = 0;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  char buf[4096];
  while (std::chrono::steady_clock::now() < deadline) {
    if (header_end != std::string::npos && request.size() >= header_end + 4 + body_size) break;
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 100) <= 0) continue;
    ssize_t got = ::recv(fd, buf, sizeof(buf), 0);
    if (got <= 0) return;
    request.append(buf, static_cast<size_t>(got));
    if (request.size() > 64 * 1024) return;  // no test sends that much
    if (header_end == std::string::npos &&
        (header_end = request.find("\r\n\r\n")) != std::string::npos) {
      std::string lower = request.substr(0, header_end);
      for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      if (size_t at = lower.find("\r\ncontent-length:"); at != std::string::npos) {
        body_size = std::strtoul(lower.c_str() + at + 17, nullptr, 10);
      }
    }
  }
  if (header_end == std::string::npos) return;
  const std::string head = request.substr(0, header_end);
  const std::string body = request.substr(header_end + 4);
  int status = 404;
  std::string answer = R"({"error":"not_found"})";
  if (head.starts_with("GET /jwks ")) {
    status = 200;
    answer = Jwks();
    jwks_served_.fetch_add(1);
  } else if (head.starts_with("POST /token ")) {
    const std::string basic = "\r\nAuthorization: Basic " +
                              Base64(options_.client_id + ":" + options_.client_secret, false) +
                              "\r\n";
    const bool authorised = (head + "\r\n").find(basic) != std::string::npos;
    const bool grant = body.find("grant_type=client_credentials") != std::string::npos;
    if (authorised && grant) {
      status = 200;
      answer = fmt::format(R"({{"access_token":"{}","token_type":"bearer","expires_in":{}}})",
                           Token(), options_.lifetime.count());
      tokens_issued_.fetch_add(1);
    } else {
      status = grant ? 401 : 400;
      answer = grant ? R"({"error":"invalid_client"})" : R"({"error":"unsupported_grant_type"})";
      tokens_refused_.fetch_add(1);
    }
  }
  const char* reason = status == 200   ? "OK"
                       : status == 401 ? "Unauthorized"
                       : status == 400 ? "Bad Request"
                                       : "Not Found";
  std::string response = fmt::format(
      "HTTP/1.1 {} {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n"
      "Cache-Control: no-store\r\nConnection: close\r\n\r\n{}",
      status, reason, answer.size(), answer);
  size_t sent = 0;
  while (sent < response.size()) {
    ssize_t n = ::send(fd, response.data() + sent, response.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) return;
    sent += static_cast<size_t>(n);
  }
}

std::string OidcIssuer::Token() {
  const std::time_t now = std::time(nullptr);
  const std::string header = Base64(R"({"alg":"RS256","typ":"JWT","kid":"outbox-test-1"})", true);
  const std::string claims = Base64(
      fmt::format(R"({{"iss":"{}","sub":"{}","aud":"{}","scope":"kafka","iat":{},"exp":{}}})",
                  issuer(), options_.client_id, options_.audience, now,
                  now + options_.lifetime.count()),
      true);
  const std::string signing_input = header + "." + claims;
  return signing_input + "." + Base64(key_->SignRs256(signing_input), true);
}

std::string OidcIssuer::Jwks() const {
  return fmt::format(
      R"({{"keys":[{{"kty":"RSA","use":"sig","alg":"RS256","kid":"outbox-test-1","n":"{}","e":"{}"}}]}})",
      key_->n, key_->e);
}

}  // namespace outbox_test
