// Writers of outbox events, as the services write them, and a ledger of what
// was committed and what was rolled back.
//
// Each writer owns its aggregates and writes its transactions one after the
// other, so the per-aggregate sequence number in the payload follows commit
// order: Kafka must show it increasing. Rows are written as the seed's Go
// services do: payload JSON, metadata = json.Marshal(map[string]string)
// (sorted keys, \u003c-style escapes), uuid = a 26-character ULID.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "support/kafka.h"
#include "support/pg.h"

namespace outbox_test {

// The Kafka record the contract (DESIGN §4) says a row becomes.
struct ExpectedRecord {
  std::string topic;
  std::optional<std::string> key;
  std::optional<std::string> value;
  std::vector<KafkaHeader> headers;
};

struct WrittenRow {
  std::string uuid;
  std::string aggregate;      // "" when the row has no Aggregate-Id
  int64_t seq = 0;            // per-aggregate sequence number (payload "seq")
  std::string xid;            // xid8 of the writing transaction (committed rows)
  std::string metadata_json;  // the metadata column as written
  ExpectedRecord expected;
};

struct CommittedTransaction {
  std::string xid;
  int rows = 0;  // outbox rows committed by it
};

// What the writers did; safe to use from several threads.
class Ledger {
 public:
  // `keep_records` false: rows are kept without their expected record and
  // metadata (uuid, aggregate, seq, xid only), for runs too long to hold
  // every record in memory (the fault campaign's hour) that check delivery
  // as sets and not the records' bytes.
  explicit Ledger(bool keep_records = true) : keep_records_(keep_records) {}

  void AddCommitted(const std::string& xid, std::vector<WrittenRow> rows);
  void AddRolledBack(std::vector<WrittenRow> rows);
  // Rows of a transaction whose COMMIT got no answer (the server went away):
  // committed or not, only the table can tell.
  void AddInDoubt(std::vector<WrittenRow> rows);
  void CountAborted() { aborted_transactions_.fetch_add(1); }
  void CountOtherTableRows(size_t n) { other_table_rows_.fetch_add(n); }

  std::vector<WrittenRow> committed() const;
  // Visits the committed rows without copying them (ledgers of millions of
  // rows); `f` must not call back into the ledger.
  void VisitCommitted(const std::function<void(const WrittenRow&)>& f) const;
  std::vector<WrittenRow> rolled_back() const;
  std::vector<WrittenRow> in_doubt() const;
  std::vector<CommittedTransaction> transactions() const;
  size_t committed_count() const;
  size_t aborted_transactions() const { return aborted_transactions_.load(); }
  size_t other_table_rows() const { return other_table_rows_.load(); }

 private:
  void Trim(std::vector<WrittenRow>* rows) const;

  const bool keep_records_;
  mutable std::mutex mu_;
  std::vector<WrittenRow> committed_;
  std::vector<WrittenRow> rolled_back_;
  std::vector<WrittenRow> in_doubt_;
  std::vector<CommittedTransaction> transactions_;
  std::atomic<size_t> aborted_transactions_{0};
  std::atomic<size_t> other_table_rows_{0};
};

struct WorkloadOptions {
  std::string database_url;
  std::string table;        // the outbox table (schema public)
  std::string other_table;  // a table outside the publication: (id bigserial, note text)
  std::string
      topic_prefix;  // the relay runs with "<prefix>.{Source-Service}.{Event-Type:aggregate}"
  int aggregates_per_writer = 16;
  size_t payload_bytes = 250;
};

// One transaction. Rows are inserted in statements of at most 100 rows.
struct TxSpec {
  int rows = 1;                        // outbox rows that commit with the transaction
  bool rollback = false;               // end with ROLLBACK: every row is a phantom if seen
  int savepoint_rolled_back_rows = 0;  // SAVEPOINT; INSERT these; ROLLBACK TO SAVEPOINT (midway)
  int other_table_rows = 0;            // rows written to the other table inside the transaction
};

// Go's encoding/json string encoding (HTML-safe escapes, U+2028/9, \ufffd for
// invalid UTF-8), including the quotes.
std::string GoJsonString(std::string_view s);
// json.Marshal(map[string]string): keys sorted by bytes.
std::string GoJsonObject(const std::map<std::string, std::string>& m);
// The headers the contract expects for a row: the uuid header, then the
// metadata entries and partition_key (= Aggregate-Id, when present) sorted by key.
std::vector<KafkaHeader> ExpectedHeaders(const std::string& uuid,
                                         const std::map<std::string, std::string>& metadata);
// 26 Crockford base32 characters: 48-bit milliseconds, then 80 bits that are unique
// in this process (a counter) and random.
std::string NewUlid();

class Writer {
 public:
  // writer_id < 0: a process-unique one. Aggregate ids embed it ("review-w3-007").
  Writer(const WorkloadOptions& options, Ledger* ledger, int writer_id, uint64_t seed);

  // Runs one transaction; true when it committed. Throws on SQL errors.
  bool Transaction(const TxSpec& spec);
  // A transaction that writes only to the other table.
  void OtherTableOnly(int rows);

  Pg& pg() { return pg_; }

 private:
  WrittenRow MakeRow();
  void Insert(const std::vector<WrittenRow>& rows, std::string* xid_out);
  void InsertOther(int rows);

  WorkloadOptions options_;
  Ledger* ledger_;
  int writer_id_;
  std::mt19937_64 rng_;
  Pg pg_;
  std::vector<std::string> aggregates_;
  std::map<std::string, int64_t> seq_;
};

// Writers on their own threads and connections, each running `next(rng)`
// transactions back to back (with `pause` between them) until Stop().
class LoadGenerator {
 public:
  using NextTx = std::function<TxSpec(std::mt19937_64&)>;
  // What a writer does when a statement fails: stop (the first error is
  // Stop's result), or start over after 100 ms with a new connection and new
  // aggregates (per-aggregate order stays checkable), for loads that must
  // outlive the database going away. A transaction whose COMMIT got no answer
  // may or may not have committed: the ledger does not have it, the table may
  // (RowsFromTable in tests/integration/resilience_support.h).
  enum class OnFailure { kStop, kReconnect };
  LoadGenerator(WorkloadOptions options, Ledger* ledger, int writers, NextTx next,
                std::chrono::microseconds pause = std::chrono::microseconds(0),
                OnFailure on_failure = OnFailure::kStop);
  ~LoadGenerator();

  // The writers' seeds derive from `seed` (default: a random one), so that a
  // run can be repeated from one printed number. Call before Start().
  void Seed(uint64_t seed) { seed_ = seed; }
  // Each writer's seed is printed, so a failing run can be repeated.
  void Start();
  // Stops and joins the writers; returns the first writer error ("" if none).
  std::string Stop();
  size_t transactions() const { return transactions_.load(); }
  // Writer failures (each restarted the writer with kReconnect).
  size_t failures() const { return failures_.load(); }
  std::string first_error() const {
    std::lock_guard lock(mu_);
    return error_;
  }

 private:
  void Write(uint64_t seed);

  WorkloadOptions options_;
  Ledger* ledger_;
  int writers_;
  NextTx next_;
  std::chrono::microseconds pause_;
  OnFailure on_failure_;
  std::optional<uint64_t> seed_;
  std::atomic<bool> stop_{false};
  std::atomic<size_t> transactions_{0};
  std::atomic<size_t> failures_{0};
  std::vector<std::thread> threads_;
  mutable std::mutex mu_;
  std::string error_;
};

}  // namespace outbox_test
