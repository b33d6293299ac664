#include "outbox_relay/ops/replay.h"

#include <spdlog/spdlog.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <deque>
#include <limits>
#include <memory>
#include <optional>
#include <thread>

#include "outbox_relay/app/commands.h"
#include "outbox_relay/app/logging.h"
#include "outbox_relay/app/signals.h"
#include "outbox_relay/core/mutex.h"
#include "outbox_relay/core/progress.h"
#include "outbox_relay/kafka/producer.h"
#include "outbox_relay/ops/commands.h"
#include "outbox_relay/outbox/record.h"
#include "outbox_relay/pg/commit_index.h"
#include "outbox_relay/pg/connection.h"
#include "outbox_relay/pg/relay_schema.h"
#include "outbox_relay/pg/rows.h"
#include "outbox_relay/pipeline/progress_report.h"

namespace outbox_relay::ops {

namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// Set by InstallStopSignals() for the command's run; a pointer so the
// helpers below can read it.
const std::atomic<bool>* g_replay_stop = nullptr;

bool StopRequested() { return g_replay_stop != nullptr && g_replay_stop->load(); }

double SecondsSince(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// One transaction being replayed: how many of its records still wait for a
// delivery report. Lives in a deque (stable addresses) as the records' opaque.
struct PendingTx {
  Lsn commit_lsn;
  int64_t outstanding = 0;
  bool failed = false;
};

// Shared between the producing thread and the producer's delivery thread.
struct DeliveryState {
  Mutex mu;
  CondVar progress;
  // Commit order; the fully delivered prefix is popped.
  std::deque<PendingTx> window GUARDED_BY(mu);
  int64_t reported GUARDED_BY(mu) = 0;
  int64_t delivered GUARDED_BY(mu) = 0;
  int64_t failed GUARDED_BY(mu) = 0;
  std::string first_failure GUARDED_BY(mu);

  void OnDelivery(const kafka::Delivery& d) {
    MutexLock lock(&mu);
    auto* tx = static_cast<PendingTx*>(d.opaque);
    --tx->outstanding;
    ++reported;
    if (d.error) {
      ++failed;
      tx->failed = true;
      if (first_failure.empty()) {
        first_failure =
            fmt::format("{} (topic {}, commit {})", d.error->message, d.topic, tx->commit_lsn);
      }
    } else {
      ++delivered;
    }
    progress.NotifyAll();
  }

  // Drops the fully delivered transactions at the front (keeps the last one:
  // it may still be receiving records).
  void PopDeliveredLocked() REQUIRES(mu) {
    while (window.size() > 1 && window.front().outstanding == 0 && !window.front().failed) {
      window.pop_front();
    }
  }
};

struct Range {
  pg::IndexRangeBy by = pg::IndexRangeBy::kLsn;
  std::string from;
  std::string to;
  std::string text;  // for people
};

Result<Range> ResolveRange(pg::Connection& conn, const ReplayConfig& c) {
  Range r;
  if (!c.by_time) {
    r.from = c.from.ToString();
    r.to = c.to.ToString();
    r.text = fmt::format("commit_lsn {} .. {}", r.from, c.to_lsn.empty() ? "end" : r.to);
    return r;
  }
  // The server parses the times: anything timestamptz accepts, in the
  // session's time zone when none is given.
  auto parse = [&](const std::string& text, const char* flag,
                   const char* env) -> Result<std::string> {
    std::optional<std::string> params[] = {text};
    auto res = conn.ExecParams("SELECT $1::timestamptz::text", params);
    if (!res) {
      return app::BadSetting(flag, env,
                             fmt::format("'{}' is not a timestamp PostgreSQL accepts ({})", text,
                                         res.error().message));
    }
    auto parsed = pg::Rows(res->get()).Text(0, 0);
    if (!parsed) return std::unexpected(parsed.error());
    return std::string(*parsed);
  };
  auto from = parse(c.from_time, "--from-time", "OUTBOX_REPLAY_FROM_TIME");
  if (!from) return std::unexpected(from.error());
  auto to = parse(c.to_time.empty() ? std::string("infinity") : c.to_time, "--to-time",
                  "OUTBOX_REPLAY_TO_TIME");
  if (!to) return std::unexpected(to.error());
  r.by = pg::IndexRangeBy::kTime;
  r.from = *from;
  r.to = *to;
  r.text = fmt::format("commit_time {} .. {}", r.from, c.to_time.empty() ? "end" : r.to);
  return r;
}

// The range as the index has it, and what cleanup already took from it.
Status Survey(pg::Connection& conn, const ReplayConfig& c, const Range& range,
              ReplayReport* report) {
  auto survey = pg::SurveyIndex(conn, c.relay.slot, c.relay.table_name.Quoted(),
                                c.relay.columns.transaction_id, range.by, range.from, range.to);
  if (!survey) return std::unexpected(survey.error());
  report->transactions = survey->transactions;
  report->indexed_rows = survey->indexed_rows;
  report->rows_found = survey->rows_found;
  report->transactions_missing = survey->transactions_missing;
  report->rows_missing = survey->rows_missing;
  // None when the range holds no transaction: the report prints "-".
  report->first_commit_lsn = survey->first_commit_lsn.value_or("-");
  report->last_commit_lsn = survey->last_commit_lsn.value_or("-");
  report->first_commit_time = survey->first_commit_time.value_or("-");
  report->last_commit_time = survey->last_commit_time.value_or("-");

  // Where the slot's index starts: commits before it were pruned by cleanup
  // (or happened before the relay ran).
  auto oldest = pg::OldestIndexedCommit(conn, c.relay.slot);
  if (!oldest) return std::unexpected(oldest.error());
  if (!oldest->has_value()) {
    spdlog::warn("replay: the commit index has no transactions of slot {} at all", c.relay.slot);
  } else {
    spdlog::info(
        "replay: the index of slot {} starts at commit {} ({}); older transactions were "
        "pruned by cleanup or precede the relay",
        c.relay.slot, (*oldest)->commit_lsn, (*oldest)->commit_time);
  }
  return Ok();
}

Result<outbox::ColumnMap> CheckTable(pg::Connection& conn, const ReplayConfig& c) {
  std::optional<std::string> params[] = {c.relay.table_name.Quoted()};
  auto exists = conn.ExecParams("SELECT to_regclass($1) IS NOT NULL", params);
  if (!exists) return std::unexpected(exists.error());
  auto table = pg::Rows(exists->get()).Bool(0, 0);
  if (!table) return std::unexpected(table.error());
  auto index = pg::CommitIndexExists(conn);
  if (!index) return std::unexpected(index.error());
  if (!*table) {
    return app::BadSetting("--table", "OUTBOX_TABLE",
                           fmt::format("table {} does not exist", c.relay.table_name.ToString()));
  }
  if (!*index) {
    return Fail(ErrorCode::kFatal,
                "there is no commit index (outbox_relay.commits): the relay never published "
                "from this database, so there is nothing to replay");
  }
  // The index's rows as this release knows them, or not at all.
  auto schema = pg::ReadRelaySchema(conn);
  if (!schema) return std::unexpected(schema.error());
  if (auto st = pg::CheckRelaySchema(*schema); !st) return std::unexpected(st.error());
  auto probe = conn.Exec(fmt::format("SELECT * FROM {} LIMIT 0", c.relay.table_name.Quoted()));
  if (!probe) return std::unexpected(probe.error());
  return outbox::ColumnMap::Resolve(pg::RelationOf(probe->get()), c.relay.columns);
}

class Replayer {
 public:
  Replayer(const ReplayConfig& config, pg::Connection& conn, ReplayReport* report)
      : c_(config), conn_(conn), report_(report) {}

  Status Run(const Range& range) {
    auto mapper = outbox::RecordMapper::Create(c_.relay.mapper);
    if (!mapper) return std::unexpected(mapper.error());
    mapper_.emplace(std::move(*mapper));
    if (!c_.dry_run) {
      if (auto st = StartSink(); !st) return st;
    }
    started_ = Clock::now();
    last_progress_ = started_;
    progress_.emplace(c_.dry_run ? "replay (dry run)" : "replay",
                      static_cast<uint64_t>(std::max<int64_t>(report_->rows_found, 0)),
                      /*estimated=*/false);
    Status st = ReadAndProduce(range);
    if (!c_.dry_run) {
      Status drained = Drain();
      if (st && !drained) st = drained;
    }
    sink_.reset();  // joins the delivery thread before the state goes
    progress_->Finish(static_cast<uint64_t>(report_->produced));
    report_->seconds = SecondsSince(started_);
    MutexLock lock(&state_.mu);
    report_->delivered = state_.delivered;
    report_->failed = state_.failed;
    report_->first_failure = state_.first_failure;
    report_->resume_from = ResumePointLocked();
    return st;
  }

 private:
  Status StartSink() {
    auto sink = app::MakeSink(c_.relay, [this](const kafka::Delivery& d) { state_.OnDelivery(d); });
    if (!sink) return std::unexpected(sink.error());
    if (auto* producer = dynamic_cast<kafka::KafkaProducer*>(sink->get())) {
      if (auto st = producer->CheckConnection(milliseconds(10000)); !st) {
        return Fail(ErrorCode::kTransient, "Kafka is not reachable at {}: {}",
                    c_.relay.kafka_brokers, st.error().message);
      }
    }
    sink_ = std::move(*sink);
    return Ok();
  }

  Status ReadAndProduce(const Range& range) {
    const auto& cols = c_.relay.columns;
    const std::string sql = pg::IndexedRowsPageSql(c_.relay.table_name.Quoted(),
                                                   cols.transaction_id, cols.offset, range.by);
    std::optional<std::string> params[] = {c_.relay.slot,
                                           range.from,
                                           range.to,
                                           std::string("0/0"),
                                           std::to_string(std::numeric_limits<int64_t>::min()),
                                           std::to_string(c_.page_rows)};
    pgoutput::TupleData tuple;
    while (true) {
      auto res = conn_.ExecParams(sql, params);
      if (!res) return std::unexpected(res.error());
      const PGresult* r = res->get();
      pg::Rows rows(r);
      const int n = rows.size();
      if (n == 0) break;
      auto columns = outbox::ColumnMap::Resolve(pg::RelationOf(r), cols);
      if (!columns) return std::unexpected(columns.error());
      for (int i = 0; i < n; ++i) {
        auto lsn = rows.LsnAt(i, 0);
        if (!lsn) return std::unexpected(lsn.error());
        if (StopRequested() || Failed()) {
          // The current transaction is complete if this row starts the next one.
          current_complete_ = *lsn != current_lsn_;
          next_unproduced_ = *lsn;
          return Ok();
        }
        pg::TupleOf(r, i, &tuple);
        if (auto st = Replay(*columns, tuple, *lsn); !st) return st;
      }
      // Where the next page starts: the last row's commit LSN and offset.
      auto last_lsn = rows.Text(n - 1, 0);
      auto last_offset = rows.Text(n - 1, columns->offset);
      if (const Error* e = pg::FirstError(last_lsn, last_offset)) return std::unexpected(*e);
      params[3] = std::string(*last_lsn);
      params[4] = std::string(*last_offset);
      if (n < c_.page_rows) break;
    }
    current_complete_ = true;
    return Ok();
  }

  Status Replay(const outbox::ColumnMap& columns, const pgoutput::TupleData& row, Lsn commit_lsn) {
    if (commit_lsn != current_lsn_) {
      current_lsn_ = commit_lsn;
      lsn_text_ = commit_lsn.ToString();
      if (!c_.dry_run) {
        MutexLock lock(&state_.mu);
        state_.PopDeliveredLocked();
        state_.window.push_back(PendingTx{commit_lsn});
      }
    }
    auto mapped = mapper_->Map(columns, row, commit_lsn);
    if (!mapped) return std::unexpected(mapped.error());
    if (mapped->poison) {
      SkipPoison(mapped->identity, commit_lsn, mapped->poison->message);
      return Ok();
    }
    const outbox::KafkaRecord& original = *mapped->record;
    record_.topic = original.topic;
    record_.key = original.key;
    record_.value = original.value;
    record_.event_type = original.event_type;
    record_.headers.assign(original.headers.begin(), original.headers.end());
    record_.headers.emplace_back(kReplayHeader, "true");
    record_.headers.emplace_back(kReplayCommitLsnHeader, lsn_text_);
    if (!c_.dry_run) {
      auto st = Produce(record_);
      if (!st) {
        if (st.error().code != ErrorCode::kPoison) return st;
        SkipPoison(mapped->identity, commit_lsn, st.error().message);
        return Ok();
      }
    }
    ReplayCounts& counts = report_->topics[std::string(original.topic)];
    ++counts.rows;
    ++counts.event_types[std::string(original.event_type)];
    ++report_->produced;
    LogProgress(false);
    return Ok();
  }

  void SkipPoison(const outbox::RowIdentity& id, Lsn commit_lsn, const std::string& why) {
    ++report_->poison_skipped;
    spdlog::warn(
        "replay: skipping poison row transaction_id={} offset={} uuid='{}' (commit {}): "
        "{}; the original run dead-lettered it",
        id.transaction_id, id.offset, id.uuid, commit_lsn, why);
  }

  Status Produce(const outbox::KafkaRecord& record) {
    PendingTx* tx = nullptr;
    {
      MutexLock lock(&state_.mu);
      // Bounded in flight: wait for delivery reports before producing more.
      while (report_->produced - state_.reported >= c_.relay.max_in_flight && state_.failed == 0 &&
             !StopRequested()) {
        state_.progress.WaitFor(&state_.mu, milliseconds(100));
      }
      tx = &state_.window.back();
      ++tx->outstanding;
    }
    while (true) {
      auto accepted = sink_->Produce(record, tx);
      if (accepted && *accepted == kafka::Sink::Accepted::kQueued) return Ok();
      if (!accepted) {
        MutexLock lock(&state_.mu);
        --tx->outstanding;
        return std::unexpected(accepted.error());
      }
      // The producer's queue is full: its delivery thread makes room.
      MutexLock lock(&state_.mu);
      state_.progress.WaitFor(&state_.mu, milliseconds(10));
    }
  }

  bool Failed() {
    if (c_.dry_run) return false;
    MutexLock lock(&state_.mu);
    return state_.failed > 0;
  }

  // Waits for every delivery report (an interrupt waits at most 10 s more).
  Status Drain() {
    auto interrupted_at = std::optional<Clock::time_point>();
    while (true) {
      {
        MutexLock lock(&state_.mu);
        if (state_.reported >= report_->produced) break;
      }
      if (StopRequested()) {
        if (!interrupted_at) interrupted_at = Clock::now();
        if (Clock::now() - *interrupted_at > std::chrono::seconds(10)) break;
      }
      if (auto st = sink_->Flush(milliseconds(500)); !st) {
        spdlog::debug("replay: flush: {}", st.error().message);
      }
      LogProgress(true);
    }
    return Ok();
  }

  // Every transaction before the returned LSN was delivered in full.
  Lsn ResumePointLocked() const REQUIRES(state_.mu) {
    for (const PendingTx& tx : state_.window) {
      if (tx.outstanding > 0 || tx.failed) return tx.commit_lsn;
    }
    if (!current_complete_ && current_lsn_.valid()) return current_lsn_;
    if (next_unproduced_) return *next_unproduced_;
    return kInvalidLsn;  // nothing left
  }

  void LogProgress(bool draining) {
    if (progress_->terminal()) {
      progress_->Update(static_cast<uint64_t>(report_->produced));
      return;
    }
    auto now = Clock::now();
    if (now - last_progress_ < std::chrono::seconds(5)) return;
    last_progress_ = now;
    double secs = SecondsSince(started_);
    int64_t delivered = 0;
    {
      MutexLock lock(&state_.mu);
      delivered = state_.delivered;
    }
    Progress p;
    p.done = static_cast<uint64_t>(report_->produced);
    p.total = static_cast<uint64_t>(std::max<int64_t>(report_->rows_found, 0));
    p.elapsed = std::chrono::duration<double>(secs);
    spdlog::info("{}; {} delivered; {} commit {}",
                 DescribeProgress(c_.dry_run ? "replay (dry run)" : "replay", p), delivered,
                 draining ? "waiting for delivery reports, last" : "at", current_lsn_);
  }

  const ReplayConfig& c_;
  pg::Connection& conn_;
  ReplayReport* report_;
  std::optional<outbox::RecordMapper> mapper_;
  DeliveryState state_;
  std::unique_ptr<kafka::Sink> sink_;
  outbox::KafkaRecord record_;
  Lsn current_lsn_;
  std::string lsn_text_;
  bool current_complete_ = false;
  std::optional<Lsn> next_unproduced_;  // stopped before the transaction at this LSN
  Clock::time_point started_;
  std::optional<pipeline::ProgressReport> progress_;
  Clock::time_point last_progress_;
};

void PrintSummary(const ReplayConfig& c, const Range& range, const ReplayReport& r) {
  std::printf("replay%s: slot %s, %s\n", c.dry_run ? " (dry run)" : "", c.relay.slot.c_str(),
              range.text.c_str());
  if (r.transactions == 0) {
    std::printf("replay: no transactions of slot %s in range in outbox_relay.commits\n",
                c.relay.slot.c_str());
  } else {
    std::printf(
        "replay: %lld transactions in range (commit_lsn %s .. %s, commit_time %s .. %s), "
        "%lld rows indexed, %lld still in the table\n",
        static_cast<long long>(r.transactions), r.first_commit_lsn.c_str(),
        r.last_commit_lsn.c_str(), r.first_commit_time.c_str(), r.last_commit_time.c_str(),
        static_cast<long long>(r.indexed_rows), static_cast<long long>(r.rows_found));
  }
  std::printf(
      "replay: %lld of %lld transactions in range have rows deleted by cleanup (%lld rows "
      "missing)\n",
      static_cast<long long>(r.transactions_missing), static_cast<long long>(r.transactions),
      static_cast<long long>(r.rows_missing));
  for (const auto& [topic, counts] : r.topics) {
    std::string types;
    for (const auto& [type, n] : counts.event_types) {
      if (!types.empty()) types += ", ";
      types += fmt::format("{} {}", type.empty() ? "(no Event-Type)" : type, n);
    }
    std::printf("  topic %s: %lld rows (%s)\n", topic.c_str(), static_cast<long long>(counts.rows),
                types.c_str());
  }
  if (c.dry_run) {
    std::printf("replay (dry run): would publish %lld rows; %lld poison rows would be skipped\n",
                static_cast<long long>(r.produced), static_cast<long long>(r.poison_skipped));
  } else {
    double rate = r.seconds > 0 ? static_cast<double>(r.produced) / r.seconds : 0.0;
    std::printf(
        "replay: produced %lld rows: %lld delivered, %lld failed, %lld poison rows "
        "skipped, in %.2f s (%.0f rows/s)\n",
        static_cast<long long>(r.produced), static_cast<long long>(r.delivered),
        static_cast<long long>(r.failed), static_cast<long long>(r.poison_skipped), r.seconds,
        rate);
  }
  std::fflush(stdout);
}

}  // namespace

void AddReplayFlags(CLI::App& app, ReplayConfig& c) {
  app::AddRunFlags(app, c.relay);
  app::AddLogFlags(app, c.relay.log);
  app.add_option("--from-lsn", c.from_lsn,
                 "Replay transactions whose commit LSN is >= this (X/Y, as pg_lsn prints it)")
      ->envname("OUTBOX_REPLAY_FROM_LSN");
  app.add_option("--to-lsn", c.to_lsn, "... and <= this (default: to the end of the index)")
      ->envname("OUTBOX_REPLAY_TO_LSN");
  app.add_option("--from-time", c.from_time,
                 "Replay transactions committed at or after this time (ISO-8601, or anything "
                 "PostgreSQL's timestamptz accepts)")
      ->envname("OUTBOX_REPLAY_FROM_TIME");
  app.add_option("--to-time", c.to_time, "... and at or before this time (default: no end)")
      ->envname("OUTBOX_REPLAY_TO_TIME");
  app.add_flag("--dry-run", c.dry_run, "Count the rows per topic and event type; produce nothing")
      ->envname("OUTBOX_REPLAY_DRY_RUN");
  app::AddIntOption(app, "--page-rows", "OUTBOX_REPLAY_PAGE_ROWS", &c.page_rows, 1, 1'000'000,
                    "Rows read per query (memory stays bounded by it)");
  app.footer(
      "Replay re-publishes, in original commit order, the rows (still in the table) of the\n"
      "transactions that the commit-LSN index (outbox_relay.commits) lists for --slot in the\n"
      "range, with their original UUIDs and the same record contract as `run` (the mapping and\n"
      "Kafka flags above apply; the streaming-only ones are ignored). Each record gets two\n"
      "extra headers after the contract's:\n"
      "  outbox_replay             = \"true\"\n"
      "  outbox_replay_commit_lsn  = the transaction's commit LSN, \"X/Y\"\n"
      "offset_acked and the index are never changed. Poison rows are skipped with a warning and\n"
      "counted (the original run already dead-lettered them; --on-poison/--dlq-* do not apply).\n"
      "It reports how much of the range cleanup already deleted. Exit 1 if any record was not\n"
      "delivered (the message says how many were and the --from-lsn to continue from).");
}

Status ValidateReplay(ReplayConfig& c) {
  // A dry run needs no Kafka.
  app::SinkKind sink = c.relay.sink;
  if (c.dry_run) c.relay.sink = app::SinkKind::kNull;
  Status st = Validate(c.relay);
  c.relay.sink = sink;
  if (!st) return st;
  if (c.relay.watermill) {
    // The commit index holds the transactions' xids, but replay reads and
    // maps rows of the seed table only.
    return app::BadSetting(
        "--table-mode", "OUTBOX_TABLE_MODE",
        "replay re-publishes rows of the seed table only; with watermill-sql's "
        "tables, stop the relay, move the consumer group's position back in the "
        "offsets table and drop the slot (`slot drop --confirm`): the next start "
        "publishes every row after the position (docs/migration.md)");
  }

  const bool by_lsn = !c.from_lsn.empty();
  c.by_time = !c.from_time.empty();
  if (!by_lsn && !c.by_time) {
    return app::BadSetting("--from-lsn", "OUTBOX_REPLAY_FROM_LSN",
                           "required (or --from-time): the range of transactions to replay");
  }
  if (by_lsn && c.by_time) {
    return app::BadSetting("--from-time", "OUTBOX_REPLAY_FROM_TIME",
                           "use either --from-lsn/--to-lsn or --from-time/--to-time, not both");
  }
  if (by_lsn && !c.to_time.empty()) {
    return app::BadSetting("--to-time", "OUTBOX_REPLAY_TO_TIME",
                           "goes with --from-time, not --from-lsn");
  }
  if (c.by_time && !c.to_lsn.empty()) {
    return app::BadSetting("--to-lsn", "OUTBOX_REPLAY_TO_LSN",
                           "goes with --from-lsn, not --from-time");
  }
  if (by_lsn) {
    auto from = Lsn::Parse(c.from_lsn);
    if (!from) return app::BadSetting("--from-lsn", "OUTBOX_REPLAY_FROM_LSN", from.error().message);
    c.from = *from;
    if (!c.to_lsn.empty()) {
      auto to = Lsn::Parse(c.to_lsn);
      if (!to) return app::BadSetting("--to-lsn", "OUTBOX_REPLAY_TO_LSN", to.error().message);
      c.to = *to;
      if (c.to < c.from) {
        return app::BadSetting("--to-lsn", "OUTBOX_REPLAY_TO_LSN",
                               fmt::format("{} is before --from-lsn {}", c.to_lsn, c.from_lsn));
      }
    }
  }
  return Ok();
}

int ReplayCommand(ReplayConfig& c) {
  app::SetupLogging(c.relay.log);
  if (auto st = ValidateReplay(c); !st) {
    spdlog::error("{}", st.error().message);
    return app::kExitConfig;
  }
  g_replay_stop = &app::InstallStopSignals();
  auto conn = pg::Connection::Open(c.relay.database_url, pg::Connection::Mode::kNormal,
                                   "outbox-relay-replay");
  if (!conn) {
    spdlog::error("replay: {}", conn.error().message);
    return app::kExitFailure;
  }
  // Short index lookups only: JIT compilation would cost more than it saves.
  if (auto jit = conn->Exec("SET jit = off"); !jit) {
    spdlog::error("replay: {}", jit.error().message);
    return app::kExitFailure;
  }
  auto columns = CheckTable(*conn, c);
  if (!columns) {
    spdlog::error("replay: {}", columns.error().message);
    return app::ExitCodeOf(columns.error());
  }
  auto range = ResolveRange(*conn, c);
  if (!range) {
    spdlog::error("{}", range.error().message);
    return app::ExitCodeOf(range.error());
  }
  ReplayReport report;
  if (auto st = Survey(*conn, c, *range, &report); !st) {
    spdlog::error("replay: {}", st.error().message);
    return app::kExitFailure;
  }
  spdlog::info(
      "replay{}: slot {}, {}: {} transactions, {} rows still in the table; {} of them "
      "have rows deleted by cleanup ({} rows missing)",
      c.dry_run ? " (dry run)" : "", c.relay.slot, range->text, report.transactions,
      report.rows_found, report.transactions_missing, report.rows_missing);

  Replayer replayer(c, *conn, &report);
  Status st = replayer.Run(*range);
  report.interrupted = StopRequested();
  PrintSummary(c, *range, report);
  if (!st) {
    spdlog::error("replay failed after {} of {} rows were delivered: {}", report.delivered,
                  report.produced, st.error().message);
  }
  if (report.failed > 0) {
    spdlog::error("replay: {} of {} records were not delivered (first: {}); {} were delivered",
                  report.failed, report.produced, report.first_failure, report.delivered);
  }
  if (report.interrupted) {
    spdlog::error("replay interrupted: {} of {} produced rows delivered", report.delivered,
                  report.produced);
  }
  if (!st || report.failed > 0 || report.interrupted ||
      (!c.dry_run && report.delivered < report.produced)) {
    if (report.resume_from.valid()) {
      spdlog::error(
          "every transaction before commit {} was delivered in full: rerun with "
          "--from-lsn {} --to-lsn {} to continue",
          report.resume_from, report.resume_from, report.last_commit_lsn);
    }
    return st ? app::kExitFailure : app::ExitCodeOf(st.error());
  }
  if (report.poison_skipped > 0) {
    spdlog::warn("replay: {} poison rows skipped (see the warnings above)", report.poison_skipped);
  }
  return app::kExitOk;
}

}  // namespace outbox_relay::ops
