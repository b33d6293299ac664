#include "outbox_relay/kafka/producer.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <array>
#include <charconv>

#include "outbox_relay/core/failpoint.h"

namespace outbox_relay::kafka {

namespace {

// The producer's fatal error, said as the operator needs it: a fenced
// transactional producer means another instance took this one's place.
std::string FatalErrorText(rd_kafka_resp_err_t fatal, const char* reason) {
  if (fatal == RD_KAFKA_RESP_ERR__FENCED || fatal == RD_KAFKA_RESP_ERR_PRODUCER_FENCED ||
      fatal == RD_KAFKA_RESP_ERR_INVALID_PRODUCER_EPOCH) {
    return fmt::format(
        "Kafka producer fenced: this relay was replaced: another instance took over its "
        "transactional.id ({}: {}); it publishes nothing more",
        rd_kafka_err2name(fatal), reason);
  }
  return fmt::format("Kafka producer fatal error: {}: {}", rd_kafka_err2name(fatal), reason);
}

// The producer's fatal error as the relay judges it. A transactional
// producer's is fatal: its transactions end there (kFenced when another
// instance took its place). An idempotent producer's (at-least-once) is about its
// own bookkeeping of sequence numbers (a broker answering out of order: a
// partition that lost acknowledged records, e.g. after an unclean leader
// election; before librdkafka 2.3.0 also a failover that lost nothing,
// confluentinc/librdkafka#4438, which the librdkafka the relay links no
// longer does): the producer is replaced and what it held is sent again from
// the slot (kAborted), as when Kafka does not acknowledge in time. Being
// refused the right to write at all is a setting a new producer would meet
// again.
Error FatalError(rd_kafka_resp_err_t fatal, const char* reason, bool transactional) {
  const bool refused = fatal == RD_KAFKA_RESP_ERR_CLUSTER_AUTHORIZATION_FAILED ||
                       fatal == RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED ||
                       fatal == RD_KAFKA_RESP_ERR_TRANSACTIONAL_ID_AUTHORIZATION_FAILED;
  if (transactional &&
      (fatal == RD_KAFKA_RESP_ERR__FENCED || fatal == RD_KAFKA_RESP_ERR_PRODUCER_FENCED ||
       fatal == RD_KAFKA_RESP_ERR_INVALID_PRODUCER_EPOCH)) {
    // Another instance initialised the transactional.id: this producer is
    // done for, the relay is not (it replaces the producer, app/recovery.h).
    return Error{ErrorCode::kFenced, FatalErrorText(fatal, reason)};
  }
  if (transactional || refused) return Error{ErrorCode::kFatal, FatalErrorText(fatal, reason)};
  return Error{ErrorCode::kAborted,
               fmt::format("Kafka producer failed: {}: {}; a new producer sends what it held "
                           "again from the slot",
                           rd_kafka_err2name(fatal), reason)};
}

using std::chrono::milliseconds;

// librdkafka's own default batch.size.
constexpr int64_t kDefaultBatchSize = 1000000;
// What a record adds to its key, value and headers on the wire: the record's
// varint lengths and attributes, and the batch header when it is alone.
constexpr int64_t kRecordOverhead = 128;

// Properties whose values would let a record be lost or reordered.
Status CheckGuarantee(const std::string& key, const std::string& value) {
  if (key == "enable.idempotence" && value != "true") {
    return Fail(ErrorCode::kInvalidArgument,
                "kafka property enable.idempotence={}: must stay true (ordering under retries "
                "depends on the idempotent producer)",
                value);
  }
  if ((key == "message.timeout.ms" || key == "delivery.timeout.ms") && value != "0") {
    // librdkafka skips a record that times out while queued and sends the
    // ones after it (INTRODUCTION.md, "Message timeout considerations"):
    // re-sent from the slot, the skipped one then lands after its successors.
    return Fail(ErrorCode::kInvalidArgument,
                "kafka property {}={}: must stay 0 (librdkafka would skip a timed-out record and "
                "deliver the ones after it, out of order); set --kafka-delivery-timeout-ms "
                "(OUTBOX_KAFKA_DELIVERY_TIMEOUT_MS) instead",
                key, value);
  }
  if ((key == "acks" || key == "request.required.acks") && value != "all" && value != "-1") {
    return Fail(ErrorCode::kInvalidArgument,
                "kafka property {}={}: must be all (-1), anything less can lose acknowledged "
                "records",
                key, value);
  }
  return Ok();
}

// librdkafka's reason for refusing a property may quote the value; the value
// may be a password (sasl.password, ssl.key.password): never repeat it.
std::string Redact(std::string text, const std::string& value) {
  if (value.empty()) return text;
  for (size_t at = text.find(value); at != std::string::npos; at = text.find(value, at + 3)) {
    text.replace(at, value.size(), "***");
  }
  return text;
}

bool IsSizeRefusal(rd_kafka_resp_err_t err) {
  return err == RD_KAFKA_RESP_ERR_MSG_SIZE_TOO_LARGE ||
         err == RD_KAFKA_RESP_ERR_RECORD_LIST_TOO_LARGE;
}

bool IsPermanentForRecord(rd_kafka_resp_err_t err) {
  switch (err) {
    case RD_KAFKA_RESP_ERR_MSG_SIZE_TOO_LARGE:
    case RD_KAFKA_RESP_ERR_INVALID_RECORD:
    case RD_KAFKA_RESP_ERR_RECORD_LIST_TOO_LARGE:
    case RD_KAFKA_RESP_ERR_INVALID_MSG:
    case RD_KAFKA_RESP_ERR_INVALID_MSG_SIZE:
    case RD_KAFKA_RESP_ERR__INVALID_ARG:
      return true;
    default:
      return false;
  }
}

// The batch.size of a lane for a topic whose batches may not exceed
// `max_message_bytes`: librdkafka counts the protocol framing in batch.size.
int64_t BatchSizeFor(int64_t max_message_bytes) {
  return std::max<int64_t>(1, max_message_bytes - kRecordOverhead);
}

}  // namespace

// One librdkafka instance and the thread that serves its delivery reports.
struct KafkaProducer::Lane {
  KafkaProducer* owner = nullptr;
  int64_t batch_size = 0;
  KafkaHandle rk;
  std::thread poller;
  Delivery scratch;                       // reused by this lane's poller only
  bool transactions_initialised = false;  // InitTransactions succeeded on this lane
};

// A topic the loop has produced to. Written by the admin thread until
// `ready`, read-only afterwards; never erased before the producer is gone.
struct KafkaProducer::TopicState {
  bool ready = false;  // guarded by topics_mu_
  Lane* lane = nullptr;
  TopicHandle rkt;                           // on `lane`; null: librdkafka refused the name
  TopicHandle twin_rkt;                      // transactional: on the twin lane
  std::string rkt_error;                     // why, when rkt is null
  std::optional<int64_t> max_message_bytes;  // nullopt: unknown
};

Result<std::map<std::string, std::string>> ProducerConfig(const ProducerOptions& options) {
  std::map<std::string, std::string> conf = {
      {"bootstrap.servers", options.brokers},
      {"client.id", "outbox-relay"},
      {"enable.idempotence", "true"},
      {"acks", "all"},
      // librdkafka never gives up on a record because of time: it is
      // acknowledged or the producer fails fatally. Time limits are the
      // relay's (--kafka-delivery-timeout-ms): it replaces the whole producer
      // and sends the transactions again from the slot, so no later record
      // of a partition overtakes one that timed out.
      {"message.timeout.ms", "0"},
      // 3 ms, not librdkafka's 5: at a few hundred rows/s a record waits
      // the linger alone (p99 commit -> broker append 8 ms against 10-11 at
      // 500 rows/s). Not 1: at thousands of rows/s the batches get so small
      // that the relay's CPU doubles and it falls behind (bench/analyses.md).
      {"linger.ms", "3"},
      {"partitioner", "fnv1a_random"},  // = Sarama's hash partitioner (the Go forwarder)
      {"compression.type", "none"},
      // Bounded memory: the relay keeps its own smaller in-flight bound; these
      // only stop librdkafka from buffering a whole backlog.
      {"queue.buffering.max.messages", "100000"},
      {"queue.buffering.max.kbytes", std::to_string(kMaxQueuedBytes / 1024)},
      {"socket.keepalive.enable", "true"},
  };
  if (!options.transactional_id.empty()) {
    // A transactional producer may not wait for a record longer than its
    // transaction may stay open; a record that times out fails (aborts) the
    // transaction, and the slot sends it again.
    conf["message.timeout.ms"] = std::to_string(options.transaction_timeout.count());
    conf["linger.ms"] = std::to_string(std::clamp(options.transaction_interval.count(), int64_t{3},
                                                  int64_t{kMaxTransactionLinger.count()}));
  }
  for (const auto& [key, value] : options.properties) {
    auto ok = CheckGuarantee(key, value);
    if (!ok) return std::unexpected(ok.error());
    conf[key] = value;
  }
  return conf;
}

Result<std::unique_ptr<KafkaProducer>> KafkaProducer::Create(const ProducerOptions& options,
                                                             DeliveryCallback on_delivery,
                                                             SinkErrorCallback on_error) {
  auto settings = ProducerConfig(options);
  if (!settings) return std::unexpected(settings.error());
  std::unique_ptr<KafkaProducer> p(new KafkaProducer());
  p->on_delivery_ = std::move(on_delivery);
  p->options_ = options;
  p->on_error_ = std::move(on_error);
  p->settings_ = std::move(*settings);
  p->batch_size_ = kDefaultBatchSize;
  if (options.batch_size > 0) p->settings_["batch.size"] = std::to_string(options.batch_size);
  if (auto it = p->settings_.find("batch.size"); it != p->settings_.end()) {
    int64_t v = 0;
    auto [end, ec] = std::from_chars(it->second.data(), it->second.data() + it->second.size(), v);
    if (ec == std::errc() && end == it->second.data() + it->second.size()) p->batch_size_ = v;
  }
  if (p->transactional()) {
    p->settings_["transactional.id"] = options.transactional_id;
    p->settings_["transaction.timeout.ms"] = std::to_string(options.transaction_timeout.count());
  }
  auto lane = p->LaneWithBatchSize(p->batch_size_);
  if (!lane) return std::unexpected(lane.error());
  p->default_lane_ = *lane;
  if (p->transactional()) {
    std::lock_guard lock(p->lanes_mu_);
    auto twin = p->AddLaneLocked(p->batch_size_, TwinTransactionalId(options.transactional_id));
    if (!twin) return std::unexpected(twin.error());
    p->twin_lane_ = *twin;
  }
  p->admin_ = std::thread([raw = p.get()] { raw->AdminLoop(); });
  return p;
}

Result<KafkaProducer::Lane*> KafkaProducer::LaneWithBatchSize(int64_t batch_size) {
  std::lock_guard lock(lanes_mu_);
  for (const auto& lane : lanes_) {
    if (lane->batch_size == batch_size) return lane.get();
  }
  return AddLaneLocked(batch_size, "");
}

Result<KafkaProducer::Lane*> KafkaProducer::AddLaneLocked(int64_t batch_size,
                                                          const std::string& transactional_id) {
  KafkaConfHandle conf(rd_kafka_conf_new());
  std::array<char, 512> errstr{};
  auto set = [&](const std::string& key, const std::string& value) -> Status {
    if (rd_kafka_conf_set(conf.get(), key.c_str(), value.c_str(), errstr.data(), errstr.size()) !=
        RD_KAFKA_CONF_OK) {
      return Fail(ErrorCode::kInvalidArgument, "kafka property {}: {}", key,
                  Redact(errstr.data(), value));
    }
    return Ok();
  };
  for (const auto& [key, value] : settings_) {
    if (auto st = set(key, value); !st) return std::unexpected(st.error());
  }
  if (!lanes_.empty()) {
    if (auto st = set("batch.size", std::to_string(batch_size)); !st) {
      return std::unexpected(st.error());
    }
  }
  if (!transactional_id.empty()) {
    if (auto st = set("transactional.id", transactional_id); !st) {
      return std::unexpected(st.error());
    }
  }
  auto lane = std::make_unique<Lane>();
  lane->owner = this;
  lane->batch_size = batch_size;
  rd_kafka_conf_set_opaque(conf.get(), lane.get());
  // Delivery reports and errors as events, served by this lane's poller only:
  // rd_kafka_flush (and rd_kafka_commit_transaction, which flushes) then
  // never serves them on the calling thread as well.
  rd_kafka_conf_set_events(conf.get(), RD_KAFKA_EVENT_DR | RD_KAFKA_EVENT_ERROR);
  rd_kafka_conf_set_log_cb(conf.get(), &KafkaProducer::OnLog);
  // On success rd_kafka_new owns conf; on failure we still do.
  lane->rk.reset(rd_kafka_new(RD_KAFKA_PRODUCER, conf.get(), errstr.data(), errstr.size()));
  if (!lane->rk) {
    return Fail(ErrorCode::kInvalidArgument, "create Kafka producer: {}", errstr.data());
  }
  (void)conf.release();
  lane->poller = std::thread([this, raw = lane.get()] {
    QueueHandle queue(rd_kafka_queue_get_main(raw->rk.get()));
    while (!stop_.load(std::memory_order_relaxed)) {
      EventHandle ev(rd_kafka_queue_poll(queue.get(), 20));
      if (!ev) continue;
      switch (rd_kafka_event_type(ev.get())) {
        case RD_KAFKA_EVENT_DR:
          while (const rd_kafka_message_t* msg = rd_kafka_event_message_next(ev.get())) {
            Report(*raw, msg);
          }
          break;
        case RD_KAFKA_EVENT_ERROR:
          OnError(*raw, rd_kafka_event_error(ev.get()), rd_kafka_event_error_string(ev.get()));
          break;
        default:
          break;
      }
    }
  });
  if (!lanes_.empty() && transactional_id.empty()) {
    spdlog::info(
        "kafka: a second producer lane with batch.size {} for topics with a smaller "
        "max.message.bytes",
        batch_size);
  }
  lanes_.push_back(std::move(lane));
  return lanes_.back().get();
}

KafkaProducer::~KafkaProducer() {
  {
    MutexLock lock(&topics_mu_);
    stop_.store(true);
  }
  prepare_cv_.NotifyAll();
  if (admin_.joinable()) admin_.join();
  for (auto& lane : lanes_) {
    if (lane->poller.joinable()) lane->poller.join();
  }
  // Nothing serves reports any more: drop what is still queued rather than
  // let rd_kafka_destroy wait for brokers that may be away.
  for (auto& lane : lanes_) {
    (void)rd_kafka_purge(lane->rk.get(), RD_KAFKA_PURGE_F_QUEUE | RD_KAFKA_PURGE_F_INFLIGHT);
  }
  topics_.clear();  // topic handles before their producers
  lanes_.clear();
}

rd_kafka_t* KafkaProducer::handle() const { return default_lane_->rk.get(); }

void KafkaProducer::AdminLoop() {
  while (true) {
    std::string name;
    {
      MutexLock lock(&topics_mu_);
      while (!stop_.load() && to_prepare_.empty()) prepare_cv_.Wait(&topics_mu_);
      if (stop_.load()) return;
      name = std::move(to_prepare_.front());
      to_prepare_.pop_front();
    }
    PrepareTopic(name);
  }
}

void KafkaProducer::PrepareTopic(const std::string& name) {
  rd_kafka_t* rk = handle();
  bool created = false;
  if (options_.create_topics) {
    auto st = CreateTopic(rk, name, options_.topic_partitions, options_.topic_replication_factor,
                          options_.admin_timeout, &stop_);
    created = st.has_value();
    if (!st) spdlog::warn("kafka: {}", st.error().message);
  }
  if (auto served = WaitPartitionsServed(rk, name, created, options_.admin_timeout, &stop_);
      !served && !stop_.load()) {
    spdlog::warn("kafka: {}; its records go out now and wait in librdkafka",
                 served.error().message);
  }
  auto limit = TopicMaxMessageBytes(rk, name, options_.admin_timeout, &stop_);
  std::optional<int64_t> max_message_bytes;
  if (limit) {
    max_message_bytes = *limit;
  } else if (!stop_.load()) {
    // The brokers did not answer (down?) or may not be asked: the records go
    // out now and wait in librdkafka as any others.
    spdlog::warn(
        "kafka: cannot read max.message.bytes of topic {} ({}): its batches use batch.size {}; "
        "if the topic's limit is lower, the relay stops at the first refused batch",
        name, limit.error().message, batch_size_);
  }
  Lane* lane = default_lane_;
  if (max_message_bytes && BatchSizeFor(*max_message_bytes) < batch_size_ && transactional()) {
    // A transaction is one producer's: no second lane. The pipeline starts
    // again with a producer whose batches fit every topic.
    int64_t wanted = BatchSizeFor(*max_message_bytes);
    int64_t seen = required_batch_size_.load();
    while ((seen == 0 || wanted < seen) &&
           !required_batch_size_.compare_exchange_weak(seen, wanted)) {
    }
    spdlog::info(
        "kafka: topic {} accepts batches of at most {} bytes: the transactional producer "
        "starts again with batch.size {}",
        name, *max_message_bytes, wanted);
  } else if (max_message_bytes && BatchSizeFor(*max_message_bytes) < batch_size_) {
    auto smaller = LaneWithBatchSize(BatchSizeFor(*max_message_bytes));
    if (smaller) {
      lane = *smaller;
      spdlog::info(
          "kafka: topic {} accepts batches of at most {} bytes: its records go through "
          "the lane with batch.size {}",
          name, *max_message_bytes, lane->batch_size);
    } else {
      spdlog::error("kafka: {}", smaller.error().message);
    }
  }
  TopicHandle rkt(rd_kafka_topic_new(lane->rk.get(), name.c_str(), nullptr));
  std::string rkt_error = rkt ? "" : rd_kafka_err2str(rd_kafka_last_error());  // this thread's
  TopicHandle twin_rkt;
  if (rkt && twin_lane_ != nullptr) {
    twin_rkt.reset(rd_kafka_topic_new(twin_lane_->rk.get(), name.c_str(), nullptr));
    if (!twin_rkt) {
      rkt_error = rd_kafka_err2str(rd_kafka_last_error());
      rkt.reset();
    }
  }
  MutexLock lock(&topics_mu_);
  TopicState& state = *topics_.at(name);
  state.lane = lane;
  state.rkt = std::move(rkt);
  state.twin_rkt = std::move(twin_rkt);
  state.rkt_error = std::move(rkt_error);
  state.max_message_bytes = max_message_bytes;
  state.ready = true;
}

Result<Sink::Accepted> KafkaProducer::Produce(const outbox::KafkaRecord& record, void* opaque) {
  TopicState* topic = nullptr;
  {
    MutexLock lock(&topics_mu_);
    // Heterogeneous lookup needs C++20 transparent hashing; a lookup must not
    // allocate: reuse a key buffer.
    thread_local std::string key;
    key.assign(record.topic);
    auto it = topics_.find(key);
    if (it == topics_.end()) {
      topics_.emplace(key, std::make_unique<TopicState>());
      to_prepare_.push_back(key);
      prepare_cv_.NotifyOne();
      return Accepted::kQueueFull;  // not yet: the admin thread prepares the topic
    }
    if (!it->second->ready) return Accepted::kQueueFull;
    topic = it->second.get();
  }
  if (!topic->rkt) {
    return Fail(ErrorCode::kPoison, "cannot use topic '{}': {}", record.topic, topic->rkt_error);
  }
  if (int64_t wanted = required_batch_size_.load(std::memory_order_relaxed); wanted != 0) {
    return Fail(ErrorCode::kAborted,
                "topic '{}' needs batches of at most {} bytes: the transactional producer starts "
                "again with that batch.size",
                record.topic, wanted);
  }
  rd_kafka_t* rk = topic->lane->rk.get();
  rd_kafka_topic_t* rkt = topic->rkt.get();
  if (twin_lane_ != nullptr && twin_active_.load(std::memory_order_relaxed)) {
    rk = twin_lane_->rk.get();
    rkt = topic->twin_rkt.get();
  }
  HeadersHandle headers(rd_kafka_headers_new(record.headers.size()));
  int64_t bytes = 0;
  for (const auto& [name, value] : record.headers) {
    bytes += static_cast<int64_t>(name.size() + value.size());
    // A non-null pointer keeps an empty value a 0-length header, not a null one.
    const char* v = value.data() != nullptr ? value.data() : "";
    rd_kafka_header_add(headers.get(), name.data(), static_cast<ssize_t>(name.size()), v,
                        static_cast<ssize_t>(value.size()));
  }
  const void* key = record.key ? record.key->data() : nullptr;
  size_t key_len = record.key ? record.key->size() : 0;
  if (record.key && key == nullptr) key = "";  // an empty key is a 0-length key, not null
  const void* value = record.value ? record.value->data() : nullptr;
  size_t value_len = record.value ? record.value->size() : 0;
  if (record.value && value == nullptr) value = "";
  rd_kafka_resp_err_t err = rd_kafka_producev(
      rk, RD_KAFKA_V_RKT(rkt), RD_KAFKA_V_PARTITION(RD_KAFKA_PARTITION_UA),
      RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY), RD_KAFKA_V_KEY(key, key_len),
      RD_KAFKA_V_VALUE(const_cast<void*>(value), value_len), RD_KAFKA_V_HEADERS(headers.get()),
      RD_KAFKA_V_OPAQUE(opaque), RD_KAFKA_V_END);
  if (err == RD_KAFKA_RESP_ERR_NO_ERROR) {
    (void)headers.release();  // owned by the message now
    // Report takes the same sum off: the message's key, value and headers.
    bytes_in_flight_.fetch_add(bytes + static_cast<int64_t>(key_len + value_len),
                               std::memory_order_relaxed);
    return Accepted::kQueued;
  }
  if (err == RD_KAFKA_RESP_ERR__QUEUE_FULL) return Accepted::kQueueFull;
  if (IsPermanentForRecord(err)) {
    return Fail(ErrorCode::kPoison, "Kafka refused the record for topic '{}': {}", record.topic,
                rd_kafka_err2str(err));
  }
  if (err == RD_KAFKA_RESP_ERR__FATAL) {
    std::array<char, 512> reason{};
    rd_kafka_resp_err_t fatal = rd_kafka_fatal_error(rk, reason.data(), reason.size());
    return std::unexpected(FatalError(fatal, reason.data(), transactional()));
  }
  if (err == RD_KAFKA_RESP_ERR__STATE && transactional()) {
    // The Kafka transaction takes no more records: one of its records failed
    // (an abortable error) before this thread saw its report. The transaction
    // is aborted and the slot sends its rows again.
    return Fail(ErrorCode::kAborted,
                "produce to '{}': the Kafka transaction takes no more records ({}): it is "
                "aborted and its rows are sent again",
                record.topic, rd_kafka_err2str(err));
  }
  return Fail(ErrorCode::kFatal, "produce to '{}': {}", record.topic, rd_kafka_err2str(err));
}

