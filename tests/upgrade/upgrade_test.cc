// Upgrades and rollbacks (docs/upgrading.md): the relay of the previous
// release (RELEASES; scripts/previous-release builds it from the repository's
// history) and this checkout's relay replace each other as a rolling upgrade
// does, under a mixed load:
//
//   previous active -> this one standby -> SIGTERM previous -> this one active
//   -> previous standby -> SIGTERM this one (the rollback) -> previous active
//   -> this one standby -> SIGTERM previous (forward again) -> SIGTERM
//
// in at-least-once, exactly-once (each release with its default progress
// topic) and Watermill table mode: every hand-over is graceful, so lost 0,
// phantom 0, order violations 0 and duplicates 0, every exit code 0. And the
// version rules of what the relay persists: the schema this release records
// is run against by the previous release; a newer schema runs only when it
// declares this relay may read it, else the relay refuses to start naming
// both versions and loses nothing; a progress record of an unknown newer
// format is refused, never skipped past.
//
// Each test has a database of its own (the relay schema outbox_relay is one
// per database, and these tests write versions into it that would stop every
// other test's relay).
#include <fmt/format.h>
#include <librdkafka/rdkafka.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <random>
#include <thread>

#include "fixture.h"
#include "ops_support.h"
#include "resilience_support.h"

namespace outbox_test {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;
using RelayEnv = std::map<std::string, std::optional<std::string>>;

enum class Release { kPrevious, kThis };

// "the previous release's relay", "this release's relay".
const char* NameOf(Release r) { return r == Release::kPrevious ? "the previous" : "this"; }

// The previous release's relay: $OUTBOX_IT_PREVIOUS_RELAY_BIN, else the one
// scripts/previous-release built (ctest's upgrade_previous_release_build
// builds it first). "" with the reason in *why when there is none.
std::string PreviousRelease(std::string* why) {
  if (const char* bin = std::getenv("OUTBOX_IT_PREVIOUS_RELAY_BIN"); bin != nullptr && *bin) {
    return bin;
  }
  std::string cmd = std::string(OUTBOX_SOURCE_DIR) + "/scripts/previous-release path 2>&1";
  std::string out;
  if (FILE* p = ::popen(cmd.c_str(), "r")) {
    std::array<char, 512> buf{};
    while (std::fgets(buf.data(), buf.size(), p) != nullptr) out += buf.data();
    int rc = ::pclose(p);
    while (!out.empty() && out.back() == '\n') out.pop_back();
    if (rc == 0) return out;
  }
  *why = out;
  return "";
}

// One record, produced outside any transaction (a read_committed reader sees it).
void Produce(const std::string& brokers, const std::string& topic, const std::string& key,
             const std::string& value) {
  char err[512];
  rd_kafka_conf_t* conf = rd_kafka_conf_new();
  rd_kafka_conf_set(conf, "bootstrap.servers", brokers.c_str(), err, sizeof err);
  rd_kafka_conf_set(conf, "acks", "all", err, sizeof err);
  rd_kafka_t* rk = rd_kafka_new(RD_KAFKA_PRODUCER, conf, err, sizeof err);
  ASSERT_NE(rk, nullptr) << err;
  rd_kafka_resp_err_t e =
      rd_kafka_producev(rk, RD_KAFKA_V_TOPIC(topic.c_str()), RD_KAFKA_V_KEY(key.data(), key.size()),
                        RD_KAFKA_V_VALUE(const_cast<char*>(value.data()), value.size()),
                        RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY), RD_KAFKA_V_END);
  EXPECT_EQ(e, RD_KAFKA_RESP_ERR_NO_ERROR) << rd_kafka_err2str(e);
  EXPECT_EQ(rd_kafka_flush(rk, 30000), RD_KAFKA_RESP_ERR_NO_ERROR) << "not acknowledged";
  rd_kafka_destroy(rk);
}

std::string ReplaceOnce(std::string text, const std::string& from, const std::string& to) {
  size_t at = text.find(from);
  if (at != std::string::npos) text.replace(at, from.size(), to);
  return text;
}

// Writers of a Watermill table (watermill-sql's schema, as its publisher
// inserts): each writer owns five aggregates (metadata aggregate_id, the
// relay's key field), 1-3 rows a transaction, every seventh rolled back.
class WatermillLoad {
 public:
  WatermillLoad(std::string url, std::string table, Ledger* ledger, int writers)
      : url_(std::move(url)), table_(std::move(table)), ledger_(ledger), writers_(writers) {}
  ~WatermillLoad() { Stop(); }

  void Start() {
    for (int w = 0; w < writers_; ++w) threads_.emplace_back([this, w] { Write(w); });
  }
  std::string Stop() {
    stop_ = true;
    for (auto& t : threads_) t.join();
    threads_.clear();
    std::lock_guard lock(mu_);
    return error_;
  }
  size_t transactions() const { return transactions_; }

