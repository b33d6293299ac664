// A Kafka broker of the test's own, for faults the shared broker must not
// suffer (stopping it would break every other test using it) and for broker
// settings it must not get (auto.create.topics.enable=false, a small
// message.max.bytes): a single-node KRaft broker+controller on two free
// 127.0.0.1 ports, with its own data directory under /tmp. `scripts/services
// kafka-node` makes it as it makes the shared broker (the same settings, the
// same storage format, the same command line from the jars it caches); this
// kit adds the test's settings and runs the command itself.
//
// Stop() and Start() again keep the ports and the data (topics and records
// survive, as for a broker restart in production). The broker dies with the
// test process (PR_SET_PDEATHSIG); brokers of test processes that died
// anyway are killed and removed by the next constructor.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace outbox_test {

// A node of a multi-node KRaft cluster (KafkaCluster): what the cluster
// decided for it. Its broker has two listeners: INTERNAL (between the
// brokers, and for the tests' own readers) and CLIENT, which may be
// advertised as another address (a fault proxy in front of it).
struct KafkaNodeSpec {
  int node_id = 1;
  std::string cluster_id;
  std::string quorum_voters;  // "1@127.0.0.1:<controller port>,2@..."
  int internal_port = 0;
  int controller_port = 0;
  int client_port = 0;
  std::string client_advertised;  // "127.0.0.1:<port>"
};

class ThrowawayKafka {
 public:
  // `properties` are added to (or replace) the broker's server.properties,
  // e.g. {{"auto.create.topics.enable", "false"}}; in their values {port},
  // {controller_port} and {extra_port} stand for the broker's ports (the
  // extra one is free for a second listener, e.g. SASL_SSL). `format_args` go
  // to `kafka-storage format` (e.g. --add-scram for SCRAM users);
  // `jvm_options` to the broker's JVM (e.g. a -D system property such as
  // org.apache.kafka.sasl.oauthbearer.allowed.urls). Starts the broker and
  // waits until it answers on its PLAINTEXT port; throws (with the log tail)
  // when it does not.
  explicit ThrowawayKafka(std::map<std::string, std::string> properties = {},
                          std::vector<std::string> format_args = {},
                          std::vector<std::string> jvm_options = {});
  // A cluster node: configured and formatted, not started (Launch, then
  // WaitAnswering: a node answers only once a quorum of voters runs).
  ThrowawayKafka(std::map<std::string, std::string> properties, KafkaNodeSpec node);
  ~ThrowawayKafka();  // SIGKILL and remove the directory (kept, stopped, with OUTBOX_IT_KEEP)
  ThrowawayKafka(const ThrowawayKafka&) = delete;
  ThrowawayKafka& operator=(const ThrowawayKafka&) = delete;

  // Starts the broker again on the same ports and data directory; returns once
  // it answers metadata requests. Throws when it does not within `timeout`.
  void Start(std::chrono::seconds timeout = std::chrono::seconds(120));
  // The two halves of Start: spawn the JVM; wait until the broker answers.
  void Launch();
  void WaitAnswering(std::chrono::seconds timeout = std::chrono::seconds(120));
  // SIGTERM (controlled shutdown), SIGKILL after `grace`; `kill`: SIGKILL at
  // once (a crash). Returns once the process is gone and the port is free.
  void Stop(bool kill = false, std::chrono::seconds grace = std::chrono::seconds(30));
  bool Running();

  std::string brokers() const;  // "127.0.0.1:<port>" (a cluster node's INTERNAL listener)
  // What clients are told: a cluster node's advertised CLIENT address, else brokers().
  std::string client_brokers() const;
  const std::optional<KafkaNodeSpec>& node() const { return node_; }
  int port() const { return port_; }
  int extra_port() const { return extra_port_; }
  pid_t pid() const { return pid_; }
  const std::string& dir() const { return dir_; }
  // The last `lines` lines of the broker's server.log and stdout (for failure messages).
  std::string LogTail(size_t lines = 30) const;

 private:
  // Configures and formats the broker (scripts/services kafka-node); keeps its command line.
  void Make();
  bool Answers(std::chrono::milliseconds timeout) const;
  bool Reap(bool block);

  void Create();

  std::map<std::string, std::string> properties_;
  std::vector<std::string> format_args_;
  std::vector<std::string> jvm_options_;
  std::optional<KafkaNodeSpec> node_;
  std::vector<std::string> command_;  // the broker's command line, from scripts/services
  std::string dir_;
  int port_ = 0;
  int controller_port_ = 0;
  int extra_port_ = 0;
  pid_t pid_ = -1;
};

// A KRaft cluster of combined broker+controller nodes on 127.0.0.1, each a
// ThrowawayKafka (own directory, dies with the test process). Node ids are
// 1..n, all of them controller voters: a majority must run for the cluster to
// elect leaders (3 nodes: 2).
struct KafkaClusterOptions {
  int nodes = 3;
  // Every node's server.properties gets these too (after the cluster's own
  // defaults: replication factor = nodes, min.insync.replicas = nodes - 1,
  // unclean.leader.election.enable = false).
  std::map<std::string, std::string> properties;
  // Called once per node with its index and CLIENT listener port, before any
  // node is configured; returns the address to advertise for it (e.g. a
  // proxy's), or "" for the listener's own.
  std::function<std::string(size_t node, int client_port)> advertise;
};

class KafkaCluster {
 public:
  // Starts every node and waits until all answer (throws with their logs).
  explicit KafkaCluster(KafkaClusterOptions options);
  KafkaCluster(const KafkaCluster&) = delete;
  KafkaCluster& operator=(const KafkaCluster&) = delete;

  size_t size() const { return nodes_.size(); }
  ThrowawayKafka& node(size_t i) { return *nodes_.at(i); }
  // Index of the node with Kafka id `node_id` (1-based ids).
  size_t IndexOf(int32_t node_id) const { return static_cast<size_t>(node_id - 1); }
  // INTERNAL listeners (the tests' readers and admin calls; never proxied).
  std::string brokers() const;
  // CLIENT listeners as advertised (the relay's bootstrap servers).
  std::string client_brokers() const;

  // Partition leaders of the topics starting with `prefix`: node id -> number
  // of partitions it leads (leaderless partitions under -1).
  std::map<int32_t, int> LeaderCounts(const std::string& prefix) const;
  // (topic, partition) -> leader node id.
  std::map<std::pair<std::string, int32_t>, int32_t> Leaders(const std::string& prefix) const;
  // Partitions of those topics whose in-sync replicas are fewer than their
  // replicas (or that have no leader); 0 when every replica is back in sync.
  int UnderReplicated(const std::string& prefix) const;
  // Waits until UnderReplicated(prefix) == 0 (false: timeout).
  bool WaitFullyReplicated(const std::string& prefix, std::chrono::seconds timeout) const;

 private:
  std::vector<std::unique_ptr<ThrowawayKafka>> nodes_;
};

}  // namespace outbox_test