void KafkaProducer::InjectFatalErrorForTest() {
  if constexpr (failpoint::kCompiledIn) {
    rd_kafka_test_fatal_error(TransactionLane()->rk.get(),
                              RD_KAFKA_RESP_ERR_OUT_OF_ORDER_SEQUENCE_NUMBER,
                              "injected by OUTBOX_TEST_FAULT");
  }
}

Status KafkaProducer::Flush(std::chrono::milliseconds timeout) {
  // Reports are events (see LaneWithBatchSize): rd_kafka_flush sends what
  // linger holds back and waits, while the pollers serve the reports.
  auto deadline = std::chrono::steady_clock::now() + timeout;
  std::vector<rd_kafka_t*> handles;
  {
    std::lock_guard lock(lanes_mu_);
    for (const auto& lane : lanes_) handles.push_back(lane->rk.get());
  }
  int left = 0;
  for (rd_kafka_t* rk : handles) {
    auto remaining = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    (void)rd_kafka_flush(rk, static_cast<int>(std::max<int64_t>(0, remaining.count())));
    left += rd_kafka_outq_len(rk);
  }
  if (left > 0) {
    return Fail(ErrorCode::kTransient, "Kafka flush: {} records still in flight after {} ms", left,
                timeout.count());
  }
  return Ok();
}