 private:
  void Write(int w) {
    try {
      Pg pg(url_);
      std::map<std::string, int64_t> seq;  // per aggregate: the last committed
      for (int i = 0; !stop_; ++i) {
        std::string agg = fmt::format("w{}-a{}", w, i % 5);
        pg.Exec("BEGIN");
        std::string xid = pg.Scalar("SELECT pg_current_xact_id()::text").value_or("");
        std::vector<WrittenRow> rows;
        int64_t next = seq[agg];
        for (int k = 0; k < 1 + i % 3; ++k) {
          WrittenRow r;
          r.uuid = NewUlid();
          r.aggregate = agg;
          r.seq = ++next;
          pg.Exec(fmt::format("INSERT INTO {} (uuid, payload, metadata, transaction_id) VALUES "
                              "($1, $2, $3, pg_current_xact_id())",
                              QuoteIdent(table_)),
                  {r.uuid, fmt::format(R"({{"agg":"{}","seq":{}}})", agg, r.seq),
                   fmt::format(R"({{"aggregate_id":"{}"}})", agg)});
          rows.push_back(std::move(r));
        }
        if (i % 7 == 3) {
          pg.Exec("ROLLBACK");
          ledger_->AddRolledBack(std::move(rows));
        } else {
          pg.Exec("COMMIT");
          seq[agg] = next;
          ledger_->AddCommitted(xid, std::move(rows));
        }
        ++transactions_;
        std::this_thread::sleep_for(milliseconds(3));
      }
    } catch (const std::exception& e) {
      std::lock_guard lock(mu_);
      if (error_.empty()) error_ = e.what();
    }
  }

  std::string url_;
  std::string table_;
  Ledger* ledger_;
  int writers_;
  std::atomic<bool> stop_{false};
  std::atomic<size_t> transactions_{0};
  std::vector<std::thread> threads_;
  std::mutex mu_;
  std::string error_;
};

class Upgrade : public RelayTest {
 protected:
  void SetUp() override {
    RelayTest::SetUp();
    if (HasFatalFailure()) return;
    previous_ = PreviousRelease(&previous_missing_);
    shared_url_ = env_.database_url;
    db_->Exec("DROP DATABASE IF EXISTS " + QuoteIdent(name_) + " WITH (FORCE)");
    db_->Exec("CREATE DATABASE " + QuoteIdent(name_));
    database_ = name_;
    env_.database_url = WithDatabase(shared_url_, name_);
    db_ = std::make_unique<Pg>(env_.database_url);
    system_id_ =
        db_->Scalar("SELECT system_identifier::text FROM pg_control_system()").value_or("");
  }

  void TearDown() override {
    RelayTest::TearDown();  // the relays, the slot (a database with one cannot be dropped), topics
    if (kafka_ && !system_id_.empty()) {
      try {
        kafka_->DeleteTopics(kafka_->TopicsWithPrefix(DefaultProgressTopic()));
      } catch (const std::exception& e) {
        std::fprintf(stderr, "[cleanup] progress topic: %s\n", e.what());
      }
    }
    db_.reset();
    if (!database_.empty() && std::getenv("OUTBOX_IT_KEEP") == nullptr) {
      try {
        Pg(shared_url_).Exec("DROP DATABASE IF EXISTS " + QuoteIdent(database_) + " WITH (FORCE)");
      } catch (const std::exception& e) {
        std::fprintf(stderr, "[cleanup] database %s: %s\n", database_.c_str(), e.what());
      }
    }
  }

  // The URL with another database ("postgresql://u@h:p/db?x" -> ".../name?x").
  static std::string WithDatabase(const std::string& url, const std::string& name) {
    size_t scheme = url.find("://");
    size_t slash = url.find('/', scheme == std::string::npos ? 0 : scheme + 3);
    if (slash == std::string::npos) return url + "/" + name;
    size_t query = url.find('?', slash);
    return url.substr(0, slash + 1) + name + (query == std::string::npos ? "" : url.substr(query));
  }

  // This relay's default transactional.id and progress topic (the record key
  // of both releases; the topic of this one: CHANGELOG.md).
  std::string TransactionalId() const {
    return fmt::format("outbox-relay.{}.{}.{}", system_id_, database_, name_);
  }
  std::string DefaultProgressTopic() const { return TransactionalId() + ".progress"; }

  RelayProcess& Start(Release release, const std::vector<std::string>& extra = {},
                      RelayEnv env = {}) {
    env.try_emplace("DATABASE_URL", env_.database_url);
    relays_.push_back(std::make_unique<RelayProcess>(RelayArgs(extra), std::move(env)));
    if (release == Release::kPrevious) {
      EXPECT_NE(previous_, "") << "no previous release: " << previous_missing_
                               << " (ctest runs upgrade_previous_release_build first)";
      relays_.back()->set_binary(previous_);
    }
    relays_.back()->Start();
    return *relays_.back();
  }

