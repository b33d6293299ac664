#include "outbox_relay/kafka/producer.h"

#include <spdlog/spdlog.h>

#include <array>

namespace outbox_relay::kafka {

namespace {

// Properties whose values would let a record be lost or reordered.
Status CheckGuarantee(const std::string& key, const std::string& value) {
  if (key == "enable.idempotence" && value != "true") {
    return Fail(ErrorCode::kInvalidArgument,
                "kafka property enable.idempotence={}: must stay true (ordering under retries "
                "depends on the idempotent producer)",
                value);
  }
  if ((key == "acks" || key == "request.required.acks") && value != "all" && value != "-1") {
    return Fail(ErrorCode::kInvalidArgument,
                "kafka property {}={}: must be all (-1), anything less can lose acknowledged "
                "records",
                key, value);
  }
  return Ok();
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

}  // namespace

Result<std::map<std::string, std::string>> ProducerConfig(const ProducerOptions& options) {
  std::map<std::string, std::string> conf = {
      {"bootstrap.servers", options.brokers},
      {"client.id", "outbox-relay"},
      {"enable.idempotence", "true"},
      {"acks", "all"},
      // Never give up on a record because of time: it is acknowledged or the
      // producer fails fatally and the relay stops without confirming it.
      {"message.timeout.ms", "0"},
      {"linger.ms", "5"},
      {"partitioner", "fnv1a_random"},  // = Sarama's hash partitioner (the Go forwarder)
      {"compression.type", "none"},
      // Bounded memory: the relay keeps its own smaller in-flight bound; these
      // only stop librdkafka from buffering a whole backlog.
      {"queue.buffering.max.messages", "100000"},
      {"queue.buffering.max.kbytes", "65536"},
      {"socket.keepalive.enable", "true"},
  };
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
  rd_kafka_conf_t* conf = rd_kafka_conf_new();
  std::array<char, 512> errstr{};
  for (const auto& [key, value] : *settings) {
    if (rd_kafka_conf_set(conf, key.c_str(), value.c_str(), errstr.data(), errstr.size()) !=
        RD_KAFKA_CONF_OK) {
      rd_kafka_conf_destroy(conf);
      return Fail(ErrorCode::kInvalidArgument, "kafka property {}={}: {}", key, value,
                  errstr.data());
    }
  }
  std::unique_ptr<KafkaProducer> p(new KafkaProducer());
  p->on_delivery_ = std::move(on_delivery);
  p->options_ = options;
  p->on_error_ = std::move(on_error);
  rd_kafka_conf_set_opaque(conf, p.get());
  rd_kafka_conf_set_dr_msg_cb(conf, &KafkaProducer::OnDeliveryReport);
  rd_kafka_conf_set_error_cb(conf, &KafkaProducer::OnError);
  rd_kafka_conf_set_log_cb(conf, &KafkaProducer::OnLog);
  // On success rd_kafka_new owns conf; on failure we still do.
  rd_kafka_t* rk = rd_kafka_new(RD_KAFKA_PRODUCER, conf, errstr.data(), errstr.size());
  if (rk == nullptr) {
    rd_kafka_conf_destroy(conf);
    return Fail(ErrorCode::kInvalidArgument, "create Kafka producer: {}", errstr.data());
  }
  p->rk_.reset(rk);
  p->poller_ = std::thread([raw = p.get()] { raw->PollLoop(); });
  return p;
}

KafkaProducer::~KafkaProducer() {
  stop_.store(true);
  if (poller_.joinable()) poller_.join();
  topics_.clear();  // topic handles before the producer
  rk_.reset();
}

void KafkaProducer::PollLoop() {
  while (!stop_.load(std::memory_order_relaxed)) {
    if (flush_waiters_.load(std::memory_order_relaxed) > 0) {
      (void)rd_kafka_flush(rk_.get(), 20);  // serves reports here, on this thread
    } else {
      rd_kafka_poll(rk_.get(), 20);
    }
  }
}

rd_kafka_topic_t* KafkaProducer::Topic(std::string_view name) {
  std::lock_guard lock(topics_mu_);
  // Heterogeneous lookup needs C++20 transparent hashing; one string copy per
  // new topic is fine, but a lookup must not allocate: reuse a key buffer.
  thread_local std::string key;
  key.assign(name);
  auto it = topics_.find(key);
  if (it != topics_.end()) return it->second.get();
  if (options_.create_topics) CreateTopic(key);
  rd_kafka_topic_t* rkt = rd_kafka_topic_new(rk_.get(), key.c_str(), nullptr);
  if (rkt == nullptr) return nullptr;
  topics_.emplace(key, TopicHandle(rkt));
  return rkt;
}

void KafkaProducer::CreateTopic(const std::string& name) {
  std::array<char, 512> errstr{};
  rd_kafka_NewTopic_t* topic =
      rd_kafka_NewTopic_new(name.c_str(), options_.topic_partitions,
                            options_.topic_replication_factor, errstr.data(), errstr.size());
  if (topic == nullptr) {
    spdlog::warn("kafka: cannot create topic {}: {}", name, errstr.data());
    return;
  }
  rd_kafka_queue_t* queue = rd_kafka_queue_new(rk_.get());
  rd_kafka_AdminOptions_t* opts =
      rd_kafka_AdminOptions_new(rk_.get(), RD_KAFKA_ADMIN_OP_CREATETOPICS);
  rd_kafka_AdminOptions_set_operation_timeout(opts, 10000, errstr.data(), errstr.size());
  rd_kafka_CreateTopics(rk_.get(), &topic, 1, opts, queue);
  rd_kafka_event_t* ev = rd_kafka_queue_poll(queue, 15000);
  const rd_kafka_CreateTopics_result_t* result =
      ev != nullptr ? rd_kafka_event_CreateTopics_result(ev) : nullptr;
  if (result == nullptr) {
    spdlog::warn("kafka: creating topic {}: {}", name,
                 ev != nullptr ? rd_kafka_event_error_string(ev) : "timed out");
  } else {
    size_t count = 0;
    const rd_kafka_topic_result_t** topics = rd_kafka_CreateTopics_result_topics(result, &count);
    for (size_t i = 0; i < count; ++i) {
      rd_kafka_resp_err_t err = rd_kafka_topic_result_error(topics[i]);
      if (err == RD_KAFKA_RESP_ERR_NO_ERROR) {
        spdlog::info("kafka: created topic {} ({} partitions)", name, options_.topic_partitions);
      } else if (err != RD_KAFKA_RESP_ERR_TOPIC_ALREADY_EXISTS) {
        spdlog::warn("kafka: creating topic {}: {}", name,
                     rd_kafka_topic_result_error_string(topics[i]));
      }
    }
  }
  if (ev != nullptr) rd_kafka_event_destroy(ev);
  rd_kafka_AdminOptions_destroy(opts);
  rd_kafka_queue_destroy(queue);
  rd_kafka_NewTopic_destroy(topic);
}

Result<Sink::Accepted> KafkaProducer::Produce(const outbox::KafkaRecord& record, void* opaque) {
  rd_kafka_topic_t* rkt = Topic(record.topic);
  if (rkt == nullptr) {
    return Fail(ErrorCode::kPoison, "cannot use topic '{}': {}", record.topic,
                rd_kafka_err2str(rd_kafka_last_error()));
  }
  rd_kafka_headers_t* headers = rd_kafka_headers_new(record.headers.size());
  for (const auto& [name, value] : record.headers) {
    // A non-null pointer keeps an empty value a 0-length header, not a null one.
    const char* v = value.data() != nullptr ? value.data() : "";
    rd_kafka_header_add(headers, name.data(), static_cast<ssize_t>(name.size()), v,
                        static_cast<ssize_t>(value.size()));
  }
  const void* key = record.key ? record.key->data() : nullptr;
  size_t key_len = record.key ? record.key->size() : 0;
  const void* value = record.value ? record.value->data() : nullptr;
  size_t value_len = record.value ? record.value->size() : 0;
  rd_kafka_resp_err_t err =
      rd_kafka_producev(rk_.get(), RD_KAFKA_V_RKT(rkt), RD_KAFKA_V_PARTITION(RD_KAFKA_PARTITION_UA),
                        RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY), RD_KAFKA_V_KEY(key, key_len),
                        RD_KAFKA_V_VALUE(const_cast<void*>(value), value_len),
                        RD_KAFKA_V_HEADERS(headers), RD_KAFKA_V_OPAQUE(opaque), RD_KAFKA_V_END);
  if (err == RD_KAFKA_RESP_ERR_NO_ERROR) return Accepted::kQueued;  // headers now owned
  rd_kafka_headers_destroy(headers);
  if (err == RD_KAFKA_RESP_ERR__QUEUE_FULL) return Accepted::kQueueFull;
  if (IsPermanentForRecord(err)) {
    return Fail(ErrorCode::kPoison, "Kafka refused the record for topic '{}': {}", record.topic,
                rd_kafka_err2str(err));
  }
  if (err == RD_KAFKA_RESP_ERR__FATAL) {
    std::array<char, 512> reason{};
    rd_kafka_resp_err_t fatal = rd_kafka_fatal_error(rk_.get(), reason.data(), reason.size());
    return Fail(ErrorCode::kFatal, "Kafka producer fatal error: {}: {}", rd_kafka_err2name(fatal),
                reason.data());
  }
  return Fail(ErrorCode::kFatal, "produce to '{}': {}", record.topic, rd_kafka_err2str(err));
}

void KafkaProducer::InjectFatalErrorForTest() {
  rd_kafka_test_fatal_error(rk_.get(), RD_KAFKA_RESP_ERR_OUT_OF_ORDER_SEQUENCE_NUMBER,
                            "injected by OUTBOX_TEST_FAULT");
}

Status KafkaProducer::Flush(std::chrono::milliseconds timeout) {
  // Not rd_kafka_flush here: it would serve delivery reports on this thread
  // while the poller serves others on its own. The poller flushes instead.
  auto deadline = std::chrono::steady_clock::now() + timeout;
  flush_waiters_.fetch_add(1);
  while (rd_kafka_outq_len(rk_.get()) > 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  flush_waiters_.fetch_sub(1);
  if (rd_kafka_outq_len(rk_.get()) > 0) {
    return Fail(ErrorCode::kTransient, "Kafka flush: {} records still in flight after {} ms",
                rd_kafka_outq_len(rk_.get()), timeout.count());
  }
  return Ok();
}

bool KafkaProducer::Reachable() const { return !brokers_down_.load(std::memory_order_relaxed); }

Status KafkaProducer::CheckConnection(std::chrono::milliseconds timeout) {
  const rd_kafka_metadata_t* md = nullptr;
  rd_kafka_resp_err_t err =
      rd_kafka_metadata(rk_.get(), 0, nullptr, &md, static_cast<int>(timeout.count()));
  if (err != RD_KAFKA_RESP_ERR_NO_ERROR) {
    if (std::string refused = CredentialsError(); !refused.empty()) {
      return Fail(ErrorCode::kInvalidArgument,
                  "invalid setting --kafka-property (OUTBOX_KAFKA_PROPERTIES): the brokers "
                  "refused the connection: {} (check security.protocol, sasl.mechanisms, "
                  "sasl.username, sasl.password, ssl.ca.location)",
                  refused);
    }
    return Fail(ErrorCode::kTransient, "Kafka metadata request: {}", rd_kafka_err2str(err));
  }
  rd_kafka_metadata_destroy(md);
  brokers_down_.store(false);
  return Ok();
}

void KafkaProducer::OnDeliveryReport(rd_kafka_t* rk, const rd_kafka_message_t* msg, void* opaque) {
  auto* self = static_cast<KafkaProducer*>(opaque);
  Delivery& d = self->scratch_;
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
  rd_kafka_headers_t* all = nullptr;
  if (rd_kafka_message_headers(msg, &all) == RD_KAFKA_RESP_ERR_NO_ERROR) {
    const void* value = nullptr;
    size_t size = 0;
    if (rd_kafka_header_get_last(all, "Event-Type", &value, &size) == RD_KAFKA_RESP_ERR_NO_ERROR &&
        value != nullptr) {
      d.event_type = std::string_view(static_cast<const char*>(value), size);
    }
  }
  if (msg->err == RD_KAFKA_RESP_ERR_NO_ERROR) {
    self->brokers_down_.store(false, std::memory_order_relaxed);
  } else {
    // Content only matters when the record has to be dead-lettered.
    if (msg->key) d.key = std::string_view(static_cast<const char*>(msg->key), msg->key_len);
    if (msg->payload) {
      d.value = std::string_view(static_cast<const char*>(msg->payload), msg->len);
    }
    rd_kafka_headers_t* hdrs = nullptr;
    if (rd_kafka_message_headers(msg, &hdrs) == RD_KAFKA_RESP_ERR_NO_ERROR) {
      const char* name = nullptr;
      const void* value = nullptr;
      size_t size = 0;
      for (size_t i = 0;
           rd_kafka_header_get_all(hdrs, i, &name, &value, &size) == RD_KAFKA_RESP_ERR_NO_ERROR;
           ++i) {
        d.headers.emplace_back(name, std::string_view(static_cast<const char*>(value), size));
        d.size_bytes += std::string_view(name).size() + size;
      }
    }
    if (IsPermanentForRecord(msg->err)) {
      d.error = Error{ErrorCode::kPoison, fmt::format("Kafka refused the record for topic '{}': {}",
                                                      d.topic, rd_kafka_err2str(msg->err))};
    } else if (msg->err == RD_KAFKA_RESP_ERR__FATAL ||
               rd_kafka_fatal_error(rk, nullptr, 0) != RD_KAFKA_RESP_ERR_NO_ERROR) {
      // After a fatal error the messages still queued come back as "purged";
      // the fatal error is the reason worth reporting.
      std::array<char, 512> reason{};
      rd_kafka_resp_err_t fatal = rd_kafka_fatal_error(rk, reason.data(), reason.size());
      d.error = Error{ErrorCode::kFatal, fmt::format("Kafka producer fatal error: {}: {}",
                                                     rd_kafka_err2name(fatal), reason.data())};
    } else {
      d.error = Error{ErrorCode::kFatal, fmt::format("delivery to '{}' failed: {}", d.topic,
                                                     rd_kafka_err2str(msg->err))};
    }
  }
  self->on_delivery_(d);
}

std::string KafkaProducer::CredentialsError() const {
  std::lock_guard lock(credentials_mu_);
  return credentials_error_;
}

void KafkaProducer::OnError(rd_kafka_t* rk, int err, const char* reason, void* opaque) {
  auto* self = static_cast<KafkaProducer*>(opaque);
  auto code = static_cast<rd_kafka_resp_err_t>(err);
  if (code == RD_KAFKA_RESP_ERR__ALL_BROKERS_DOWN) self->brokers_down_.store(true);
  // Refused credentials and a certificate that does not verify: settings, not outages.
  if (code == RD_KAFKA_RESP_ERR__AUTHENTICATION ||
      (code == RD_KAFKA_RESP_ERR__SSL &&
       std::string_view(reason).find("certificate verify failed") != std::string_view::npos)) {
    std::lock_guard lock(self->credentials_mu_);
    self->credentials_error_ = reason;
  }
  if (self->on_error_) {
    self->on_error_(
        Error{code == RD_KAFKA_RESP_ERR__FATAL ? ErrorCode::kFatal : ErrorCode::kTransient,
              fmt::format("{}: {}", rd_kafka_err2name(code), reason)});
  }
  if (code == RD_KAFKA_RESP_ERR__FATAL) {
    std::array<char, 512> buf{};
    rd_kafka_resp_err_t fatal = rd_kafka_fatal_error(rk, buf.data(), buf.size());
    spdlog::error("kafka: fatal error {}: {}", rd_kafka_err2name(fatal), buf.data());
    return;
  }
  spdlog::warn("kafka: {}: {}", rd_kafka_err2name(code), reason);
}

void KafkaProducer::OnLog(const rd_kafka_t*, int level, const char* fac, const char* buf) {
  // Connection failures also arrive through the error callback (logged as
  // warnings there); the log stream is for debugging.
  if (level <= 2) {
    spdlog::error("kafka {}: {}", fac, buf);
  } else {
    spdlog::debug("kafka {}: {}", fac, buf);
  }
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