bool KafkaProducer::Reachable() const { return !brokers_down_.load(std::memory_order_relaxed); }

Status KafkaProducer::CheckConnection(std::chrono::milliseconds timeout) {
  const rd_kafka_metadata_t* md = nullptr;
  rd_kafka_resp_err_t err =
      rd_kafka_metadata(handle(), 0, nullptr, &md, static_cast<int>(timeout.count()));
  if (err != RD_KAFKA_RESP_ERR_NO_ERROR) {
    if (std::string refused = CredentialsError(); !refused.empty()) {
      // SASL/OAUTHBEARER with OIDC: librdkafka got no token from the token
      // endpoint, so it never reached the brokers; its own settings are the ones to check.
      const bool no_token = refused.find("OAUTHBEARER token") != std::string::npos;
      return Fail(ErrorCode::kInvalidArgument,
                  "invalid setting --kafka-property (OUTBOX_KAFKA_PROPERTIES): {}: {} (check {})",
                  no_token ? "no token from the OAuth/OIDC token endpoint"
                           : "the brokers refused the connection",
                  refused,
                  no_token ? "sasl.oauthbearer.method, sasl.oauthbearer.client.id, "
                             "sasl.oauthbearer.client.secret, sasl.oauthbearer.token.endpoint.url"
                           : "security.protocol, sasl.mechanisms, sasl.username, sasl.password, "
                             "ssl.ca.location");
    }
    return Fail(ErrorCode::kTransient, "Kafka metadata request: {}", rd_kafka_err2str(err));
  }
  MetadataHandle owned(md);
  brokers_down_.store(false);
  return Ok();
}

