// Fakes for the pipeline tests: a walsender that replays a recorded pgoutput
// stream, a Kafka sink the test drives by hand, and a marker. With them the
// real StreamSession, Publisher, RecordMapper and AckTracker run in memory,
// in milliseconds.
#pragma once

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "../pgoutput/golden_stream.h"
#include "fake_kafka.h"
#include "outbox_relay/core/clock.h"
#include "outbox_relay/kafka/sink.h"
#include "outbox_relay/metrics/metrics.h"
#include "outbox_relay/pgoutput/decoder.h"
#include "outbox_relay/pipeline/publisher.h"
#include "outbox_relay/pipeline/source.h"
#include "outbox_relay/pipeline/stream_session.h"
#include "outbox_relay/tracking/ack_tracker.h"
#include "outbox_relay/walproto/walproto.h"

namespace outbox_relay::pipeline::fakes {

using namespace std::chrono_literals;

// The recorded stream, by transaction, as a walsender sends it: every
// transaction whose commit ends after the start position, each change's
// relation described first in every new connection.
class FakeWalSender {
 public:
  struct Tx {
    Lsn end_lsn;                      // Commit.end_lsn
    std::vector<size_t> lines;        // indexes into lines_, B..C
    std::vector<pgoutput::Oid> uses;  // relation ids its changes use, in order
  };

  static FakeWalSender Recorded(const std::string& path = pgoutput::golden::GoldenStreamPath()) {
    auto lines = pgoutput::golden::LoadGoldenStream(path);
    EXPECT_TRUE(lines.has_value()) << lines.error().message;
    FakeWalSender w;
    if (lines) w.lines_ = std::move(*lines);
    Tx tx;
    for (size_t i = 0; i < w.lines_.size(); ++i) {
      pgoutput::DecodedMessage m;
      auto st = pgoutput::Decode(w.lines_[i].bytes, &m);
      EXPECT_TRUE(st.has_value()) << "line " << w.lines_[i].line_number;
      if (!st) continue;
      if (std::holds_alternative<pgoutput::Message>(m) && w.lines_[i].xid == 0) continue;
      tx.lines.push_back(i);
      if (auto* ins = std::get_if<pgoutput::Insert>(&m)) tx.uses.push_back(ins->relation_id);
      if (auto* c = std::get_if<pgoutput::Commit>(&m)) {
        tx.end_lsn = c->end_lsn;
        w.txs_.push_back(std::move(tx));
        tx = Tx{};
      }
    }
    return w;
  }

  const std::vector<Tx>& transactions() const { return txs_; }
  const pgoutput::golden::GoldenLine& line(size_t i) const { return lines_[i]; }

  // The XLogData frames a connection started at `start` receives.
  std::vector<std::string> From(Lsn start) const {
    std::vector<std::string> out;
    std::map<pgoutput::Oid, size_t> latest;  // relation id -> line of its last R
    std::set<pgoutput::Oid> described;       // in this connection
    for (const Tx& tx : txs_) {
      bool send = tx.end_lsn > start;
      for (size_t i : tx.lines) {
        pgoutput::DecodedMessage m;
        (void)pgoutput::Decode(lines_[i].bytes, &m);
        if (auto* r = std::get_if<pgoutput::Relation>(&m)) {
          latest[r->relation_id] = i;
          if (send) {
            described.insert(r->relation_id);
            out.push_back(Frame(lines_[i]));
          }
          continue;
        }
        if (!send) continue;
        pgoutput::Oid uses = 0;
        if (auto* ins = std::get_if<pgoutput::Insert>(&m)) uses = ins->relation_id;
        if (uses != 0 && !described.contains(uses) && latest.contains(uses)) {
          described.insert(uses);
          out.push_back(Frame(lines_[latest[uses]]));
        }
        out.push_back(Frame(lines_[i]));
      }
    }
    return out;
  }

  static std::string Frame(const pgoutput::golden::GoldenLine& line) {
    walproto::XLogData x;
    x.wal_start = line.lsn;
    x.wal_end = line.lsn;
    x.data = line.bytes;
    return walproto::Encode(x);
  }
  static std::string Keepalive(Lsn wal_end, bool reply_requested) {
    walproto::PrimaryKeepalive k;
    k.wal_end = wal_end;
    k.reply_requested = reply_requested;
    return walproto::Encode(k);
  }

