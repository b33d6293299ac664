// A Kafka cluster in memory for the exactly-once tests: transactions on two
// lanes as the transactional KafkaProducer has them, producer epochs (an Init
// fences the producers before it), read_committed visibility, the progress
// topic, and a journal of every durable step.
//
// The journal is what makes "a cut at every step" cheap: a run appends each
// state change that survives a crash (a Kafka commit, a mark in the table, a
// confirmation to the slot) in the order it happened; the state a crash after
// any prefix of it leaves is rebuilt from that prefix (DurableState), and a new
// "process" is started on it.
#pragma once

#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "outbox_relay/kafka/sink.h"
#include "outbox_relay/tracking/ack_tracker.h"

namespace outbox_relay::pipeline::fakes {

// A record as the fake sink keeps it.
struct Produced {
  std::string topic;
  std::optional<std::string> key;
  std::optional<std::string> value;
  std::vector<std::pair<std::string, std::string>> headers;
  void* opaque = nullptr;
  bool settled = false;

  std::string Header(const std::string& name) const {
    for (const auto& [k, v] : headers) {
      if (k == name) return v;
    }
    return "<none>";
  }
};

// One step that survives a crash.
struct Durable {
  enum class Kind { kCommit, kMark, kConfirm };
  Kind kind = Kind::kCommit;
  std::vector<Produced> records;           // kCommit: its data records
  std::optional<std::string> progress;     // kCommit: its progress record
  std::vector<tracking::RowRange> marked;  // kMark
  Lsn confirmed;                           // kConfirm
};

class Journal {
 public:
  void Add(Durable d) {
    std::lock_guard lock(mu_);
    events_.push_back(std::move(d));
  }
  std::vector<Durable> events() const {
    std::lock_guard lock(mu_);
    return events_;
  }

 private:
  mutable std::mutex mu_;
  std::vector<Durable> events_;
};

// What a crash after the first `n` journal events leaves behind.
struct DurableState {
  std::vector<Produced> committed;  // in Kafka, visible to read_committed consumers
  std::optional<std::string> progress;
  std::vector<tracking::RowRange> marked;  // offset_acked in the table
  Lsn confirmed = Lsn(1);                  // the slot's confirmed_flush_lsn

  static DurableState After(const std::vector<Durable>& events, size_t n) {
    DurableState base;
    for (size_t i = 0; i < n && i < events.size(); ++i) {
      const Durable& d = events[i];
      switch (d.kind) {
        case Durable::Kind::kCommit:
          base.committed.insert(base.committed.end(), d.records.begin(), d.records.end());
          if (d.progress) base.progress = d.progress;
          break;
        case Durable::Kind::kMark:
          base.marked.insert(base.marked.end(), d.marked.begin(), d.marked.end());
          break;
        case Durable::Kind::kConfirm:
          base.confirmed = std::max(base.confirmed, d.confirmed);
          break;
      }
    }
    return base;
  }
  bool Marked(uint64_t xid, int64_t offset) const {
    for (const auto& r : marked) {
      if (r.transaction_id == xid && offset >= r.first && offset <= r.last) return true;
    }
    return false;
  }
};

// The cluster: what is committed, and the transactional.id's epoch. Shared
// by every "process" (FakeTxnSink) of a test.
class FakeKafka {
 public:
  explicit FakeKafka(std::string progress_topic = "relay.progress", Journal* journal = nullptr)
      : progress_topic_(std::move(progress_topic)), journal_(journal) {}
  // Starts from what a crash left.
  void Restore(const DurableState& s) {
    std::lock_guard lock(mu_);
    committed_ = s.committed;
    progress_.clear();
    if (s.progress) progress_[key_] = *s.progress;
  }
  void set_key(std::string key) { key_ = std::move(key); }
  void set_journal(Journal* j) { journal_ = j; }
  const std::string& progress_topic() const { return progress_topic_; }