void KafkaProducer::Report(Lane& lane, const rd_kafka_message_t* msg) {
  rd_kafka_t* rk = lane.rk.get();
  Delivery& d = lane.scratch;
  d.opaque = msg->_private;
  d.error.reset();
  d.topic = rd_kafka_topic_name(msg->rkt);
  d.partition = msg->partition;
  d.offset = msg->offset;
  d.latency = std::chrono::microseconds(rd_kafka_message_latency(msg));
  d.key.reset();
  d.value.reset();
  d.headers.clear();
  d.size_bytes = msg->len + msg->key_len;
  d.event_type = {};
  const bool failed = msg->err != RD_KAFKA_RESP_ERR_NO_ERROR;
  rd_kafka_headers_t* all = nullptr;
  if (rd_kafka_message_headers(msg, &all) == RD_KAFKA_RESP_ERR_NO_ERROR) {
    const char* name = nullptr;
    const void* value = nullptr;
    size_t size = 0;
    for (size_t i = 0;
         rd_kafka_header_get_all(all, i, &name, &value, &size) == RD_KAFKA_RESP_ERR_NO_ERROR; ++i) {
      std::string_view n(name);
      std::string_view v(static_cast<const char*>(value), value != nullptr ? size : 0);
      if (n == "Event-Type" && value != nullptr) d.event_type = v;  // the last one, as Kafka's
      // Content only matters when the record has to be dead-lettered.
      if (failed) d.headers.emplace_back(n, v);
      d.size_bytes += n.size() + size;
    }
  }
  bytes_in_flight_.fetch_sub(static_cast<int64_t>(d.size_bytes), std::memory_order_relaxed);
  if (!failed) {
    brokers_down_.store(false, std::memory_order_relaxed);
    on_delivery_(d);
    return;
  }
  if (msg->key) d.key = std::string_view(static_cast<const char*>(msg->key), msg->key_len);
  if (msg->payload) d.value = std::string_view(static_cast<const char*>(msg->payload), msg->len);
  if (IsSizeRefusal(msg->err)) {
    // The broker judged a whole batch. The record alone was refused only if
    // it was batched alone (as large as batch.size) or the lane's batches fit
    // the topic's limit.
    std::optional<int64_t> limit;
    {
      MutexLock lock(&topics_mu_);
      thread_local std::string key;
      key.assign(d.topic);
      if (auto it = topics_.find(key); it != topics_.end()) limit = it->second->max_message_bytes;
    }
    int64_t record = static_cast<int64_t>(d.size_bytes) + kRecordOverhead;
    bool alone = record >= lane.batch_size;
    bool batches_fit = limit && lane.batch_size <= *limit;
    if (!alone && !batches_fit && !(limit && record > *limit)) {
      d.error = Error{
          ErrorCode::kFatal,
          fmt::format(
              "Kafka refused a batch for topic '{}' as too large ({}), and not for one record: "
              "the topic's max.message.bytes ({}) is below the producer's batch.size ({}). "
              "Nothing was dead-lettered and nothing past it is confirmed. Let the relay's user "
              "describe the topic's configuration (then it sizes batches itself), or set "
              "--kafka-property batch.size=<below the topic's max.message.bytes>",
              d.topic, rd_kafka_err2str(msg->err),
              limit ? std::to_string(*limit) : std::string("unknown"), lane.batch_size)};
      on_delivery_(d);
      return;
    }
  }
  if (IsPermanentForRecord(msg->err)) {
    d.error = Error{ErrorCode::kPoison, fmt::format("Kafka refused the record for topic '{}': {}",
                                                    d.topic, rd_kafka_err2str(msg->err))};
  } else if (transactional() && msg->err != RD_KAFKA_RESP_ERR__FATAL &&
             rd_kafka_fatal_error(rk, nullptr, 0) == RD_KAFKA_RESP_ERR_NO_ERROR) {
    // In a transaction a failed record fails the transaction: it is aborted
    // and what it held is sent again (purged records come back this way too).
    d.error = Error{ErrorCode::kAborted, fmt::format("delivery to '{}' failed: {}", d.topic,
                                                     rd_kafka_err2str(msg->err))};
  } else if (msg->err == RD_KAFKA_RESP_ERR__FATAL ||
             rd_kafka_fatal_error(rk, nullptr, 0) != RD_KAFKA_RESP_ERR_NO_ERROR) {
    // After a fatal error the messages still queued come back as "purged";
    // the fatal error is the reason worth reporting.
    std::array<char, 512> reason{};
    rd_kafka_resp_err_t fatal = rd_kafka_fatal_error(rk, reason.data(), reason.size());
    d.error = FatalError(fatal, reason.data(), transactional());
  } else {
    d.error = Error{ErrorCode::kFatal, fmt::format("delivery to '{}' failed: {}", d.topic,
                                                   rd_kafka_err2str(msg->err))};
  }
  on_delivery_(d);
}

