#include "support/throwaway_pg.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <netinet/in.h>
#include <pwd.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>
#include <stdexcept>

#ifndef OUTBOX_SOURCE_DIR
#error "OUTBOX_SOURCE_DIR must name the source tree (for scripts/services)"
#endif

namespace outbox_test {

namespace {

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

// Claims `port` for this process among the test processes of this machine: an
// exclusive lock on a file named after it, held until the process ends (the
// descriptor stays open). Two tests run at once (ctest -j2, two lanes) and
// each checks its ports free a few seconds before its server binds them (a
// JVM's start); without the claim both could take the same free port.
bool ClaimPort(int port) {
  static const std::string dir = [] {
    std::string d = "/tmp/outbox-test-ports";
    ::mkdir(d.c_str(), 0777);
    ::chmod(d.c_str(), 01777);
    return d;
  }();
  int fd = ::open(fmt::format("{}/{}", dir, port).c_str(), O_CREAT | O_RDWR | O_CLOEXEC, 0666);
  if (fd < 0) return true;  // no claim possible: the bind check alone, as before
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    ::close(fd);
    return false;
  }
  return true;  // fd left open: the claim lasts as long as the process
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

std::string Trim(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  return s;
}

// Runs a command as the cluster owner (initdb and postgres refuse root).
int RunAsPostgres(const std::string& command) {
  std::string cmd = ::geteuid() == 0 ? "runuser -u postgres -- " + command : command;
  return std::system(cmd.c_str());
}

// The major a bin directory's postgres reports ("postgres (PostgreSQL) 17.10" -> 17), or 0.
int MajorOfBin(const std::string& bin) {
  std::string out;
  if (FILE* p = ::popen((bin + "/postgres --version 2>/dev/null").c_str(), "r")) {
    char buf[256];
    while (std::fgets(buf, sizeof buf, p) != nullptr) out += buf;
    ::pclose(p);
  }
  size_t paren = out.find(") ");
  return paren == std::string::npos ? 0 : std::atoi(out.c_str() + paren + 2);
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
    std::string bin = Trim(ReadFile(dir + "/bin"));
    if (!bin.empty()) {
      (void)RunAsPostgres(
          fmt::format("{}/pg_ctl -D {}/data -m immediate -w stop > /dev/null 2>&1", bin, dir));
    }
    std::filesystem::remove_all(entry.path(), ec);
  }
}

}  // namespace

int TestPgVersion() {
  const char* v = std::getenv("OUTBOX_PG_VERSION");
  if (v == nullptr || *v == '\0') return 15;
  int major = std::atoi(v);
  if (major < 10) throw std::runtime_error(fmt::format("OUTBOX_PG_VERSION={}: not a major", v));
  return major;
}

std::string PgBinDir(int major) {
  static std::mutex mu;
  static std::map<int, std::string> known;
  std::lock_guard lock(mu);
  if (auto it = known.find(major); it != known.end()) return it->second;
  std::string bin;
  if (const char* env = std::getenv("OUTBOX_PG_BIN"); env != nullptr && *env != '\0') {
    if (MajorOfBin(env) == major) bin = env;
  }
  if (bin.empty()) {
    std::string cmd = fmt::format("{}/scripts/services pg-bin {} 2>&1", OUTBOX_SOURCE_DIR, major);
    std::string out;
    if (FILE* p = ::popen(cmd.c_str(), "r")) {
      char buf[4096];
      while (std::fgets(buf, sizeof buf, p) != nullptr) out += buf;
      ::pclose(p);
    }
    out = Trim(out);
    std::string last = out.substr(out.rfind('\n') == std::string::npos ? 0 : out.rfind('\n') + 1);
    if (MajorOfBin(last) != major) {
      throw std::runtime_error(
          fmt::format("no PostgreSQL {} server programs: `{}` said:\n{}", major, cmd, out));
    }
    bin = last;
  }
  known[major] = bin;
  return bin;
}

int FreeLocalPort(int first) {
  if (first < 1024 || first + 200 > kFirstEphemeralPort) {
    throw std::logic_error(
        fmt::format("FreeLocalPort({}): test ports stay in 1024..{} (below the ephemeral range)",
                    first, kFirstEphemeralPort - 1));
  }
  for (int p = first; p < first + 200; ++p) {
    if (PortFree(p) && ClaimPort(p)) return p;
  }
  throw std::runtime_error(fmt::format("no free port in {}..{}", first, first + 199));
}

ThrowawayPostgres::ThrowawayPostgres(int port, std::string settings, int major, NoInit)
    : port_(port), major_(major == 0 ? TestPgVersion() : major), settings_(std::move(settings)) {
  ReapStaleClusters();
  bin_ = PgBinDir(major_);
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
  std::ofstream(dir_ + "/bin") << bin_ << "\n";
}

ThrowawayPostgres::ThrowawayPostgres(int port, const std::string& settings, int major)
    : ThrowawayPostgres(port, settings, major, NoInit{}) {
  RunServicesScript(fmt::format("pg-cluster {} {} {}", dir_, port_, major_),
                    dir_ + "/services.log");
  Start();
}

std::string RunServicesScript(const std::string& args, const std::string& log) {
  std::string cmd = fmt::format("{}/scripts/services {} 2> {}", OUTBOX_SOURCE_DIR, args, log);
  std::string out;
  int rc = -1;
  if (FILE* pipe = ::popen(cmd.c_str(), "r")) {
    char buf[4096];
    while (std::fgets(buf, sizeof buf, pipe) != nullptr) out += buf;
    rc = ::pclose(pipe);
  }
  if (rc != 0) {
    throw std::runtime_error(
        fmt::format("scripts/services {} failed ({}):\n{}", args, rc, ReadFile(log)));
  }
  return out;
}

