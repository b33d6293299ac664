#include "support/throwaway_kafka.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <librdkafka/rdkafka.h>
#include <netinet/in.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <random>
#include <sstream>
#include <stdexcept>
#include <thread>
#include <vector>

#include "support/throwaway_pg.h"

#ifndef OUTBOX_SOURCE_DIR
#error "OUTBOX_SOURCE_DIR must name the source tree (for scripts/services and scripts/kafka)"
#endif

namespace outbox_test {

namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

std::string Tail(const std::string& text, size_t lines) {
  size_t pos = text.size();
  if (pos > 0 && text[pos - 1] == '\n') --pos;
  for (size_t n = 0; n < lines && pos > 0; ++n) {
    size_t nl = text.rfind('\n', pos - 1);
    if (nl == std::string::npos) {
      pos = 0;
      break;
    }
    pos = nl;
  }
  return text.substr(pos == 0 ? 0 : pos + 1);
}

// Nobody listens on 127.0.0.1:port (TIME_WAIT leftovers do not count: the
// broker binds with SO_REUSEADDR too).
bool NoListener(int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return false;
  int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  ::close(fd);
  return ok;
}

// A KRaft cluster id: 16 random bytes, base64url without padding (Kafka's
// Uuid.toString), not starting with '-' (Uuid.randomUuid avoids those too).
std::string RandomClusterId() {
  static constexpr char kAlphabet[] =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
  std::random_device rd;
  while (true) {
    unsigned char b[18] = {};
    for (int i = 0; i < 16; ++i) b[i] = static_cast<unsigned char>(rd());
    std::string out;
    for (int i = 0; i < 18; i += 3) {
      uint32_t v = (uint32_t{b[i]} << 16) | (uint32_t{b[i + 1]} << 8) | b[i + 2];
      for (int k = 3; k >= 0; --k) out.push_back(kAlphabet[(v >> (6 * k)) & 63]);
    }
    out.resize(22);  // 128 bits
    if (out[0] != '-') return out;
  }
}

// Brokers left by a test process that died without its destructors: kill
// those whose owner is gone and remove their directories.
void ReapStaleBrokers() {
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator("/tmp", ec)) {
    std::string name = entry.path().filename().string();
    if (!name.starts_with("outbox-it-kafka-")) continue;
    long owner = 0;
    std::ifstream(entry.path() / "owner.pid") >> owner;
    if (owner <= 0) continue;
    if (::kill(static_cast<pid_t>(owner), 0) == 0 || errno != ESRCH) continue;
    long pid = 0;
    std::ifstream(entry.path() / "kafka.pid") >> pid;
    if (pid > 0) {
      std::string cmdline = ReadFile(fmt::format("/proc/{}/cmdline", pid));
      if (cmdline.find(entry.path().string()) != std::string::npos) {
        ::kill(static_cast<pid_t>(pid), SIGKILL);
      }
    }
    std::fprintf(stderr, "[throwaway kafka] removing %s, left by dead test process %ld\n",
                 entry.path().c_str(), owner);
    std::filesystem::remove_all(entry.path(), ec);
  }
}

}  // namespace

ThrowawayKafka::ThrowawayKafka(std::map<std::string, std::string> properties,
                               std::vector<std::string> format_args,
                               std::vector<std::string> jvm_options)
    : properties_(std::move(properties)),
      format_args_(std::move(format_args)),
      jvm_options_(std::move(jvm_options)) {
  Create();
}

ThrowawayKafka::ThrowawayKafka(std::map<std::string, std::string> properties, KafkaNodeSpec node)
    : properties_(std::move(properties)), node_(std::move(node)) {
  Create();
}

void ThrowawayKafka::Create() {
  ReapStaleBrokers();
  char tmpl[] = "/tmp/outbox-it-kafka-XXXXXX";
  if (::mkdtemp(tmpl) == nullptr) throw std::runtime_error("mkdtemp failed");
  dir_ = tmpl;
  std::ofstream(dir_ + "/owner.pid") << ::getpid() << "\n";
  try {
    if (node_) {
      port_ = node_->internal_port;
      controller_port_ = node_->controller_port;
    } else {
      port_ = FreeLocalPort(27100 + static_cast<int>(::getpid() % 700));
      controller_port_ = FreeLocalPort(port_ + 1);
    }
    extra_port_ = FreeLocalPort(std::max(controller_port_, node_ ? node_->client_port : 0) + 1);
    Make();
    if (!node_) Start();
  } catch (...) {
    if (pid_ > 0 && !Reap(false)) {
      ::kill(pid_, SIGKILL);
      Reap(true);
    }
    std::filesystem::remove_all(dir_);
    throw;
  }
}