  // `next` starts as `active`'s hot standby; `active` gets SIGTERM under
  // load: it must exit 0 (a graceful stop, nothing in flight left behind),
  // and `next` take over.
  RelayProcess* HandOver(RelayProcess* active, Release next_release,
                         const std::vector<std::string>& extra, const std::string& what) {
    RelayProcess& next = Start(next_release, extra);
    EXPECT_TRUE(next.WaitForLog("standby:", seconds(30)))
        << what << ": " << NameOf(next_release) << " release did not say it is standby\n"
        << next.LogTail();
    std::this_thread::sleep_for(milliseconds(1500));  // both running, under load
    auto t0 = std::chrono::steady_clock::now();
    active->Terminate();
    std::optional<int> code = active->Wait(seconds(40));
    double stopped = SecondsSince(t0);
    EXPECT_EQ(code, std::optional<int>(0)) << what << ": SIGTERM\n" << active->LogTail();
    bool took_over = WaitStreaming(next, seconds(30));
    EXPECT_TRUE(took_over) << what << ": no takeover\n" << next.LogTail();
    figures_ += fmt::format(
        "  {}: exit {} {:.2f} s after SIGTERM; {} release's relay streaming {:.2f} s "
        "after it\n",
        what, code.value_or(-1), stopped, NameOf(next_release), SecondsSince(t0));
    return &next;
  }

  // The whole round trip under `load` (started and stopped here): previous ->
  // this -> previous -> this. `done` waits until everything committed is
  // delivered and marked. Returns the last relay (still running).
  template <typename Load, typename Done>
  RelayProcess* RoundTrip(const std::vector<std::string>& args, Load& load, Done done) {
    RelayProcess* active = &Start(Release::kPrevious, args);
    EXPECT_TRUE(WaitStreaming(*active, seconds(60))) << active->LogTail();
    load.Start();
    std::this_thread::sleep_for(milliseconds(1500));
    active = HandOver(active, Release::kThis, args, "upgrade (previous -> this)");
    active = HandOver(active, Release::kPrevious, args, "rollback (this -> previous)");
    active = HandOver(active, Release::kThis, args, "forward again (previous -> this)");
    std::this_thread::sleep_for(milliseconds(1500));
    EXPECT_EQ(load.Stop(), "") << "writer failed";
    EXPECT_TRUE(done()) << "not everything delivered\n" << active->LogTail();
    return active;
  }

  void Stop(RelayProcess* relay) {
    relay->Terminate();
    EXPECT_EQ(relay->Wait(seconds(40)), std::optional<int>(0)) << relay->LogTail();
  }

  // The records of this test's event topics (the dead letters left out).
  std::vector<KafkaRecord> Events(bool read_committed) {
    std::vector<KafkaRecord> out;
    for (KafkaRecord& r : ReadTopics({.timeout = seconds(90), .read_committed = read_committed})) {
      if (r.topic != topic_prefix_ + ".dlq") out.push_back(std::move(r));
    }
    return out;
  }

  // The set checks of DESIGN §8, with duplicates 0: every hand-over was graceful.
  void CheckEveryRowOnce(const Ledger& ledger, const std::vector<KafkaRecord>& records,
                         const std::string& what) {
    DeliveryReport r = CheckDelivery(ledger.committed(), ledger.rolled_back(), records);
    fmt::print("{}: {}\n{}", what, r.Summary(), figures_);
    EXPECT_GT(r.committed, 0u);
    EXPECT_EQ(r.lost, 0u) << r.Samples();
    EXPECT_EQ(r.phantom, 0u) << r.Samples();
    EXPECT_EQ(r.order_violations, 0u) << r.Samples();
    EXPECT_EQ(r.split_aggregates, 0u) << r.Samples();
    EXPECT_EQ(r.duplicates, 0u) << r.Samples();
  }

  LoadGenerator MixedLoad(Ledger* ledger) {
    return LoadGenerator(Workload(), ledger, 2, resilience::MixedTx,
                         std::chrono::microseconds(3000));
  }

  std::string previous_;
  std::string previous_missing_;
  std::string shared_url_;
  std::string database_;
  std::string system_id_;
  std::string figures_;
};

TEST_F(Upgrade, AtLeastOnceForwardRollbackAndForwardAgainUnderLoad) {
  CreateTables();
  Ledger ledger;
  LoadGenerator load = MixedLoad(&ledger);
  RelayProcess* last = RoundTrip({}, load, [&] { return WaitAllAcked(seconds(90)) == 0; });
  Stop(last);
  EXPECT_EQ(MisackedRows(), 0);
  CheckCommitIndex(ledger);
  CheckEveryRowOnce(ledger, Events(false), "at-least-once round trip");
  // The first release made the tables without a version; this one recorded
  // it (version 1: their layout) and the previous release ran on beside it.
  EXPECT_EQ(db_->Scalar("SELECT string_agg(version || '/' || readable_by, ',') FROM "
                        "outbox_relay.schema_version"),
            std::optional<std::string>("1/1"));
  fmt::print("{} transactions; total {:.1f} s\n", load.transactions(), SecondsSince(started_));
}

