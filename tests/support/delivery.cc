#include "support/delivery.h"

#include <fmt/format.h>

#include <set>
#include <unordered_map>
#include <unordered_set>

namespace outbox_test {

namespace {

constexpr size_t kMaxSamples = 10;

void Sample(std::vector<std::string>* samples, std::string s) {
  if (samples->size() < kMaxSamples) samples->push_back(std::move(s));
}

std::string Join(const std::vector<std::string>& v) {
  std::string out;
  for (const auto& s : v) out += "  " + s + "\n";
  return out;
}

std::string HeadersText(const std::vector<KafkaHeader>& headers) {
  std::string out = "[";
  for (size_t i = 0; i < headers.size(); ++i) {
    if (i > 0) out += ", ";
    out += headers[i].name + "=" + Printable(headers[i].value);
  }
  return out + "]";
}

}  // namespace

std::string Printable(const std::optional<std::string>& bytes) {
  if (!bytes) return "<null>";
  std::string out = "\"";
  for (unsigned char c : *bytes) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < 0x20 || c == 0x7f) {
      out += fmt::format("\\x{:02x}", c);
    } else {
      out += static_cast<char>(c);
    }
  }
  return out + "\"";
}

std::string DeliveryReport::Summary() const {
  return fmt::format(
      "delivery: committed={} consumed={} lost={} phantom={} duplicates={} order_violations={} "
      "(phantoms from rolled-back rows={}, aggregates split over partitions={})",
      committed, consumed, lost, phantom, duplicates, order_violations, phantom_rolled_back,
      split_aggregates);
}

std::string DeliveryReport::Samples() const { return Join(samples); }

DeliveryReport CheckDelivery(const std::vector<WrittenRow>& committed,
                             const std::vector<WrittenRow>& rolled_back,
                             const std::vector<KafkaRecord>& records) {
  DeliveryReport rep;
  rep.committed = committed.size();
  rep.consumed = records.size();

  std::unordered_map<std::string, const WrittenRow*> by_uuid;
  by_uuid.reserve(committed.size());
  for (const WrittenRow& r : committed) by_uuid.emplace(r.uuid, &r);
  std::unordered_set<std::string> rolled;
  for (const WrittenRow& r : rolled_back) rolled.insert(r.uuid);

  std::unordered_map<std::string, size_t> copies;
  struct AggState {
    std::string where;  // "topic/partition" of its first record
    int64_t last_seq = 0;
    int64_t last_offset = -1;  // where last_seq first arrived
    bool split = false;
  };
  std::unordered_map<std::string, AggState> aggs;

  for (const KafkaRecord& rec : records) {
    const KafkaHeader* h = rec.FindHeader("_watermill_message_uuid");
    std::string uuid = h != nullptr && h->value ? *h->value : "";
    auto it = by_uuid.find(uuid);
    if (it == by_uuid.end()) {
      ++rep.phantom;
      bool from_rollback = rolled.contains(uuid);
      if (from_rollback) ++rep.phantom_rolled_back;
      Sample(&rep.samples,
             fmt::format("phantom {} at {}/{}@{} ({})", Printable(uuid), rec.topic, rec.partition,
                         rec.offset, from_rollback ? "a rolled-back row" : "unknown uuid"));
      continue;
    }
    const WrittenRow& row = *it->second;
    if (copies[uuid]++ > 0) {
      ++rep.duplicates;
      continue;  // order is judged on first occurrences
    }
    if (row.aggregate.empty()) continue;
    std::string where = fmt::format("{}/{}", rec.topic, rec.partition);
    auto [ait, fresh] = aggs.try_emplace(row.aggregate);
    AggState& st = ait->second;
    if (fresh) st.where = where;
    if (st.where != where && !st.split) {
      st.split = true;
      ++rep.split_aggregates;
      Sample(&rep.samples,
             fmt::format("aggregate {} in {} and {}", row.aggregate, st.where, where));
    }
    if (row.seq <= st.last_seq) {
      ++rep.order_violations;
      Sample(&rep.samples,
             fmt::format("order: aggregate {} seq {} after seq {} (at {}@{}; seq {} first at @{})",
                         row.aggregate, row.seq, st.last_seq, where, rec.offset, st.last_seq,
                         st.last_offset));
    }
    if (row.seq > st.last_seq) {
      st.last_seq = row.seq;
      st.last_offset = rec.offset;
    }
  }
  for (const WrittenRow& r : committed) {
    if (!copies.contains(r.uuid)) {
      ++rep.lost;
      Sample(&rep.samples, fmt::format("lost {} (aggregate {} seq {}, xid {})", r.uuid, r.aggregate,
                                       r.seq, r.xid));
    }
  }
  return rep;
}

std::string ContractReport::Summary() const {
  return fmt::format("contract: checked={} mismatches={} wrong_partition={}", checked, mismatches,
                     wrong_partition);
}

std::string ContractReport::Samples() const { return Join(samples); }

ContractReport CheckContract(const std::vector<WrittenRow>& committed,
                             const std::vector<KafkaRecord>& records,
                             const std::map<std::string, int>& partitions) {
  ContractReport rep;
  std::unordered_map<std::string, const WrittenRow*> by_uuid;
  for (const WrittenRow& r : committed) by_uuid.emplace(r.uuid, &r);
  for (const KafkaRecord& rec : records) {
    const KafkaHeader* h = rec.FindHeader("_watermill_message_uuid");
    if (h == nullptr || !h->value) continue;
    auto it = by_uuid.find(*h->value);
    if (it == by_uuid.end()) continue;  // a phantom: CheckDelivery reports it
    const ExpectedRecord& want = it->second->expected;
    ++rep.checked;
    std::vector<std::string> diffs;
    if (rec.topic != want.topic)
      diffs.push_back(fmt::format("topic {} != {}", rec.topic, want.topic));
    if (rec.key != want.key) {
      diffs.push_back(fmt::format("key {} != {}", Printable(rec.key), Printable(want.key)));
    }
    if (rec.value != want.value) {
      diffs.push_back(fmt::format("value {} != {}", Printable(rec.value), Printable(want.value)));
    }
    if (rec.headers != want.headers) {
      diffs.push_back(
          fmt::format("headers {} != {}", HeadersText(rec.headers), HeadersText(want.headers)));
    }
    if (!diffs.empty()) {
      ++rep.mismatches;
      std::string all;
      for (const auto& d : diffs) all += "\n      " + d;
      Sample(&rep.samples, fmt::format("record {}/{}@{} uuid {}:{}", rec.topic, rec.partition,
                                       rec.offset, *h->value, all));
    }
    if (rec.key) {
      auto p = partitions.find(rec.topic);
      if (p == partitions.end()) {
        ++rep.wrong_partition;
        Sample(&rep.samples, fmt::format("no partition count for topic {}", rec.topic));
      } else if (int32_t want_p = SaramaHashPartition(*rec.key, p->second);
                 want_p != rec.partition) {
        ++rep.wrong_partition;
        Sample(&rep.samples, fmt::format("key {} in partition {} of {}, Sarama's FNV-1a says {}",
                                         Printable(rec.key), rec.partition, rec.topic, want_p));
      }
    }
  }
  return rep;
}

}  // namespace outbox_test
