// Helpers of the resilience tests (resilience_{kafka,pg,poison,schema}_test.cc):
// the relay's memory from /proc, samplers of the slot and of the relay's RSS,
// writers that survive a database restart, the committed rows as the table
// holds them, the commit-LSN index, /metrics, and topics with their own
// settings. Header-only: tests/integration/CMakeLists.txt builds *_test.cc.
#pragma once

#include <arpa/inet.h>
#include <fmt/format.h>
#include <librdkafka/rdkafka.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "support/http_get.h"
#include "support/pg.h"
#include "support/throwaway_pg.h"
#include "support/workload.h"

namespace outbox_test::resilience {

using std::chrono::milliseconds;
using std::chrono::seconds;

// How many times `needle` occurs in `text` (lines of a relay's log).
inline size_t CountOccurrences(std::string_view text, std::string_view needle) {
  size_t n = 0;
  for (size_t at = text.find(needle); at != std::string_view::npos;
       at = text.find(needle, at + needle.size())) {
    ++n;
  }
  return n;
}

// The crash loops' mix: 1-50 rows, a tenth rolled back, a tenth with a
// rolled-back savepoint, a tenth also writing another table.
inline TxSpec MixedTx(std::mt19937_64& rng) {
  TxSpec tx;
  tx.rows = 1 + static_cast<int>(rng() % 50);
  tx.rollback = rng() % 10 == 0;
  if (rng() % 10 == 0) tx.savepoint_rolled_back_rows = 1 + static_cast<int>(rng() % 3);
  if (rng() % 10 == 0) tx.other_table_rows = 5;
  return tx;
}

// A field of /proc/<pid>/status in kB ("VmRSS", "VmHWM"); -1 when unreadable.
inline long ProcStatusKb(pid_t pid, const std::string& field) {
  std::ifstream in(fmt::format("/proc/{}/status", static_cast<int>(pid)));
  for (std::string line; std::getline(in, line);) {
    if (line.compare(0, field.size() + 1, field + ":") == 0) {
      return std::atol(line.c_str() + field.size() + 1);
    }
  }
  return -1;
}

inline double Mb(long kb) { return static_cast<double>(kb) / 1024.0; }

// Samples a process's VmRSS every 100 ms on a thread of its own.
class RssSampler {
 public:
  explicit RssSampler(pid_t pid) : pid_(pid) {
    thread_ = std::thread([this] {
      while (!stop_) {
        long kb = ProcStatusKb(pid_, "VmRSS");
        if (kb > 0) {
          last_ = kb;
          peak_ = std::max(peak_.load(), kb);
        }
        std::this_thread::sleep_for(milliseconds(100));
      }
    });
  }
  ~RssSampler() { Stop(); }
  void Stop() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
  }
  long peak_kb() const { return peak_; }
  long last_kb() const { return last_; }

 private:
  pid_t pid_;
  std::atomic<bool> stop_{false};
  std::atomic<long> peak_{0};
  std::atomic<long> last_{0};
  std::thread thread_;
};

// Samples the slot every 100 ms on its own connection: the highest
// confirmed_flush_lsn seen since the last Reset(), and the walsender pids that
// held it (a new pid: the relay reconnected). Errors (the server restarting)
// are counted and the connection is opened again.
class SlotSampler {
 public:
  SlotSampler(std::string url, std::string slot) : url_(std::move(url)), slot_(std::move(slot)) {
    thread_ = std::thread([this] { Loop(); });
  }
  ~SlotSampler() { Stop(); }
  void Stop() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
  }
  // Starts a new window for max_confirmed().
  void Reset() {
    std::lock_guard lock(mu_);
    max_confirmed_ = 0;
  }
  uint64_t max_confirmed() const {
    std::lock_guard lock(mu_);
    return max_confirmed_;
  }
  std::set<int> walsender_pids() const {
    std::lock_guard lock(mu_);
    return pids_;
  }
  size_t inactive_samples() const { return inactive_; }
  size_t errors() const { return errors_; }

 private:
  void Loop() {
    std::optional<Pg> pg;
    while (!stop_) {
      try {
        if (!pg) pg.emplace(url_, "outbox-it-slot-sampler");
        auto s = QuerySlot(*pg, slot_);
        std::lock_guard lock(mu_);
        if (s && s->confirmed_flush_lsn) {
          max_confirmed_ = std::max(max_confirmed_, *s->confirmed_flush_lsn);
        }
        if (s && s->active_pid) pids_.insert(*s->active_pid);
        if (s && !s->active) ++inactive_;
      } catch (const std::exception&) {
        ++errors_;
        pg.reset();
      }
      std::this_thread::sleep_for(milliseconds(100));
    }
  }

  std::string url_;
  std::string slot_;
  mutable std::mutex mu_;
  uint64_t max_confirmed_ = 0;
  std::set<int> pids_;
  std::atomic<size_t> inactive_{0};
  std::atomic<size_t> errors_{0};
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