TEST_F(Upgrade, ExactlyOnceForwardRollbackAndForwardAgainUnderLoad) {
  // Each release with its default progress topic: the previous one keeps its
  // progress in the topic all relays shared (outbox-relay.progress, format 1),
  // this one in its own (format 2, which declares format-1 readers may read
  // it). Each takes over from the other with nothing produced twice.
  CreateTables();
  const std::vector<std::string> eos = {"--delivery", "exactly-once", "--shutdown-timeout-ms",
                                        "10000"};
  Ledger ledger;
  LoadGenerator load = MixedLoad(&ledger);
  RelayProcess* last = RoundTrip(eos, load, [&] { return WaitAllAcked(seconds(90)) == 0; });
  Stop(last);
  EXPECT_EQ(MisackedRows(), 0);
  CheckCommitIndex(ledger);
  CheckEveryRowOnce(ledger, Events(true), "exactly-once round trip (read_committed)");
  // The upgrade read the previous release's record where it kept it.
  size_t legacy_reads = 0;
  for (const auto& r : relays_) {
    if (r->binary() == RelayBinary() &&
        r->Log().find("the progress was read from outbox-relay.progress") != std::string::npos) {
      ++legacy_reads;
    }
  }
  EXPECT_EQ(legacy_reads, 1u) << "the first start of this release reads the previous one's "
                                 "record; later ones their own";
  // What each release wrote, under the one key both use.
  std::vector<KafkaRecord> legacy =
      kafka_->Read({"outbox-relay.progress"}, "", {.timeout = seconds(30), .read_committed = true});
  std::vector<KafkaRecord> own =
      kafka_->Read({DefaultProgressTopic()}, "", {.timeout = seconds(30), .read_committed = true});
  auto last_of = [&](const std::vector<KafkaRecord>& records) {
    std::string value;
    for (const KafkaRecord& r : records) {
      if (r.key == TransactionalId() && r.value) value = *r.value;
    }
    return value;
  };
  std::string previous_record = last_of(legacy), this_record = last_of(own);
  fmt::print("progress: previous release's {}\n          this release's {}\n",
             previous_record.substr(0, 200), this_record.substr(0, 200));
  EXPECT_TRUE(previous_record.starts_with(R"({"v":1,"key":)")) << previous_record;
  EXPECT_TRUE(this_record.starts_with(R"({"v":1,"format":2,)")) << this_record;
  fmt::print("{} transactions; total {:.1f} s\n", load.transactions(), SecondsSince(started_));
}

TEST_F(Upgrade, WatermillTablesForwardRollbackAndForwardAgainUnderLoad) {
  // watermill-sql's table, its offsets table created by the relay.
  db_->Exec(fmt::format(
      "CREATE TABLE {} (\"offset\" BIGSERIAL, \"uuid\" VARCHAR(36) NOT NULL, "
      "\"created_at\" TIMESTAMP NOT NULL DEFAULT CURRENT_TIMESTAMP, \"payload\" JSON DEFAULT "
      "NULL, \"metadata\" JSON DEFAULT NULL, \"transaction_id\" xid8 NOT NULL, "
      "PRIMARY KEY (\"transaction_id\", \"offset\"))",
      QuoteIdent(name_)));
  const std::vector<std::string> args = {"--table-mode",
                                         "watermill",
                                         "--watermill-tables",
                                         "public." + name_,
                                         "--watermill-topic-map",
                                         fmt::format("public.{}={}.orders", name_, topic_prefix_),
                                         "--watermill-offsets-table-map",
                                         fmt::format("public.{}=public.{}", name_, other_table_),
                                         "--watermill-consumer-group",
                                         "g",
                                         "--watermill-key-field",
                                         "aggregate_id",
                                         "--create-topics",
                                         "true"};
  auto position_at_last_row = [&] {
    const std::string last_row = fmt::format(
        "SELECT transaction_id::text || '/' || \"offset\" FROM {} ORDER BY "
        "transaction_id DESC, \"offset\" DESC LIMIT 1",
        QuoteIdent(name_));
    const std::string position = fmt::format(
        "SELECT last_processed_transaction_id::text || '/' || offset_acked FROM {} WHERE "
        "consumer_group = 'g'",
        QuoteIdent(other_table_));
    auto deadline = std::chrono::steady_clock::now() + seconds(90);
    while (std::chrono::steady_clock::now() < deadline) {
      auto want = db_->Scalar(last_row);
      auto have = db_->Query(position);
      if (want && !have.empty() && have[0][0] == want) return true;
      std::this_thread::sleep_for(milliseconds(200));
    }
    return false;
  };
  Ledger ledger;
  WatermillLoad load(env_.database_url, name_, &ledger, 2);
  RelayProcess* last = RoundTrip(args, load, position_at_last_row);
  Stop(last);
  CheckEveryRowOnce(ledger, Events(false), "watermill tables round trip");
  fmt::print("{} transactions; total {:.1f} s\n", load.transactions(), SecondsSince(started_));
}

