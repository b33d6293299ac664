// A throwaway certificate authority for the TLS tests, made with the openssl
// command: a CA, and a server certificate it signed for 127.0.0.1 and
// localhost (subjectAltName), EC P-256 keys in PKCS#8 PEM. A second,
// unrelated CA ("other") is there to be the wrong one. Everything lives in a
// temporary directory, removed when the object goes.
#pragma once

#include <string>

namespace outbox_test {

class TestCa {
 public:
  TestCa();  // throws (with openssl's output) on failure
  ~TestCa();
  TestCa(const TestCa&) = delete;
  TestCa& operator=(const TestCa&) = delete;

  const std::string& dir() const { return dir_; }
  std::string ca_cert() const { return dir_ + "/ca.crt"; }
  std::string server_cert() const { return dir_ + "/server.crt"; }
  std::string server_key() const { return dir_ + "/server.key"; }
  // The server's key and certificate in one file (a Kafka PEM keystore).
  std::string server_key_and_cert() const { return dir_ + "/server.pem"; }
  // A CA that signed nothing here: verification against it must fail.
  std::string other_ca_cert() const { return dir_ + "/other-ca.crt"; }

 private:
  std::string dir_;
};

// The contents of a file ("" if it cannot be read).
std::string ReadWholeFile(const std::string& path);

}  // namespace outbox_test