  std::vector<Produced> committed() const {
    std::lock_guard lock(mu_);
    return committed_;
  }
  std::optional<std::string> progress(const std::string& key) const {
    std::lock_guard lock(mu_);
    auto it = progress_.find(key);
    if (it == progress_.end()) return std::nullopt;
    return it->second;
  }
  void PutProgress(const std::string& key, std::string value) {
    std::lock_guard lock(mu_);
    progress_[key] = std::move(value);
  }
  // A record in the topic relays before 0.2 shared (outbox-relay.progress).
  void PutShared(const std::string& key, std::string value) {
    std::lock_guard lock(mu_);
    shared_[key] = std::move(value);
  }
  std::optional<std::string> shared(const std::string& key) const {
    std::lock_guard lock(mu_);
    auto it = shared_.find(key);
    if (it == shared_.end()) return std::nullopt;
    return it->second;
  }
  int Fence() {
    std::lock_guard lock(mu_);
    return ++epoch_;
  }
  // Applies a committed transaction of the producer of `epoch`; kFenced when
  // a newer producer initialised since.
  Status Commit(int epoch, std::vector<Produced> records) {
    std::lock_guard lock(mu_);
    if (epoch != epoch_) {
      return Fail(ErrorCode::kFenced, "fake Kafka: producer epoch {} fenced by {}", epoch, epoch_);
    }
    Durable d;
    for (Produced& p : records) {
      if (p.topic == progress_topic_) {
        progress_[p.key.value_or("")] = p.value.value_or("");
        d.progress = p.value;
      } else {
        committed_.push_back(p);
        d.records.push_back(std::move(p));
      }
    }
    if (journal_ != nullptr) journal_->Add(std::move(d));
    ++commits_;
    return Ok();
  }
  int commits() const {
    std::lock_guard lock(mu_);
    return commits_;
  }

 private:
  mutable std::mutex mu_;
  std::string progress_topic_;
  Journal* journal_;
  std::string key_ = "relay";
  std::vector<Produced> committed_;
  std::map<std::string, std::string> progress_;
  std::map<std::string, std::string> shared_;
  int epoch_ = 0;
  int commits_ = 0;
};

// One process's transactional producer on the fake cluster.
class FakeTxnSink final : public kafka::TransactionalSink {
 public:
  FakeTxnSink(FakeKafka* kafka, kafka::DeliveryCallback on_delivery)
      : kafka_(kafka), on_delivery_(std::move(on_delivery)) {}

  bool auto_ack = true;
  // Returned by the next CommitTransaction instead of committing (once).
  std::optional<Error> commit_fault;
  // The producer's queue is full once this many records were produced.
  std::optional<size_t> full_at;

  Result<Accepted> Produce(const outbox::KafkaRecord& record, void* opaque) override {
    size_t index;
    {
      std::lock_guard lock(mu_);
      if (!initialised_) return Fail(ErrorCode::kFatal, "fake: produce before init");
      if (!lanes_[open_].begun)
        return Fail(ErrorCode::kFatal, "fake: produce outside a transaction");
      if (full_at && records_.size() >= *full_at) return Accepted::kQueueFull;
      Produced p;
      p.topic = std::string(record.topic);
      if (record.key) p.key = std::string(*record.key);
      if (record.value) p.value = std::string(*record.value);
      for (const auto& [k, v] : record.headers) p.headers.emplace_back(k, v);
      p.opaque = opaque;
      records_.push_back(std::move(p));
      index = records_.size() - 1;
      lane_of_.push_back(open_);
      failed_.push_back(false);
      lanes_[open_].records.push_back(index);
      ++unsettled_;
    }
    if (auto_ack) Settle(index);
    return Accepted::kQueued;
  }
  // Settles record `i` (the test standing in for the producer's threads).
  void Settle(size_t i, std::optional<Error> error = std::nullopt) {
    kafka::Delivery d;
    std::vector<std::pair<std::string, std::string>> headers;
    std::string topic;
    {
      std::lock_guard lock(mu_);
      Produced& p = records_.at(i);
      if (p.settled) return;
      p.settled = true;
      failed_[i] = error.has_value();
      --unsettled_;
      d.opaque = p.opaque;
      topic = p.topic;
      headers = p.headers;
    }
    cv_.notify_all();
    d.topic = topic;
    d.error = std::move(error);
    for (const auto& [k, v] : headers) d.headers.emplace_back(k, v);
    on_delivery_(d);
  }
  Status Flush(std::chrono::milliseconds) override { return Ok(); }
  bool Reachable() const override { return true; }