// The rows the table holds (what committed, whatever the writers heard back),
// as CheckDelivery needs them: uuid, aggregate, per-aggregate seq, xid.
// Polls `probe` every 100 ms until it returns true or `timeout` passes; an
// exception counts as "not yet" (a server restarting or promoting: ask again).
template <typename Probe>
bool WaitFor(Probe probe, std::chrono::milliseconds timeout) {
  auto until = std::chrono::steady_clock::now() + timeout;
  while (true) {
    try {
      if (probe()) return true;
    } catch (const std::exception&) {
      // ask again
    }
    if (std::chrono::steady_clock::now() >= until) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

inline std::vector<WrittenRow> RowsFromTable(Pg& db, const std::string& table) {
  std::vector<WrittenRow> out;
  for (const Row& r :
       db.Query(fmt::format("SELECT uuid, metadata->>'Aggregate-Id', (payload->>'seq')::bigint, "
                            "transaction_id::text FROM {} ORDER BY offset_consumed",
                            QuoteIdent(table)))) {
    WrittenRow w;
    w.uuid = r[0].value_or("");
    w.aggregate = r[1].value_or("");
    w.seq = r[2] ? std::stoll(*r[2]) : 0;
    w.xid = r[3].value_or("");
    out.push_back(std::move(w));
  }
  return out;
}

// The lowest commit LSN the commit index (outbox_relay.commits) records for
// any of `xids`; nullopt when it has none of them.
inline std::optional<uint64_t> MinCommitLsn(Pg& db, const std::string& slot,
                                            const std::vector<std::string>& xids) {
  if (xids.empty()) return std::nullopt;
  std::string array = "{";
  for (size_t i = 0; i < xids.size(); ++i) array += (i > 0 ? "," : "") + xids[i];
  array += "}";
  auto v = db.Scalar(
      "SELECT min(commit_lsn)::text FROM outbox_relay.commits "
      "WHERE slot_name = $1 AND transaction_ids && $2::xid8[]",
      {slot, array});
  if (!v) return std::nullopt;
  return ParseLsn(*v);
}

// The xids of the transactions in `rows` (each once).
inline std::vector<std::string> Xids(const std::vector<WrittenRow>& rows) {
  std::set<std::string> s;
  for (const WrittenRow& r : rows) s.insert(r.xid);
  return {s.begin(), s.end()};
}

// pg_ctl of a throwaway cluster, e.g. PgCtl(cluster, "restart -m fast"): its
// log goes on into the cluster's postgres.log; restart keeps the options the
// cluster was started with (postmaster.opts). Throws on failure.
inline void PgCtl(const ThrowawayPostgres& cluster, const std::string& args) {
  std::string cmd = fmt::format(
      "{2}/pg_ctl -D {0}/data -l {0}/postgres.log -w -t 60 {1} "
      "> /dev/null",
      cluster.dir(), args, cluster.bin());
  if (::geteuid() == 0) cmd = "runuser -u postgres -- " + cmd;
  int rc = std::system(cmd.c_str());
  if (rc != 0) {
    throw std::runtime_error(
        fmt::format("pg_ctl {} failed ({}): see {}/postgres.log", args, rc, cluster.dir()));
  }
}

// Creates `topic` with `partitions` and topic-level `configs` (e.g.
// max.message.bytes) through the admin API. Throws on failure.
inline void CreateTopic(const std::string& brokers, const std::string& topic, int partitions,
                        const std::map<std::string, std::string>& configs) {
  char err[512];
  rd_kafka_conf_t* conf = rd_kafka_conf_new();
  rd_kafka_conf_set(conf, "bootstrap.servers", brokers.c_str(), err, sizeof err);
  rd_kafka_conf_set(conf, "log_level", "3", err, sizeof err);
  rd_kafka_t* rk = rd_kafka_new(RD_KAFKA_PRODUCER, conf, err, sizeof err);
  if (rk == nullptr) {
    rd_kafka_conf_destroy(conf);
    throw std::runtime_error(std::string("rd_kafka_new: ") + err);
  }
  rd_kafka_NewTopic_t* nt = rd_kafka_NewTopic_new(topic.c_str(), partitions, -1, err, sizeof err);
  std::string error;
  if (nt == nullptr) error = err;
  for (const auto& [k, v] : configs) {
    if (nt != nullptr) rd_kafka_NewTopic_set_config(nt, k.c_str(), v.c_str());
  }
  if (nt != nullptr) {
    rd_kafka_queue_t* q = rd_kafka_queue_new(rk);
    rd_kafka_CreateTopics(rk, &nt, 1, nullptr, q);
    rd_kafka_event_t* ev = rd_kafka_queue_poll(q, 30000);
    const rd_kafka_CreateTopics_result_t* res =
        ev != nullptr ? rd_kafka_event_CreateTopics_result(ev) : nullptr;
    if (res == nullptr) {
      error = ev != nullptr ? rd_kafka_event_error_string(ev) : "timed out";
    } else {
      size_t n = 0;
      const rd_kafka_topic_result_t** t = rd_kafka_CreateTopics_result_topics(res, &n);
      for (size_t i = 0; i < n; ++i) {
        if (rd_kafka_topic_result_error(t[i]) != RD_KAFKA_RESP_ERR_NO_ERROR) {
          error = rd_kafka_topic_result_error_string(t[i]);
        }
      }
    }
    if (ev != nullptr) rd_kafka_event_destroy(ev);
    rd_kafka_queue_destroy(q);
    rd_kafka_NewTopic_destroy(nt);
  }
  rd_kafka_destroy(rk);
  if (!error.empty()) throw std::runtime_error("create topic " + topic + ": " + error);
}

}  // namespace outbox_test::resilience
