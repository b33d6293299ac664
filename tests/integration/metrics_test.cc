// /metrics, /healthz and /readyz of a running relay after a known workload:
// the seed's metric names and labels with the values the workload implies
// (published per topic and event type, row counts by status, a marshal error
// and a dead letter for the one poison row), and readiness that tells a
// streaming instance from a standby one.
#include <fmt/format.h>

#include <cstdlib>
#include <thread>

#include "fixture.h"
#include "support/http_get.h"
#include "support/throwaway_pg.h"

namespace outbox_test {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

class Metrics : public RelayTest {
 protected:
  // Polls /metrics until `done(text)` or the timeout; returns the last scrape.
  std::string ScrapeUntil(int port, const std::function<bool(const std::string&)>& done,
                          milliseconds timeout) {
    auto deadline = std::chrono::steady_clock::now() + timeout;
    std::string text;
    while (true) {
      HttpResponse r = HttpGet(port, "/metrics");
      if (r.status == 200) text = r.body;
      if ((r.status == 200 && done(text)) || std::chrono::steady_clock::now() > deadline) {
        return text;
      }
      std::this_thread::sleep_for(milliseconds(200));
    }
  }

  static std::string Label(const std::string& key, const std::string& value) {
    return fmt::format("{}=\"{}\"", key, value);
  }
};

TEST_F(Metrics, KnownWorkloadGivesTheSeedsMetricsAndHealth) {
  CreateTables();
  const int port = FreeLocalPort(17000);
  const std::string addr = fmt::format("127.0.0.1:{}", port);
  RelayProcess& relay = StartRelay({"--metrics-addr", addr, "--row-count-interval-s", "1"});
  ASSERT_TRUE(WaitStreaming(relay)) << relay.LogTail();

  // Health before any row: alive, and ready once streaming with Kafka reachable.
  HttpResponse health = HttpGet(port, "/healthz");
  EXPECT_EQ(health.status, 200) << health.body;
  HttpResponse ready;
  for (int i = 0; i < 50 && ready.status != 200; ++i) {
    ready = HttpGet(port, "/readyz");
    if (ready.status != 200) std::this_thread::sleep_for(milliseconds(200));
  }
  EXPECT_EQ(ready.status, 200) << ready.body;

  // The workload: 30 review.created rows in 3 transactions, 12 order.paid rows
  // in one, and one poison row (metadata is a JSON array) in a transaction of its own.
  const std::string table = "public." + QuoteIdent(name_);
  auto insert = [&](const std::string& event_type, int rows, int first) {
    std::string sql = fmt::format("INSERT INTO {} (uuid, payload, metadata) VALUES ", table);
    for (int i = 0; i < rows; ++i) {
      int n = first + i;
      sql += fmt::format(
          "{}('m-{}', '{{\"n\":{}}}', "
          "'{{\"Aggregate-Id\":\"agg-{}\",\"Event-Type\":\"{}\",\"Source-Service\":\"shop\"}}')",
          i == 0 ? "" : ",", n, n, n % 5, event_type);
    }
    db_->Exec(sql);
  };
  for (int t = 0; t < 3; ++t) insert("review.created", 10, t * 10);
  insert("order.paid", 12, 100);
  db_->Exec(
      fmt::format("INSERT INTO {} (uuid, payload, metadata) VALUES ('m-poison', '{{}}', "
                  "'[\"not\", \"an\", \"object\"]')",
                  table));
  ASSERT_EQ(WaitAllAcked(seconds(60)), 0) << DescribeUnacked();

  const std::string svc = Label("service", "it");
  const std::string review_topic = topic_prefix_ + ".shop.review";
  const std::string order_topic = topic_prefix_ + ".shop.order";
  // Row counts are sampled every second on the sampler's own connection.
  std::string text = ScrapeUntil(
      port,
      [&](const std::string& t) {
        return MetricSum(t, "outbox_rows_total", {svc, Label("status", "acked")}) == 43.0 &&
               MetricSum(t, "outbox_relay_in_flight_messages", {svc}) == 0.0 &&
               MetricSum(t, "outbox_relay_in_flight_bytes", {svc}) == 0.0;
      },
      seconds(20));
  ASSERT_FALSE(text.empty()) << "no answer on /metrics";
  // Every record's bytes are taken off when it is reported, dead letters included.
  EXPECT_EQ(MetricSum(text, "outbox_relay_in_flight_bytes", {svc}), 0.0) << text;

  // Seed names and labels.
  EXPECT_EQ(MetricSum(text, "outbox_rows_total", {svc, Label("status", "acked")}), 43.0) << text;
  EXPECT_EQ(MetricSum(text, "outbox_rows_total", {svc, Label("status", "pending")}), 0.0);
  EXPECT_EQ(MetricSum(text, "outbox_rows_total", {svc, Label("status", "unacked")}), 0.0);
  EXPECT_EQ(MetricSum(text, "outbox_forwarder_lag_seconds", {svc}), 0.0);
  EXPECT_EQ(MetricSum(text, "events_published_total",
                      {svc, Label("topic", review_topic), Label("event_type", "review.created")}),
            30.0)
      << text;
  EXPECT_EQ(MetricSum(text, "events_published_total",
                      {svc, Label("topic", order_topic), Label("event_type", "order.paid")}),
            12.0);
  EXPECT_EQ(MetricSum(text, "outbox_forwarder_publish_duration_seconds_count",
                      {svc, Label("topic", review_topic), Label("result", "ok")}),
            30.0);
  EXPECT_EQ(MetricSum(text, "outbox_forwarder_errors_total", {svc, Label("reason", "marshal")}),
            1.0);
  EXPECT_EQ(
      MetricSum(text, "outbox_forwarder_errors_total", {svc, Label("reason", "kafka_unavailable")}),
      0.0);
  EXPECT_TRUE(MetricSum(text, "outbox_forwarder_errors_total", {svc, Label("reason", "db_read")}));
  EXPECT_TRUE(MetricSum(text, "outbox_forwarder_errors_total", {svc, Label("reason", "db_ack")}));
  // Replication metrics.
  EXPECT_EQ(MetricSum(text, "outbox_relay_dead_lettered_total", {svc}), 1.0);
  EXPECT_EQ(MetricSum(text, "outbox_relay_transactions_total", {svc}), 5.0);
  EXPECT_EQ(MetricSum(text, "outbox_relay_commit_to_ack_seconds_count", {svc}), 43.0);
  EXPECT_EQ(MetricSum(text, "outbox_relay_streaming", {svc}), 1.0);
  EXPECT_EQ(MetricSum(text, "outbox_relay_standby", {svc}), 0.0);
  EXPECT_EQ(MetricSum(text, "outbox_relay_slot_active", {svc}), 1.0);
  EXPECT_GT(MetricSum(text, "outbox_relay_confirmed_lsn", {svc}).value_or(0), 0.0);
  EXPECT_TRUE(MetricSum(text, "outbox_relay_slot_retained_wal_bytes", {svc}));
  double heartbeat = MetricSum(text, "outbox_relay_heartbeat_timestamp_seconds", {svc}).value_or(0);
  double now = static_cast<double>(std::time(nullptr));
  EXPECT_LT(now - heartbeat, 30.0) << "heartbeat " << heartbeat << " now " << now;
  double last_commit =
      MetricSum(text, "outbox_relay_last_commit_timestamp_seconds", {svc}).value_or(0);
  EXPECT_LT(now - last_commit, 120.0);

  // A stuck row ages the lag gauge: one row made unacked again with an old
  // created_at (an UPDATE, which the insert-only publication never sends).
  db_->Exec(
      fmt::format("UPDATE {} SET offset_acked = NULL, created_at = now() - interval "
                  "'90 seconds' WHERE uuid = 'm-7'",
                  table));
  std::string lagging = ScrapeUntil(
      port,
      [&](const std::string& t) {
        return MetricSum(t, "outbox_forwarder_lag_seconds", {svc}).value_or(0) >= 90.0;
      },
      seconds(20));
  EXPECT_GE(MetricSum(lagging, "outbox_forwarder_lag_seconds", {svc}).value_or(0), 90.0) << lagging;
  EXPECT_EQ(MetricSum(lagging, "outbox_rows_total", {svc, Label("status", "pending")}), 1.0);
  EXPECT_EQ(MetricSum(lagging, "outbox_rows_total", {svc, Label("status", "unacked")}), 1.0);
  EXPECT_EQ(MetricSum(lagging, "outbox_rows_total", {svc, Label("status", "acked")}), 42.0);
  db_->Exec(fmt::format("UPDATE {} SET offset_acked = offset_consumed WHERE uuid = 'm-7'", table));

  // A second instance on the same slot is a standby: alive, not ready.
  const int standby_port = FreeLocalPort(port + 1);
  RelayProcess& standby = StartRelay({"--metrics-addr", fmt::format("127.0.0.1:{}", standby_port)});
  ASSERT_TRUE(standby.WaitForLog("standby", seconds(30))) << standby.LogTail();
  HttpResponse standby_ready = HttpGet(standby_port, "/readyz");
  EXPECT_EQ(standby_ready.status, 503) << standby_ready.body;
  EXPECT_NE(standby_ready.body.find("standby"), std::string::npos) << standby_ready.body;
  EXPECT_EQ(HttpGet(standby_port, "/healthz").status, 200);
  std::string standby_text = ScrapeUntil(
      standby_port,
      [&](const std::string& t) { return MetricSum(t, "outbox_relay_standby", {svc}) == 1.0; },
      seconds(10));
  EXPECT_EQ(MetricSum(standby_text, "outbox_relay_standby", {svc}), 1.0);
  EXPECT_EQ(MetricSum(standby_text, "outbox_relay_streaming", {svc}), 0.0);

  fmt::print(
      "metrics: published review {} order {}, marshal errors {}, dead-lettered {}, acked rows {}, "
      "/healthz {}, /readyz {} (standby: /readyz {})\n",
      MetricSum(text, "events_published_total", {svc, Label("topic", review_topic)}).value_or(-1),
      MetricSum(text, "events_published_total", {svc, Label("topic", order_topic)}).value_or(-1),
      MetricSum(text, "outbox_forwarder_errors_total", {svc, Label("reason", "marshal")})
          .value_or(-1),
      MetricSum(text, "outbox_relay_dead_lettered_total", {svc}).value_or(-1),
      MetricSum(text, "outbox_rows_total", {svc, Label("status", "acked")}).value_or(-1),
      health.status, ready.status, standby_ready.status);
}

}  // namespace
}  // namespace outbox_test