 private:
  std::vector<pgoutput::golden::GoldenLine> lines_;
  std::vector<Tx> txs_;
};

// Server messages handed out one by one; after `cut_after` of them the
// connection breaks (kTransient). Status updates are recorded. Messages can
// be added while the session runs (Push).
class FakeSource final : public ReplicationSource {
 public:
  explicit FakeSource(std::vector<std::string> messages,
                      std::optional<size_t> cut_after = std::nullopt)
      : queue_(messages.begin(), messages.end()), cut_after_(cut_after) {}

  Result<std::optional<std::string_view>> TryRead() override {
    std::lock_guard lock(mu_);
    if (cut_after_ && read_ >= *cut_after_) {
      return Fail(ErrorCode::kTransient, "replication connection: cut by the test");
    }
    if (queue_.empty()) return std::optional<std::string_view>();
    if (pace.count() > 0) {
      // A server slower than the relay: one message per `pace`.
      auto now = std::chrono::steady_clock::now();
      if (now - last_read_ < pace) return std::optional<std::string_view>();
      last_read_ = now;
    }
    current_ = std::move(queue_.front());
    queue_.pop_front();
    ++read_;
    return std::optional<std::string_view>(current_);
  }
  Status Wait(std::chrono::milliseconds timeout) override {
    std::unique_lock lock(mu_);
    cv_.wait_for(lock, std::min<std::chrono::milliseconds>(timeout, 5ms),
                 [&] { return !queue_.empty(); });
    return Ok();
  }
  Status SendStatus(const walproto::StandbyStatusUpdate& update) override {
    std::lock_guard lock(mu_);
    statuses_.push_back(update);
    if (journal != nullptr && update.flush > journaled_) {
      journaled_ = update.flush;
      Durable d;
      d.kind = Durable::Kind::kConfirm;
      d.confirmed = update.flush;
      journal->Add(std::move(d));
    }
    return Ok();
  }
  Journal* journal = nullptr;  // confirmations are durable steps (exactly-once tests)
  std::chrono::microseconds pace{0};
  Status Finish(std::chrono::milliseconds) override {
    finished_ = true;
    return Ok();
  }

  void Push(std::string message) {
    {
      std::lock_guard lock(mu_);
      queue_.push_back(std::move(message));
    }
    cv_.notify_all();
  }
  size_t read() const {
    std::lock_guard lock(mu_);
    return read_;
  }
  bool empty() const {
    std::lock_guard lock(mu_);
    return queue_.empty();
  }
  std::vector<Lsn> flushes() const {
    std::lock_guard lock(mu_);
    std::vector<Lsn> out;
    for (const auto& s : statuses_) out.push_back(s.flush);
    return out;
  }
  std::vector<walproto::StandbyStatusUpdate> statuses() const {
    std::lock_guard lock(mu_);
    return statuses_;
  }

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::string> queue_;
  std::string current_;
  std::optional<size_t> cut_after_;
  size_t read_ = 0;
  std::vector<walproto::StandbyStatusUpdate> statuses_;
  Lsn journaled_;
  std::chrono::steady_clock::time_point last_read_{};
  std::atomic<bool> finished_{false};
};

// The sink, driven by the test. Produce (loop thread) queues; the test
// thread, standing in for the producer's threads, settles records: acked,
// refused (poison), failed (fatal). With `auto_ack` every record is acked at
// once, on the loop thread, as the null sink does.
class FakeSink final : public kafka::Sink {
 public:
  explicit FakeSink(kafka::DeliveryCallback on_delivery) : on_delivery_(std::move(on_delivery)) {}

  bool auto_ack = true;
  size_t queue_limit = SIZE_MAX;  // unsettled records: kQueueFull at the limit
  // A record it refuses at once (Produce returns kPoison), e.g. too large.
  std::function<bool(const outbox::KafkaRecord&)> refuse_at_produce;

  // Once set, every record is refused with it (a producer failed for good).
  std::optional<Error> failed;