ThrowawayKafka::~ThrowawayKafka() {
  if (std::getenv("OUTBOX_IT_KEEP") != nullptr) {
    // For a look at its logs and data (java -cp '<libs>/*' kafka.tools.DumpLogSegments).
    Stop();
    std::fprintf(stderr, "[throwaway kafka] OUTBOX_IT_KEEP is set: keeping %s\n", dir_.c_str());
    std::ofstream(dir_ + "/owner.pid") << 0 << "\n";  // never reaped
    return;
  }
  if (pid_ > 0 && !Reap(false)) {
    ::kill(pid_, SIGKILL);
    Reap(true);
  }
  std::error_code ec;
  if (!dir_.empty()) std::filesystem::remove_all(dir_, ec);
}

std::string ThrowawayKafka::brokers() const { return fmt::format("127.0.0.1:{}", port_); }

std::string ThrowawayKafka::client_brokers() const {
  return node_ ? node_->client_advertised : brokers();
}

void ThrowawayKafka::Make() {
  // scripts/services makes every test broker, the shared one too: its
  // settings, the storage format and the command line are the script's; this
  // kit passes what differs (the file of KEY=VALUE lines below) and runs the
  // command itself, so that the broker dies with the test process.
  std::map<std::string, std::string> p = {
      // Small and quick: a test broker holds little.
      {"num.network.threads", "2"},
      {"num.io.threads", "2"},
      {"log.segment.bytes", "16777216"},
  };
  if (node_) {
    // INTERNAL between the brokers (and for the tests' readers), CLIENT for
    // the relay, possibly advertised as a fault proxy in front of it.
    p["node.id"] = std::to_string(node_->node_id);
    p["controller.quorum.voters"] = node_->quorum_voters;
    p["listeners"] =
        fmt::format("INTERNAL://127.0.0.1:{},CLIENT://127.0.0.1:{},CONTROLLER://127.0.0.1:{}",
                    port_, node_->client_port, controller_port_);
    p["advertised.listeners"] =
        fmt::format("INTERNAL://127.0.0.1:{},CLIENT://{}", port_, node_->client_advertised);
    p["listener.security.protocol.map"] =
        "INTERNAL:PLAINTEXT,CLIENT:PLAINTEXT,CONTROLLER:PLAINTEXT";
    p["inter.broker.listener.name"] = "INTERNAL";
  }
  for (const auto& [k, v] : properties_) {
    std::string value = v;
    for (const auto& [name, port] : {std::pair<std::string, int>{"{port}", port_},
                                     {"{controller_port}", controller_port_},
                                     {"{extra_port}", extra_port_}}) {
      for (size_t at; (at = value.find(name)) != std::string::npos;) {
        value.replace(at, name.size(), std::to_string(port));
      }
    }
    p[k] = value;
  }
  {
    std::ofstream out(dir_ + "/overrides.properties");
    for (const auto& [k, v] : p) out << k << "=" << v << "\n";
    if (!out) throw std::runtime_error("cannot write " + dir_ + "/overrides.properties");
  }
  std::string args =
      fmt::format("kafka-node {} {} {} {} {}/overrides.properties", dir_, port_, controller_port_,
                  node_ ? node_->cluster_id : RandomClusterId(), dir_);
  for (const std::string& a : format_args_) args += " '" + a + "'";
  const std::string out = RunServicesScript(args, dir_ + "/services.log");
  command_.clear();
  for (size_t at = 0; at < out.size();) {
    size_t end = out.find('\n', at);
    if (end == std::string::npos) end = out.size();
    if (end > at) command_.push_back(out.substr(at, end - at));
    at = end + 1;
  }
  if (command_.empty() || command_.front() != "java") {
    throw std::runtime_error("scripts/services kafka-node printed no java command line:\n" + out);
  }
}