std::string KafkaProducer::CredentialsError() const {
  MutexLock lock(&credentials_mu_);
  return credentials_error_;
}

void KafkaProducer::OnError(Lane& lane, rd_kafka_resp_err_t code, const char* reason) {
  if (code == RD_KAFKA_RESP_ERR__ALL_BROKERS_DOWN) brokers_down_.store(true);
  // Refused credentials and a certificate that does not verify: settings, not outages.
  if (code == RD_KAFKA_RESP_ERR__AUTHENTICATION ||
      (code == RD_KAFKA_RESP_ERR__SSL &&
       std::string_view(reason).find("certificate verify failed") != std::string_view::npos)) {
    MutexLock lock(&credentials_mu_);
    credentials_error_ = reason;
  }
  if (on_error_) {
    on_error_(Error{code == RD_KAFKA_RESP_ERR__FATAL ? ErrorCode::kFatal : ErrorCode::kTransient,
                    fmt::format("{}: {}", rd_kafka_err2name(code), reason)});
  }
  if (code == RD_KAFKA_RESP_ERR__FATAL) {
    std::array<char, 512> buf{};
    rd_kafka_resp_err_t fatal = rd_kafka_fatal_error(lane.rk.get(), buf.data(), buf.size());
    spdlog::error("kafka: fatal error {}: {}", rd_kafka_err2name(fatal), buf.data());
    return;
  }
  spdlog::warn("kafka: {}: {}", rd_kafka_err2name(code), reason);
}