  Result<Accepted> Produce(const outbox::KafkaRecord& record, void* opaque) override {
    if (refuse_at_produce && refuse_at_produce(record)) {
      return Fail(ErrorCode::kPoison, "record too large for the fake sink");
    }
    if (failed) return std::unexpected(*failed);
    size_t index;
    {
      std::lock_guard lock(mu_);
      if (unsettled_ >= queue_limit) {
        ++queue_full_;
        return Accepted::kQueueFull;
      }
      Produced p;
      p.topic = std::string(record.topic);
      if (record.key) p.key = std::string(*record.key);
      if (record.value) p.value = std::string(*record.value);
      for (const auto& [k, v] : record.headers) p.headers.emplace_back(k, v);
      p.opaque = opaque;
      unsettled_bytes_ += Bytes(p);
      produced_.push_back(std::move(p));
      index = produced_.size() - 1;
      ++unsettled_;
    }
    if (auto_ack) Ack(index);
    return Accepted::kQueued;
  }
  Status Flush(std::chrono::milliseconds) override { return Ok(); }
  bool Reachable() const override { return true; }
  int64_t BytesInFlight() const override {
    std::lock_guard lock(mu_);
    return unsettled_bytes_;
  }
  // Key, value and headers, as the Kafka producer counts them.
  static int64_t Bytes(const Produced& p) {
    size_t n = p.key.value_or("").size() + p.value.value_or("").size();
    for (const auto& [k, v] : p.headers) n += k.size() + v.size();
    return static_cast<int64_t>(n);
  }

  // Settles record `i`: acked, or with `error` (kPoison: refused by the
  // broker, kFatal: the producer failed).
  void Settle(size_t i, std::optional<Error> error = std::nullopt) {
    kafka::Delivery d;
    std::string topic, value;
    std::vector<std::pair<std::string, std::string>> headers;
    {
      std::lock_guard lock(mu_);
      Produced& p = produced_.at(i);
      if (p.settled) return;
      p.settled = true;
      --unsettled_;
      unsettled_bytes_ -= Bytes(p);
      topic = p.topic;
      value = p.value.value_or("");
      headers = p.headers;
      d.opaque = p.opaque;
    }
    d.topic = topic;
    d.error = std::move(error);
    d.value = value;
    for (const auto& [k, v] : headers) d.headers.emplace_back(k, v);
    on_delivery_(d);
  }
  void Ack(size_t i) { Settle(i); }

  size_t size() const {
    std::lock_guard lock(mu_);
    return produced_.size();
  }
  std::vector<Produced> produced() const {
    std::lock_guard lock(mu_);
    return produced_;
  }
  size_t queue_full() const {
    std::lock_guard lock(mu_);
    return queue_full_;
  }

 private:
  kafka::DeliveryCallback on_delivery_;
  mutable std::mutex mu_;
  std::vector<Produced> produced_;
  size_t unsettled_ = 0;
  int64_t unsettled_bytes_ = 0;
  size_t queue_full_ = 0;
};

// The marker's part of the confirmation rule, without a database: takes
// what is delivered and marks it, unless paused.
class FakeMarker {
 public:
  // `threaded`: marks on a thread of its own, as the real marker; else only
  // when the test calls MarkNow.
  explicit FakeMarker(tracking::AckTracker* tracker, Journal* journal = nullptr,
                      bool threaded = true)
      : tracker_(tracker), journal_(journal) {
    if (!threaded) return;
    thread_ = std::thread([this] {
      std::vector<tracking::Transaction*> batch;
      while (!stop_) {
        if (paused_) {
          std::this_thread::sleep_for(1ms);
          continue;
        }
        std::lock_guard round(round_mu_);  // Pause waits for a round in progress
        if (paused_) continue;
        batch.clear();
        tracker_->TakeDelivered(&batch, 1000, 5ms);
        if (batch.empty()) continue;
        Mark(batch);
      }
    });
  }
  ~FakeMarker() {
    stop_ = true;
    tracker_->Wake();
    if (thread_.joinable()) thread_.join();
  }
  // One round of marking, on the caller's thread (a marker made unthreaded);
  // nothing while paused. True when it marked something.
  bool MarkNow() {
    if (paused_) return false;
    std::vector<tracking::Transaction*> batch;
    tracker_->TakeDelivered(&batch, 1000, std::chrono::milliseconds(0));
    if (batch.empty()) return false;
    Mark(batch);
    return true;
  }
  // Returns once no round is in progress: nothing is marked after Pause(true).
  void Pause(bool paused) {
    paused_ = paused;
    std::lock_guard round(round_mu_);
  }
  std::vector<tracking::RowRange> marked() const {
    std::lock_guard lock(mu_);
    return marked_;
  }
  // The primary's standbys as the real marker reads them after each round
  // (tracking::StandbyMarks), with the WAL counted in mark rounds: a standby
  // that has the marks of the first `rounds` rounds only; nullopt (the
  // default): the primary has no standby.
  void SetStandby(std::optional<uint64_t> rounds) {
    standby_rounds_ = rounds ? static_cast<int64_t>(*rounds) : -1;
  }