void ThrowawayKafka::Start(std::chrono::seconds timeout) {
  Launch();
  WaitAnswering(timeout);
}

void ThrowawayKafka::Launch() {
  if (pid_ > 0 && !Reap(false)) throw std::logic_error("throwaway kafka already running");
  std::vector<int> ports = {port_, controller_port_};
  if (node_) ports.push_back(node_->client_port);
  for (int p : ports) {
    auto until = Clock::now() + std::chrono::seconds(10);
    while (!NoListener(p) && Clock::now() < until) std::this_thread::sleep_for(milliseconds(100));
    if (!NoListener(p)) {
      throw std::runtime_error(fmt::format("throwaway kafka: port {} is taken", p));
    }
  }
  // The script's command line, and the test's JVM options after `java`.
  std::vector<std::string> args = command_;
  args.insert(args.begin() + 1, jvm_options_.begin(), jvm_options_.end());
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);

  int fd = ::open((dir_ + "/stdout.log").c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) throw std::runtime_error("open stdout.log: " + std::string(std::strerror(errno)));
  pid_t parent = ::getpid();
  pid_t pid = ::fork();
  if (pid < 0) {
    ::close(fd);
    throw std::runtime_error(std::string("fork: ") + std::strerror(errno));
  }
  if (pid == 0) {
    ::setsid();  // a terminal's ^C reaches the test, which then kills the broker itself
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);  // and the broker never outlives the test process
    if (::getppid() != parent) ::_exit(1);
    int devnull = ::open("/dev/null", O_RDONLY);
    if (devnull >= 0) ::dup2(devnull, STDIN_FILENO);
    ::dup2(fd, STDOUT_FILENO);
    ::dup2(fd, STDERR_FILENO);
    ::execvp(argv[0], argv.data());
    const char msg[] = "[throwaway kafka] exec java failed\n";
    (void)!::write(STDERR_FILENO, msg, sizeof(msg) - 1);
    ::_exit(127);
  }
  ::close(fd);
  pid_ = pid;
  std::ofstream(dir_ + "/kafka.pid") << pid_ << "\n";
}

void ThrowawayKafka::WaitAnswering(std::chrono::seconds timeout) {
  auto deadline = Clock::now() + timeout;
  while (!Answers(milliseconds(2000))) {
    if (Reap(false)) {
      throw std::runtime_error(
          fmt::format("throwaway kafka exited during start-up:\n{}", LogTail(30)));
    }
    if (Clock::now() >= deadline) {
      throw std::runtime_error(fmt::format("throwaway kafka did not answer on {} within {} s:\n{}",
                                           brokers(), timeout.count(), LogTail(30)));
    }
    std::this_thread::sleep_for(milliseconds(250));
  }
}

void ThrowawayKafka::Stop(bool kill, std::chrono::seconds grace) {
  if (pid_ <= 0 || Reap(false)) return;
  ::kill(pid_, kill ? SIGKILL : SIGTERM);
  auto deadline = Clock::now() + grace;
  while (!Reap(false)) {
    if (Clock::now() >= deadline) {
      std::fprintf(stderr, "[throwaway kafka] still alive %lld s after SIGTERM: SIGKILL\n",
                   static_cast<long long>(grace.count()));
      ::kill(pid_, SIGKILL);
      Reap(true);
      break;
    }
    std::this_thread::sleep_for(milliseconds(50));
  }
  auto until = Clock::now() + std::chrono::seconds(10);
  while (!NoListener(port_) && Clock::now() < until) std::this_thread::sleep_for(milliseconds(50));
  while (node_ && !NoListener(node_->client_port) && Clock::now() < until) {
    std::this_thread::sleep_for(milliseconds(50));
  }
}

bool ThrowawayKafka::Running() { return pid_ > 0 && !Reap(false); }

bool ThrowawayKafka::Reap(bool block) {
  if (pid_ <= 0) return true;
  int status = 0;
  pid_t r;
  do {
    r = ::waitpid(pid_, &status, block ? 0 : WNOHANG);
  } while (r < 0 && errno == EINTR);
  if (r == 0) return false;
  // Exited (or not our child any more): forget it so a Start() can follow.
  pid_ = -1;
  return true;
}

