#include "fixture.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <filesystem>
#include <thread>

namespace outbox_test {

double SecondsSince(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

namespace {

// The PostgreSQL matrix (tests/integration/CMakeLists.txt): OUTBOX_IT_MATRIX=<major> runs the
// test on a cluster of its own of that major (its throwaway clusters are of it too), with the
// crash suite's shorter loop. Set before main, so that every reader of these sees them.
[[maybe_unused]] const bool kMatrix = [] {
  const char* major = std::getenv("OUTBOX_IT_MATRIX");
  if (major == nullptr || *major == '\0') return false;
  ::setenv("OUTBOX_PG_VERSION", major, 1);
  ::setenv("OUTBOX_IT_OWN_CLUSTER", "1", 1);
  ::setenv("OUTBOX_IT_CRASH_KILLS", "8", 0);
  return true;
}();

}  // namespace

void RelayTest::SetUp() {
  started_ = std::chrono::steady_clock::now();
  if (const char* own = std::getenv("OUTBOX_IT_OWN_CLUSTER"); own != nullptr && *own == '1') {
    UseOwnCluster();
  }
  ASSERT_NO_FATAL_FAILURE(LoadEnv(&env_));
  const ::testing::TestInfo* info = ::testing::UnitTest::GetInstance()->current_test_info();
  std::string test;
  for (char c : std::string(info->test_suite_name()).substr(0, 8) + "_" + info->name()) {
    if (std::isalnum(static_cast<unsigned char>(c)) || c == '_') {
      test += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    }
  }
  name_ = UniqueName("it_" + test.substr(0, 30));
  other_table_ = name_ + "_side";
  topic_prefix_ = name_;
  std::error_code ec;
  std::filesystem::remove(TestLogPath(), ec);  // this run's relays start a fresh log
  db_ = std::make_unique<Pg>(env_.database_url);
  kafka_ = std::make_unique<KafkaReader>(env_.kafka_brokers);
  // A leftover of an earlier run with the same pid (unlikely) would skew the figures.
  DropRelayObjects(env_.database_url, name_, name_, {name_, other_table_}, 2000);
}

void RelayTest::UseOwnCluster() {
  if (own_cluster_) return;
  auto t0 = std::chrono::steady_clock::now();
  // With the shared cluster's settings (scripts/services pg-cluster makes it).
  own_cluster_ = std::make_unique<ThrowawayPostgres>(
      FreeLocalPort(27200 + static_cast<int>(getpid() % 500)), "");
  Pg(own_cluster_->url()).Exec("CREATE DATABASE outbox");
  const std::string url = own_cluster_->url("outbox");
  if (const char* shared = std::getenv("DATABASE_URL")) shared_database_url_ = shared;
  ::setenv("DATABASE_URL", url.c_str(), 1);
  if (db_) {  // after SetUp: the fixture follows too
    env_.database_url = url;
    db_ = std::make_unique<Pg>(url);
  }
  fmt::print("[fixture] a cluster of this test's own: {} in {:.1f} s\n", url, SecondsSince(t0));
}

void RelayTest::TearDown() {
  if (shared_database_url_) ::setenv("DATABASE_URL", shared_database_url_->c_str(), 1);
  for (auto& r : relays_) {
    if (r->Running()) {
      r->Kill(SIGKILL);
      r->Wait(std::chrono::seconds(10));
    }
  }
  if (std::getenv("OUTBOX_IT_KEEP") != nullptr) {
    std::fprintf(stderr,
                 "[cleanup] OUTBOX_IT_KEEP is set: keeping table, slot, publication %s and "
                 "topics %s.*\n",
                 name_.c_str(), topic_prefix_.c_str());
    relays_.clear();
    return;
  }
  if (!env_.database_url.empty()) {
    DropRelayObjects(env_.database_url, name_, name_, {name_, other_table_});
  }
  if (kafka_ && !topic_prefix_.empty()) {
    try {
      kafka_->DeleteTopics(kafka_->TopicsWithPrefix(topic_prefix_ + "."));
    } catch (const std::exception& e) {
      std::fprintf(stderr, "[cleanup] kafka topics: %s\n", e.what());
    }
  }
  // Relays print their log tail (on failure) when destroyed.
  relays_.clear();
}

void RelayTest::CreateTables() {
  db_->Exec(OutboxTableDdl(name_));
  db_->Exec(fmt::format("CREATE TABLE {} (id BIGSERIAL PRIMARY KEY, note TEXT)",
                        QuoteIdent(other_table_)));
}

namespace {

std::vector<std::string> BaseArgs(const std::string& name, const std::string& prefix) {
  return {"run",
          "--table",
          "public." + name,
          "--slot",
          name,
          "--publication",
          name,
          "--topic-template",
          prefix + ".{Source-Service}.{Event-Type:aggregate}",
          "--service",
          "it",
          "--metrics-addr",
          "",
          "--dlq-topic",
          prefix + ".dlq"};
}

}  // namespace

std::vector<std::string> RelayTest::RelayArgs(const std::vector<std::string>& extra) const {
  std::vector<std::string> args = BaseArgs(name_, topic_prefix_);
  // "--flag value" pairs of `extra` replace the fixture's value of that flag
  // (CLI11 refuses a single-value flag given twice); the rest is appended.
  for (size_t i = 0; i < extra.size(); ++i) {
    auto it = std::find(args.begin() + 1, args.end(), extra[i]);
    if (extra[i].starts_with("--") && i + 1 < extra.size() && it != args.end() &&
        it + 1 != args.end()) {
      *(it + 1) = extra[++i];
    } else {
      args.push_back(extra[i]);
    }
  }
  return args;
}

RelayProcess& RelayTest::StartRelay(const std::vector<std::string>& extra,
                                    std::map<std::string, std::optional<std::string>> env) {
  relays_.push_back(std::make_unique<RelayProcess>(RelayArgs(extra), std::move(env)));
  relays_.back()->Start();
  return *relays_.back();
}

bool RelayTest::WaitStreaming(RelayProcess& relay, std::chrono::milliseconds timeout) {
  return relay.WaitForLog("streaming from slot", timeout);
}

WorkloadOptions RelayTest::Workload() const {
  WorkloadOptions o;
  o.database_url = env_.database_url;
  o.table = name_;
  o.other_table = other_table_;
  o.topic_prefix = topic_prefix_;
  return o;
}

std::vector<std::string> RelayTest::Eos(std::vector<std::string> extra) const {
  extra.insert(extra.end(), {"--delivery", "exactly-once", "--progress-topic",
                             topic_prefix_ + ".progress", "--shutdown-timeout-ms", "10000"});
  return extra;
}

WrittenRow RelayTest::InsertRow(Pg& pg, const RowSpec& spec) {
  WrittenRow w;
  w.uuid = NewUlid();
  w.aggregate = spec.agg;
  w.seq = spec.seq;
  std::map<std::string, std::string> metadata = {{"Aggregate-Id", spec.agg},
                                                 {"Event-Type", spec.event_type},
                                                 {"Source-Service", spec.service}};
  w.metadata_json = GoJsonObject(metadata);
  w.expected.topic = fmt::format("{}.{}.{}", topic_prefix_, spec.service,
                                 spec.event_type.substr(0, spec.event_type.find('.')));
  w.expected.key = spec.agg;
  w.expected.value =
      fmt::format(R"({{"agg":"{}","seq":{}{}}})", spec.agg, spec.seq,
                  spec.pad == 0 ? "" : R"(,"pad":")" + std::string(spec.pad, 'p') + "\"");
  w.expected.headers = ExpectedHeaders(w.uuid, metadata);
  std::string payload = spec.stored_payload.value_or(*w.expected.value);
  std::vector<std::optional<std::string>> params = {w.uuid, payload, w.metadata_json};
  std::string columns = "uuid, payload, metadata";
  if (spec.created_at) {
    columns += ", created_at";
    params.emplace_back(*spec.created_at);
  }
  if (spec.offset) {
    columns += ", offset_consumed";
    params.emplace_back(std::to_string(*spec.offset));
  }
  std::string values;
  for (size_t i = 1; i <= params.size(); ++i) values += fmt::format("{}${}", i == 1 ? "" : ", ", i);
  auto rows = pg.Query(fmt::format("INSERT INTO {} ({}) VALUES ({}) RETURNING transaction_id::text",
                                   QuoteIdent(name_), columns, values),
                       params);
  w.xid = rows.at(0)[0].value_or("");
  return w;
}

int64_t RelayTest::UnackedRows() {
  return db_->Int(
      fmt::format("SELECT count(*) FROM {} WHERE offset_acked IS NULL", QuoteIdent(name_)));
}

std::string RelayTest::DescribeUnacked() {
  auto rows = db_->Query(
      fmt::format("SELECT t.offset_consumed, t.uuid, t.transaction_id, "
                  " (SELECT count(*) FROM {0} a WHERE a.transaction_id = t.transaction_id), "
                  " EXISTS (SELECT 1 FROM outbox_relay.commits c WHERE c.slot_name = $1 "
                  "         AND t.transaction_id = ANY (c.transaction_ids)) "
                  "FROM {0} t WHERE t.offset_acked IS NULL ORDER BY t.offset_consumed LIMIT 10",
                  QuoteIdent(name_)),
      {name_});
  std::string out;
  for (const Row& r : rows) {
    out += fmt::format(
        "  unacked: offset {} uuid {} xid {} ({} rows in its transaction); commit index {}\n",
        r[0].value_or("?"), r[1].value_or("?"), r[2].value_or("?"), r[3].value_or("?"),
        r[4] == "t" ? "HAS the transaction: it was published and taken as marked"
                    : "does not have the transaction");
  }
  return out;
}

int64_t RelayTest::MisackedRows() {
  return db_->Int(fmt::format(
      "SELECT count(*) FROM {} WHERE offset_acked IS NOT NULL AND offset_acked <> offset_consumed",
      QuoteIdent(name_)));
}

int64_t RelayTest::WaitAllAcked(std::chrono::milliseconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (true) {
    int64_t n = UnackedRows();
    if (n == 0 || std::chrono::steady_clock::now() >= deadline) return n;
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
}

uint64_t RelayTest::WaitConfirmedAtLeast(uint64_t lsn, std::chrono::milliseconds timeout,
                                         const std::string& slot_name) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (true) {
    auto slot = QuerySlot(*db_, slot_name.empty() ? name_ : slot_name);
    uint64_t confirmed = slot && slot->confirmed_flush_lsn ? *slot->confirmed_flush_lsn : 0;
    if (confirmed >= lsn || std::chrono::steady_clock::now() >= deadline) return confirmed;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

namespace {

// "{123,456}" -> {"123", "456"}.
std::vector<std::string> ParseTextArray(const std::string& text) {
  std::vector<std::string> out;
  std::string cur;
  for (char c : text) {
    if (c == '{' || c == '}' || c == '"') continue;
    if (c == ',') {
      out.push_back(cur);
      cur.clear();
    } else {
      cur += c;
    }
  }
  if (!cur.empty()) out.push_back(cur);
  return out;
}

}  // namespace

void RelayTest::CheckCommitIndex(const Ledger& ledger) {
  std::map<std::string, int> want;
  for (const CommittedTransaction& tx : ledger.transactions()) want[tx.xid] = tx.rows;
  auto rows = db_->Query(
      "SELECT transaction_ids::text, row_count FROM outbox_relay.commits WHERE slot_name = $1",
      {name_});
  std::map<std::string, int> got;
  size_t multi_xid = 0, repeated = 0, mismatches = 0, unknown = 0;
  for (const Row& r : rows) {
    auto xids = ParseTextArray(r[0].value_or(""));
    if (xids.size() != 1) ++multi_xid;
    for (const auto& x : xids) {
      if (got.contains(x)) ++repeated;
      got[x] = std::stoi(r[1].value_or("-1"));
    }
  }
  for (const auto& [xid, n] : want) {
    auto it = got.find(xid);
    if (it == got.end() || it->second != n) {
      if (++mismatches <= 5) {
        ADD_FAILURE() << "commit index: transaction " << xid << " wrote " << n
                      << " outbox rows, the index says "
                      << (it == got.end() ? std::string("nothing") : std::to_string(it->second));
      }
    }
  }
  for (const auto& [xid, n] : got) {
    if (!want.contains(xid) && ++unknown <= 5) {
      ADD_FAILURE() << "commit index: transaction " << xid << " (" << n
                    << " rows) was not committed with outbox rows by the test";
    }
  }
  fmt::print(
      "commit index: {} rows for {} committed transactions; {} missing or wrong, {} "
      "unknown, {} xids in two rows, {} rows with more than one xid\n",
      rows.size(), want.size(), mismatches, unknown, repeated, multi_xid);
  EXPECT_EQ(rows.size(), want.size());
  EXPECT_EQ(mismatches, 0u);
  EXPECT_EQ(unknown, 0u);
  EXPECT_EQ(repeated, 0u);
  EXPECT_EQ(multi_xid, 0u);
}

std::vector<KafkaRecord> RelayTest::ReadTopics(const ReadOptions& options) {
  return kafka_->Read({}, topic_prefix_ + ".", options);
}

std::map<std::string, int> RelayTest::PartitionCounts(const std::vector<KafkaRecord>& records) {
  std::map<std::string, int> out;
  for (const KafkaRecord& r : records) {
    if (out.contains(r.topic)) continue;
    if (auto n = kafka_->PartitionCount(r.topic)) out[r.topic] = *n;
  }
  return out;
}

}  // namespace outbox_test