TEST_F(Upgrade, TheSchemaThisReleaseWritesIsRunAgainstByThePreviousOne) {
  // A new database: this release creates the relay schema and records its
  // version; the previous release (which reads no version) runs against it.
  CreateTables();
  Ledger ledger;
  Writer writer(Workload(), &ledger, 0, 7);
  RelayProcess& first = Start(Release::kThis);
  ASSERT_TRUE(WaitStreaming(first)) << first.LogTail();
  EXPECT_NE(first.Log().find("relay schema: no relay schema -> version 1"), std::string::npos)
      << first.LogTail();
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(writer.Transaction({.rows = 3}));
  ASSERT_EQ(WaitAllAcked(seconds(60)), 0) << DescribeUnacked();
  Stop(&first);
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(writer.Transaction({.rows = 3}));
  RelayProcess& previous = Start(Release::kPrevious);
  ASSERT_TRUE(WaitStreaming(previous)) << previous.LogTail();
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(writer.Transaction({.rows = 3}));
  EXPECT_EQ(WaitAllAcked(seconds(60)), 0) << DescribeUnacked() << previous.LogTail();
  Stop(&previous);
  // And back: the version is current, nothing to do.
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(writer.Transaction({.rows = 3}));
  RelayProcess& again = Start(Release::kThis);
  ASSERT_TRUE(WaitStreaming(again)) << again.LogTail();
  EXPECT_EQ(WaitAllAcked(seconds(60)), 0) << DescribeUnacked() << again.LogTail();
  EXPECT_EQ(again.Log().find("relay schema:"), std::string::npos) << again.LogTail();
  Stop(&again);
  CheckCommitIndex(ledger);
  CheckEveryRowOnce(ledger, Events(false), "this release's schema, the previous release on it");
}

