#include "support/test_ca.h"

#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>

namespace outbox_test {

std::string ReadWholeFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

TestCa::TestCa() {
  char tmpl[] = "/tmp/outbox-it-ca-XXXXXX";
  if (::mkdtemp(tmpl) == nullptr) throw std::runtime_error("mkdtemp failed");
  dir_ = tmpl;
  ::chmod(dir_.c_str(), 0755);  // the postgres user reads the CA file too
  const std::string key = "-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes";
  std::string script = fmt::format(
      "set -e; cd {dir}; "
      "openssl req -x509 {key} -keyout ca.key -out ca.crt -days 2 "
      "-subj '/CN=outbox-relay test CA'; "
      "openssl req -x509 {key} -keyout other-ca.key -out other-ca.crt -days 2 "
      "-subj '/CN=outbox-relay other CA'; "
      "openssl req {key} -keyout server.key -out server.csr -subj '/CN=127.0.0.1'; "
      "printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\\n' > server.ext; "
      "openssl x509 -req -in server.csr -CA ca.crt -CAkey ca.key -CAcreateserial "
      "-out server.crt -days 2 -extfile server.ext; "
      "cat server.key server.crt > server.pem; chmod 644 ca.crt other-ca.crt server.crt",
      fmt::arg("dir", dir_), fmt::arg("key", key));
  std::string cmd = "sh -c \"" + script + "\" > " + dir_ + "/openssl.log 2>&1";
  if (std::system(cmd.c_str()) != 0) {
    std::string log = ReadWholeFile(dir_ + "/openssl.log");
    std::filesystem::remove_all(dir_);
    throw std::runtime_error("openssl could not make the test CA:\n" + log);
  }
}

TestCa::~TestCa() {
  std::error_code ec;
  if (!dir_.empty()) std::filesystem::remove_all(dir_, ec);
}

}  // namespace outbox_test