void KafkaProducer::OnLog(const rd_kafka_t* rk, int level, const char* fac, const char* buf) {
  // Connection failures also arrive through the error callback (logged as
  // warnings there); the log stream is for debugging. The instance's name
  // tells a transactional producer's two lanes apart.
  const char* name = rk != nullptr ? rd_kafka_name(rk) : "";
  if (level <= 2) {
    spdlog::error("kafka {} {}: {}", name, fac, buf);
  } else {
    spdlog::debug("kafka {} {}: {}", name, fac, buf);
  }
}

namespace {

// A transactional API error as the relay judges it; consumes `error`.
Error TxnError(rd_kafka_error_t* error, std::string_view what) {
  ErrorHandle owned(error);
  rd_kafka_resp_err_t code = rd_kafka_error_code(error);
  std::string text = rd_kafka_error_string(error);
  if (code == RD_KAFKA_RESP_ERR__FENCED || code == RD_KAFKA_RESP_ERR_PRODUCER_FENCED ||
      code == RD_KAFKA_RESP_ERR_INVALID_PRODUCER_EPOCH) {
    return Error{ErrorCode::kFenced,
                 fmt::format("{}: this relay was replaced: another instance took over its "
                             "transactional.id and fenced it ({}); it publishes nothing more",
                             what, text)};
  }
  if (rd_kafka_error_is_fatal(error)) {
    return Error{ErrorCode::kFatal, fmt::format("{}: fatal: {}", what, text)};
  }
  if (rd_kafka_error_txn_requires_abort(error)) {
    return Error{ErrorCode::kAborted, fmt::format("{}: {}", what, text)};
  }
  if (rd_kafka_error_is_retriable(error)) {
    return Error{ErrorCode::kTransient, fmt::format("{}: {}", what, text)};
  }
  return Error{ErrorCode::kFatal, fmt::format("{}: {}", what, text)};
}

}  // namespace

