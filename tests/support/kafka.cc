#include "support/kafka.h"

#include <fmt/format.h>
#include <librdkafka/rdkafka.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <map>
#include <memory>
#include <set>
#include <stdexcept>
#include <string_view>
#include <thread>
#include <utility>

namespace outbox_test {

namespace {

using Clock = std::chrono::steady_clock;

struct RkDeleter {
  void operator()(rd_kafka_t* rk) const { rd_kafka_destroy(rk); }
};
using RkHandle = std::unique_ptr<rd_kafka_t, RkDeleter>;

struct MetadataDeleter {
  void operator()(const rd_kafka_metadata_t* md) const { rd_kafka_metadata_destroy(md); }
};

void Set(rd_kafka_conf_t* conf, const char* key, const std::string& value) {
  char err[512];
  if (rd_kafka_conf_set(conf, key, value.c_str(), err, sizeof(err)) != RD_KAFKA_CONF_OK) {
    throw std::runtime_error(fmt::format("kafka config {}={}: {}", key, value, err));
  }
}

RkHandle MakeClient(const std::string& brokers, rd_kafka_type_t type, bool read_committed = false) {
  static std::atomic<int> counter{0};
  rd_kafka_conf_t* conf = rd_kafka_conf_new();
  try {
    Set(conf, "bootstrap.servers", brokers);
    Set(conf, "log_level", "3");
    if (type == RD_KAFKA_CONSUMER) {
      // A group id is required by rd_kafka_assign(); the group is never joined
      // (no subscribe) and no offset is ever committed.
      Set(conf, "group.id", fmt::format("outbox-it-reader-{}-{}", getpid(), counter++));
      Set(conf, "enable.auto.commit", "false");
      Set(conf, "enable.auto.offset.store", "false");
      Set(conf, "auto.offset.reset", "earliest");
      Set(conf, "enable.partition.eof", read_committed ? "true" : "false");
      Set(conf, "isolation.level", read_committed ? "read_committed" : "read_uncommitted");
      Set(conf, "allow.auto.create.topics", "false");
      Set(conf, "fetch.wait.max.ms", "100");
    }
  } catch (...) {
    rd_kafka_conf_destroy(conf);
    throw;
  }
  char err[512];
  rd_kafka_t* rk = rd_kafka_new(type, conf, err, sizeof(err));
  if (rk == nullptr) {
    rd_kafka_conf_destroy(conf);
    throw std::runtime_error(std::string("rd_kafka_new: ") + err);
  }
  return RkHandle(rk);
}

// topic -> partition count, for every topic the broker describes without error.
std::map<std::string, int> AllTopics(rd_kafka_t* rk) {
  const rd_kafka_metadata_t* md = nullptr;
  rd_kafka_resp_err_t e = rd_kafka_metadata(rk, 1, nullptr, &md, 10000);
  if (e != RD_KAFKA_RESP_ERR_NO_ERROR) {
    throw std::runtime_error(std::string("kafka metadata: ") + rd_kafka_err2str(e));
  }
  std::unique_ptr<const rd_kafka_metadata_t, MetadataDeleter> guard(md);
  std::map<std::string, int> out;
  for (int i = 0; i < md->topic_cnt; ++i) {
    const rd_kafka_metadata_topic_t& t = md->topics[i];
    if (t.err != RD_KAFKA_RESP_ERR_NO_ERROR || t.partition_cnt == 0) continue;
    bool leaders = true;
    for (int p = 0; p < t.partition_cnt; ++p) leaders = leaders && t.partitions[p].leader >= 0;
    if (leaders) out[t.topic] = t.partition_cnt;
  }
  return out;
}

}  // namespace

const KafkaHeader* KafkaRecord::FindHeader(const std::string& name) const {
  for (const KafkaHeader& h : headers) {
    if (h.name == name) return &h;
  }
  return nullptr;
}

KafkaReader::KafkaReader(std::string brokers) : brokers_(std::move(brokers)) {}

std::vector<std::string> KafkaReader::TopicsWithPrefix(const std::string& prefix) {
  RkHandle rk = MakeClient(brokers_, RD_KAFKA_PRODUCER);
  std::vector<std::string> out;
  for (const auto& [name, n] : AllTopics(rk.get())) {
    if (name.starts_with(prefix)) out.push_back(name);
  }
  return out;
}

std::optional<int> KafkaReader::PartitionCount(const std::string& topic) {
  RkHandle rk = MakeClient(brokers_, RD_KAFKA_PRODUCER);
  auto all = AllTopics(rk.get());
  auto it = all.find(topic);
  if (it == all.end()) return std::nullopt;
  return it->second;
}

std::vector<KafkaRecord> KafkaReader::Read(const std::vector<std::string>& topics,
                                           const std::string& prefix, const ReadOptions& options) {
  RkHandle rk = MakeClient(brokers_, RD_KAFKA_CONSUMER, options.read_committed);
  rd_kafka_poll_set_consumer(rk.get());
  std::set<std::string> wanted(topics.begin(), topics.end());

  using Tp = std::pair<std::string, int32_t>;
  std::map<Tp, int64_t> next;  // partition -> next offset to read (low watermark at first)
  std::map<Tp, int64_t> high;  // last seen high watermarks
  std::set<Tp> at_end;         // read_committed: partitions the consumer reported at their end
  std::vector<KafkaRecord> records;
  size_t taken = 0;  // records read (options.each keeps none)

  auto start = Clock::now();
  auto deadline = start + options.timeout;
  Clock::time_point last_refresh{};
  // When the reader was first seen caught up with unchanged watermarks (max(): not now).
  Clock::time_point caught_up_since = Clock::time_point::max();

  auto refresh_assignment = [&] {
    std::unique_ptr<rd_kafka_topic_partition_list_t,
                    decltype(&rd_kafka_topic_partition_list_destroy)>
        add(rd_kafka_topic_partition_list_new(8), &rd_kafka_topic_partition_list_destroy);
    for (const auto& [name, count] : AllTopics(rk.get())) {
      if (!wanted.contains(name) && (prefix.empty() || !name.starts_with(prefix))) continue;
      for (int32_t p = 0; p < count; ++p) {
        Tp tp{name, p};
        if (next.contains(tp)) continue;
        int64_t lo = 0, hi = 0;
        rd_kafka_query_watermark_offsets(rk.get(), name.c_str(), p, &lo, &hi, 5000);
        next[tp] = lo;
        rd_kafka_topic_partition_list_add(add.get(), name.c_str(), p)->offset =
            RD_KAFKA_OFFSET_BEGINNING;
      }
    }
    if (add->cnt > 0) {
      rd_kafka_error_t* err = rd_kafka_incremental_assign(rk.get(), add.get());
      if (err != nullptr) {
        std::string msg = rd_kafka_error_string(err);
        rd_kafka_error_destroy(err);
        throw std::runtime_error("kafka incremental_assign: " + msg);
      }
      caught_up_since = Clock::time_point::max();
    }
  };

  auto take = [&](rd_kafka_message_t* m) {
    std::unique_ptr<rd_kafka_message_t, decltype(&rd_kafka_message_destroy)> guard(
        m, &rd_kafka_message_destroy);
    if (m->err != RD_KAFKA_RESP_ERR_NO_ERROR) {
      if (m->err == RD_KAFKA_RESP_ERR__PARTITION_EOF) {
        at_end.insert(Tp{rd_kafka_topic_name(m->rkt), m->partition});
      } else {
        std::fprintf(stderr, "[kafka reader] %s\n", rd_kafka_message_errstr(m));
      }
      return;
    }
    at_end.erase(Tp{rd_kafka_topic_name(m->rkt), m->partition});
    KafkaRecord r;
    r.topic = rd_kafka_topic_name(m->rkt);
    r.partition = m->partition;
    r.offset = m->offset;
    if (m->key != nullptr && !options.ids_only) {
      r.key.emplace(static_cast<const char*>(m->key), m->key_len);
    }
    if (m->payload != nullptr && !options.ids_only) {
      r.value.emplace(static_cast<const char*>(m->payload), m->len);
    }
    rd_kafka_headers_t* hdrs = nullptr;
    if (rd_kafka_message_headers(m, &hdrs) == RD_KAFKA_RESP_ERR_NO_ERROR) {
      const char* name = nullptr;
      const void* val = nullptr;
      size_t size = 0;
      for (size_t i = 0;
           rd_kafka_header_get_all(hdrs, i, &name, &val, &size) == RD_KAFKA_RESP_ERR_NO_ERROR;
           ++i) {
        if (options.ids_only && std::string_view(name) != "_watermill_message_uuid") continue;
        KafkaHeader h{name, std::nullopt};
        if (val != nullptr) h.value.emplace(static_cast<const char*>(val), size);
        r.headers.push_back(std::move(h));
      }
    }
    Tp tp{r.topic, r.partition};
    next[tp] = std::max(next[tp], r.offset + 1);
    ++taken;
    if (options.each) {
      options.each(std::move(r));
    } else {
      records.push_back(std::move(r));
    }
  };

  // Whether every partition was read up to its high watermark. The cached
  // watermarks (from fetch responses, no request) decide "still behind"
  // cheaply; only when they say "caught up" are the brokers asked: their
  // ListOffsets answers queue behind the long-polling fetches.
  auto caught_up = [&](bool* moved) {
    *moved = false;
    if (next.empty() && (!wanted.empty() || !prefix.empty())) return false;
    for (const std::string& t : wanted) {
      bool known = std::any_of(next.begin(), next.end(),
                               [&](const auto& kv) { return kv.first.first == t; });
      if (!known) return false;  // a named topic that does not exist yet
    }
    for (const auto& [tp, pos] : next) {
      int64_t lo = 0, hi = 0;
      if (options.read_committed) {
        if (!at_end.contains(tp)) return false;
        continue;
      }
      if (rd_kafka_get_watermark_offsets(rk.get(), tp.first.c_str(), tp.second, &lo, &hi) ==
              RD_KAFKA_RESP_ERR_NO_ERROR &&
          hi >= 0 && pos < hi) {
        return false;
      }
    }
    for (const auto& [tp, pos] : next) {
      int64_t lo = 0, hi = 0;
      if (rd_kafka_query_watermark_offsets(rk.get(), tp.first.c_str(), tp.second, &lo, &hi, 5000) !=
          RD_KAFKA_RESP_ERR_NO_ERROR) {
        return false;
      }
      auto it = high.find(tp);
      if (it == high.end() || it->second != hi) *moved = true;
      high[tp] = hi;
      if (!options.read_committed && pos < hi) return false;
    }
    return true;
  };

  while (taken < options.max_records && Clock::now() < deadline) {
    auto now = Clock::now();
    if (now - last_refresh >= std::chrono::seconds(1)) {
      last_refresh = now;
      refresh_assignment();
    }
    // Read for a while, then look at the watermarks.
    auto window_end = Clock::now() + std::chrono::milliseconds(250);
    while (taken < options.max_records && Clock::now() < window_end) {
      rd_kafka_message_t* m = rd_kafka_consumer_poll(rk.get(), 50);
      if (m != nullptr) take(m);
    }
    bool moved = false;
    if (!caught_up(&moved) || moved) {
      caught_up_since = Clock::time_point::max();
    } else if (caught_up_since == Clock::time_point::max()) {
      caught_up_since = Clock::now();
    } else if (Clock::now() - caught_up_since >= options.stable_for) {
      break;
    }
  }
  rd_kafka_consumer_close(rk.get());
  std::stable_sort(records.begin(), records.end(), [](const KafkaRecord& a, const KafkaRecord& b) {
    return std::tie(a.topic, a.partition, a.offset) < std::tie(b.topic, b.partition, b.offset);
  });
  return records;
}

void KafkaReader::DeleteTopics(const std::vector<std::string>& topics) {
  if (topics.empty()) return;
  try {
    RkHandle rk = MakeClient(brokers_, RD_KAFKA_PRODUCER);
    std::vector<rd_kafka_DeleteTopic_t*> del;
    for (const std::string& t : topics) del.push_back(rd_kafka_DeleteTopic_new(t.c_str()));
    rd_kafka_queue_t* q = rd_kafka_queue_new(rk.get());
    rd_kafka_DeleteTopics(rk.get(), del.data(), del.size(), nullptr, q);
    rd_kafka_event_t* ev = rd_kafka_queue_poll(q, 15000);
    if (ev == nullptr) {
      std::fprintf(stderr, "[kafka cleanup] delete topics: no answer\n");
    } else {
      if (rd_kafka_event_error(ev) != RD_KAFKA_RESP_ERR_NO_ERROR) {
        std::fprintf(stderr, "[kafka cleanup] delete topics: %s\n",
                     rd_kafka_event_error_string(ev));
      }
      rd_kafka_event_destroy(ev);
    }
    rd_kafka_DeleteTopic_destroy_array(del.data(), del.size());
    rd_kafka_queue_destroy(q);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "[kafka cleanup] %s\n", e.what());
  }
}

