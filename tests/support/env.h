// Connection settings of the services the integration tests run against.
//
// The tests need a real PostgreSQL (wal_level=logical) and a real Kafka broker,
// started by `scripts/services up`. A test without them FAILS (never skips):
// a green run must mean the behaviour was checked.
#pragma once

#include <cstdint>
#include <string>

namespace outbox_test {

struct Env {
  std::string database_url;   // DATABASE_URL
  std::string kafka_brokers;  // KAFKA_BROKERS
};

// Reads DATABASE_URL and KAFKA_BROKERS and checks both services answer.
// On a missing variable or an unreachable service: a fatal gtest failure
// (use as ASSERT_NO_FATAL_FAILURE(LoadEnv(&env))) naming `scripts/services up`.
void LoadEnv(Env* env);

// Directory for per-test relay logs (under the build directory).
std::string LogDir();

// The relay log file of the running test: <LogDir()>/<Suite.Name>.log (pg<major>:<Suite.Name>.log
// in the PostgreSQL matrix, OUTBOX_IT_MATRIX).
std::string TestLogPath();

// "<prefix>_<pid>": names that do not collide across test reruns.
std::string UniqueName(const std::string& prefix);

// The name of the running test, "Suite.Name" ("" outside a test).
std::string CurrentTestName();

// A seed for a test's random schedule: OUTBOX_IT_SEED if set (to replay a
// run), else a new one; printed either way ("seed N (OUTBOX_IT_SEED)").
uint64_t TestSeed();

}  // namespace outbox_test