std::string TwinTransactionalId(const std::string& transactional_id) {
  return transactional_id + ".2";
}

KafkaProducer::Lane* KafkaProducer::TransactionLane(int lane) const {
  return lane == 1 && twin_lane_ != nullptr ? twin_lane_ : default_lane_;
}

int KafkaProducer::OpenLane() const {
  return twin_lane_ != nullptr && twin_active_.load(std::memory_order_acquire) ? 1 : 0;
}

Status KafkaProducer::InitTransactions(std::chrono::milliseconds timeout) {
  // Both transactional.ids: each fences its earlier producers and completes
  // what they left open, whichever of the two a predecessor was using.
  // A lane done in an earlier call (the other one timed out) is not asked
  // again: librdkafka refuses a second init of a ready producer.
  for (Lane* lane : {default_lane_, twin_lane_}) {
    if (lane == nullptr || lane->transactions_initialised) continue;
    if (rd_kafka_error_t* e =
            rd_kafka_init_transactions(lane->rk.get(), static_cast<int>(timeout.count()))) {
      return std::unexpected(TxnError(
          e,
          fmt::format("Kafka: init transactions of transactional.id {} (the relay uses {} and "
                      "{}: grant both, or a prefixed ACL)",
                      lane == twin_lane_ ? TwinTransactionalId(options_.transactional_id)
                                         : options_.transactional_id,
                      options_.transactional_id, TwinTransactionalId(options_.transactional_id))));
    }
    lane->transactions_initialised = true;
  }
  twin_active_.store(false);
  return Ok();
}