TEST_F(Upgrade, ANewerSchemaRunsOnlyWhenItDeclaresThisReleaseMayReadIt) {
  CreateTables();
  Ledger ledger;
  Writer writer(Workload(), &ledger, 0, 11);
  RelayProcess& first = Start(Release::kThis);
  ASSERT_TRUE(WaitStreaming(first)) << first.LogTail();
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(writer.Transaction({.rows = 5}));
  ASSERT_EQ(WaitAllAcked(seconds(60)), 0) << DescribeUnacked();
  Stop(&first);
  auto confirmed = [&] { return QuerySlot(*db_, name_)->confirmed_flush_lsn.value_or(0); };
  const uint64_t confirmed_before = confirmed();

  // A release after this one changed the schema in a way this one would
  // misread (readable by its own version only), while rows kept coming.
  db_->Exec(
      "INSERT INTO outbox_relay.schema_version (version, readable_by, relay) "
      "VALUES (2, 2, 'outbox-relay 9.0.0')");
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(writer.Transaction({.rows = 5}));
  RelayProcess& refused = Start(Release::kThis);
  EXPECT_EQ(refused.Wait(seconds(30)), std::optional<int>(2)) << refused.LogTail();
  const std::string log = refused.Log();
  fmt::print("refused: {}\n", log.substr(log.find("the relay schema outbox_relay")).substr(0, 400));
  EXPECT_NE(log.find("the relay schema outbox_relay is of version 2, which relays of schema "
                     "version 2 or newer can run against"),
            std::string::npos)
      << log;
  EXPECT_NE(log.find("knows schema version 1"), std::string::npos) << log;
  // `check` says so before a rollout.
  std::vector<std::string> check_args = RelayArgs();
  check_args[0] = "check";
  const RelayEnv check_env = {{"DATABASE_URL", env_.database_url},
                              {"KAFKA_BROKERS", env_.kafka_brokers}};
  CommandResult check = RunRelayCommand(check_args, check_env);
  EXPECT_EQ(check.exit_code, 1) << check.Describe();
  EXPECT_NE(check.out.find("schema outbox_relay: the relay schema outbox_relay is of version 2"),
            std::string::npos)
      << check.Describe();
  // The commands that read or delete the commit index leave it alone too.
  CommandResult cleanup =
      RunRelayCommand({"cleanup", "--dry-run"}, {{"DATABASE_URL", env_.database_url},
                                                 {"OUTBOX_TABLE", "public." + name_},
                                                 {"OUTBOX_RETENTION_DAYS", "7"}});
  EXPECT_EQ(cleanup.exit_code, 2) << cleanup.Describe();
  EXPECT_NE((cleanup.out + cleanup.err).find("is of version 2"), std::string::npos)
      << cleanup.Describe();
  CommandResult replay = RunRelayCommand(
      {"replay", "--table", "public." + name_, "--slot", name_, "--from-lsn", "0/0", "--dry-run"},
      check_env);
  EXPECT_EQ(replay.exit_code, 2) << replay.Describe();
  EXPECT_NE((replay.out + replay.err).find("is of version 2"), std::string::npos)
      << replay.Describe();
  // Nothing read from the slot, nothing published or marked.
  EXPECT_EQ(confirmed(), confirmed_before);
  EXPECT_EQ(UnackedRows(), 20);
  EXPECT_EQ(ReadTopics().size(), 20u) << "only the rows delivered before the change";

  // The release after that adds version 3, readable by relays of version 1
  // (additive again): this release runs against it and delivers everything.
  db_->Exec(
      "INSERT INTO outbox_relay.schema_version (version, readable_by, relay) "
      "VALUES (3, 1, 'outbox-relay 9.1.0')");
  check = RunRelayCommand(check_args, check_env);
  EXPECT_EQ(check.exit_code, 0) << check.Describe();
  EXPECT_NE(check.out.find("version 3, newer than this relay's 1 and readable by it"),
            std::string::npos)
      << check.Describe();
  RelayProcess& runs = Start(Release::kThis);
  ASSERT_TRUE(WaitStreaming(runs)) << runs.LogTail();
  EXPECT_NE(runs.Log().find("newer than this relay's version 1: it runs, as that version allows"),
            std::string::npos)
      << runs.LogTail();
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(writer.Transaction({.rows = 5}));
  EXPECT_EQ(WaitAllAcked(seconds(60)), 0) << DescribeUnacked() << runs.LogTail();
  Stop(&runs);
  // It left the newer schema as it found it.
  EXPECT_EQ(db_->Scalar("SELECT string_agg(version || '/' || readable_by, ',' ORDER BY version) "
                        "FROM outbox_relay.schema_version"),
            std::optional<std::string>("1/1,2/2,3/1"));
  CheckEveryRowOnce(ledger, Events(false), "newer schemas: refused, then readable");
}

TEST_F(Upgrade, AProgressRecordOfAnUnknownNewerFormatIsRefusedNeverSkippedPast) {
  CreateTables();
  const std::vector<std::string> eos = {"--delivery", "exactly-once", "--shutdown-timeout-ms",
                                        "10000"};
  Ledger ledger;
  Writer writer(Workload(), &ledger, 0, 13);
  RelayProcess& first = Start(Release::kThis, eos);
  ASSERT_TRUE(WaitStreaming(first, seconds(60))) << first.LogTail();
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(writer.Transaction({.rows = 5}));
  ASSERT_EQ(WaitAllAcked(seconds(60)), 0) << DescribeUnacked();
  Stop(&first);
  std::string record;
  for (const KafkaRecord& r : kafka_->Read({DefaultProgressTopic()}, "",
                                           {.timeout = seconds(30), .read_committed = true})) {
    if (r.key == TransactionalId() && r.value) record = *r.value;
  }
  ASSERT_TRUE(record.starts_with(R"({"v":1,"format":2,)")) << record;
  auto confirmed = [&] { return QuerySlot(*db_, name_)->confirmed_flush_lsn.value_or(0); };
  const uint64_t confirmed_before = confirmed();

  // A newer release's record that needs a reader of its own format: this one
  // cannot tell what it proves, so it does not start (never skipping rows on
  // a guess), and loses nothing.
  Produce(env_.kafka_brokers, DefaultProgressTopic(), TransactionalId(),
          ReplaceOnce(record, R"("v":1,"format":2,)", R"("v":3,"format":3,)"));
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(writer.Transaction({.rows = 5}));
  RelayProcess& refused = Start(Release::kThis, eos);
  EXPECT_EQ(refused.Wait(seconds(60)), std::optional<int>(2)) << refused.LogTail();
  const std::string log = refused.Log();
  EXPECT_NE(log.find("the record is of format 3 and needs a reader of format 3 or newer; this "
                     "relay reads format 2"),
            std::string::npos)
      << log;
  EXPECT_EQ(confirmed(), confirmed_before);
  EXPECT_EQ(UnackedRows(), 20);
  EXPECT_EQ(Events(true).size(), 20u);

  // The previous release refuses it too (it reads format 1 only), pointed at
  // that topic (its default is the shared one).
  std::vector<std::string> previous_eos = eos;
  previous_eos.insert(previous_eos.end(), {"--progress-topic", DefaultProgressTopic()});
  RelayProcess& previous = Start(Release::kPrevious, previous_eos);
  EXPECT_EQ(previous.Wait(seconds(60)).value_or(-1), 1) << previous.LogTail();
  EXPECT_NE(previous.Log().find("progress: version 3 is not 1"), std::string::npos)
      << previous.LogTail();
  EXPECT_EQ(UnackedRows(), 20);

  // A newer format that declares format-2 readers may read it (fields added
  // that they do not know): this release runs on it and sends the rest once.
  Produce(env_.kafka_brokers, DefaultProgressTopic(), TransactionalId(),
          ReplaceOnce(record, R"("v":1,"format":2,)",
                      R"("v":2,"format":3,"added_later":{"x":[1,2]},)"));
  RelayProcess& runs = Start(Release::kThis, eos);
  ASSERT_TRUE(WaitStreaming(runs, seconds(60))) << runs.LogTail();
  EXPECT_EQ(WaitAllAcked(seconds(60)), 0) << DescribeUnacked() << runs.LogTail();
  Stop(&runs);
  CheckEveryRowOnce(ledger, Events(true), "progress records of newer formats");
}