 private:
  void Mark(const std::vector<tracking::Transaction*>& batch) {
    {
      std::lock_guard lock(mu_);
      Durable d;
      d.kind = Durable::Kind::kMark;
      for (auto* tx : batch) {
        for (const auto& run : tx->row_ranges) {
          marked_.push_back(run);
          d.marked.push_back(run);
        }
      }
      // Marked in the table before the tracker learns it.
      if (journal_ != nullptr) journal_->Add(std::move(d));
    }
    tracker_->OnMarked(batch);
    const uint64_t round = ++rounds_;
    const int64_t standby = standby_rounds_;
    tracker_->standby_marks().Read(tracking::StandbyPositions{
        .written = Lsn(round),
        .lowest =
            standby >= 0 ? std::optional<Lsn>(Lsn(static_cast<uint64_t>(standby))) : std::nullopt});
  }

  tracking::AckTracker* tracker_;
  std::atomic<uint64_t> rounds_{0};
  std::atomic<int64_t> standby_rounds_{-1};  // -1: no standby
  Journal* journal_;
  std::atomic<bool> stop_{false};
  std::atomic<bool> paused_{false};
  std::mutex round_mu_;
  mutable std::mutex mu_;
  std::vector<tracking::RowRange> marked_;
  std::thread thread_;
};

// Polls `cond` for up to `timeout`.
inline bool Eventually(const std::function<bool()>& cond,
                       std::chrono::milliseconds timeout = 5000ms) {
  auto until = std::chrono::steady_clock::now() + timeout;
  while (!cond()) {
    if (std::chrono::steady_clock::now() > until) return false;
    std::this_thread::sleep_for(1ms);
  }
  return true;
}

// The real pipeline on fakes: a tracker starting at `start`, a Publisher on
// a FakeSink, a FakeMarker, and stream sessions run on a thread of their own.
class Pipeline {
 public:
  // A pipeline whose session the test steps itself (Open, RunUntilIdle,
  // Advance) on a ManualClock, its marker marking in the same steps: no
  // threads but the exactly-once commit worker, no sleeps.
  struct Stepped {};
  Pipeline(Stepped, PublisherOptions options = DefaultOptions(), Lsn start = Lsn(1),
           FakeKafka* kafka = nullptr, TransactionOptions txn = {}, Journal* journal = nullptr)
      : tracker_(start, /*marking=*/true),
        metrics_("test"),
        stop_(stop_flag_, clock_),
        marker_(&tracker_, journal, /*threaded=*/false),
        journal_(journal),
        stepped_(true) {
    auto publisher = Publisher::Create(std::move(options), &tracker_, &stats_, &metrics_, &stop_);
    EXPECT_TRUE(publisher.has_value()) << publisher.error().message;
    publisher_ = std::move(*publisher);
    if (kafka == nullptr) {
      auto sink = std::make_unique<FakeSink>(publisher_->DeliveryCallback());
      sink_ = sink.get();
      publisher_->AttachSink(std::move(sink));
      return;
    }
    auto sink = std::make_unique<FakeTxnSink>(kafka, publisher_->DeliveryCallback());
    txn_sink_ = sink.get();
    publisher_->AttachSink(std::move(sink));
    log_ = std::make_unique<FakeProgressLog>(kafka);
    eos_ = publisher_->EnableTransactions(txn, txn_sink_, log_.get());
  }
  explicit Pipeline(PublisherOptions options = DefaultOptions(), Lsn start = Lsn(1))
      : tracker_(start, /*marking=*/true), metrics_("test"), stop_(stop_flag_), marker_(&tracker_) {
    auto publisher = Publisher::Create(std::move(options), &tracker_, &stats_, &metrics_, &stop_);
    EXPECT_TRUE(publisher.has_value()) << publisher.error().message;
    publisher_ = std::move(*publisher);
    auto sink = std::make_unique<FakeSink>(publisher_->DeliveryCallback());
    sink_ = sink.get();
    publisher_->AttachSink(std::move(sink));
  }
  // Exactly-once on `kafka` (a process of its transactional.id): a
  // transactional sink and the progress log in memory; `journal` records the
  // process's durable steps. Start with StartTransactions.
  Pipeline(FakeKafka* kafka, TransactionOptions txn, Lsn start, Journal* journal = nullptr,
           PublisherOptions options = DefaultOptions())
      : tracker_(start, /*marking=*/true),
        metrics_("test"),
        stop_(stop_flag_),
        marker_(&tracker_, journal),
        journal_(journal) {
    auto publisher = Publisher::Create(std::move(options), &tracker_, &stats_, &metrics_, &stop_);
    EXPECT_TRUE(publisher.has_value()) << publisher.error().message;
    publisher_ = std::move(*publisher);
    auto sink = std::make_unique<FakeTxnSink>(kafka, publisher_->DeliveryCallback());
    txn_sink_ = sink.get();
    publisher_->AttachSink(std::move(sink));
    log_ = std::make_unique<FakeProgressLog>(kafka);
    eos_ = publisher_->EnableTransactions(txn, txn_sink_, log_.get());
  }
  Status StartTransactions(const ProgressFacts& facts) { return eos_->Start(facts); }
  ExactlyOnce& eos() { return *eos_; }
  FakeTxnSink& txn_sink() { return *txn_sink_; }
  ~Pipeline() {
    (void)StopSession();  // the test is over: how the session ended was its to check
    publisher_->CloseSink();
  }
  // The session's end, as the supervisor handles it: exactly-once, what the
  // open Kafka transaction holds commits (or, after an abort, is sent again).
  // Call after WaitSession or StopSession.
  Status EndTransactions(Status ended) {
    if (!ended && ended.error().code == ErrorCode::kAborted) return eos_->Abort(5000ms);
    return eos_->Finish(5000ms, nullptr);
  }

