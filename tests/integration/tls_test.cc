// TLS and authentication, with a throwaway CA made by openssl (support/test_ca):
//
// TlsPostgres  A cluster of the major under test with ssl = on and only
//              scram-sha-256 over TLS (hostssl) for the relay's role; the relay
//              connects with sslmode=verify-full and streams, publishes and marks
//              over TLS (pg_stat_ssl shows every session of it encrypted). A CA
//              that did not sign the server's certificate, or a wrong password,
//              stops it at start with exit 2 and a message naming the setting.
// TlsKafka     A private Kafka 4 broker with a SASL_SSL listener (PEM keystore):
//              PLAIN and SCRAM-SHA-512 users, and OAUTHBEARER tokens of an OIDC
//              issuer the test serves (support/oidc_issuer: a client-credentials
//              token endpoint for the relay, a JWKS endpoint the broker verifies
//              the tokens with). The relay connects through --kafka-property
//              with each mechanism. A wrong password or client secret stops it
//              at start with a clear message; the rows stay unacked (nothing
//              lost) and are delivered once it is right.
//
// And everywhere: no password appears in the relay's log lines, its error
// messages, `check` output, `slot status` output or /metrics. The secrets
// are distinctive strings the tests grep for.
#include <fmt/format.h>
#include <unistd.h>

#include <thread>

#include "fixture.h"
#include "ops_support.h"
#include "support/http_get.h"
#include "support/oidc_issuer.h"
#include "support/test_ca.h"
#include "support/throwaway_kafka.h"
#include "support/throwaway_pg.h"

namespace outbox_test {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;
using RelayEnv = std::map<std::string, std::optional<std::string>>;

constexpr const char* kPgPassword = "pg-Secret-7e1f9c0d";
constexpr const char* kKafkaPassword = "kafka-Secret-4b2d8a6e";
constexpr const char* kWrongPassword = "wrong-Secret-93c5e1aa";
constexpr const char* kOidcSecret = "oidc-Secret-2f6d9b17";

// The relay's own output: without the test harness's "==== [test] starting
// relay: <command line>" lines.
std::string WithoutBanner(const std::string& output) {
  std::string text;
  size_t pos = 0;
  while (pos < output.size()) {
    size_t end = output.find('\n', pos);
    if (end == std::string::npos) end = output.size();
    std::string_view line(output.data() + pos, end - pos);
    if (!line.starts_with("==== [test] starting relay:")) text.append(line).push_back('\n');
    pos = end + 1;
  }
  return text;
}

// Adds a failure for every secret found in `output` (`what` says where).
void ExpectNoSecret(const std::string& output, const std::string& what) {
  const std::string text = WithoutBanner(output);
  for (const char* secret : {kPgPassword, kKafkaPassword, kWrongPassword, kOidcSecret}) {
    size_t at = text.find(secret);
    EXPECT_EQ(at, std::string::npos) << "a secret appears in " << what << ": ..."
                                     << text.substr(at < 200 ? 0 : at - 200, 400) << "...";
  }
}

// ---- PostgreSQL ---------------------------------------------------------------------------

class TlsPostgres : public RelayTest {
 protected:
  void SetUp() override {
    RelayTest::SetUp();
    if (HasFatalFailure()) return;
    ca_ = std::make_unique<TestCa>();
    cluster_ = std::make_unique<ThrowawayPostgres>(
        FreeLocalPort(25670 + static_cast<int>(getpid() % 20)),
        "-c wal_level=logical -c max_wal_senders=6 -c max_replication_slots=4");
    Pg admin(cluster_->url());
    admin.Exec("SET password_encryption = 'scram-sha-256'");
    admin.Exec(
        fmt::format("CREATE ROLE relay LOGIN SUPERUSER PASSWORD {}", QuoteLiteral(kPgPassword)));
    cluster_->WriteDataFile("server.crt", ReadWholeFile(ca_->server_cert()), 0644);
    cluster_->WriteDataFile("server.key", ReadWholeFile(ca_->server_key()), 0600);
    cluster_->AppendConfig("ssl = on\nssl_cert_file = 'server.crt'\nssl_key_file = 'server.key'");
    // The relay's role: TLS and a SCRAM password only. The test's own sessions
    // (postgres) stay on trust.
    cluster_->WriteDataFile("pg_hba.conf",
                            "local all all trust\n"
                            "hostssl all relay 127.0.0.1/32 scram-sha-256\n"
                            "hostssl replication relay 127.0.0.1/32 scram-sha-256\n"
                            "host all postgres 127.0.0.1/32 trust\n"
                            "host replication postgres 127.0.0.1/32 trust\n");
    cluster_->Reload();
    db_ = std::make_unique<Pg>(cluster_->url());
    // The reload is asynchronous: wait until TLS is on.
    for (int i = 0; i < 100 && db_->Scalar("SHOW ssl") != "on"; ++i) {
      std::this_thread::sleep_for(milliseconds(50));
    }
    ASSERT_EQ(db_->Scalar("SHOW ssl"), "on");
  }

