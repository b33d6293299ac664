// The metrics a row can grow: label values taken from rows stop at the cap
// (--metrics-label-cap), the rest is counted under "__overflow__", the
// totals stay exact and the overflow is counted.
#include "outbox_relay/metrics/metrics.h"

#include <gtest/gtest.h>
#include <prometheus/text_serializer.h>

#include <map>
#include <string>

namespace outbox_relay::metrics {
namespace {

// Samples of `family` as (labels as text -> value); counters only.
std::map<std::string, double> Samples(Metrics& m, const std::string& family) {
  std::map<std::string, double> out;
  for (const auto& f : m.registry().Collect()) {
    if (f.name != family) continue;
    for (const auto& metric : f.metric) {
      std::string labels;
      for (const auto& l : metric.label) labels += l.name + "=" + l.value + ",";
      out[labels] = metric.counter.value;
    }
  }
  return out;
}

size_t HistogramSeries(Metrics& m, const std::string& family) {
  for (const auto& f : m.registry().Collect()) {
    if (f.name == family) return f.metric.size();
  }
  return 0;
}

double Sum(const std::map<std::string, double>& samples) {
  double sum = 0;
  for (const auto& [labels, value] : samples) sum += value;
  return sum;
}

TEST(MetricsLabelCap, DistinctEventTypesStopAtTheCap) {
  Metrics m("svc", 10);
  for (int i = 0; i < 1000; ++i)
    m.ObservePublish("orders", "req-" + std::to_string(i), 0.001, true);
  auto published = Samples(m, "events_published_total");
  // 10 pairs of their own and the topic's overflow series.
  EXPECT_EQ(published.size(), 11u);
  EXPECT_EQ(Sum(published), 1000);
  EXPECT_EQ(published["event_type=__overflow__,service=svc,topic=orders,"], 990);
  auto overflow = Samples(m, "outbox_relay_metric_label_overflow_total");
  EXPECT_EQ(overflow["metric=events_published_total,service=svc,"], 990);
  EXPECT_EQ(overflow["metric=outbox_forwarder_publish_duration_seconds,service=svc,"], 0);
  // A known pair still counts on its own series.
  m.ObservePublish("orders", "req-3", 0.001, true);
  EXPECT_EQ((Samples(m, "events_published_total")["event_type=req-3,service=svc,topic=orders,"]),
            2);
}

TEST(MetricsLabelCap, DistinctTopicsStopAtTheCap) {
  Metrics m("svc", 5);
  for (int i = 0; i < 100; ++i) {
    m.ObservePublish("topic-" + std::to_string(i), "made", 0.001, true);
    m.ObservePublish("topic-" + std::to_string(i), "made", 0.001, false);
  }
  // 5 topics and the overflow topic, each with result ok and error.
  EXPECT_EQ(HistogramSeries(m, "outbox_forwarder_publish_duration_seconds"), 12u);
  auto published = Samples(m, "events_published_total");
  EXPECT_EQ(published.size(), 6u);
  EXPECT_EQ(Sum(published), 100);
  EXPECT_EQ(published["event_type=__overflow__,service=svc,topic=__overflow__,"], 95);
  auto overflow = Samples(m, "outbox_relay_metric_label_overflow_total");
  EXPECT_EQ(overflow["metric=outbox_forwarder_publish_duration_seconds,service=svc,"], 190);
}

TEST(MetricsLabelCap, TotalsByTopicStayExactPastTheCap) {
  Metrics m("svc", 4);
  for (int i = 0; i < 50; ++i) {
    m.ObservePublish(i % 2 == 0 ? "a" : "b", "type-" + std::to_string(i), 0.001, true);
  }
  double a = 0;
  double b = 0;
  for (const auto& [labels, value] : Samples(m, "events_published_total")) {
    (labels.find("topic=a,") != std::string::npos ? a : b) += value;
  }
  EXPECT_EQ(a, 25);
  EXPECT_EQ(b, 25);
}

}  // namespace
}  // namespace outbox_relay::metrics
