// Progress on long work (issue 41): `replay` on a terminal redraws one line
// with the rows done of the total, the rate and the time left; `check` there
// shows what it waits for; a first start's backfill shows in /metrics as
// outbox_relay_backfill_rows_estimated (the rows it counted) and
// outbox_relay_backfilled_rows_total rising toward it, for the seed's table and
// for watermill-sql's tables.
#include <fmt/format.h>
#include <poll.h>
#include <pty.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <set>
#include <thread>

#include "fixture.h"
#include "ops_support.h"
#include "support/http_get.h"
#include "support/throwaway_pg.h"

namespace outbox_test {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

struct PtyRun {
  int exit_code = -1;
  std::string output;  // what the terminal received
};

// Runs the relay binary with `args` on a pseudo-terminal (its standard input,
// output and error), `env` added to the inherited environment.
PtyRun RunOnTerminal(const std::vector<std::string>& args,
                     const std::map<std::string, std::string>& env, seconds timeout) {
  PtyRun out;
  int master = -1;
  pid_t pid = forkpty(&master, nullptr, nullptr, nullptr);
  if (pid < 0) throw std::runtime_error("forkpty failed");
  if (pid == 0) {
    for (const auto& [k, v] : env) setenv(k.c_str(), v.c_str(), 1);
    std::string binary = RelayBinary();
    std::vector<char*> argv;
    argv.push_back(binary.data());
    std::vector<std::string> copy = args;
    for (std::string& a : copy) argv.push_back(a.data());
    argv.push_back(nullptr);
    execv(binary.c_str(), argv.data());
    _exit(127);
  }
  auto deadline = std::chrono::steady_clock::now() + timeout;
  char buf[4096];
  while (std::chrono::steady_clock::now() < deadline) {
    pollfd p{master, POLLIN, 0};
    if (poll(&p, 1, 100) <= 0) continue;
    ssize_t n = read(master, buf, sizeof buf);
    if (n <= 0) break;  // EIO: the child's side is closed
    out.output.append(buf, static_cast<size_t>(n));
  }
  close(master);
  if (std::chrono::steady_clock::now() >= deadline) kill(pid, SIGKILL);
  int status = 0;
  waitpid(pid, &status, 0);
  out.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return out;
}

// 120000 -> "120,000", as the progress line prints it.
std::string GroupedDigitsForTest(int n) {
  std::string digits = std::to_string(n), out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return out;
}

class OpsProgress : public RelayTest {};

TEST_F(OpsProgress, ReplayOnATerminalRedrawsItsProgressLine) {
  CreateTables();
  RelayProcess& relay = StartRelay();
  ASSERT_TRUE(WaitStreaming(relay)) << relay.LogTail();
  constexpr int kRows = 120000;
  Ledger ledger;
  {
    Writer writer(Workload(), &ledger, -1, 41);
    for (int i = 0; i < kRows / 6000; ++i) ASSERT_TRUE(writer.Transaction({.rows = 6000}));
  }
  ASSERT_EQ(WaitAllAcked(seconds(120)), 0) << relay.LogTail();
  relay.Terminate();
  ASSERT_EQ(relay.Wait(seconds(30)), 0) << relay.LogTail();

  PtyRun run = RunOnTerminal(
      {"replay", "--table", "public." + name_, "--slot", name_, "--topic-template",
       topic_prefix_ + ".replay.{Source-Service}.{Event-Type:aggregate}", "--dlq-topic",
       topic_prefix_ + ".dlq", "--metrics-addr", "", "--from-lsn", "0/0"},
      {{"DATABASE_URL", env_.database_url}, {"KAFKA_BROKERS", env_.kafka_brokers}}, seconds(180));
  ASSERT_EQ(run.exit_code, 0) << run.output;
  // Each redraw starts with a carriage return: the rows done grow, the total is the range's.
  std::set<std::string> done;
  const std::string total = fmt::format(" of {} rows (", GroupedDigitsForTest(kRows));
  for (size_t at = run.output.find("\rreplay: "); at != std::string::npos;
       at = run.output.find("\rreplay: ", at + 1)) {
    size_t end = run.output.find_first_of("\r\n\x1b", at + 1);
    std::string line = run.output.substr(at + 1, end - at - 1);
    EXPECT_NE(line.find(total), std::string::npos) << line;
    EXPECT_NE(line.find(" rows/s"), std::string::npos) << line;
    done.insert(line.substr(0, line.find(" of ")));
  }
  fmt::print("replay on a terminal: {} distinct progress lines; the last: {}\n", done.size(),
             done.empty() ? "-" : *done.rbegin());
  EXPECT_GE(done.size(), 2u) << "the progress line did not move\n" << run.output;
  EXPECT_NE(run.output.find(fmt::format("replay: {} of {} rows (100%)", GroupedDigitsForTest(kRows),
                                        GroupedDigitsForTest(kRows))),
            std::string::npos)
      << run.output;
}

// `check` prints its results at the end; while a server does not answer, a
// terminal shows what it waits for and for how long, and the line is gone
// before the results.
TEST_F(OpsProgress, CheckOnATerminalShowsWhatItWaitsFor) {
  CreateTables();
  PtyRun run = RunOnTerminal({"check", "--table", "public." + name_, "--kafka-timeout-ms", "3000"},
                             {{"DATABASE_URL", env_.database_url},
                              {"KAFKA_BROKERS", "127.0.0.1:1"}},  // nothing listens there
                             seconds(60));
  EXPECT_EQ(run.exit_code, 1) << run.output;
  const std::string waiting = "\rcheck: Kafka at 127.0.0.1:1 (up to 3.0 s a request): ";
  std::set<std::string> shown;
  size_t last = std::string::npos;
  for (size_t at = run.output.find(waiting); at != std::string::npos;
       at = run.output.find(waiting, at + 1)) {
    size_t from = at + waiting.size();
    shown.insert(run.output.substr(from, run.output.find(" s", from) - from));
    last = at;
  }
  fmt::print("check on a terminal: {} distinct waiting lines, the last at {} s\n", shown.size(),
             shown.empty() ? "-" : *shown.rbegin());
  EXPECT_GE(shown.size(), 5u) << run.output;
  ASSERT_NE(last, std::string::npos) << run.output;
  // Erased, then the results.
  size_t erased = run.output.find("\r\x1b[K", last + 1);
  size_t result = run.output.find("FAIL  kafka: no broker of 127.0.0.1:1", last + 1);
  EXPECT_NE(erased, std::string::npos) << run.output;
  EXPECT_NE(result, std::string::npos) << run.output;
  EXPECT_LT(erased, result) << run.output;
}

// What /metrics said of a backfill, scraped every 50 ms until the counter
// reached the estimate (or `bound` passed).
struct BackfillScrape {
  double estimated = 0;   // outbox_relay_backfill_rows_estimated, last seen
  std::set<double> seen;  // outbox_relay_backfilled_rows_total while an estimate was set
  // Figures between none and all: scraped while it ran.
  size_t MidWay() const {
    size_t n = 0;
    for (double d : seen) n += d > 0 && d < estimated ? 1 : 0;
    return n;
  }
};

BackfillScrape ScrapeBackfill(int port, seconds bound) {
  BackfillScrape out;
  auto deadline = std::chrono::steady_clock::now() + bound;
  while (std::chrono::steady_clock::now() < deadline) {
    HttpResponse r = HttpGet(port, "/metrics");
    if (r.status == 200) {
      out.estimated = MetricValue(r.body, "outbox_relay_backfill_rows_estimated").value_or(0);
      double done = MetricValue(r.body, "outbox_relay_backfilled_rows_total").value_or(0);
      if (out.estimated > 0) out.seen.insert(done);
      if (out.estimated > 0 && done >= out.estimated) break;
    }
    std::this_thread::sleep_for(milliseconds(50));
  }
  return out;
}

TEST_F(OpsProgress, AFirstStartsBackfillShowsInTheMetrics) {
  CreateTables();
  // The backlog a polling forwarder left: 150,000 unacked rows before any slot.
  constexpr int kRows = 150000;
  Ledger ledger;
  {
    Writer writer(Workload(), &ledger, -1, 42);
    for (int i = 0; i < kRows / 10000; ++i) ASSERT_TRUE(writer.Transaction({.rows = 10000}));
  }
  int port = FreeLocalPort(19300 + static_cast<int>(getpid() % 500));
  RelayProcess& relay = StartRelay({"--metrics-addr", fmt::format("127.0.0.1:{}", port)});
  BackfillScrape scrape = ScrapeBackfill(port, seconds(120));
  EXPECT_EQ(scrape.estimated, kRows) << relay.LogTail();
  ASSERT_FALSE(scrape.seen.empty()) << relay.LogTail();
  EXPECT_EQ(*scrape.seen.rbegin(), kRows);
  fmt::print("backfill of {} rows: {} distinct figures scraped, {} of them mid-way\n", kRows,
             scrape.seen.size(), scrape.MidWay());
  EXPECT_GE(scrape.MidWay(), 1u) << relay.LogTail();
  EXPECT_EQ(WaitAllAcked(seconds(120)), 0) << relay.LogTail();
  relay.Terminate();
  EXPECT_EQ(relay.Wait(seconds(30)), 0) << relay.LogTail();
}

// The same for watermill-sql's tables (--table-mode=watermill): the rows the
// consumer group has not processed, of every table, counted before the first
// start's backfill publishes them, and the group's positions at each table's
// last row at the end.
TEST_F(OpsProgress, AWatermillFirstStartsBackfillShowsInTheMetrics) {
  const std::string schema = name_;
  db_->Exec(fmt::format("DROP SCHEMA IF EXISTS {} CASCADE", QuoteIdent(schema)));
  db_->Exec(fmt::format("CREATE SCHEMA {}", QuoteIdent(schema)));
  constexpr int kRowsPerTable = 40000;
  std::vector<std::string> tables;
  for (const char* t : {"a", "b"}) {
    std::string table =
        QuoteIdent(schema) + "." + QuoteIdent("watermill_" + topic_prefix_ + "." + t);
    tables.push_back(table);
    // watermill-sql's DDL (DefaultPostgreSQLSchema), and its backlog: 40 transactions of 1,000.
    db_->Exec(fmt::format(
        "CREATE TABLE {} (\"offset\" BIGSERIAL, \"uuid\" VARCHAR(36) NOT NULL, "
        "\"created_at\" TIMESTAMP NOT NULL DEFAULT CURRENT_TIMESTAMP, \"payload\" JSON "
        "DEFAULT NULL, \"metadata\" JSON DEFAULT NULL, \"transaction_id\" xid8 NOT NULL, "
        "PRIMARY KEY (\"transaction_id\", \"offset\"))",
        table));
    for (int i = 0; i < kRowsPerTable / 1000; ++i) {
      db_->Exec(fmt::format(
          "INSERT INTO {} (uuid, payload, metadata, transaction_id) SELECT "
          "gen_random_uuid()::text, "
          "json_build_object('n', n), '{{}}', pg_current_xact_id() FROM generate_series(1, 1000) "
          "n",
          table));
    }
  }
  int port = FreeLocalPort(19800 + static_cast<int>(getpid() % 500));
  RelayProcess& relay =
      StartRelay({"--metrics-addr", fmt::format("127.0.0.1:{}", port), "--table-mode", "watermill",
                  "--watermill-consumer-group", "g", "--watermill-table-pattern",
                  schema + ".watermill_*", "--create-topics", "true"});
  BackfillScrape scrape = ScrapeBackfill(port, seconds(120));
  constexpr double kRows = 2.0 * kRowsPerTable;
  EXPECT_EQ(scrape.estimated, kRows) << relay.LogTail();
  ASSERT_FALSE(scrape.seen.empty()) << relay.LogTail();
  EXPECT_EQ(*scrape.seen.rbegin(), kRows);
  fmt::print("watermill backfill of {} rows: {} distinct figures scraped, {} of them mid-way\n",
             kRows, scrape.seen.size(), scrape.MidWay());
  EXPECT_GE(scrape.MidWay(), 1u) << relay.LogTail();
  EXPECT_NE(relay.Log().find(fmt::format("backfill: {} rows to publish", kRowsPerTable * 2)),
            std::string::npos)
      << relay.LogTail();
  ASSERT_TRUE(WaitStreaming(relay)) << relay.LogTail();
  relay.Terminate();
  EXPECT_EQ(relay.Wait(seconds(30)), 0) << relay.LogTail();
  db_->Exec(fmt::format("DROP SCHEMA IF EXISTS {} CASCADE", QuoteIdent(schema)));
}

}  // namespace
}  // namespace outbox_test