bool ThrowawayKafka::Answers(std::chrono::milliseconds timeout) const {
  char err[512];
  rd_kafka_conf_t* conf = rd_kafka_conf_new();
  if (rd_kafka_conf_set(conf, "bootstrap.servers", brokers().c_str(), err, sizeof err) !=
          RD_KAFKA_CONF_OK ||
      rd_kafka_conf_set(conf, "log_level", "0", err, sizeof err) != RD_KAFKA_CONF_OK) {
    rd_kafka_conf_destroy(conf);
    return false;
  }
  rd_kafka_t* rk = rd_kafka_new(RD_KAFKA_PRODUCER, conf, err, sizeof err);
  if (rk == nullptr) {
    rd_kafka_conf_destroy(conf);
    return false;
  }
  const rd_kafka_metadata_t* md = nullptr;
  bool ok = rd_kafka_metadata(rk, 0, nullptr, &md, static_cast<int>(timeout.count())) ==
            RD_KAFKA_RESP_ERR_NO_ERROR;
  if (ok) {
    ok = md->broker_cnt > 0;
    rd_kafka_metadata_destroy(md);
  }
  rd_kafka_destroy(rk);
  return ok;
}

std::string ThrowawayKafka::LogTail(size_t lines) const {
  return fmt::format("---- {}/logs/server.log ----\n{}\n---- {}/stdout.log ----\n{}", dir_,
                     Tail(ReadFile(dir_ + "/logs/server.log"), lines), dir_,
                     Tail(ReadFile(dir_ + "/stdout.log"), 10));
}

namespace {

// Cluster metadata from `brokers` (a librdkafka handle of its own); throws
// when no broker answers.
struct Metadata {
  explicit Metadata(const std::string& brokers) {
    char err[512];
    rd_kafka_conf_t* conf = rd_kafka_conf_new();
    rd_kafka_conf_set(conf, "bootstrap.servers", brokers.c_str(), err, sizeof err);
    rd_kafka_conf_set(conf, "log_level", "0", err, sizeof err);
    rk = rd_kafka_new(RD_KAFKA_PRODUCER, conf, err, sizeof err);
    if (rk == nullptr) {
      rd_kafka_conf_destroy(conf);
      throw std::runtime_error(std::string("rd_kafka_new: ") + err);
    }
    rd_kafka_resp_err_t e = rd_kafka_metadata(rk, 1, nullptr, &md, 10000);
    if (e != RD_KAFKA_RESP_ERR_NO_ERROR) {
      rd_kafka_destroy(rk);
      throw std::runtime_error(std::string("metadata: ") + rd_kafka_err2str(e));
    }
  }
  ~Metadata() {
    rd_kafka_metadata_destroy(md);
    rd_kafka_destroy(rk);
  }
  Metadata(const Metadata&) = delete;
  Metadata& operator=(const Metadata&) = delete;

  rd_kafka_t* rk = nullptr;
  const rd_kafka_metadata_t* md = nullptr;
};

}  // namespace