  Status InitTransactions(std::chrono::milliseconds) override {
    std::lock_guard lock(mu_);
    epoch_ = kafka_->Fence();
    initialised_ = true;
    for (auto& lane : lanes_) lane = Lane{};
    open_ = 0;
    ++inits_;
    return Ok();
  }
  Status BeginTransaction() override {
    std::lock_guard lock(mu_);
    if (lanes_[open_].begun) return Fail(ErrorCode::kFatal, "fake: begin twice");
    lanes_[open_].begun = true;
    return Ok();
  }
  Status FlushTransaction(std::chrono::milliseconds timeout) override {
    std::unique_lock lock(mu_);
    bool done = cv_.wait_for(lock, timeout, [&] {
      for (size_t i : lanes_[open_].records) {
        if (!records_[i].settled) return false;
      }
      return true;
    });
    if (!done) return Fail(ErrorCode::kTransient, "fake: records not all acknowledged");
    return Ok();
  }
  int HandOver() override {
    std::lock_guard lock(mu_);
    int ending = open_;
    open_ ^= 1;
    return ending;
  }
  int OpenLane() const override {
    std::lock_guard lock(mu_);
    return open_;
  }
  Status CommitTransaction(int lane, std::chrono::milliseconds) override {
    std::vector<Produced> records;
    {
      std::lock_guard lock(mu_);
      if (commit_fault) {
        Error e = *std::exchange(commit_fault, std::nullopt);
        if (e.code == ErrorCode::kAborted || e.code == ErrorCode::kFenced) lanes_[lane] = Lane{};
        return std::unexpected(e);
      }
      for (size_t i : lanes_[lane].records) {
        if (failed_[i]) {
          return Fail(ErrorCode::kAborted, "fake: a record of the transaction failed");
        }
        records.push_back(records_[i]);
      }
      lanes_[lane] = Lane{};
    }
    return kafka_->Commit(epoch_, std::move(records));
  }
  Status AbortTransaction(int lane, std::chrono::milliseconds) override {
    std::lock_guard lock(mu_);
    lanes_[lane] = Lane{};
    ++aborts_;
    return Ok();
  }

  size_t size() const {
    std::lock_guard lock(mu_);
    return records_.size();
  }
  std::vector<Produced> produced() const {
    std::lock_guard lock(mu_);
    return records_;
  }
  int aborts() const {
    std::lock_guard lock(mu_);
    return aborts_;
  }

 private:
  struct Lane {
    bool begun = false;
    std::vector<size_t> records;
  };
  FakeKafka* kafka_;
  kafka::DeliveryCallback on_delivery_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Produced> records_;
  std::vector<int> lane_of_;
  std::vector<bool> failed_;
  Lane lanes_[2];
  int open_ = 0;
  int epoch_ = 0;
  bool initialised_ = false;
  size_t unsettled_ = 0;
  int inits_ = 0;
  int aborts_ = 0;
};

class FakeProgressLog final : public kafka::ProgressLog {
 public:
  explicit FakeProgressLog(FakeKafka* kafka) : kafka_(kafka), topic_(kafka->progress_topic()) {}
  Status Prepare() override { return Ok(); }
  Result<std::optional<std::string>> ReadLast(const std::string& key) override {
    return kafka_->progress(key);
  }
  Result<std::optional<std::string>> ReadShared(const std::string& key) override {
    return kafka_->shared(key);
  }
  const std::string& topic() const override { return topic_; }

 private:
  FakeKafka* kafka_;
  std::string topic_;
};

}  // namespace outbox_relay::pipeline::fakes
