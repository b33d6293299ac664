// bench_kafka_admin: the two Kafka admin operations the benchmark harness needs and kcat lacks.
//
//   bench_kafka_admin create BROKERS TOPIC PARTITIONS [CONFIG=VALUE ...]
//       Creates TOPIC (replication factor: the broker's default) with topic configs, e.g.
//       message.timestamp.type=LogAppendTime, so that every record carries the broker's append
//       time. An existing topic is an error (the harness names topics per run).
//   bench_kafka_admin delete BROKERS PREFIX
//       Deletes every topic whose name starts with PREFIX (the harness's per-run topics).
//   bench_kafka_admin txn-warmup BROKERS TOPIC TRANSACTIONAL_ID
//       One transactional produce (init, begin, one record to TOPIC, commit): the broker's
//       first transactional producer after a start creates the transaction state log, which
//       must not fall on the first exactly-once contender's clock.
//   bench_kafka_admin warm-load BROKERS TOPIC SECONDS [TRANSACTIONAL_ID]
//       Produces to TOPIC for SECONDS as the at-least-once relay does (idempotent, acks=all,
//       linger 3 ms, 400-byte records with headers), then, given TRANSACTIONAL_ID, for SECONDS
//       more in Kafka transactions of 2,000 records, as the exactly-once relay does: the
//       broker's JIT compiles its produce and transaction paths here, not on a contender's
//       clock (a broker in service has run them for days).
//
// Exit status 0 on success; errors go to stderr.
#include <librdkafka/rdkafka.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

