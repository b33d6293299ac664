// A PostgreSQL 15 cluster of the test's own, for settings the shared service
// must not get (they would affect every other session on it): initdb into a
// temporary directory owned by the `postgres` system user, started on
// 127.0.0.1:<port> with trust auth and the given `-c` settings; stopped
// (immediate) and removed when destroyed. Clusters of test processes that
// died before their destructor ran are removed by the next constructor.
#pragma once

#include <string>

namespace outbox_test {

class ThrowawayPostgres {
 public:
  // `settings`: extra server options, e.g. "-c wal_level=logical". Throws on failure.
  ThrowawayPostgres(int port, const std::string& settings);
  ~ThrowawayPostgres();
  ThrowawayPostgres(const ThrowawayPostgres&) = delete;
  ThrowawayPostgres& operator=(const ThrowawayPostgres&) = delete;

  std::string url() const;  // postgresql://postgres@127.0.0.1:<port>/postgres
  const std::string& dir() const { return dir_; }

 private:
  void Run(const std::string& command, const char* what);

  int port_;
  std::string dir_;
  bool started_ = false;
};

// A TCP port on 127.0.0.1 nobody listens on now (from `first` on).
int FreeLocalPort(int first);

}  // namespace outbox_test
