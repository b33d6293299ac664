#include "support/throwaway_pg.h"

#include <arpa/inet.h>
#include <fmt/format.h>
#include <netinet/in.h>
#include <pwd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <stdexcept>

namespace outbox_test {

namespace {

constexpr const char* kBin = "/usr/lib/postgresql/15/bin";

bool PortFree(int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return false;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  ::close(fd);
  return ok;
}

// Clusters left by a test process that died without its destructors (e.g. a
// ctest timeout): stop and remove those whose owner pid is gone.
void ReapStaleClusters() {
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator("/tmp", ec)) {
    std::string name = entry.path().filename().string();
    if (!name.starts_with("outbox-it-pg-")) continue;
    std::ifstream in(entry.path() / "owner.pid");
    long owner = 0;
    if (!(in >> owner) || owner <= 0) continue;
    if (::kill(static_cast<pid_t>(owner), 0) == 0 || errno != ESRCH) continue;
    std::string dir = entry.path().string();
    std::fprintf(stderr, "[throwaway postgres] removing %s, left by dead test process %ld\n",
                 dir.c_str(), owner);
    std::string stop =
        fmt::format("{}/pg_ctl -D {}/data -m immediate -w stop > /dev/null 2>&1", kBin, dir);
    if (::geteuid() == 0) stop = "runuser -u postgres -- " + stop;
    (void)std::system(stop.c_str());
    std::filesystem::remove_all(entry.path(), ec);
  }
}

}  // namespace

int FreeLocalPort(int first) {
  for (int p = first; p < first + 200; ++p) {
    if (PortFree(p)) return p;
  }
  throw std::runtime_error(fmt::format("no free port in {}..{}", first, first + 199));
}

ThrowawayPostgres::ThrowawayPostgres(int port, const std::string& settings) : port_(port) {
  ReapStaleClusters();
  char tmpl[] = "/tmp/outbox-it-pg-XXXXXX";
  if (::mkdtemp(tmpl) == nullptr) throw std::runtime_error("mkdtemp failed");
  dir_ = tmpl;
  if (::geteuid() == 0) {
    const passwd* pw = ::getpwnam("postgres");
    if (pw == nullptr) throw std::runtime_error("running as root and no `postgres` system user");
    if (::chown(dir_.c_str(), pw->pw_uid, pw->pw_gid) != 0) {
      throw std::runtime_error("chown " + dir_ + " failed");
    }
  }
  std::ofstream(dir_ + "/owner.pid") << ::getpid() << "\n";
  Run(fmt::format("{}/initdb -D {}/data -A trust -U postgres --no-sync > {}/initdb.log 2>&1", kBin,
                  dir_, dir_),
      "initdb");
  Run(fmt::format("{}/pg_ctl -D {}/data -l {}/postgres.log -w -t 60 -o \"-p {} -c "
                  "listen_addresses=127.0.0.1 -k {} {}\" start > /dev/null",
                  kBin, dir_, dir_, port_, dir_, settings),
      "pg_ctl start");
  started_ = true;
}

ThrowawayPostgres::~ThrowawayPostgres() {
  if (started_) {
    try {
      Run(fmt::format("{}/pg_ctl -D {}/data -m immediate -w stop > /dev/null 2>&1", kBin, dir_),
          "pg_ctl stop");
    } catch (const std::exception& e) {
      std::fprintf(stderr, "[throwaway postgres] %s\n", e.what());
    }
  }
  if (!dir_.empty()) (void)std::system(fmt::format("rm -rf '{}'", dir_).c_str());
}

std::string ThrowawayPostgres::url() const {
  return fmt::format("postgresql://postgres@127.0.0.1:{}/postgres", port_);
}

void ThrowawayPostgres::Run(const std::string& command, const char* what) {
  std::string cmd = ::geteuid() == 0 ? "runuser -u postgres -- " + command : command;
  int rc = std::system(cmd.c_str());
  if (rc != 0) {
    throw std::runtime_error(fmt::format("{} failed ({}): see the logs in {}", what, rc, dir_));
  }
}

}  // namespace outbox_test