  static PublisherOptions DefaultOptions() {
    PublisherOptions o;
    o.table = "public.outbox";
    o.mapper.topic_template = "events";  // every recorded row maps, metadata or not
    o.dlq_topic = "dlq";
    o.max_in_flight = 1000;
    o.stop_grace = 1000ms;
    return o;
  }
  static SessionOptions Session() {
    SessionOptions s;
    s.table = pg::QualifiedName{"public", "outbox"};
    s.status_interval = 20ms;
    s.stop_grace = 1000ms;
    return s;
  }

  // A new connection replaying `messages` (cut after `cut_after` of them),
  // and a session reading it on a thread of its own. The Pipeline owns the
  // source: it outlives the session.
  FakeSource& Connect(std::vector<std::string> messages,
                      std::optional<size_t> cut_after = std::nullopt,
                      SessionOptions options = Session(),
                      std::chrono::microseconds pace = std::chrono::microseconds(0)) {
    sources_.push_back(std::make_unique<FakeSource>(std::move(messages), cut_after));
    FakeSource* source = sources_.back().get();
    source->journal = journal_;
    source->pace = pace;
    session_.emplace(options, source, publisher_.get(), &tracker_, &stats_, &stop_, &marker_error_);
    done_ = false;
    thread_ = std::thread([this] {
      result_ = session_->Run();
      if (auto* open = session_->TakeOpenTransaction()) tracker_.Abandon(open);
      done_ = true;
    });
    return *source;
  }
  bool done() const { return done_; }