int32_t SaramaHashPartition(const std::string& key, int32_t partitions) {
  uint32_t h = 2166136261u;
  for (unsigned char c : key) {
    h ^= c;
    h *= 16777619u;
  }
  int32_t p = static_cast<int32_t>(h) % partitions;
  return p < 0 ? -p : p;
}

OpenKafkaTransaction::OpenKafkaTransaction(const std::string& brokers,
                                           const std::string& transactional_id,
                                           const std::string& topic, const std::string& key) {
  char err[512];
  rd_kafka_conf_t* conf = rd_kafka_conf_new();
  for (const auto& [k, v] :
       std::vector<std::pair<std::string, std::string>>{{"bootstrap.servers", brokers},
                                                        {"transactional.id", transactional_id},
                                                        {"transaction.timeout.ms", "60000"}}) {
    if (rd_kafka_conf_set(conf, k.c_str(), v.c_str(), err, sizeof(err)) != RD_KAFKA_CONF_OK) {
      throw std::runtime_error(err);
    }
  }
  rd_kafka_t* rk = rd_kafka_new(RD_KAFKA_PRODUCER, conf, err, sizeof(err));
  if (rk == nullptr) throw std::runtime_error(err);
  rk_ = rk;
  auto check = [](rd_kafka_error_t* e, const char* what) {
    if (e == nullptr) return;
    std::string text = std::string(what) + ": " + rd_kafka_error_string(e);
    rd_kafka_error_destroy(e);
    throw std::runtime_error(text);
  };
  check(rd_kafka_init_transactions(rk, 30000), "init_transactions");
  check(rd_kafka_begin_transaction(rk), "begin_transaction");
  open_ = true;
  std::string value = "{\"an\":\"open transaction of another producer\"}";
  rd_kafka_resp_err_t e =
      rd_kafka_producev(rk, RD_KAFKA_V_TOPIC(topic.c_str()),
                        RD_KAFKA_V_KEY(const_cast<char*>(key.data()), key.size()),
                        RD_KAFKA_V_VALUE(value.data(), value.size()),
                        RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY), RD_KAFKA_V_END);
  if (e != RD_KAFKA_RESP_ERR_NO_ERROR) throw std::runtime_error(rd_kafka_err2str(e));
  rd_kafka_flush(rk, 30000);  // in the log, its transaction open
}

void OpenKafkaTransaction::Commit() {
  if (!open_) return;
  open_ = false;
  if (rd_kafka_error_t* e = rd_kafka_commit_transaction(static_cast<rd_kafka_t*>(rk_), 30000)) {
    rd_kafka_error_destroy(e);
  }
}

void OpenKafkaTransaction::Abort() {
  if (!open_) return;
  open_ = false;
  if (rd_kafka_error_t* e = rd_kafka_abort_transaction(static_cast<rd_kafka_t*>(rk_), 30000)) {
    rd_kafka_error_destroy(e);
  }
}

OpenKafkaTransaction::~OpenKafkaTransaction() {
  Abort();
  rd_kafka_destroy(static_cast<rd_kafka_t*>(rk_));
}

}  // namespace outbox_test