TEST_F(Upgrade, ALeastPrivilegeRoleOnTheFirstReleasesTablesRunsAndSaysHowToRecordTheVersion) {
  // An administrator set the schema up for the first release (its tables, no
  // version) and gave the relay's role no CREATE: this release needs no
  // change to those tables, so it runs, and prints the SQL that records the
  // version.
  CreateTables();
  RelayProcess& previous = Start(Release::kPrevious);
  ASSERT_TRUE(WaitStreaming(previous)) << previous.LogTail();
  Stop(&previous);
  ASSERT_EQ(db_->Scalar("SELECT to_regclass('outbox_relay.schema_version') IS NULL"), "t");
  const std::string role = name_ + "_role";
  db_->Exec(fmt::format(
      "DROP ROLE IF EXISTS {role}; CREATE ROLE {role} LOGIN REPLICATION;"
      "REVOKE CREATE ON DATABASE {db} FROM PUBLIC;"
      "GRANT SELECT, UPDATE ON {table} TO {role};"
      "GRANT USAGE ON SCHEMA outbox_relay TO {role};"
      "GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA outbox_relay TO {role};",
      fmt::arg("role", QuoteIdent(role)), fmt::arg("db", QuoteIdent(database_)),
      fmt::arg("table", "public." + QuoteIdent(name_))));
  std::string url = env_.database_url;
  size_t scheme = url.find("://");
  size_t at = url.find('@', scheme);
  ASSERT_NE(at, std::string::npos) << "DATABASE_URL without a user: " << url;
  url = url.substr(0, scheme + 3) + role + url.substr(at);

  Ledger ledger;
  Writer writer(Workload(), &ledger, 0, 17);
  RelayProcess& relay = Start(Release::kThis, {}, {{"DATABASE_URL", url}});
  ASSERT_TRUE(WaitStreaming(relay)) << relay.LogTail();
  const std::string log = relay.Log();
  EXPECT_NE(log.find("relay schema: version 1 (0.1.0's tables, no version recorded); " + role +
                     " may not record it"),
            std::string::npos)
      << log;
  EXPECT_NE(log.find("CREATE TABLE IF NOT EXISTS outbox_relay.schema_version"), std::string::npos)
      << log;
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(writer.Transaction({.rows = 4}));
  EXPECT_EQ(WaitAllAcked(seconds(60)), 0) << DescribeUnacked() << relay.LogTail();
  Stop(&relay);
  CheckEveryRowOnce(ledger, Events(false), "least privilege on the first release's tables");
  db_->Exec(fmt::format("DROP OWNED BY {0}; DROP ROLE {0}", QuoteIdent(role)));
}

}  // namespace
}  // namespace outbox_test

