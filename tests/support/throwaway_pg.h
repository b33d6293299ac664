// A PostgreSQL cluster of the test's own, for settings the shared service
// must not get (they would affect every other session on it), for faults (a
// restart, a crash) and for topologies (a primary and its physical standby):
// initdb into a temporary directory owned by the `postgres` system user,
// started on 127.0.0.1:<port> with trust auth and the given `-c` settings;
// stopped (immediate) and removed when destroyed. Clusters of test processes
// that died before their destructor ran are removed by the next constructor.
//
// The server major is the one the tests run against (TestPgVersion(): the
// services' OUTBOX_PG_VERSION, 15 by default) unless one is given; its
// programs come from PgBinDir(major).
#pragma once

#include <memory>
#include <string>

namespace outbox_test {

// The PostgreSQL major the tests run against: $OUTBOX_PG_VERSION (exported by
// `scripts/services env`), else 15.
int TestPgVersion();

// The directory of PostgreSQL `major`'s server programs (initdb, pg_ctl,
// postgres): $OUTBOX_PG_BIN when it holds that major, else what
// `scripts/services pg-bin <major>` prints (it fetches the pinned build once).
// Throws when there is none: a missing server build fails the test loudly.
std::string PgBinDir(int major);

class ThrowawayPostgres {
 public:
  // `settings`: extra server options, e.g. "-c wal_level=logical"; `major`
  // 0: TestPgVersion(). Starts the cluster. Throws on failure.
  ThrowawayPostgres(int port, const std::string& settings, int major = 0);
  ~ThrowawayPostgres();
  ThrowawayPostgres(const ThrowawayPostgres&) = delete;
  ThrowawayPostgres& operator=(const ThrowawayPostgres&) = delete;

  // A physical standby of `primary`, which must be stopped (a clean shutdown:
  // its data directory is a consistent copy then, as pg_basebackup would
  // give). Its data directory is copied, without the replication slots;
  // standby.signal and `standby_conf` (primary_conninfo, primary_slot_name, ...)
  // are added. Not started: call Start().
  static std::unique_ptr<ThrowawayPostgres> StandbyOf(const ThrowawayPostgres& primary, int port,
                                                      const std::string& settings,
                                                      const std::string& standby_conf);

  // A physical standby of the RUNNING `primary`, copied with pg_basebackup
  // (-X stream -R: standby.signal, and primary_conninfo naming `primary` with
  // application_name `name`), as a standby is made in production: under load,
  // without stopping the primary, and asynchronous unless the primary's
  // synchronous_standby_names names it. Needs pg_basebackup beside the
  // server programs (Debian's PostgreSQL 15 has it, the npm builds of the
  // other majors do not: then it throws, saying so). Not started: call Start().
  static std::unique_ptr<ThrowawayPostgres> BaseBackupOf(const ThrowawayPostgres& primary, int port,
                                                         const std::string& settings,
                                                         const std::string& name);

  std::string url(const std::string& database = "postgres") const;  // postgresql://postgres@...
  const std::string& dir() const { return dir_; }
  std::string data_dir() const { return dir_ + "/data"; }
  const std::string& bin() const { return bin_; }
  int major() const { return major_; }
  int port() const { return port_; }

  // pg_ctl start / stop -m <mode> (fast, immediate) / promote, waiting for it.
  void Start();
  void Stop(const std::string& mode = "fast");
  void Promote();
  // Appends lines to postgresql.conf (read at the next start or reload).
  void AppendConfig(const std::string& lines);
  // Writes a file into the data directory, owned by the cluster's user with `mode`.
  void WriteDataFile(const std::string& name, const std::string& content, int mode = 0600);
  // pg_ctl reload.
  void Reload();

 private:
  struct NoInit {};
  ThrowawayPostgres(int port, std::string settings, int major, NoInit);
  void Run(const std::string& command, const char* what) const;

  int port_;
  int major_;
  std::string bin_;
  std::string settings_;
  std::string dir_;
  bool started_ = false;
};

// A TCP port on 127.0.0.1 nobody listens on now (from `first` on), below
// Linux's ephemeral range (32768-60999 by default): a port in that range can
// become the local end of any outgoing connection between a stop and a
// restart on the same port (seen in CI: "throwaway kafka: port 57342 is
// taken" after a broker was killed and started again). A `first` whose 200
// candidates reach into the range is a mistake in the test (std::logic_error).
inline constexpr int kFirstEphemeralPort = 32768;
int FreeLocalPort(int first);

// `scripts/services ARGS`, which makes every test server (the shared ones and
// the tests' own): returns what it printed on stdout; its stderr goes to
// `log`. Throws with the log's text when it fails.
std::string RunServicesScript(const std::string& args, const std::string& log);

}  // namespace outbox_test