Status KafkaProducer::BeginTransaction() {
  if (rd_kafka_error_t* e = rd_kafka_begin_transaction(TransactionLane()->rk.get())) {
    return std::unexpected(TxnError(e, "Kafka: begin transaction"));
  }
  return Ok();
}

Status KafkaProducer::FlushTransaction(std::chrono::milliseconds timeout) {
  // Sends what lingers at once, and waits for every acknowledgement (or
  // failure: a failed record fails the commit that follows).
  if (rd_kafka_resp_err_t err =
          rd_kafka_flush(TransactionLane()->rk.get(), static_cast<int>(timeout.count()));
      err != RD_KAFKA_RESP_ERR_NO_ERROR) {
    return Fail(ErrorCode::kTransient,
                "Kafka: the transaction's records are not all acknowledged after {} ms: {}",
                timeout.count(), rd_kafka_err2str(err));
  }
  return Ok();
}

int KafkaProducer::HandOver() {
  int ending = OpenLane();
  if (twin_lane_ != nullptr) twin_active_.store(ending == 0, std::memory_order_release);
  return ending;
}

Status KafkaProducer::CommitTransaction(int lane, std::chrono::milliseconds timeout) {
  if (rd_kafka_error_t* e = rd_kafka_commit_transaction(TransactionLane(lane)->rk.get(),
                                                        static_cast<int>(timeout.count()))) {
    return std::unexpected(TxnError(e, "Kafka: commit transaction"));
  }
  return Ok();
}

Status KafkaProducer::AbortTransaction(int lane, std::chrono::milliseconds timeout) {
  if (rd_kafka_error_t* e = rd_kafka_abort_transaction(TransactionLane(lane)->rk.get(),
                                                       static_cast<int>(timeout.count()))) {
    return std::unexpected(TxnError(e, "Kafka: abort transaction"));
  }
  return Ok();
}

std::optional<int64_t> KafkaProducer::RequiredBatchSize() const {
  int64_t v = required_batch_size_.load();
  return v == 0 ? std::nullopt : std::optional<int64_t>(v);
}

Result<Sink::Accepted> NullSink::Produce(const outbox::KafkaRecord& record, void* opaque) {
  delivery_.opaque = opaque;
  delivery_.topic = record.topic;
  delivery_.partition = 0;
  delivery_.offset = -1;
  delivery_.size_bytes = (record.value ? record.value->size() : 0);
  on_delivery_(delivery_);
  return Accepted::kQueued;
}

}  // namespace outbox_relay::kafka