namespace {

constexpr int kTimeoutMs = 30000;

rd_kafka_t* NewProducer(const std::vector<std::pair<const char*, const char*>>& settings);

rd_kafka_t* Connect(const char* brokers) {
  rd_kafka_t* rk = NewProducer({{"bootstrap.servers", brokers}});
  if (rk == nullptr) std::exit(2);
  return rk;
}

// Waits for the admin result event of type `type` on `queue`.
rd_kafka_event_t* WaitFor(rd_kafka_queue_t* queue, rd_kafka_event_type_t type) {
  while (true) {
    rd_kafka_event_t* ev = rd_kafka_queue_poll(queue, kTimeoutMs + 5000);
    if (ev == nullptr) {
      std::fprintf(stderr, "admin request timed out\n");
      std::exit(1);
    }
    if (rd_kafka_event_type(ev) == type) return ev;
    rd_kafka_event_destroy(ev);
  }
}

int CheckTopicResults(const rd_kafka_topic_result_t** results, size_t n, const char* what) {
  int failures = 0;
  for (size_t i = 0; i < n; ++i) {
    rd_kafka_resp_err_t e = rd_kafka_topic_result_error(results[i]);
    if (e != RD_KAFKA_RESP_ERR_NO_ERROR) {
      const char* msg = rd_kafka_topic_result_error_string(results[i]);
      std::fprintf(stderr, "%s %s: %s\n", what, rd_kafka_topic_result_name(results[i]),
                   msg != nullptr ? msg : rd_kafka_err2str(e));
      ++failures;
    }
  }
  return failures == 0 ? 0 : 1;
}

int Create(const char* brokers, const char* topic, int partitions, int nconf, char** confs) {
  rd_kafka_t* rk = Connect(brokers);
  char err[512];
  rd_kafka_NewTopic_t* nt = rd_kafka_NewTopic_new(topic, partitions, -1, err, sizeof err);
  if (nt == nullptr) {
    std::fprintf(stderr, "NewTopic: %s\n", err);
    return 2;
  }
  for (int i = 0; i < nconf; ++i) {
    std::string kv = confs[i];
    size_t eq = kv.find('=');
    if (eq == std::string::npos) {
      std::fprintf(stderr, "config '%s' is not key=value\n", confs[i]);
      return 2;
    }
    if (rd_kafka_NewTopic_set_config(nt, kv.substr(0, eq).c_str(), kv.substr(eq + 1).c_str()) !=
        RD_KAFKA_RESP_ERR_NO_ERROR) {
      std::fprintf(stderr, "config '%s' refused\n", confs[i]);
      return 2;
    }
  }
  rd_kafka_AdminOptions_t* opts = rd_kafka_AdminOptions_new(rk, RD_KAFKA_ADMIN_OP_CREATETOPICS);
  rd_kafka_AdminOptions_set_operation_timeout(opts, kTimeoutMs, err, sizeof err);
  rd_kafka_queue_t* queue = rd_kafka_queue_new(rk);
  rd_kafka_CreateTopics(rk, &nt, 1, opts, queue);
  rd_kafka_event_t* ev = WaitFor(queue, RD_KAFKA_EVENT_CREATETOPICS_RESULT);
  int rc = 0;
  if (rd_kafka_event_error(ev) != RD_KAFKA_RESP_ERR_NO_ERROR) {
    std::fprintf(stderr, "CreateTopics: %s\n", rd_kafka_event_error_string(ev));
    rc = 1;
  } else {
    size_t n = 0;
    const rd_kafka_topic_result_t** res =
        rd_kafka_CreateTopics_result_topics(rd_kafka_event_CreateTopics_result(ev), &n);
    rc = CheckTopicResults(res, n, "create");
  }
  rd_kafka_event_destroy(ev);
  rd_kafka_queue_destroy(queue);
  rd_kafka_AdminOptions_destroy(opts);
  rd_kafka_NewTopic_destroy(nt);
  rd_kafka_destroy(rk);
  return rc;
}

int Delete(const char* brokers, const char* prefix) {
  rd_kafka_t* rk = Connect(brokers);
  const rd_kafka_metadata_t* md = nullptr;
  rd_kafka_resp_err_t e = rd_kafka_metadata(rk, 1, nullptr, &md, kTimeoutMs);
  if (e != RD_KAFKA_RESP_ERR_NO_ERROR) {
    std::fprintf(stderr, "metadata: %s\n", rd_kafka_err2str(e));
    return 1;
  }
  std::vector<rd_kafka_DeleteTopic_t*> victims;
  for (int i = 0; i < md->topic_cnt; ++i) {
    const char* name = md->topics[i].topic;
    if (std::strncmp(name, prefix, std::strlen(prefix)) == 0) {
      victims.push_back(rd_kafka_DeleteTopic_new(name));
      std::printf("%s\n", name);
    }
  }
  rd_kafka_metadata_destroy(md);
  int rc = 0;
  if (!victims.empty()) {
    char err[512];
    rd_kafka_AdminOptions_t* opts = rd_kafka_AdminOptions_new(rk, RD_KAFKA_ADMIN_OP_DELETETOPICS);
    rd_kafka_AdminOptions_set_operation_timeout(opts, kTimeoutMs, err, sizeof err);
    rd_kafka_queue_t* queue = rd_kafka_queue_new(rk);
    rd_kafka_DeleteTopics(rk, victims.data(), victims.size(), opts, queue);
    rd_kafka_event_t* ev = WaitFor(queue, RD_KAFKA_EVENT_DELETETOPICS_RESULT);
    if (rd_kafka_event_error(ev) != RD_KAFKA_RESP_ERR_NO_ERROR) {
      std::fprintf(stderr, "DeleteTopics: %s\n", rd_kafka_event_error_string(ev));
      rc = 1;
    } else {
      size_t n = 0;
      const rd_kafka_topic_result_t** res =
          rd_kafka_DeleteTopics_result_topics(rd_kafka_event_DeleteTopics_result(ev), &n);
      rc = CheckTopicResults(res, n, "delete");
    }
    rd_kafka_event_destroy(ev);
    rd_kafka_queue_destroy(queue);
    rd_kafka_AdminOptions_destroy(opts);
    for (auto* v : victims) rd_kafka_DeleteTopic_destroy(v);
  }
  rd_kafka_destroy(rk);
  return rc;
}

int Fail(const char* what, rd_kafka_error_t* error) {
  std::fprintf(stderr, "%s: %s\n", what, rd_kafka_error_string(error));
  rd_kafka_error_destroy(error);
  return 1;
}

// A producer with `settings`; null (the reason on stderr) when librdkafka refuses them.
rd_kafka_t* NewProducer(const std::vector<std::pair<const char*, const char*>>& settings) {
  char err[512];
  rd_kafka_conf_t* conf = rd_kafka_conf_new();
  for (auto [key, value] : settings) {
    if (rd_kafka_conf_set(conf, key, value, err, sizeof err) != RD_KAFKA_CONF_OK) {
      std::fprintf(stderr, "%s: %s\n", key, err);
      rd_kafka_conf_destroy(conf);
      return nullptr;
    }
  }
  rd_kafka_t* rk = rd_kafka_new(RD_KAFKA_PRODUCER, conf, err, sizeof err);
  if (rk == nullptr) std::fprintf(stderr, "rd_kafka_new: %s\n", err);
  return rk;
}

int TxnWarmup(const char* brokers, const char* topic, const char* transactional_id) {
  rd_kafka_t* rk =
      NewProducer({{"bootstrap.servers", brokers}, {"transactional.id", transactional_id}});
  if (rk == nullptr) return 2;
  int rc = 0;
  if (rd_kafka_error_t* e = rd_kafka_init_transactions(rk, 60000)) {
    rc = Fail("init_transactions", e);
  } else if (rd_kafka_error_t* e2 = rd_kafka_begin_transaction(rk)) {
    rc = Fail("begin_transaction", e2);
  } else {
    static const char kValue[] = "warm-up";
    rd_kafka_resp_err_t pe = rd_kafka_producev(
        rk, RD_KAFKA_V_TOPIC(topic), RD_KAFKA_V_VALUE(const_cast<char*>(kValue), sizeof kValue - 1),
        RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY), RD_KAFKA_V_END);
    if (pe != RD_KAFKA_RESP_ERR_NO_ERROR) {
      std::fprintf(stderr, "produce: %s\n", rd_kafka_err2str(pe));
      rc = 1;
    } else if (rd_kafka_error_t* e3 = rd_kafka_commit_transaction(rk, 60000)) {
      rc = Fail("commit_transaction", e3);
    }
  }
  rd_kafka_destroy(rk);
  return rc;
}

