#include "support/env.h"

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <libpq-fe.h>
#include <librdkafka/rdkafka.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <random>
#include <string>

#ifndef OUTBOX_IT_LOG_DIR
#define OUTBOX_IT_LOG_DIR "it-logs"
#endif

namespace outbox_test {

namespace {

constexpr const char* kHowToStart =
    "start the services with `scripts/services up` and export their settings with "
    "`eval \"$(scripts/services env)\"`";

// Empty on success, else what went wrong.
std::string CheckPostgres(const std::string& url) {
  const char* keys[] = {"dbname", "connect_timeout", nullptr};
  const char* values[] = {url.c_str(), "5", nullptr};
  std::unique_ptr<PGconn, decltype(&PQfinish)> conn(PQconnectdbParams(keys, values, 1), &PQfinish);
  if (!conn || PQstatus(conn.get()) != CONNECTION_OK) {
    return conn ? PQerrorMessage(conn.get()) : "out of memory";
  }
  std::unique_ptr<PGresult, decltype(&PQclear)> res(PQexec(conn.get(), "SHOW wal_level"), &PQclear);
  if (PQresultStatus(res.get()) != PGRES_TUPLES_OK) return PQerrorMessage(conn.get());
  std::string level = PQgetvalue(res.get(), 0, 0);
  if (level != "logical") return "wal_level is " + level + ", not logical";
  return "";
}

std::string CheckKafka(const std::string& brokers) {
  char err[512];
  rd_kafka_conf_t* conf = rd_kafka_conf_new();
  if (rd_kafka_conf_set(conf, "bootstrap.servers", brokers.c_str(), err, sizeof(err)) !=
      RD_KAFKA_CONF_OK) {
    rd_kafka_conf_destroy(conf);
    return err;
  }
  rd_kafka_conf_set(conf, "log_level", "0", err, sizeof(err));
  rd_kafka_t* rk = rd_kafka_new(RD_KAFKA_PRODUCER, conf, err, sizeof(err));
  if (rk == nullptr) {
    rd_kafka_conf_destroy(conf);
    return err;
  }
  const rd_kafka_metadata_t* md = nullptr;
  rd_kafka_resp_err_t e = rd_kafka_metadata(rk, 0, nullptr, &md, 10000);
  std::string out;
  if (e != RD_KAFKA_RESP_ERR_NO_ERROR) {
    out = rd_kafka_err2str(e);
  } else {
    if (md->broker_cnt == 0) out = "no brokers in the metadata";
    rd_kafka_metadata_destroy(md);
  }
  rd_kafka_destroy(rk);
  return out;
}

}  // namespace

void LoadEnv(Env* env) {
  const char* db = std::getenv("DATABASE_URL");
  const char* kafka = std::getenv("KAFKA_BROKERS");
  if (db == nullptr || *db == '\0') {
    FAIL() << "DATABASE_URL is not set: " << kHowToStart;
  }
  if (kafka == nullptr || *kafka == '\0') {
    FAIL() << "KAFKA_BROKERS is not set: " << kHowToStart;
  }
  env->database_url = db;
  env->kafka_brokers = kafka;
  if (std::string why = CheckPostgres(env->database_url); !why.empty()) {
    FAIL() << "PostgreSQL at DATABASE_URL=" << env->database_url << " is not usable (" << why
           << "): " << kHowToStart;
  }
  if (std::string why = CheckKafka(env->kafka_brokers); !why.empty()) {
    FAIL() << "Kafka at KAFKA_BROKERS=" << env->kafka_brokers << " is not reachable (" << why
           << "): " << kHowToStart;
  }
}

std::string LogDir() {
  std::filesystem::path dir(OUTBOX_IT_LOG_DIR);
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  return dir.string();
}

std::string TestLogPath() {
  std::string name = CurrentTestName();
  if (name.empty()) name = "relay";
  // The matrix (OUTBOX_IT_MATRIX=<major>) runs a test under the same name on several majors at
  // once: each its own log, named as ctest names the test (pg17:Suite.Test), or the relays of
  // two majors write one file and a test counting its relay's log lines counts both.
  if (const char* major = std::getenv("OUTBOX_IT_MATRIX"); major != nullptr && *major != '\0') {
    name = fmt::format("pg{}:{}", major, name);
  }
  for (char& c : name) {
    if (c == '/' || c == ' ') c = '_';
  }
  return LogDir() + "/" + name + ".log";
}

std::string UniqueName(const std::string& prefix) {
  return fmt::format("{}_{}", prefix, static_cast<long>(getpid()));
}

std::string CurrentTestName() {
  const ::testing::TestInfo* info = ::testing::UnitTest::GetInstance()->current_test_info();
  if (info == nullptr) return "";
  return fmt::format("{}.{}", info->test_suite_name(), info->name());
}

uint64_t TestSeed() {
  uint64_t seed = (static_cast<uint64_t>(std::random_device{}()) << 32) ^ std::random_device{}();
  if (const char* s = std::getenv("OUTBOX_IT_SEED"); s != nullptr && *s != '\0') {
    seed = std::stoull(s);
  }
  fmt::print("seed {} (OUTBOX_IT_SEED)\n", seed);
  std::fflush(stdout);
  return seed;
}

}  // namespace outbox_test
