// Settings and shapes the relay used to accept and then serve wrongly: each
// is now refused at start with the setting named, or served right.
//
// - The same slot name in two databases of one cluster (slot names are per
//   cluster): the second relay waited for ever as a "standby".
// - A bytea payload column: published as its hex text.
// - Secrets: a rejected Kafka property was logged with its value, and
//   OUTBOX_KAFKA_PROPERTIES could not carry a ';' inside a value.
// - /healthz starved by two idle connections.
// - The outbox table renamed under the relay; a created_at column that is
//   not there; a malformed quoted table name; log lines forged by a newline
//   in a row's metadata.
#include <arpa/inet.h>
#include <fmt/format.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <regex>
#include <sstream>
#include <thread>

#include "fixture.h"
#include "ops_support.h"
#include "support/http_get.h"
#include "support/throwaway_pg.h"

namespace outbox_test {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

// What the relay itself wrote to its log (the test's own "starting relay"
// lines, which quote the command line, left out).
std::string RelayOutput(const RelayProcess& relay) {
  std::istringstream in(relay.Log());
  std::string out;
  for (std::string line; std::getline(in, line);) {
    if (!line.starts_with("==== [test]")) out += line + "\n";
  }
  return out;
}

class SetupChecks : public RelayTest {
 protected:
  // Expects the relay to exit 2 within 30 s with `needle` in its log.
  void ExpectRefused(RelayProcess& relay, const std::string& needle) {
    auto code = relay.Wait(seconds(30));
    ASSERT_TRUE(code.has_value()) << "still running\n" << relay.LogTail();
    EXPECT_EQ(*code, 2) << relay.LogTail();
    EXPECT_NE(relay.Log().find(needle), std::string::npos) << relay.LogTail();
  }
};

TEST_F(SetupChecks, SlotNameTakenInAnotherDatabaseIsRefusedNotWaitedFor) {
  CreateTables();
  RelayProcess& first = StartRelay();
  ASSERT_TRUE(WaitStreaming(first)) << first.LogTail();
  // The same slot name, for the outbox of another database of this cluster.
  const std::string db2 = name_ + "_db2";
  db_->Exec("DROP DATABASE IF EXISTS " + QuoteIdent(db2));
  db_->Exec("CREATE DATABASE " + QuoteIdent(db2));
  std::string url2 =
      std::regex_replace(env_.database_url, std::regex("/[^/?]*($|\\?)"), "/" + db2 + "$1");
  {
    Pg other(url2);
    other.Exec(OutboxTableDdl(name_));
  }
  RelayProcess& second = StartRelay({}, {{"DATABASE_URL", url2}});
  ExpectRefused(second, "invalid setting --slot (OUTBOX_SLOT)");
  EXPECT_NE(second.Log().find("belongs to database"), std::string::npos) << second.LogTail();
  EXPECT_TRUE(first.Running());
  first.Kill(SIGKILL);
  first.Wait(seconds(10));
  for (int i = 0; i < 50; ++i) {
    try {
      db_->Exec("DROP DATABASE IF EXISTS " + QuoteIdent(db2));
      break;
    } catch (const std::exception&) {
      std::this_thread::sleep_for(milliseconds(200));  // the second relay's sessions end
    }
  }
}

std::string Hex(const std::string& bytes) {
  std::string out;
  for (unsigned char c : bytes) out += fmt::format("{:02x}", static_cast<unsigned>(c));
  return out;
}

TEST_F(SetupChecks, ByteaPayloadIsPublishedAsItsBytes) {
  db_->Exec(fmt::format(
      "CREATE TABLE {0} (offset_acked BIGINT, offset_consumed BIGSERIAL NOT NULL, "
      "uuid VARCHAR(36) NOT NULL, created_at TIMESTAMPTZ NOT NULL DEFAULT NOW(), payload BYTEA, "
      "metadata JSON, transaction_id xid8 NOT NULL DEFAULT pg_current_xact_id(), "
      "PRIMARY KEY (transaction_id, offset_consumed))",
      QuoteIdent(name_)));
  // Written before the relay starts (the backfill reads it with SQL) and after
  // (pgoutput sends it): both paths must give the bytes.
  const std::string bytes = std::string("\x00\x01 binary \xff\xfe", 13) + "{\"x\":1}";
  auto insert = [&](const std::string& uuid) {
    db_->Exec(fmt::format("INSERT INTO {} (uuid, payload, metadata) VALUES ($1, decode($2, "
                          "'hex'), $3)",
                          QuoteIdent(name_)),
              {uuid, Hex(bytes),
               R"({"Aggregate-Id":"b-1","Event-Type":"blob.stored","Source-Service":"blob"})"});
  };
  std::string before = NewUlid(), after = NewUlid();
  insert(before);
  RelayProcess& relay = StartRelay();
  ASSERT_TRUE(WaitStreaming(relay)) << relay.LogTail();
  insert(after);
  EXPECT_EQ(WaitAllAcked(seconds(60)), 0) << DescribeUnacked();
  std::vector<KafkaRecord> records = ReadTopics();
  int seen = 0;
  for (const KafkaRecord& rec : records) {
    const KafkaHeader* h = rec.FindHeader("_watermill_message_uuid");
    if (h == nullptr || !h->value || (*h->value != before && *h->value != after)) continue;
    ++seen;
    EXPECT_EQ(rec.topic, topic_prefix_ + ".blob.blob");
    EXPECT_EQ(rec.value, bytes) << "uuid " << *h->value << ": " << Printable(rec.value);
  }
  EXPECT_EQ(seen, 2);
}

TEST_F(SetupChecks, SecretsNeverReachTheLog) {
  CreateTables();
  const std::string secret = "S3cr3t-" + NewUlid();
  // A mistyped property name with a password for value.
  RelayProcess& typo = StartRelay({"--kafka-property", "sasl.pasword=" + secret});
  ExpectRefused(typo, "sasl.pasword");
  EXPECT_EQ(RelayOutput(typo).find(secret), std::string::npos) << typo.LogTail();
  // A password holding ';' in OUTBOX_KAFKA_PROPERTIES: escaped, it is one
  // value; the item before a stray ';' is not echoed either.
  RelayProcess& broken = StartRelay(
      {}, {{"OUTBOX_KAFKA_PROPERTIES", "linger.ms=5;sasl.password=ab;" + secret + ";acks=all"}});
  ExpectRefused(broken, "not key=value");
  EXPECT_EQ(RelayOutput(broken).find(secret), std::string::npos) << broken.LogTail();
  RelayProcess& escaped =
      StartRelay({}, {{"OUTBOX_KAFKA_PROPERTIES",
                       "security.protocol=SASL_PLAINTEXT;sasl.mechanism=PLAIN;sasl.username=u;"
                       "sasl.password=ab\\;" +
                           secret}});
  // librdkafka takes the value; the broker (no SASL listener) never answers
  // the handshake, so the relay waits for Kafka: it must not say the secret.
  ASSERT_TRUE(escaped.WaitForLog("connected to PostgreSQL", seconds(30))) << escaped.LogTail();
  std::this_thread::sleep_for(seconds(2));
  escaped.Kill(SIGKILL);
  escaped.Wait(seconds(10));
  EXPECT_EQ(RelayOutput(escaped).find(secret), std::string::npos) << escaped.LogTail();
  EXPECT_EQ(RelayOutput(escaped).find("not key=value"), std::string::npos) << escaped.LogTail();
}

TEST_F(SetupChecks, IdleConnectionsDoNotStarveHealthz) {
  CreateTables();
  int port = FreeLocalPort(28900 + static_cast<int>(getpid() % 90));
  RelayProcess& relay = StartRelay({"--metrics-addr", fmt::format("127.0.0.1:{}", port)});
  ASSERT_TRUE(WaitStreaming(relay)) << relay.LogTail();
  // Connections that never send a request (a port scan, a half-open check).
  std::vector<int> idle;
  for (int i = 0; i < 6; ++i) {
    int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(port));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    idle.push_back(fd);
  }
  std::this_thread::sleep_for(milliseconds(200));
  for (int i = 0; i < 5; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    HttpResponse r = HttpGet(port, "/healthz", seconds(1));  // a kubelet's default timeout
    EXPECT_EQ(r.status, 200) << "after " << SecondsSince(t0) << " s";
    r = HttpGet(port, "/readyz", seconds(1));
    EXPECT_EQ(r.status, 200) << r.body;
  }
  for (int fd : idle) ::close(fd);
}