std::unique_ptr<ThrowawayPostgres> ThrowawayPostgres::StandbyOf(const ThrowawayPostgres& primary,
                                                                int port,
                                                                const std::string& settings,
                                                                const std::string& standby_conf) {
  if (primary.started_) throw std::logic_error("StandbyOf: stop the primary first");
  std::unique_ptr<ThrowawayPostgres> s(
      new ThrowawayPostgres(port, settings, primary.major_, NoInit{}));
  s->Run(fmt::format("cp -a {}/data {}/data", primary.dir_, s->dir_), "copy the data directory");
  // The copy must not start with the primary's slots (a logical slot of the
  // same name would block the synchronization of the primary's).
  s->Run(fmt::format("sh -c 'rm -rf {0}/data/pg_replslot/* {0}/data/postmaster.pid'", s->dir_),
         "remove the copied slots");
  RunServicesScript(fmt::format("pg-cluster-config {} {}", s->dir_, s->port_),
                    s->dir_ + "/services.log");
  s->WriteDataFile("standby.signal", "");
  s->AppendConfig(standby_conf);
  return s;
}

std::unique_ptr<ThrowawayPostgres> ThrowawayPostgres::BaseBackupOf(const ThrowawayPostgres& primary,
                                                                   int port,
                                                                   const std::string& settings,
                                                                   const std::string& name) {
  if (!primary.started_) throw std::logic_error("BaseBackupOf: start the primary first");
  const std::string tool = primary.bin_ + "/pg_basebackup";
  if (::access(tool.c_str(), X_OK) != 0) {
    throw std::runtime_error(fmt::format(
        "no {}: the PostgreSQL {} build has no client programs (Debian's PostgreSQL 15, which "
        "scripts/deps installs, has them)",
        tool, primary.major_));
  }
  std::unique_ptr<ThrowawayPostgres> s(
      new ThrowawayPostgres(port, settings, primary.major_, NoInit{}));
  // --checkpoint=fast: the copy starts at once instead of at the next
  // scheduled checkpoint; --no-sync: a test cluster need not survive a power
  // cut of the machine (the server's own fsync stays on).
  s->Run(fmt::format("{}/pg_basebackup -D {}/data -d 'host=127.0.0.1 port={} user=postgres "
                     "application_name={}' -X stream -R --checkpoint=fast --no-sync "
                     "> {}/basebackup.log 2>&1",
                     primary.bin_, s->dir_, primary.port_, name, s->dir_),
         "pg_basebackup");
  RunServicesScript(fmt::format("pg-cluster-config {} {}", s->dir_, s->port_),
                    s->dir_ + "/services.log");
  return s;
}

ThrowawayPostgres::~ThrowawayPostgres() {
  if (started_) {
    try {
      Run(fmt::format("{}/pg_ctl -D {}/data -m immediate -w stop > /dev/null 2>&1", bin_, dir_),
          "pg_ctl stop");
    } catch (const std::exception& e) {
      std::fprintf(stderr, "[throwaway postgres] %s\n", e.what());
    }
  }
  if (!dir_.empty()) (void)std::system(fmt::format("rm -rf '{}'", dir_).c_str());
}

std::string ThrowawayPostgres::url(const std::string& database) const {
  return fmt::format("postgresql://postgres@127.0.0.1:{}/{}", port_, database);
}

void ThrowawayPostgres::Start() {
  // The port, address and socket directory are in data/outbox-relay.conf.
  Run(fmt::format("{}/pg_ctl -D {}/data -l {}/postgres.log -w -t 60 -o \"{}\" start > /dev/null",
                  bin_, dir_, dir_, settings_),
      "pg_ctl start");
  started_ = true;
}

void ThrowawayPostgres::Stop(const std::string& mode) {
  Run(fmt::format("{}/pg_ctl -D {}/data -m {} -w -t 60 stop > /dev/null", bin_, dir_, mode),
      "pg_ctl stop");
  started_ = false;
}

void ThrowawayPostgres::Promote() {
  Run(fmt::format("{}/pg_ctl -D {}/data -w -t 60 promote > /dev/null", bin_, dir_),
      "pg_ctl promote");
}

void ThrowawayPostgres::Reload() {
  Run(fmt::format("{}/pg_ctl -D {}/data reload > /dev/null", bin_, dir_), "pg_ctl reload");
}

void ThrowawayPostgres::AppendConfig(const std::string& lines) {
  std::ofstream out(data_dir() + "/postgresql.conf", std::ios::app);
  out << "\n# added by the test\n" << lines << "\n";
  if (!out) throw std::runtime_error("cannot append to " + data_dir() + "/postgresql.conf");
}

void ThrowawayPostgres::WriteDataFile(const std::string& name, const std::string& content,
                                      int mode) {
  std::string path = data_dir() + "/" + name;
  {
    std::ofstream out(path, std::ios::trunc);
    out << content;
    if (!out) throw std::runtime_error("cannot write " + path);
  }
  if (::geteuid() == 0) {
    const passwd* pw = ::getpwnam("postgres");
    if (pw == nullptr || ::chown(path.c_str(), pw->pw_uid, pw->pw_gid) != 0) {
      throw std::runtime_error("chown " + path + " failed");
    }
  }
  ::chmod(path.c_str(), static_cast<mode_t>(mode));
}

void ThrowawayPostgres::Run(const std::string& command, const char* what) const {
  int rc = RunAsPostgres(command);
  if (rc != 0) {
    throw std::runtime_error(fmt::format("{} failed ({}): see the logs in {}", what, rc, dir_));
  }
}

}  // namespace outbox_test