KafkaCluster::KafkaCluster(KafkaClusterOptions options) {
  const int n = options.nodes;
  std::vector<KafkaNodeSpec> specs(static_cast<size_t>(n));
  int next = 27800 + static_cast<int>(::getpid() % 600);
  std::string voters;
  std::string cluster_id = RandomClusterId();
  for (int i = 0; i < n; ++i) {
    KafkaNodeSpec& spec = specs[static_cast<size_t>(i)];
    spec.node_id = i + 1;
    spec.cluster_id = cluster_id;
    spec.internal_port = FreeLocalPort(next);
    spec.controller_port = FreeLocalPort(spec.internal_port + 1);
    spec.client_port = FreeLocalPort(spec.controller_port + 1);
    next = spec.client_port + 1;
    voters +=
        fmt::format("{}{}@127.0.0.1:{}", i == 0 ? "" : ",", spec.node_id, spec.controller_port);
  }
  std::map<std::string, std::string> defaults = {
      {"default.replication.factor", std::to_string(n)},
      {"min.insync.replicas", std::to_string(std::max(1, n - 1))},
      {"unclean.leader.election.enable", "false"},
      {"offsets.topic.replication.factor", std::to_string(n)},
      {"transaction.state.log.replication.factor", std::to_string(n)},
      {"transaction.state.log.min.isr", std::to_string(std::max(1, n - 1))},
      {"share.coordinator.state.topic.replication.factor", std::to_string(n)},
      {"share.coordinator.state.topic.min.isr", std::to_string(std::max(1, n - 1))},
      // A dead node's partitions move within seconds; a restarted one catches up.
      {"replica.lag.time.max.ms", "10000"},
      {"auto.leader.rebalance.enable", "false"},
  };
  for (const auto& [k, v] : options.properties) defaults[k] = v;
  for (int i = 0; i < n; ++i) {
    KafkaNodeSpec& spec = specs[static_cast<size_t>(i)];
    spec.quorum_voters = voters;
    std::string advertised =
        options.advertise ? options.advertise(static_cast<size_t>(i), spec.client_port) : "";
    spec.client_advertised =
        advertised.empty() ? fmt::format("127.0.0.1:{}", spec.client_port) : advertised;
    nodes_.push_back(std::make_unique<ThrowawayKafka>(defaults, spec));
  }
  for (auto& node : nodes_) node->Launch();
  for (auto& node : nodes_) node->WaitAnswering(std::chrono::seconds(180));
  // Every broker registered (a node answers before the others joined).
  auto deadline = Clock::now() + std::chrono::seconds(120);
  while (true) {
    try {
      Metadata m(brokers());
      if (m.md->broker_cnt == n) break;
    } catch (const std::exception&) {
    }
    if (Clock::now() > deadline) {
      std::string logs;
      for (auto& node : nodes_) logs += node->LogTail(15) + "\n";
      throw std::runtime_error("kafka cluster: not every broker registered within 120 s\n" + logs);
    }
    std::this_thread::sleep_for(milliseconds(250));
  }
}

std::string KafkaCluster::brokers() const {
  std::string out;
  for (const auto& node : nodes_) out += (out.empty() ? "" : ",") + node->brokers();
  return out;
}

std::string KafkaCluster::client_brokers() const {
  std::string out;
  for (const auto& node : nodes_) out += (out.empty() ? "" : ",") + node->client_brokers();
  return out;
}

std::map<std::pair<std::string, int32_t>, int32_t> KafkaCluster::Leaders(
    const std::string& prefix) const {
  std::map<std::pair<std::string, int32_t>, int32_t> out;
  Metadata m(brokers());
  for (int t = 0; t < m.md->topic_cnt; ++t) {
    const rd_kafka_metadata_topic_t& topic = m.md->topics[t];
    if (!std::string(topic.topic).starts_with(prefix)) continue;
    for (int p = 0; p < topic.partition_cnt; ++p) {
      out[{topic.topic, topic.partitions[p].id}] = topic.partitions[p].leader;
    }
  }
  return out;
}

std::map<int32_t, int> KafkaCluster::LeaderCounts(const std::string& prefix) const {
  std::map<int32_t, int> out;
  for (const auto& [tp, leader] : Leaders(prefix)) ++out[leader];
  return out;
}

int KafkaCluster::UnderReplicated(const std::string& prefix) const {
  int n = 0;
  Metadata m(brokers());
  for (int t = 0; t < m.md->topic_cnt; ++t) {
    const rd_kafka_metadata_topic_t& topic = m.md->topics[t];
    if (!std::string(topic.topic).starts_with(prefix)) continue;
    for (int p = 0; p < topic.partition_cnt; ++p) {
      const rd_kafka_metadata_partition_t& part = topic.partitions[p];
      if (part.leader < 0 || part.isr_cnt < part.replica_cnt) ++n;
    }
  }
  return n;
}

bool KafkaCluster::WaitFullyReplicated(const std::string& prefix,
                                       std::chrono::seconds timeout) const {
  auto deadline = Clock::now() + timeout;
  while (true) {
    try {
      if (UnderReplicated(prefix) == 0) return true;
    } catch (const std::exception&) {
    }
    if (Clock::now() > deadline) return false;
    std::this_thread::sleep_for(milliseconds(500));
  }
}

}  // namespace outbox_test