// Produces one record, waiting while librdkafka's queue is full.
bool ProduceOne(rd_kafka_t* rk, const char* topic, const std::string& key,
                const std::string& value) {
  while (true) {
    rd_kafka_resp_err_t e =
        rd_kafka_producev(rk, RD_KAFKA_V_TOPIC(topic), RD_KAFKA_V_KEY(key.data(), key.size()),
                          RD_KAFKA_V_VALUE(const_cast<char*>(value.data()), value.size()),
                          RD_KAFKA_V_HEADER("uuid", "00000000-0000-0000-0000-000000000000", 36),
                          RD_KAFKA_V_HEADER("event_type", "warm-up", 7),
                          RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY), RD_KAFKA_V_END);
    if (e == RD_KAFKA_RESP_ERR_NO_ERROR) return true;
    if (e != RD_KAFKA_RESP_ERR__QUEUE_FULL) {
      std::fprintf(stderr, "produce: %s\n", rd_kafka_err2str(e));
      return false;
    }
    rd_kafka_poll(rk, 10);
  }
}

int WarmLoad(const char* brokers, const char* topic, double seconds, const char* transactional_id) {
  const std::string value(400, 'w');
  long produced = 0;
  auto load = [&](const char* txn_id) -> int {
    std::vector<std::pair<const char*, const char*>> settings = {
        {"bootstrap.servers", brokers},
        {"enable.idempotence", "true"},
        {"acks", "all"},
        {"linger.ms", txn_id != nullptr ? "20" : "3"},
        {"queue.buffering.max.kbytes", "16384"}};
    if (txn_id != nullptr) settings.emplace_back("transactional.id", txn_id);
    rd_kafka_t* rk = NewProducer(settings);
    if (rk == nullptr) return 2;
    int rc = 0;
    if (txn_id != nullptr) {
      if (rd_kafka_error_t* e = rd_kafka_init_transactions(rk, 60000)) rc = Fail("init", e);
    }
    const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
    while (rc == 0 && std::chrono::steady_clock::now() < end) {
      if (txn_id != nullptr) {
        if (rd_kafka_error_t* e = rd_kafka_begin_transaction(rk)) {
          rc = Fail("begin_transaction", e);
          break;
        }
      }
      for (int i = 0; i < 2000 && rc == 0; ++i, ++produced) {
        if (!ProduceOne(rk, topic, "key-" + std::to_string(produced % 1000), value)) rc = 1;
        rd_kafka_poll(rk, 0);
      }
      if (rc == 0 && txn_id != nullptr) {
        if (rd_kafka_error_t* e = rd_kafka_commit_transaction(rk, 60000)) {
          rc = Fail("commit_transaction", e);
        }
      }
    }
    if (rc == 0 && rd_kafka_flush(rk, 60000) != RD_KAFKA_RESP_ERR_NO_ERROR) {
      std::fprintf(stderr, "flush timed out\n");
      rc = 1;
    }
    rd_kafka_destroy(rk);
    return rc;
  };
  int rc = load(nullptr);
  if (rc == 0 && transactional_id != nullptr) rc = load(transactional_id);
  if (rc == 0) std::printf("%ld records\n", produced);
  return rc;
}

int Usage() {
  std::fprintf(stderr,
               "usage: bench_kafka_admin create BROKERS TOPIC PARTITIONS [CONFIG=VALUE ...]\n"
               "       bench_kafka_admin delete BROKERS PREFIX\n"
               "       bench_kafka_admin txn-warmup BROKERS TOPIC TRANSACTIONAL_ID\n"
               "       bench_kafka_admin warm-load BROKERS TOPIC SECONDS [TRANSACTIONAL_ID]\n");
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc >= 5 && std::strcmp(argv[1], "create") == 0) {
    return Create(argv[2], argv[3], std::atoi(argv[4]), argc - 5, argv + 5);
  }
  if (argc == 4 && std::strcmp(argv[1], "delete") == 0) return Delete(argv[2], argv[3]);
  if (argc == 5 && std::strcmp(argv[1], "txn-warmup") == 0) {
    return TxnWarmup(argv[2], argv[3], argv[4]);
  }
  if ((argc == 5 || argc == 6) && std::strcmp(argv[1], "warm-load") == 0) {
    return WarmLoad(argv[2], argv[3], std::atof(argv[4]), argc == 6 ? argv[5] : nullptr);
  }
  return Usage();
}