namespace outbox_test {
namespace {

// A crash during a rollout, in exactly-once mode: this release's relay is
// killed (-9) under load with the previous one as its standby (a rollback
// because the new release crashes), then the previous one with this one as
// its standby (forward again). A crash sends again what was in flight: a
// relay publishes it again unless the progress record it reads holds it.
// - With each release's default progress topic the previous release reads
//   the record it wrote itself before the upgrade (outbox-relay.progress), and
//   this release the one it wrote before the rollback: both hold less than
//   Kafka does, and what was in flight at the crash is published again
//   (duplicates counted, never a loss).
// - With --progress-topic outbox-relay.progress on both (the rollout setting
//   docs/upgrading.md gives for exactly-once), they read each other's
//   records: nothing is published twice.
class UpgradeCrash : public Upgrade, public ::testing::WithParamInterface<bool> {};

TEST_P(UpgradeCrash, ExactlyOnceKillNineOfEitherReleaseUnderLoad) {
  const bool shared_topic = GetParam();
  CreateTables();
  std::vector<std::string> eos = {"--delivery", "exactly-once", "--shutdown-timeout-ms", "10000"};
  if (shared_topic) eos.insert(eos.end(), {"--progress-topic", "outbox-relay.progress"});
  Ledger ledger;
  LoadGenerator load = MixedLoad(&ledger);
  RelayProcess* active = &Start(Release::kThis, eos);
  ASSERT_TRUE(WaitStreaming(*active, seconds(60))) << active->LogTail();
  load.Start();
  for (Release next : {Release::kPrevious, Release::kThis}) {
    RelayProcess& standby = Start(next, eos);
    ASSERT_TRUE(standby.WaitForLog("standby:", seconds(30))) << standby.LogTail();
    std::this_thread::sleep_for(milliseconds(2000));
    auto t0 = std::chrono::steady_clock::now();
    active->Kill(SIGKILL);
    ASSERT_EQ(active->Wait(seconds(10)), std::optional<int>(128 + SIGKILL));
    ASSERT_TRUE(WaitStreaming(standby, seconds(60))) << standby.LogTail();
    figures_ += fmt::format("  kill -9; {} release's relay streaming {:.2f} s after it\n",
                            NameOf(next), SecondsSince(t0));
    active = &standby;
  }
  std::this_thread::sleep_for(milliseconds(1500));
  ASSERT_EQ(load.Stop(), "") << "writer failed";
  EXPECT_EQ(WaitAllAcked(seconds(90)), 0) << DescribeUnacked();
  Stop(active);
  EXPECT_EQ(MisackedRows(), 0);
  DeliveryReport r = CheckDelivery(ledger.committed(), ledger.rolled_back(), Events(true));
  fmt::print("exactly-once, kill -9 of each release, {} progress topic: {}\n{}",
             shared_topic ? "the shared" : "each release's default", r.Summary(), figures_);
  EXPECT_GT(r.committed, 0u);
  EXPECT_EQ(r.lost, 0u) << r.Samples();
  EXPECT_EQ(r.phantom, 0u) << r.Samples();
  EXPECT_EQ(r.order_violations, 0u) << r.Samples();
  EXPECT_EQ(r.split_aggregates, 0u) << r.Samples();
  if (shared_topic) {
    EXPECT_EQ(r.duplicates, 0u) << r.Samples();
  }
}

// Forward again after a graceful rollback, when the previous release then
// crashes: this release's own topic holds the record it wrote before the
// rollback, outbox-relay.progress the newer one the previous release wrote.
// It takes the one that holds more: what the previous release had in flight
// is marked, not published twice.
TEST_F(Upgrade, ExactlyOnceForwardAgainAfterThePreviousReleaseCrashedPublishesNothingTwice) {
  CreateTables();
  const std::vector<std::string> eos = {"--delivery", "exactly-once", "--shutdown-timeout-ms",
                                        "10000"};
  Ledger ledger;
  LoadGenerator load = MixedLoad(&ledger);
  RelayProcess* active = &Start(Release::kThis, eos);
  ASSERT_TRUE(WaitStreaming(*active, seconds(60))) << active->LogTail();
  load.Start();
  std::this_thread::sleep_for(milliseconds(1500));
  active = HandOver(active, Release::kPrevious, eos, "rollback (this -> previous)");
  RelayProcess& next = Start(Release::kThis, eos);
  ASSERT_TRUE(next.WaitForLog("standby:", seconds(30))) << next.LogTail();
  std::this_thread::sleep_for(milliseconds(2000));
  auto t0 = std::chrono::steady_clock::now();
  active->Kill(SIGKILL);
  ASSERT_EQ(active->Wait(seconds(10)), std::optional<int>(128 + SIGKILL));
  ASSERT_TRUE(WaitStreaming(next, seconds(60))) << next.LogTail();
  figures_ +=
      fmt::format("  kill -9 of the previous release; this one streaming {:.2f} s after it\n",
                  SecondsSince(t0));
  EXPECT_NE(next.Log().find("the shared progress topic holds this relay's progress up to"),
            std::string::npos)
      << next.LogTail();
  std::this_thread::sleep_for(milliseconds(1500));
  ASSERT_EQ(load.Stop(), "") << "writer failed";
  EXPECT_EQ(WaitAllAcked(seconds(90)), 0) << DescribeUnacked();
  Stop(&next);
  EXPECT_EQ(MisackedRows(), 0);
  CheckEveryRowOnce(ledger, Events(true), "exactly-once, forward again after a crash");
}

INSTANTIATE_TEST_SUITE_P(ProgressTopic, UpgradeCrash, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& param) {
                           return param.param ? std::string("Shared") : std::string("Defaults");
                         });

}  // namespace
}  // namespace outbox_test
