// The image as users run it: outbox-relay:local (docker/Dockerfile, built by
// scripts/image) as uid 10001 with a read-only root file system, against the
// test PostgreSQL and Kafka on 127.0.0.1 (--network host).
//
//   - the same workload as the integration tests arrives byte for byte as the
//     bare binary delivers it (both run side by side on one table, each with
//     its own slot and topics), and as the record contract says;
//   - /healthz, /readyz and /metrics answer from the container;
//   - `docker stop` (SIGTERM, then SIGKILL after the Deployment's grace period)
//     drains and exits 0 in time, with no duplicates across the restarts;
//   - `docker kill` (SIGKILL) and a new container lose nothing;
//   - the runtime image is slim: no toolchain, every library resolved.
#include <fmt/format.h>

#include <cstdio>
#include <fstream>
#include <map>
#include <random>
#include <regex>
#include <sstream>
#include <thread>

#include "docker.h"
#include "integration/fixture.h"
#include "support/http_get.h"
#include "support/throwaway_pg.h"

namespace outbox_test {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

// terminationGracePeriodSeconds of docs/deploy/deployment.yaml: `docker stop`
// gets the time the kubelet gives.
int DeploymentGraceSeconds() {
  std::ifstream in(std::string(OUTBOX_SOURCE_DIR) + "/docs/deploy/deployment.yaml");
  std::stringstream text;
  text << in.rdbuf();
  std::smatch m;
  std::string s = text.str();
  if (!std::regex_search(s, m, std::regex(R"(terminationGracePeriodSeconds:\s*(\d+))"))) return 0;
  return std::stoi(m[1]);
}

class ImageRelay : public RelayTest {
 protected:
  void SetUp() override {
    RelayTest::SetUp();
    ASSERT_NO_FATAL_FAILURE(UseImageEngine());
  }

  // A container of the image running `outbox-relay run` with the fixture's
  // arguments (table, slot, publication, topics) plus `extra`.
  RelayContainer& StartContainer(const std::vector<std::string>& extra = {}) {
    std::string name = fmt::format("{}_{}", name_, containers_.size());
    containers_.push_back(std::make_unique<RelayContainer>(
        name,
        std::vector<std::string>{"-e", "DATABASE_URL=" + env_.database_url, "-e",
                                 "KAFKA_BROKERS=" + env_.kafka_brokers},
        RelayArgs(extra)));
    containers_.back()->Start();
    return *containers_.back();
  }

  static bool WaitStreaming(RelayContainer& c, milliseconds timeout = seconds(60)) {
    return c.WaitForLog("streaming from slot", timeout);
  }

  void TearDown() override {
    containers_.clear();  // docker rm -f before the fixture drops the slot
    RelayTest::TearDown();
    // The bare binary's slot of the first test (nothing when it does not exist).
    DropRelayObjects(env_.database_url, name_ + "_bare", name_, {}, 2000);
  }