TEST_F(SetupChecks, OutboxTableRenamedWhileRunningStopsTheRelayNamingTheSetting) {
  CreateTables();
  RelayProcess& relay = StartRelay();
  ASSERT_TRUE(WaitStreaming(relay)) << relay.LogTail();
  Ledger ledger;
  Writer writer(Workload(), &ledger, -1, 401);
  ASSERT_TRUE(writer.Transaction({.rows = 3}));
  ASSERT_EQ(WaitAllAcked(seconds(30)), 0) << DescribeUnacked();
  // Renamed, then a column dropped: the rows' column positions change.
  db_->Exec(fmt::format("ALTER TABLE {} RENAME TO {}; ALTER TABLE {} DROP COLUMN created_at",
                        QuoteIdent(name_), QuoteIdent(name_ + "_renamed"),
                        QuoteIdent(name_ + "_renamed")));
  db_->Exec(
      fmt::format("INSERT INTO {} (uuid, payload, metadata) VALUES ('r', '{{}}', "
                  "'{{\"Event-Type\":\"x.y\",\"Source-Service\":\"x\"}}')",
                  QuoteIdent(name_ + "_renamed")));
  auto code = relay.Wait(seconds(30));
  ASSERT_TRUE(code.has_value()) << relay.LogTail();
  EXPECT_EQ(*code, 1) << relay.LogTail();
  EXPECT_NE(relay.Log().find("--table (OUTBOX_TABLE)"), std::string::npos) << relay.LogTail();
  db_->Exec("DROP TABLE " + QuoteIdent(name_ + "_renamed"));
}