  // The relay's DATABASE_URL: role relay, its password, TLS verified against `ca`.
  std::string RelayUrl(const std::string& ca, const std::string& password = kPgPassword) const {
    return fmt::format(
        "postgresql://relay:{}@127.0.0.1:{}/postgres?sslmode=verify-full&sslrootcert={}", password,
        cluster_->port(), ca);
  }

  std::unique_ptr<TestCa> ca_;
  std::unique_ptr<ThrowawayPostgres> cluster_;
};

TEST_F(TlsPostgres, VerifyFullWithScramStreamsAndNoSecretIsShown) {
  CreateTables();
  const int metrics_port = FreeLocalPort(17400 + static_cast<int>(getpid() % 300));
  RelayEnv env = {{"DATABASE_URL", RelayUrl(ca_->ca_cert())}};
  RelayProcess& relay = StartRelay(
      {"--metrics-addr", fmt::format("127.0.0.1:{}", metrics_port), "--row-count-interval-s", "1"},
      env);
  ASSERT_TRUE(WaitStreaming(relay)) << relay.LogTail();

  WorkloadOptions options = Workload();
  options.database_url = cluster_->url();
  Ledger ledger;
  {
    Writer writer(options, &ledger, -1, 7);
    for (int i = 0; i < 30; ++i) ASSERT_TRUE(writer.Transaction({.rows = 1 + i % 4}));
  }
  ASSERT_EQ(WaitAllAcked(seconds(60)), 0) << relay.LogTail();
  DeliveryReport delivery = CheckDelivery(ledger.committed(), ledger.rolled_back(), ReadTopics());
  EXPECT_EQ(delivery.lost, 0u) << delivery.Samples();
  EXPECT_EQ(delivery.phantom, 0u) << delivery.Samples();

  // Every session of the relay's role is encrypted: replication, marker, sampler.
  auto sessions = db_->Query(
      "SELECT a.application_name, a.backend_type, s.ssl, s.version FROM pg_stat_activity a "
      "JOIN pg_stat_ssl s USING (pid) WHERE a.usename = 'relay'");
  std::set<std::string> kinds;
  for (const Row& r : sessions) {
    EXPECT_EQ(r[2], "t") << r[0].value_or("") << " (" << r[1].value_or("") << ") is not TLS";
    kinds.insert(r[1].value_or(""));
  }
  EXPECT_TRUE(kinds.contains("walsender")) << "no replication session of the relay";
  EXPECT_GE(sessions.size(), 3u);
  fmt::print("relay sessions over TLS: {} ({})\n", sessions.size(),
             sessions.empty() ? "" : sessions[0][3].value_or(""));

  HttpResponse metrics = HttpGet(metrics_port, "/metrics");
  EXPECT_EQ(metrics.status, 200);
  ExpectNoSecret(metrics.body, "/metrics");

  CommandResult check =
      RunRelayCommand({"check", "--table", "public." + name_, "--slot", name_, "--publication",
                       name_, "--dlq-topic", topic_prefix_ + ".dlq"},
                      env);
  EXPECT_EQ(check.exit_code, 0) << check.Describe();
  ExpectNoSecret(check.out + check.err, "check output");
  CommandResult status = RunRelayCommand({"slot", "status", "--slot", name_}, env);
  EXPECT_EQ(status.exit_code, 0) << status.Describe();
  ExpectNoSecret(status.out + status.err, "slot status output");

  relay.Terminate();
  EXPECT_EQ(relay.Wait(seconds(40)), std::optional<int>(0)) << relay.LogTail();
  ExpectNoSecret(relay.Log(), "the relay's log");
}

TEST_F(TlsPostgres, WrongCaOrPasswordFailsAtStartNamingTheSetting) {
  CreateTables();
  struct Case {
    const char* what;
    std::string url;
    const char* says;
  };
  std::vector<Case> cases = {
      {"a CA that did not sign the server's certificate", RelayUrl(ca_->other_ca_cert()),
       "sslrootcert"},
      {"a wrong password", RelayUrl(ca_->ca_cert(), kWrongPassword),
       "password authentication failed"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    RelayProcess& relay = StartRelay({}, {{"DATABASE_URL", c.url}});
    EXPECT_EQ(relay.Wait(seconds(30)), std::optional<int>(2)) << relay.LogTail();
    std::string log = relay.Log();
    EXPECT_NE(log.find("invalid setting --database-url (DATABASE_URL)"), std::string::npos) << log;
    EXPECT_NE(log.find(c.says), std::string::npos) << log;
    ExpectNoSecret(log, fmt::format("the relay's log ({})", c.what));

    CommandResult check = RunRelayCommand(
        {"check", "--table", "public." + name_, "--slot", name_, "--sample-rows", "0"},
        {{"DATABASE_URL", c.url}});
    EXPECT_EQ(check.exit_code, 1) << check.Describe();
    EXPECT_NE(check.out.find(c.says), std::string::npos) << check.Describe();
    ExpectNoSecret(check.out + check.err, fmt::format("check output ({})", c.what));
    CommandResult status =
        RunRelayCommand({"slot", "status", "--slot", name_}, {{"DATABASE_URL", c.url}});
    EXPECT_NE(status.exit_code, 0) << status.Describe();
    ExpectNoSecret(status.out + status.err, fmt::format("slot status output ({})", c.what));
  }
  EXPECT_FALSE(QuerySlot(*db_, name_).has_value()) << "a refused start created the slot";
}

// ---- Kafka --------------------------------------------------------------------------------

class TlsKafka : public RelayTest {
 protected:
  static void TearDownTestSuite() {
    broker_.reset();
    issuer_.reset();
    ca_.reset();
  }

  // The suite's broker: PLAINTEXT for the test's reads, SASL_SSL (PLAIN,
  // SCRAM-SHA-512, OAUTHBEARER; PEM keystore) for the relay.
  ThrowawayKafka& Broker() {
    if (!broker_) {
      ca_ = std::make_unique<TestCa>();
      issuer_ = std::make_unique<OidcIssuer>(OidcIssuer::Options{.client_secret = kOidcSecret});
      auto started = std::chrono::steady_clock::now();
      broker_ = std::make_unique<ThrowawayKafka>(
          std::map<std::string, std::string>{
              {"listeners",
               "PLAINTEXT://127.0.0.1:{port},SASL_SSL://127.0.0.1:{extra_port},"
               "CONTROLLER://127.0.0.1:{controller_port}"},
              {"advertised.listeners",
               "PLAINTEXT://127.0.0.1:{port},SASL_SSL://127.0.0.1:{extra_port}"},
              {"listener.security.protocol.map",
               "PLAINTEXT:PLAINTEXT,SASL_SSL:SASL_SSL,CONTROLLER:PLAINTEXT"},
              {"sasl.enabled.mechanisms", "SCRAM-SHA-512,PLAIN,OAUTHBEARER"},
              {"listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config",
               "org.apache.kafka.common.security.scram.ScramLoginModule required;"},
              {"listener.name.sasl_ssl.plain.sasl.jaas.config",
               fmt::format("org.apache.kafka.common.security.plain.PlainLoginModule required "
                           "user_relay=\"{}\";",
                           kKafkaPassword)},
              // KIP-768: the broker verifies the tokens' RS256 signatures with the
              // issuer's JWKS and checks their issuer, audience and expiry.
              {"listener.name.sasl_ssl.oauthbearer.sasl.jaas.config",
               "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule required;"},
              {"listener.name.sasl_ssl.oauthbearer.sasl.server.callback.handler.class",
               "org.apache.kafka.common.security.oauthbearer.OAuthBearerValidatorCallbackHandler"},
              {"sasl.oauthbearer.jwks.endpoint.url", issuer_->jwks_endpoint()},
              {"sasl.oauthbearer.expected.issuer", issuer_->issuer()},
              {"sasl.oauthbearer.expected.audience", issuer_->audience()},
              {"listener.name.sasl_ssl.ssl.keystore.type", "PEM"},
              {"listener.name.sasl_ssl.ssl.keystore.location", ca_->server_key_and_cert()},
          },
          std::vector<std::string>{
              "--add-scram", fmt::format("SCRAM-SHA-512=[name=relay,password={}]", kKafkaPassword)},
          // Kafka 4 fetches OAUTHBEARER endpoints only from URLs allowed here.
          std::vector<std::string>{"-Dorg.apache.kafka.sasl.oauthbearer.allowed.urls=" +
                                   issuer_->jwks_endpoint()});
      fmt::print("private SASL_SSL broker 127.0.0.1:{} up in {:.1f} s\n", broker_->extra_port(),
                 SecondsSince(started));
    }
    kafka_ = std::make_unique<KafkaReader>(broker_->brokers());
    private_broker_ = true;
    return *broker_;
  }

  void TearDown() override {
    if (private_broker_) kafka_.reset();  // its topics go with the broker
    RelayTest::TearDown();
  }

  // The relay's Kafka settings for the SASL_SSL listener.
  // (One token per property: RelayArgs would take a second "--kafka-property"
  // "value" pair for a new value of the first.)
  std::vector<std::string> KafkaArgs(const std::string& password,
                                     const std::string& mechanism = "PLAIN") const {
    return {"--kafka-brokers",
            fmt::format("127.0.0.1:{}", broker_->extra_port()),
            "--kafka-property=security.protocol=SASL_SSL",
            "--kafka-property=sasl.mechanisms=" + mechanism,
            "--kafka-property=sasl.username=relay",
            "--kafka-property=sasl.password=" + password,
            "--kafka-property=ssl.ca.location=" + ca_->ca_cert()};
  }

  // The relay's Kafka settings for OAUTHBEARER with librdkafka's OIDC client
  // (the client-credentials grant at the suite's issuer), over SASL_SSL.
  std::vector<std::string> OidcArgs(const std::string& client_secret) const {
    return {"--kafka-brokers",
            fmt::format("127.0.0.1:{}", broker_->extra_port()),
            "--kafka-property=security.protocol=SASL_SSL",
            "--kafka-property=sasl.mechanisms=OAUTHBEARER",
            "--kafka-property=sasl.oauthbearer.method=oidc",
            "--kafka-property=sasl.oauthbearer.client.id=relay",
            "--kafka-property=sasl.oauthbearer.client.secret=" + client_secret,
            "--kafka-property=sasl.oauthbearer.token.endpoint.url=" + issuer_->token_endpoint(),
            "--kafka-property=ssl.ca.location=" + ca_->ca_cert()};
  }

  void WrongThenRight(const std::string& what, const std::vector<std::string>& wrong_args,
                      const std::vector<std::string>& right_args, const std::string& refusal,
                      const std::string& hint = "sasl.password");

  static std::unique_ptr<TestCa> ca_;
  static std::unique_ptr<OidcIssuer> issuer_;
  static std::unique_ptr<ThrowawayKafka> broker_;
  bool private_broker_ = false;
};

std::unique_ptr<TestCa> TlsKafka::ca_;
std::unique_ptr<OidcIssuer> TlsKafka::issuer_;
std::unique_ptr<ThrowawayKafka> TlsKafka::broker_;

TEST_F(TlsKafka, SaslOverTlsDeliversAndNoSecretIsShown) {
  Broker();
  CreateTables();
  const int metrics_port = FreeLocalPort(17400 + static_cast<int>(getpid() % 300));
  std::vector<std::string> args = KafkaArgs(kKafkaPassword);
  args.insert(args.end(), {"--metrics-addr", fmt::format("127.0.0.1:{}", metrics_port),
                           "--create-topics", "true"});
  RelayProcess& relay = StartRelay(args);
  ASSERT_TRUE(WaitStreaming(relay)) << relay.LogTail();
  Ledger ledger;
  {
    Writer writer(Workload(), &ledger, -1, 9);
    for (int i = 0; i < 30; ++i) ASSERT_TRUE(writer.Transaction({.rows = 1 + i % 4}));
  }
  ASSERT_EQ(WaitAllAcked(seconds(60)), 0) << relay.LogTail();
  DeliveryReport delivery = CheckDelivery(ledger.committed(), ledger.rolled_back(), ReadTopics());
  fmt::print("over SASL_SSL: {}\n", delivery.Summary());
  EXPECT_EQ(delivery.lost, 0u) << delivery.Samples();
  EXPECT_EQ(delivery.phantom, 0u) << delivery.Samples();

  HttpResponse metrics = HttpGet(metrics_port, "/metrics");
  EXPECT_EQ(metrics.status, 200);
  ExpectNoSecret(metrics.body, "/metrics");
  std::vector<std::string> check_args = {"check",
                                         "--table",
                                         "public." + name_,
                                         "--slot",
                                         name_,
                                         "--publication",
                                         name_,
                                         "--create-topics",
                                         "true",
                                         "--dlq-topic",
                                         topic_prefix_ + ".dlq"};
  std::vector<std::string> kafka_args = KafkaArgs(kKafkaPassword);
  check_args.insert(check_args.end(), kafka_args.begin(), kafka_args.end());
  CommandResult check = RunRelayCommand(check_args, {{"DATABASE_URL", env_.database_url}});
  EXPECT_EQ(check.exit_code, 0) << check.Describe();
  EXPECT_NE(check.out.find("OK    kafka: 127.0.0.1:"), std::string::npos) << check.Describe();
  ExpectNoSecret(check.out + check.err, "check output");

  relay.Terminate();
  EXPECT_EQ(relay.Wait(seconds(40)), std::optional<int>(0)) << relay.LogTail();
  ExpectNoSecret(relay.Log(), "the relay's log");
}

// With the Kafka settings `wrong`: the relay stops at start (exit 2, the
// setting and the refusal's words named, no secret shown), `check` says so
// too, nothing is marked; with `right` everything written meanwhile is
// delivered.
void TlsKafka::WrongThenRight(const std::string& what, const std::vector<std::string>& wrong_args,
                              const std::vector<std::string>& right_args,
                              const std::string& refusal, const std::string& hint) {
  Broker();
  CreateTables();
  Ledger ledger;
  Writer writer(Workload(), &ledger, -1, 13);
  for (int i = 0; i < 10; ++i) ASSERT_TRUE(writer.Transaction({.rows = 2}));

  std::vector<std::string> args = wrong_args;
  args.insert(args.end(), {"--create-topics", "true"});
  RelayProcess& wrong = StartRelay(args);
  EXPECT_EQ(wrong.Wait(seconds(60)), std::optional<int>(2)) << wrong.LogTail();
  std::string log = wrong.Log();
  EXPECT_NE(log.find("invalid setting --kafka-property (OUTBOX_KAFKA_PROPERTIES)"),
            std::string::npos)
      << log;
  EXPECT_NE(log.find(refusal), std::string::npos) << log;  // the brokers' (or issuer's) words
  EXPECT_NE(log.find(hint), std::string::npos) << log;     // the settings to check
  ExpectNoSecret(log, "the relay's log (wrong password)");
  EXPECT_EQ(UnackedRows(), 20) << "rows were marked without reaching Kafka";

  std::vector<std::string> check_args = {
      "check", "--table", "public." + name_, "--slot", name_, "--sample-rows", "0"};
  check_args.insert(check_args.end(), wrong_args.begin(), wrong_args.end());
  CommandResult check = RunRelayCommand(check_args, {{"DATABASE_URL", env_.database_url}});
  EXPECT_EQ(check.exit_code, 1) << check.Describe();
  EXPECT_NE(check.out.find(refusal), std::string::npos) << check.Describe();
  ExpectNoSecret(check.out + check.err, "check output (wrong password)");

  // The right password: everything written meanwhile is delivered.
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(writer.Transaction({.rows = 1}));
  std::vector<std::string> right = right_args;
  right.insert(right.end(), {"--create-topics", "true"});
  RelayProcess& relay = StartRelay(right);
  ASSERT_TRUE(WaitStreaming(relay)) << relay.LogTail();
  EXPECT_EQ(WaitAllAcked(seconds(60)), 0) << relay.LogTail();
  DeliveryReport delivery = CheckDelivery(ledger.committed(), ledger.rolled_back(), ReadTopics());
  fmt::print("{}: wrong secret, then the right one: {}\n", what, delivery.Summary());
  EXPECT_EQ(delivery.lost, 0u) << delivery.Samples();
  EXPECT_EQ(delivery.phantom, 0u) << delivery.Samples();
  ExpectNoSecret(relay.Log(), "the relay's log");
}

TEST_F(TlsKafka, WrongPasswordFailsClearlyAndLosesNothing) {
  Broker();
  WrongThenRight("PLAIN", KafkaArgs(kWrongPassword), KafkaArgs(kKafkaPassword),
                 "Authentication failed");
}

// SASL/SCRAM-SHA-512 over TLS against the Kafka 4 broker. librdkafka before
// 2.6.1 (Debian 12 packages 2.0.2) sends the server's nonce twice in the SCRAM
// client-final message and Kafka 4 refuses it ("Authentication failed during
// authentication due to invalid credentials", with the right password); the
// relay links a current librdkafka (scripts/librdkafka). Delivered as a set:
// nothing lost, no phantom, in order; `check` passes with the same settings.
TEST_F(TlsKafka, ScramSha512OverTlsDeliversWithKafka4) {
  Broker();
  CreateTables();
  std::vector<std::string> args = KafkaArgs(kKafkaPassword, "SCRAM-SHA-512");
  args.insert(args.end(), {"--create-topics", "true"});
  RelayProcess& relay = StartRelay(args);
  ASSERT_TRUE(WaitStreaming(relay)) << relay.LogTail();
  Ledger ledger;
  {
    Writer writer(Workload(), &ledger, -1, 17);
    for (int i = 0; i < 30; ++i) ASSERT_TRUE(writer.Transaction({.rows = 1 + i % 4}));
  }
  ASSERT_EQ(WaitAllAcked(seconds(60)), 0) << relay.LogTail();
  DeliveryReport delivery = CheckDelivery(ledger.committed(), ledger.rolled_back(), ReadTopics());
  fmt::print("over SASL_SSL with SCRAM-SHA-512: {}\n", delivery.Summary());
  EXPECT_EQ(delivery.lost, 0u) << delivery.Samples();
  EXPECT_EQ(delivery.phantom, 0u) << delivery.Samples();
  EXPECT_EQ(delivery.order_violations, 0u) << delivery.Samples();

  std::vector<std::string> check_args = {
      "check", "--table", "public." + name_, "--slot", name_, "--sample-rows", "0"};
  std::vector<std::string> kafka_args = KafkaArgs(kKafkaPassword, "SCRAM-SHA-512");
  check_args.insert(check_args.end(), kafka_args.begin(), kafka_args.end());
  CommandResult check = RunRelayCommand(check_args, {{"DATABASE_URL", env_.database_url}});
  EXPECT_EQ(check.exit_code, 0) << check.Describe();
  EXPECT_NE(check.out.find("OK    kafka: 127.0.0.1:"), std::string::npos) << check.Describe();
  ExpectNoSecret(check.out + check.err, "check output (SCRAM)");

  relay.Terminate();
  EXPECT_EQ(relay.Wait(seconds(40)), std::optional<int>(0)) << relay.LogTail();
  ExpectNoSecret(relay.Log(), "the relay's log (SCRAM)");
}

TEST_F(TlsKafka, ScramSha512WrongPasswordFailsClearlyAndLosesNothing) {
  Broker();
  WrongThenRight("SCRAM-SHA-512", KafkaArgs(kWrongPassword, "SCRAM-SHA-512"),
                 KafkaArgs(kKafkaPassword, "SCRAM-SHA-512"), "Authentication failed");
}

// SASL/OAUTHBEARER with OIDC: librdkafka's own client (sasl.oauthbearer.method
// =oidc) takes a token from the suite's issuer with the client-credentials
// grant, and the Kafka 4 broker verifies it against the issuer's JWKS
// (signature, issuer, audience, expiry). Delivered as a set; the secret never
// shown. (librdkafka's OIDC client needs its libcurl: scripts/librdkafka
// builds it in.)
TEST_F(TlsKafka, OauthbearerOidcOverTlsDeliversWithKafka4) {
  Broker();
  CreateTables();
  const size_t issued_before = issuer_->tokens_issued();
  std::vector<std::string> args = OidcArgs(kOidcSecret);
  args.insert(args.end(), {"--create-topics", "true"});
  RelayProcess& relay = StartRelay(args);
  ASSERT_TRUE(WaitStreaming(relay)) << relay.LogTail();
  Ledger ledger;
  {
    Writer writer(Workload(), &ledger, -1, 19);
    for (int i = 0; i < 30; ++i) ASSERT_TRUE(writer.Transaction({.rows = 1 + i % 4}));
  }
  ASSERT_EQ(WaitAllAcked(seconds(60)), 0) << relay.LogTail();
  DeliveryReport delivery = CheckDelivery(ledger.committed(), ledger.rolled_back(), ReadTopics());
  fmt::print(
      "over SASL_SSL with OAUTHBEARER/OIDC: {}; the issuer gave {} tokens, served its "
      "JWKS {} times\n",
      delivery.Summary(), issuer_->tokens_issued() - issued_before, issuer_->jwks_served());
  EXPECT_EQ(delivery.lost, 0u) << delivery.Samples();
  EXPECT_EQ(delivery.phantom, 0u) << delivery.Samples();
  EXPECT_EQ(delivery.order_violations, 0u) << delivery.Samples();
  EXPECT_GE(issuer_->tokens_issued() - issued_before, 1u) << "the relay took no token";
  EXPECT_GE(issuer_->jwks_served(), 1u) << "the broker never fetched the keys";
  relay.Terminate();
  EXPECT_EQ(relay.Wait(seconds(40)), std::optional<int>(0)) << relay.LogTail();
  ExpectNoSecret(relay.Log(), "the relay's log (OIDC)");
}

// A client secret the issuer refuses: no token, so no connection to Kafka;
// the relay stops at start naming the setting, nothing is marked.
TEST_F(TlsKafka, OidcWrongClientSecretFailsClearlyAndLosesNothing) {
  Broker();
  const size_t refused_before = issuer_->tokens_refused();
  WrongThenRight("OAUTHBEARER/OIDC", OidcArgs(kWrongPassword), OidcArgs(kOidcSecret),
                 "invalid_client", "no token from the OAuth/OIDC token endpoint");
  EXPECT_GE(issuer_->tokens_refused() - refused_before, 1u);
}

// Two ways a secret once reached the log, each held by a test below:
//  1. A property librdkafka rejects was logged with its value: a misspelt
//     sasl.password key printed the password.
//  2. OUTBOX_KAFKA_PROPERTIES was split on ';' as well as on newlines: a
//     password containing ';' was cut in two and the second half printed as
//     a malformed property.
TEST_F(TlsKafka, AMisspeltPropertyIsRefusedWithoutItsValue) {
  Broker();
  CreateTables();
  std::vector<std::string> args = KafkaArgs(kKafkaPassword);
  args.push_back(std::string("--kafka-property=sasl.pasword=") + kWrongPassword);
  RelayProcess& relay = StartRelay(args);
  EXPECT_EQ(relay.Wait(seconds(60)), std::optional<int>(2)) << relay.LogTail();
  EXPECT_NE(WithoutBanner(relay.Log()).find("sasl.pasword"), std::string::npos) << relay.Log();
  ExpectNoSecret(relay.Log(), "the relay's log (misspelt property)");
}

TEST_F(TlsKafka, APasswordWithASemicolonIsOneValueAndNeverLogged) {
  // A password with ';' in it, given one property per line.
  const std::string password = std::string(kWrongPassword) + ";" + kWrongPassword;
  Broker();
  CreateTables();
  RelayProcess& relay = StartRelay(
      {"--kafka-brokers", fmt::format("127.0.0.1:{}", broker_->extra_port())},
      {{"OUTBOX_KAFKA_PROPERTIES",
        "security.protocol=SASL_SSL\nsasl.mechanisms=SCRAM-SHA-512\nsasl.username=relay\n"
        "sasl.password=" +
            password + "\nssl.ca.location=" + ca_->ca_cert()}});
  relay.Wait(seconds(60));
  ExpectNoSecret(relay.Log(), "the relay's log (password with ';')");
}

}  // namespace
}  // namespace outbox_test