  std::vector<std::unique_ptr<RelayContainer>> containers_;
};

// The workload of the end-to-end test, smaller: transactions of 1, 10 and 500
// rows between rolled-back transactions, rolled-back savepoints and writes to
// the unpublished side table, from two writers at once.
void WriteMixedWorkload(const WorkloadOptions& options, Ledger* ledger) {
  std::mt19937_64 rng(20241201);
  std::vector<TxSpec> plan;
  for (int i = 0; i < 1000; ++i) plan.push_back({.rows = 1});
  for (int i = 0; i < 100; ++i) plan.push_back({.rows = 10});
  for (int i = 0; i < 4; ++i) plan.push_back({.rows = 500});
  for (TxSpec& tx : plan) {
    if (rng() % 10 == 0) tx.savepoint_rolled_back_rows = 1 + static_cast<int>(rng() % 5);
    if (rng() % 5 == 0) tx.other_table_rows = 1 + static_cast<int>(rng() % 20);
  }
  for (int size : {1, 10, 500}) {
    for (int i = 0; i < 3; ++i) plan.push_back({.rows = size, .rollback = true});
  }
  std::shuffle(plan.begin(), plan.end(), rng);
  std::vector<std::string> errors(2);
  std::vector<std::thread> writers;
  for (size_t w = 0; w < 2; ++w) {
    writers.emplace_back([&, w] {
      try {
        Writer writer(options, ledger, -1, 7000 + w);
        for (size_t i = w; i < plan.size(); i += 2) writer.Transaction(plan[i]);
      } catch (const std::exception& e) {
        errors[w] = e.what();
      }
    });
  }
  for (auto& t : writers) t.join();
  for (const auto& e : errors) ASSERT_EQ(e, "") << "writer failed";
}

TEST_F(ImageRelay, DeliversTheWorkloadByteForByteAsTheBareBinary) {
  CreateTables();
  const int port = FreeLocalPort(17600);
  RelayContainer& container = StartContainer({"--metrics-addr", fmt::format("127.0.0.1:{}", port)});
  ASSERT_TRUE(WaitStreaming(container)) << container.LogTail();

  // How it runs: the image's user, a read-only root file system.
  CommandResult config = Docker(
      {"inspect", "-f", "{{.Config.User}} {{.HostConfig.ReadonlyRootfs}}", container.name()});
  EXPECT_EQ(config.output, "10001:10001 true\n");
  int pid = container.HostPid();
  ASSERT_GT(pid, 0);
  std::ifstream status(fmt::format("/proc/{}/status", pid));
  std::map<std::string, std::string> fields;
  for (std::string line; std::getline(status, line);) {
    size_t colon = line.find(':');
    if (colon != std::string::npos) fields[line.substr(0, colon)] = line.substr(colon + 1);
  }
  EXPECT_EQ(fields["Uid"], "\t10001\t10001\t10001\t10001")
      << "the relay's process is not uid 10001";
  EXPECT_EQ(fields["Gid"], "\t10001\t10001\t10001\t10001");

  // The bare binary beside it: same table and publication, its own slot and
  // topics (<prefix>.bare.*), so both deliver the same rows independently.
  const std::string bare_prefix = topic_prefix_ + ".bare";
  RelayProcess& bare = StartRelay({"--slot", name_ + "_bare", "--topic-template",
                                   bare_prefix + ".{Source-Service}.{Event-Type:aggregate}",
                                   "--dlq-topic", bare_prefix + ".dlq"});
  ASSERT_TRUE(RelayTest::WaitStreaming(bare)) << bare.LogTail();

  HttpResponse health = HttpGet(port, "/healthz");
  EXPECT_EQ(health.status, 200) << health.body;
  HttpResponse ready;
  for (int i = 0; i < 100 && ready.status != 200; ++i) {
    ready = HttpGet(port, "/readyz");
    if (ready.status != 200) std::this_thread::sleep_for(milliseconds(200));
  }
  EXPECT_EQ(ready.status, 200) << ready.body;

  Ledger ledger;
  ASSERT_NO_FATAL_FAILURE(WriteMixedWorkload(Workload(), &ledger));
  std::vector<WrittenRow> committed = ledger.committed();
  ASSERT_EQ(committed.size(), 4000u);
  const uint64_t wal_after_load = CurrentWalLsn(*db_);
  EXPECT_EQ(WaitAllAcked(seconds(60)), 0) << DescribeUnacked();
  EXPECT_EQ(MisackedRows(), 0);
  // Both relays mark the same rows, so the rows being marked says nothing of
  // the slower one: wait until each has confirmed the workload, which it does
  // only once it has delivered, marked and indexed every transaction of it.
  EXPECT_GE(WaitConfirmedAtLeast(wal_after_load, seconds(60)), wal_after_load);
  EXPECT_GE(WaitConfirmedAtLeast(wal_after_load, seconds(60), name_ + "_bare"), wal_after_load);
  CheckCommitIndex(ledger);

  std::vector<KafkaRecord> all = ReadTopics({.timeout = seconds(90)});
  std::vector<KafkaRecord> from_image, from_bare;
  for (KafkaRecord& r : all) {
    (r.topic.starts_with(bare_prefix + ".") ? from_bare : from_image).push_back(std::move(r));
  }
  DeliveryReport delivery = CheckDelivery(committed, ledger.rolled_back(), from_image);
  fmt::print("image: {}\n", delivery.Summary());
  EXPECT_EQ(delivery.lost, 0u) << delivery.Samples();
  EXPECT_EQ(delivery.phantom, 0u) << delivery.Samples();
  EXPECT_EQ(delivery.duplicates, 0u) << delivery.Samples();
  EXPECT_EQ(delivery.order_violations, 0u) << delivery.Samples();
  EXPECT_EQ(delivery.split_aggregates, 0u) << delivery.Samples();
  ContractReport contract = CheckContract(committed, from_image, PartitionCounts(from_image));
  fmt::print("image: {}\n", contract.Summary());
  EXPECT_EQ(contract.checked, from_image.size());
  EXPECT_EQ(contract.mismatches, 0u) << contract.Samples();
  EXPECT_EQ(contract.wrong_partition, 0u) << contract.Samples();

  // Record for record against the bare binary: same key, value, headers (bytes
  // and order) and partition, the topic differing only by the prefix.
  std::map<std::string, const KafkaRecord*> bare_by_uuid;
  for (const KafkaRecord& r : from_bare) {
    if (const KafkaHeader* h = r.FindHeader("_watermill_message_uuid"); h && h->value) {
      bare_by_uuid[*h->value] = &r;
    }
  }
  size_t compared = 0, differ = 0;
  for (const KafkaRecord& r : from_image) {
    const KafkaHeader* h = r.FindHeader("_watermill_message_uuid");
    auto it = h && h->value ? bare_by_uuid.find(*h->value) : bare_by_uuid.end();
    if (it == bare_by_uuid.end()) {
      ADD_FAILURE() << "the bare binary did not deliver " << (h ? Printable(h->value) : "?");
      continue;
    }
    const KafkaRecord& b = *it->second;
    ++compared;
    bool same = r.topic.substr(topic_prefix_.size()) == b.topic.substr(bare_prefix.size()) &&
                r.key == b.key && r.value == b.value && r.headers == b.headers &&
                r.partition == b.partition;
    if (!same && ++differ <= 5) {
      ADD_FAILURE() << "image and bare binary differ for " << Printable(h->value) << ": topic "
                    << r.topic << " / " << b.topic << ", partition " << r.partition << " / "
                    << b.partition << ", value " << Printable(r.value) << " / "
                    << Printable(b.value);
    }
  }
  fmt::print("image vs bare binary: {} records compared, {} differ ({} from the bare binary)\n",
             compared, differ, from_bare.size());
  EXPECT_EQ(compared, committed.size());
  EXPECT_EQ(from_bare.size(), committed.size());
  EXPECT_EQ(differ, 0u);

  // The metrics endpoint of the container counts what it published.
  HttpResponse metrics = HttpGet(port, "/metrics");
  ASSERT_EQ(metrics.status, 200);
  EXPECT_EQ(MetricSum(metrics.body, "events_published_total"),
            std::optional<double>(static_cast<double>(committed.size())));

  double stop_s = container.Stop(DeploymentGraceSeconds());
  EXPECT_EQ(container.ExitCode(), std::optional<int>(0)) << container.LogTail();
  fmt::print("image: docker stop took {:.2f} s\n", stop_s);
  bare.Terminate();
  EXPECT_EQ(bare.Wait(seconds(30)), std::optional<int>(0)) << bare.LogTail();
}

// Load that runs while containers are stopped, killed and replaced.
LoadGenerator MakeLoad(const WorkloadOptions& options, Ledger* ledger) {
  return LoadGenerator(
      options, ledger, 2,
      [](std::mt19937_64& rng) {
        TxSpec tx;
        tx.rows = 1 + static_cast<int>(rng() % 40);
        tx.rollback = rng() % 10 == 0;
        if (rng() % 10 == 0) tx.savepoint_rolled_back_rows = 1 + static_cast<int>(rng() % 3);
        return tx;
      },
      std::chrono::microseconds(3000));
}

TEST_F(ImageRelay, DockerStopDrainsWithinTheGracePeriodWithoutDuplicates) {
  constexpr int kStops = 3;
  const int grace = DeploymentGraceSeconds();
  ASSERT_GT(grace, 0) << "no terminationGracePeriodSeconds in docs/deploy/deployment.yaml";
  CreateTables();
  RelayContainer* container = &StartContainer();
  ASSERT_TRUE(WaitStreaming(*container)) << container->LogTail();

  Ledger ledger;
  LoadGenerator load = MakeLoad(Workload(), &ledger);
  load.Start();
  std::mt19937_64 rng(TestSeed());
  std::string stops;
  double longest = 0;
  for (int i = 0; i < kStops; ++i) {
    std::this_thread::sleep_for(milliseconds(2000 + rng() % 2000));
    ASSERT_TRUE(container->Running()) << "the container exited by itself:\n"
                                      << container->LogTail();
    double s = container->Stop(grace);
    stops += fmt::format(" {:.2f}s", s);
    longest = std::max(longest, s);
    EXPECT_EQ(container->ExitCode(), std::optional<int>(0))
        << "docker stop did not end in exit 0 (137: the grace period ran out)\n"
        << container->LogTail();
    EXPECT_LT(s, grace) << "the drain took the whole grace period";
    container = &StartContainer();
    ASSERT_TRUE(WaitStreaming(*container)) << container->LogTail();
  }
  std::this_thread::sleep_for(seconds(2));
  ASSERT_EQ(load.Stop(), "") << "writer failed";

  EXPECT_EQ(WaitAllAcked(seconds(90)), 0) << DescribeUnacked();
  EXPECT_EQ(MisackedRows(), 0);
  double last = container->Stop(grace);
  EXPECT_EQ(container->ExitCode(), std::optional<int>(0)) << container->LogTail();
  stops += fmt::format(" {:.2f}s (idle)", last);

  std::vector<WrittenRow> committed = ledger.committed();
  DeliveryReport delivery =
      CheckDelivery(committed, ledger.rolled_back(), ReadTopics({.timeout = seconds(60)}));
  fmt::print("image: {} docker stops under load (grace {} s; time to exit:{}), {} transactions\n",
             kStops, grace, stops, load.transactions());
  fmt::print("image: {}\n", delivery.Summary());
  EXPECT_EQ(delivery.lost, 0u) << delivery.Samples();
  EXPECT_EQ(delivery.phantom, 0u) << delivery.Samples();
  EXPECT_EQ(delivery.duplicates, 0u) << "a graceful stop must not cause re-sends\n"
                                     << delivery.Samples();
  EXPECT_EQ(delivery.order_violations, 0u) << delivery.Samples();
  EXPECT_EQ(delivery.split_aggregates, 0u) << delivery.Samples();
}

TEST_F(ImageRelay, DockerKillThenANewContainerLosesNothing) {
  constexpr int kKills = 3;
  CreateTables();
  RelayContainer* container = &StartContainer();
  ASSERT_TRUE(WaitStreaming(*container)) << container->LogTail();

  Ledger ledger;
  LoadGenerator load = MakeLoad(Workload(), &ledger);
  load.Start();
  std::mt19937_64 rng(TestSeed());
  for (int i = 0; i < kKills; ++i) {
    std::this_thread::sleep_for(milliseconds(1500 + rng() % 2000));
    ASSERT_TRUE(container->Running()) << container->LogTail();
    container->Kill();
    EXPECT_EQ(container->Wait(seconds(30)), std::optional<int>(137)) << container->LogTail();
    container = &StartContainer();
    ASSERT_TRUE(WaitStreaming(*container)) << container->LogTail();
  }
  std::this_thread::sleep_for(seconds(2));
  ASSERT_EQ(load.Stop(), "") << "writer failed";

  EXPECT_EQ(WaitAllAcked(seconds(90)), 0) << DescribeUnacked();
  EXPECT_EQ(MisackedRows(), 0);
  container->Stop(DeploymentGraceSeconds());
  EXPECT_EQ(container->ExitCode(), std::optional<int>(0)) << container->LogTail();

  std::vector<WrittenRow> committed = ledger.committed();
  DeliveryReport delivery =
      CheckDelivery(committed, ledger.rolled_back(), ReadTopics({.timeout = seconds(60)}));
  fmt::print("image: {} docker kills under load, {} transactions\n", kKills, load.transactions());
  fmt::print("image: {}\n", delivery.Summary());
  EXPECT_EQ(delivery.lost, 0u) << delivery.Samples();
  EXPECT_EQ(delivery.phantom, 0u) << delivery.Samples();
  EXPECT_EQ(delivery.order_violations, 0u) << delivery.Samples();
  EXPECT_EQ(delivery.split_aggregates, 0u) << delivery.Samples();
}

// No toolchain in the runtime image, every shared library of the binary
// resolves there, and the size stays that of a slim base plus the libraries.
TEST(Image, RuntimeIsSlim) {
  ASSERT_NO_FATAL_FAILURE(UseImageEngine());
  const std::string image = RelayImage();
  CommandResult tools =
      Docker({"run", "--rm", "--network", "none", "--entrypoint", "sh", image, "-c",
              "for t in gcc g++ cc c++ cmake ninja make ld as; do "
              "command -v $t; done; exit 0"});
  ASSERT_EQ(tools.status, 0) << tools.output;
  EXPECT_EQ(tools.output, "") << "build tools in the runtime image";
  CommandResult ldd = Docker({"run", "--rm", "--network", "none", "--entrypoint", "ldd", image,
                              "/usr/local/bin/outbox-relay"});
  ASSERT_EQ(ldd.status, 0) << ldd.output;
  EXPECT_EQ(ldd.output.find("not found"), std::string::npos) << ldd.output;
  CommandResult version =
      Docker({"run", "--rm", "--network", "none", "--read-only", image, "version"});
  EXPECT_EQ(version.status, 0) << version.output;
  CommandResult size = Docker({"image", "inspect", "-f", "{{.Size}}", image});
  ASSERT_EQ(size.status, 0) << size.output;
  double mb = std::stod(size.output) / 1e6;
  fmt::print("image: {} is {:.1f} MB; {}", image, mb, version.output);
  // debian:12-slim (about 80 MB) plus the relay's libraries: a few tens of MB. A
  // build stage shipped by mistake would add hundreds.
  EXPECT_LT(mb, 160.0);
}

// The shipped binary is built without the test-only faults (OUTBOX_FAILPOINTS
// =OFF in docker/Dockerfile): `version` says it has none, the faults' texts
// are not in it, and `run` says OUTBOX_TEST_FAULT is ignored. It links the
// librdkafka scripts/librdkafka builds from the pinned source, not Debian
// 12's 2.0.2 (the image installs no librdkafka1).
TEST(Image, ShipsWithoutTheTestFaults) {
  ASSERT_NO_FATAL_FAILURE(UseImageEngine());
  const std::string image = RelayImage();
  CommandResult version =
      Docker({"run", "--rm", "--network", "none", "--read-only", image, "version"});
  ASSERT_EQ(version.status, 0) << version.output;
  EXPECT_NE(version.output.find("\nfailpoints: none (a production build)\n"), std::string::npos)
      << version.output;
  EXPECT_EQ(version.output.find("compiled in"), std::string::npos) << version.output;
  // The commit it was built from: the build context has no .git, scripts/image passes it.
  EXPECT_NE(version.output.find("\ncommit: "), std::string::npos) << version.output;
  EXPECT_EQ(version.output.find("\ncommit: unknown\n"), std::string::npos) << version.output;
  const size_t at = version.output.find("\nlibrdkafka: ");
  ASSERT_NE(at, std::string::npos) << version.output;
  int major = 0, minor = 0;
  ASSERT_EQ(std::sscanf(version.output.c_str() + at, "\nlibrdkafka: %d.%d", &major, &minor), 2)
      << version.output;
  EXPECT_GE(major * 100 + minor, 212) << version.output;
  CommandResult dpkg = Docker({"run", "--rm", "--network", "none", "--entrypoint", "dpkg-query",
                               image, "-W", "-f", "${Package}\n", "librdkafka*"});
  EXPECT_EQ(dpkg.output.find("librdkafka1"), std::string::npos) << dpkg.output;
  CommandResult grep = Docker({"run", "--rm", "--network", "none", "--entrypoint", "grep", image,
                               "-c", "TEST FAULT", "/usr/local/bin/outbox-relay"});
  EXPECT_EQ(grep.output, "0\n") << "the shipped binary holds the test faults";
  // A setting refused at start (no table): the warning comes first, then exit 2.
  CommandResult run = Docker({"run", "--rm", "--network", "none", "--read-only", "-e",
                              "OUTBOX_TEST_FAULT=confirm-newest", image, "run", "--table", ""});
  EXPECT_EQ(run.status, 2) << run.output;
  EXPECT_NE(run.output.find("OUTBOX_TEST_FAULT is set and ignored"), std::string::npos)
      << run.output;
}

// The non-comment lines of a .dockerignore file.
std::vector<std::string> IgnorePatterns(const std::string& path) {
  std::ifstream in(path);
  std::vector<std::string> out;
  for (std::string line; std::getline(in, line);) {
    if (!line.empty() && line[0] != '#') out.push_back(line);
  }
  return out;
}

// The classic builder (Docker Engine before 23, such as Debian 12's docker.io, and
// docker-compose 1.x) reads only <context>/.dockerignore, not
// docker/Dockerfile.dockerignore: without the root file a build from a checkout
// sent everything (3 GB here) and failed on the test engine's files in .services/.
TEST(Image, ClassicBuilderSendsOnlyTheSources) {
  ASSERT_NO_FATAL_FAILURE(UseImageEngine());
  const std::string repo = OUTBOX_SOURCE_DIR;
  std::vector<std::string> root = IgnorePatterns(repo + "/.dockerignore");
  EXPECT_FALSE(root.empty()) << "no .dockerignore at the repository root";
  EXPECT_EQ(root, IgnorePatterns(repo + "/docker/Dockerfile.dockerignore"));
  // A target that does not exist: the builder takes the context, then stops.
  CommandResult r = RunCommand({"env", "DOCKER_BUILDKIT=0", "/usr/bin/docker", "build", "-f",
                                repo + "/docker/Dockerfile", "--target", "no-such-stage", repo},
                               std::chrono::seconds(300));
  std::smatch m;
  ASSERT_TRUE(std::regex_search(
      r.output, m, std::regex(R"(Sending build context to Docker daemon\s+([0-9.]+)([kMG]?B))")))
      << r.output;
  double bytes = std::stod(m[1]) * (m[2] == "kB"   ? 1e3
                                    : m[2] == "MB" ? 1e6
                                    : m[2] == "GB" ? 1e9
                                                   : 1);
  fmt::print("image: the classic builder's context is {:.0f} kB\n", bytes / 1e3);
  EXPECT_LT(bytes, 5e6) << r.output;
  EXPECT_NE(r.output.find("failed to reach build target no-such-stage"), std::string::npos)
      << r.output;
}

}  // namespace
}  // namespace outbox_test