TEST_F(SetupChecks, MissingCreatedAtColumnAndMalformedTableNameAreRefused) {
  db_->Exec(
      fmt::format("CREATE TABLE {0} (offset_acked BIGINT, offset_consumed BIGSERIAL NOT NULL, "
                  "uuid VARCHAR(36) NOT NULL, payload JSON, metadata JSON, "
                  "transaction_id xid8 NOT NULL DEFAULT pg_current_xact_id(), "
                  "PRIMARY KEY (transaction_id, offset_consumed))",
                  QuoteIdent(name_)));
  ExpectRefused(StartRelay(), "invalid setting --column-created-at (OUTBOX_COLUMN_CREATED_AT)");
  RelayProcess& without_lag = StartRelay({"--column-created-at", ""});
  EXPECT_TRUE(WaitStreaming(without_lag)) << without_lag.LogTail();
  without_lag.Kill(SIGKILL);
  without_lag.Wait(seconds(10));
  ExpectRefused(StartRelay({"--table", "\"a\"b\""}), "invalid setting --table (OUTBOX_TABLE)");
}

TEST_F(SetupChecks, ANewlineInARowCannotForgeALogLine) {
  CreateTables();
  RelayProcess& relay = StartRelay();
  ASSERT_TRUE(WaitStreaming(relay)) << relay.LogTail();
  // A poison row (a number where a string belongs) whose metadata carries a
  // line break and a fake log record.
  const std::string forged = "2026-01-01T00:00:00.000000Z error FORGED-" + NewUlid();
  db_->Exec(
      fmt::format("INSERT INTO {} (uuid, payload, metadata) VALUES ($1, '{{}}', $2)",
                  QuoteIdent(name_)),
      {NewUlid(), "{\"Event-Type\":\"x.y\",\"Source-Service\":\"x\",\"Bad\\n" + forged + "\":1}"});
  EXPECT_EQ(WaitAllAcked(seconds(30)), 0) << DescribeUnacked();
  std::this_thread::sleep_for(milliseconds(300));
  std::string log = relay.Log();
  ASSERT_NE(log.find("dead-lettering row"), std::string::npos) << relay.LogTail();
  std::istringstream lines(log);
  for (std::string line; std::getline(lines, line);) {
    EXPECT_FALSE(line.starts_with(forged)) << "a forged log line:\n" << line;
  }
}

}  // namespace
}  // namespace outbox_test
