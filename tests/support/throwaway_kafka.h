// A Kafka broker of the test's own, for faults the shared broker must not
// suffer (stopping it would break every other test using it) and for broker
// settings it must not get (auto.create.topics.enable=false, a small
// message.max.bytes): a single-node KRaft broker+controller on two free
// 127.0.0.1 ports, with its own data directory under /tmp, started from the
// jars `scripts/services` caches (`java -cp "<libs>/*" kafka.Kafka
// server.properties` after `kafka.tools.StorageTool format`).
//
// Stop() and Start() again keep the ports and the data (topics and records
// survive, as for a broker restart in production). The broker dies with the
// test process (PR_SET_PDEATHSIG); brokers of test processes that died
// anyway are killed and removed by the next constructor.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <map>
#include <string>
#include <vector>

namespace outbox_test {

// The directory of the broker's jars: $OUTBOX_KAFKA_LIBS (exported by
// `scripts/services env`), else what `scripts/services kafka-libs` prints.
// Throws when neither gives a directory with a kafka jar.
std::string KafkaLibsDir();

class ThrowawayKafka {
 public:
  // `properties` are added to (or replace) the broker's server.properties,
  // e.g. {{"auto.create.topics.enable", "false"}}; in their values {port},
  // {controller_port} and {extra_port} stand for the broker's ports (the
  // extra one is free for a second listener, e.g. SASL_SSL). `format_args` go
  // to `kafka-storage format` (e.g. --add-scram for SCRAM users). Starts the
  // broker and waits until it answers on its PLAINTEXT port; throws (with the
  // log tail) when it does not.
  explicit ThrowawayKafka(std::map<std::string, std::string> properties = {},
                          std::vector<std::string> format_args = {});
  ~ThrowawayKafka();  // SIGKILL and remove the directory (kept, stopped, with OUTBOX_IT_KEEP)
  ThrowawayKafka(const ThrowawayKafka&) = delete;
  ThrowawayKafka& operator=(const ThrowawayKafka&) = delete;

  // Starts the broker again on the same ports and data directory; returns once
  // it answers metadata requests. Throws when it does not within `timeout`.
  void Start(std::chrono::seconds timeout = std::chrono::seconds(120));
  // SIGTERM (controlled shutdown), SIGKILL after `grace`; `kill`: SIGKILL at
  // once (a crash). Returns once the process is gone and the port is free.
  void Stop(bool kill = false, std::chrono::seconds grace = std::chrono::seconds(30));
  bool Running();

  std::string brokers() const;  // "127.0.0.1:<port>"
  int port() const { return port_; }
  int extra_port() const { return extra_port_; }
  pid_t pid() const { return pid_; }
  const std::string& dir() const { return dir_; }
  // The last `lines` lines of the broker's server.log and stdout (for failure messages).
  std::string LogTail(size_t lines = 30) const;

 private:
  void WriteConfig();
  void Format();
  bool Answers(std::chrono::milliseconds timeout) const;
  bool Reap(bool block);

  std::map<std::string, std::string> properties_;
  std::vector<std::string> format_args_;
  std::string libs_;
  std::string dir_;
  int port_ = 0;
  int controller_port_ = 0;
  int extra_port_ = 0;
  pid_t pid_ = -1;
};

}  // namespace outbox_test