  // --- a Stepped pipeline -------------------------------------------------
  // A new connection replaying `messages` and a session the test steps.
  FakeSource& Open(std::vector<std::string> messages,
                   std::optional<size_t> cut_after = std::nullopt,
                   SessionOptions options = Session()) {
    EXPECT_TRUE(stepped_);
    sources_.push_back(std::make_unique<FakeSource>(std::move(messages), cut_after));
    FakeSource* source = sources_.back().get();
    source->journal = journal_;
    session_.emplace(options, source, publisher_.get(), &tracker_, &stats_, &stop_, &marker_error_);
    done_ = false;
    result_ = Ok();
    return *source;
  }
  // Steps the session (and the marker, unless paused) until it waits for
  // the server, is held back, or ended; a Kafka commit under way on the
  // worker thread is waited for. The session's end is in done() and result().
  // `wait_for_commit` false: returns while a Kafka commit is under way (its
  // flush waits for acknowledgements the test gives).
  void RunUntilIdle(bool wait_for_commit = true) {
    for (int turns = 0; turns < 1'000'000 && session_ && !done_; ++turns) {
      bool marked = marker_.MarkNow();
      auto step = session_->Step();
      if (!step) {
        result_ = std::unexpected(step.error());
        Close();
        return;
      }
      if (step->state == StreamSession::StepResult::kDone) {
        result_ = Ok();
        Close();
        return;
      }
      if (step->state == StreamSession::StepResult::kBusy || marked) continue;
      if (wait_for_commit && eos_ != nullptr && eos_->busy()) {
        std::this_thread::sleep_for(std::chrono::microseconds(20));  // the commit worker
        continue;
      }
      return;
    }
  }
  // Time passes (status updates, the stop grace, a commit interval fall due).
  void Advance(std::chrono::milliseconds d, std::chrono::milliseconds step = 1ms) {
    for (auto passed = 0ms; passed < d; passed += step) {
      clock_.Advance(step);
      RunUntilIdle();
    }
  }
  // Exactly-once: until every Kafka transaction committed (the interval passes).
  void CommitAll() {
    for (int i = 0; i < 10000 && eos_ != nullptr && (eos_->has_open() || eos_->busy()); ++i) {
      Advance(1ms);
    }
  }
  // A stop request, stepped to the session's end.
  Status Stop(std::chrono::milliseconds limit = 60000ms) {
    stop_flag_ = true;
    for (auto waited = 0ms; session_ && !done_ && waited < limit; waited += 1ms) {
      RunUntilIdle();
      if (done_) break;
      clock_.Advance(1ms);
    }
    return result_;
  }
  Status result() const { return result_; }
  // A stop request, seen now, without stepping anything.
  void RequestStop() {
    stop_flag_ = true;
    (void)stop_.requested();
  }
  ManualClock& clock() { return clock_; }
  // The marker marks everything delivered (a stepped pipeline's marker only
  // marks when stepped).
  void MarkAll() {
    while (marker_.MarkNow()) {
    }
  }
  // Waits for the session to end by itself (an error).
  Status WaitSession() {
    EXPECT_TRUE(Eventually([&] { return done_.load(); }));
    if (thread_.joinable()) thread_.join();
    session_.reset();
    return result_;
  }
  // Asks the session to stop and waits for it.
  Status StopSession() {
    if (stepped_) return session_ ? Stop() : result_;
    if (!thread_.joinable()) return Ok();
    stop_flag_ = true;
    thread_.join();
    session_.reset();
    return result_;
  }

  tracking::AckTracker& tracker() { return tracker_; }
  FakeSink& sink() { return *sink_; }
  FakeMarker& marker() { return marker_; }
  Publisher& publisher() { return *publisher_; }
  RelayStats& stats() { return stats_; }
  std::atomic<int64_t>& marker_error() { return marker_error_; }

 private:
  // The session is done: what it left open is abandoned (the server sends it again).
  void Close() {
    if (auto* open = session_->TakeOpenTransaction()) tracker_.Abandon(open);
    session_.reset();
    done_ = true;
  }

  tracking::AckTracker tracker_;
  RelayStats stats_;
  metrics::Metrics metrics_;
  std::atomic<bool> stop_flag_{false};
  ManualClock clock_;
  StopSignal stop_;
  std::unique_ptr<FakeProgressLog> log_;  // before the publisher: its unit reads it
  std::unique_ptr<Publisher> publisher_;
  FakeSink* sink_ = nullptr;
  FakeTxnSink* txn_sink_ = nullptr;
  ExactlyOnce* eos_ = nullptr;
  FakeMarker marker_;
  Journal* journal_ = nullptr;
  bool stepped_ = false;
  std::atomic<int64_t> marker_error_{0};
  std::vector<std::unique_ptr<FakeSource>> sources_;  // before session_: destroyed after it
  std::optional<StreamSession> session_;
  std::thread thread_;
  std::atomic<bool> done_{true};
  Status result_;
};

}  // namespace outbox_relay::pipeline::fakes
