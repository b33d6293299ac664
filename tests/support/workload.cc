#include "support/workload.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <ctime>
#include <stdexcept>

namespace outbox_test {

namespace {

std::atomic<int> g_next_writer{0};
std::atomic<uint32_t> g_ulid_counter{0};

constexpr char kCrockford[] = "0123456789ABCDEFGHJKMNPQRSTVWXYZ";

// Decodes one UTF-8 sequence at s[i]; returns its length, or 0 when invalid.
size_t Utf8Length(std::string_view s, size_t i, uint32_t* cp) {
  auto c0 = static_cast<unsigned char>(s[i]);
  size_t n;
  uint32_t min;
  if (c0 < 0x80) {
    *cp = c0;
    return 1;
  } else if ((c0 & 0xE0) == 0xC0) {
    n = 2, *cp = c0 & 0x1F, min = 0x80;
  } else if ((c0 & 0xF0) == 0xE0) {
    n = 3, *cp = c0 & 0x0F, min = 0x800;
  } else if ((c0 & 0xF8) == 0xF0) {
    n = 4, *cp = c0 & 0x07, min = 0x10000;
  } else {
    return 0;
  }
  if (i + n > s.size()) return 0;
  for (size_t k = 1; k < n; ++k) {
    auto c = static_cast<unsigned char>(s[i + k]);
    if ((c & 0xC0) != 0x80) return 0;
    *cp = (*cp << 6) | (c & 0x3F);
  }
  if (*cp < min || *cp > 0x10FFFF || (*cp >= 0xD800 && *cp <= 0xDFFF)) return 0;
  return n;
}

std::string RandomHex(std::mt19937_64& rng, size_t n) {
  std::string out;
  while (out.size() < n) out += fmt::format("{:016x}", rng());
  out.resize(n);
  return out;
}

// time.Now().UTC().Format(time.RFC3339Nano)
std::string PublishedAt() {
  auto now = std::chrono::system_clock::now();
  auto secs = std::chrono::time_point_cast<std::chrono::seconds>(now);
  auto nanos = std::chrono::duration_cast<std::chrono::nanoseconds>(now - secs).count();
  std::time_t t = std::chrono::system_clock::to_time_t(secs);
  std::tm tm{};
  gmtime_r(&t, &tm);
  std::string frac = fmt::format("{:09}", nanos);
  while (!frac.empty() && frac.back() == '0') frac.pop_back();
  return fmt::format("{:04}-{:02}-{:02}T{:02}:{:02}:{:02}{}{}Z", tm.tm_year + 1900, tm.tm_mon + 1,
                     tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, frac.empty() ? "" : ".", frac);
}

// Appends `digits` base32 digits of the low 5*digits bits of `v`.
void AppendBase32(std::string* out, uint64_t v, int digits) {
  for (int i = digits - 1; i >= 0; --i) out->push_back(kCrockford[(v >> (5 * i)) & 31]);
}

}  // namespace

std::string GoJsonString(std::string_view s) {
  std::string out = "\"";
  for (size_t i = 0; i < s.size();) {
    auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x80) {
      switch (c) {
        case '"':
          out += "\\\"";
          break;
        case '\\':
          out += "\\\\";
          break;
        case '\n':
          out += "\\n";
          break;
        case '\r':
          out += "\\r";
          break;
        case '\t':
          out += "\\t";
          break;
        case '\b':
          out += "\\b";
          break;
        case '\f':
          out += "\\f";
          break;
        case '<':
        case '>':
        case '&':
          out += fmt::format("\\u{:04x}", c);
          break;
        default:
          if (c < 0x20) {
            out += fmt::format("\\u{:04x}", c);
          } else {
            out.push_back(static_cast<char>(c));
          }
      }
      ++i;
      continue;
    }
    uint32_t cp = 0;
    size_t n = Utf8Length(s, i, &cp);
    if (n == 0) {
      out += "\\ufffd";
      ++i;
    } else if (cp == 0x2028 || cp == 0x2029) {
      out += fmt::format("\\u{:04x}", cp);
      i += n;
    } else {
      out.append(s.substr(i, n));
      i += n;
    }
  }
  out += "\"";
  return out;
}

std::string GoJsonObject(const std::map<std::string, std::string>& m) {
  std::string out = "{";
  for (const auto& [k, v] : m) {
    if (out.size() > 1) out += ",";
    out += GoJsonString(k) + ":" + GoJsonString(v);
  }
  return out + "}";
}

std::vector<KafkaHeader> ExpectedHeaders(const std::string& uuid,
                                         const std::map<std::string, std::string>& metadata) {
  std::map<std::string, std::string> sorted = metadata;  // std::map orders by bytes
  // The seed's middleware: partition_key = Aggregate-Id when that is non-empty.
  if (auto it = metadata.find("Aggregate-Id"); it != metadata.end() && !it->second.empty()) {
    sorted["partition_key"] = it->second;
  }
  std::vector<KafkaHeader> out;
  out.push_back({"_watermill_message_uuid", uuid});
  for (const auto& [k, v] : sorted) out.push_back({k, v});
  return out;
}

std::string NewUlid() {
  static thread_local std::mt19937_64 rng{std::random_device{}()};
  uint64_t ms = static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                          std::chrono::system_clock::now().time_since_epoch())
                                          .count());
  uint32_t counter = g_ulid_counter.fetch_add(1);
  uint64_t rnd = rng() & 0xFFFFFFFFFFFFull;
  // 48 bits of ms in 10 digits, then 80 bits (32 counter | 48 random) in 16 digits.
  std::string out;
  out.reserve(26);
  AppendBase32(&out, ms & 0xFFFFFFFFFFFFull, 10);
  AppendBase32(&out, (static_cast<uint64_t>(counter) << 8) | (rnd >> 40), 8);
  AppendBase32(&out, rnd & 0xFFFFFFFFFFull, 8);
  return out;
}

// ---- Ledger -------------------------------------------------------------------------------

void Ledger::Trim(std::vector<WrittenRow>* rows) const {
  if (keep_records_) return;
  // New rows, not cleared ones: a string assigned an empty one keeps its
  // buffer (the metadata's few hundred bytes a row).
  std::vector<WrittenRow> slim(rows->size());
  for (size_t i = 0; i < rows->size(); ++i) {
    WrittenRow& r = (*rows)[i];
    slim[i].uuid = std::move(r.uuid);
    slim[i].aggregate = std::move(r.aggregate);
    slim[i].seq = r.seq;
    slim[i].xid = std::move(r.xid);
  }
  rows->swap(slim);
}

void Ledger::AddCommitted(const std::string& xid, std::vector<WrittenRow> rows) {
  Trim(&rows);
  std::lock_guard lock(mu_);
  if (!rows.empty()) transactions_.push_back({xid, static_cast<int>(rows.size())});
  for (auto& r : rows) committed_.push_back(std::move(r));
}

void Ledger::AddRolledBack(std::vector<WrittenRow> rows) {
  Trim(&rows);
  std::lock_guard lock(mu_);
  for (auto& r : rows) rolled_back_.push_back(std::move(r));
}

std::vector<WrittenRow> Ledger::committed() const {
  std::lock_guard lock(mu_);
  return committed_;
}

void Ledger::VisitCommitted(const std::function<void(const WrittenRow&)>& f) const {
  std::lock_guard lock(mu_);
  for (const WrittenRow& r : committed_) f(r);
}

std::vector<WrittenRow> Ledger::rolled_back() const {
  std::lock_guard lock(mu_);
  return rolled_back_;
}

void Ledger::AddInDoubt(std::vector<WrittenRow> rows) {
  Trim(&rows);
  std::lock_guard lock(mu_);
  for (auto& r : rows) in_doubt_.push_back(std::move(r));
}

std::vector<WrittenRow> Ledger::in_doubt() const {
  std::lock_guard lock(mu_);
  return in_doubt_;
}

std::vector<CommittedTransaction> Ledger::transactions() const {
  std::lock_guard lock(mu_);
  return transactions_;
}

size_t Ledger::committed_count() const {
  std::lock_guard lock(mu_);
  return committed_.size();
}

// ---- Writer -------------------------------------------------------------------------------

Writer::Writer(const WorkloadOptions& options, Ledger* ledger, int writer_id, uint64_t seed)
    : options_(options),
      ledger_(ledger),
      writer_id_(writer_id < 0 ? g_next_writer.fetch_add(1) : writer_id),
      rng_(seed),
      pg_(options.database_url, "outbox-it-writer") {
  for (int i = 0; i < options_.aggregates_per_writer; ++i) {
    const char* kind = i % 3 == 2 ? "user" : "review";
    aggregates_.push_back(fmt::format("{}-w{}-{:03}", kind, writer_id_, i));
  }
}

WrittenRow Writer::MakeRow() {
  WrittenRow row;
  row.uuid = NewUlid();
  row.aggregate = aggregates_[rng_() % aggregates_.size()];
  row.seq = ++seq_[row.aggregate];
  bool user = row.aggregate.starts_with("user");
  std::string service = user ? "user" : "review";
  std::string event_type;
  if (user) {
    event_type = row.seq == 1 ? "user.registered" : "user.updated";
  } else {
    event_type =
        row.seq == 1 ? "review.created" : (rng_() % 4 == 0 ? "review.published" : "review.updated");
  }
  std::string correlation = NewUlid();
  if (rng_() % 8 == 0) correlation += "<b>&\"q\"";  // Go escapes these: \u003c \u003e \u0026
  std::map<std::string, std::string> metadata{
      {"Aggregate-Id", row.aggregate},
      {"Correlation-Id", correlation},
      {"Event-Type", event_type},
      {"Published-At", PublishedAt()},
      {"Schema-Version", "1"},
      {"Source-Service", service},
      {"traceparent", fmt::format("00-{}-{}-01", RandomHex(rng_, 32), RandomHex(rng_, 16))},
  };
  std::string payload = fmt::format(R"({{"agg":"{}","seq":{},"pad":")", row.aggregate, row.seq);
  size_t target = std::max(options_.payload_bytes, payload.size() + 2);
  payload.append(target - payload.size() - 2, 'x');
  payload += "\"}";

  row.expected.topic = fmt::format("{}.{}.{}", options_.topic_prefix, service,
                                   event_type.substr(0, event_type.find('.')));
  row.expected.key = row.aggregate;
  row.expected.value = payload;
  row.expected.headers = ExpectedHeaders(row.uuid, metadata);
  row.metadata_json = GoJsonObject(metadata);
  return row;
}

void Writer::Insert(const std::vector<WrittenRow>& rows, std::string* xid_out) {
  for (size_t start = 0; start < rows.size(); start += 100) {
    size_t end = std::min(rows.size(), start + 100);
    std::string sql =
        fmt::format("INSERT INTO {} (uuid, payload, metadata) VALUES ", QuoteIdent(options_.table));
    for (size_t i = start; i < end; ++i) {
      const WrittenRow& r = rows[i];
      if (i > start) sql += ",";
      sql += fmt::format("({},{},{})", QuoteLiteral(r.uuid), QuoteLiteral(*r.expected.value),
                         QuoteLiteral(r.metadata_json));
    }
    sql += " RETURNING transaction_id";
    auto xid = pg_.Scalar(sql);
    if (xid_out != nullptr && xid) *xid_out = *xid;
  }
}

void Writer::InsertOther(int rows) {
  if (rows <= 0) return;
  pg_.Exec(fmt::format("INSERT INTO {} (note) SELECT repeat('o', 200) FROM generate_series(1, {})",
                       QuoteIdent(options_.other_table), rows));
  ledger_->CountOtherTableRows(static_cast<size_t>(rows));
}

bool Writer::Transaction(const TxSpec& spec) {
  std::vector<WrittenRow> rows, phantoms;
  for (int i = 0; i < spec.rows; ++i) rows.push_back(MakeRow());
  for (int i = 0; i < spec.savepoint_rolled_back_rows; ++i) phantoms.push_back(MakeRow());
  size_t split = spec.savepoint_rolled_back_rows > 0 ? rows.size() / 2 : rows.size();
  std::string xid;

  pg_.Exec("BEGIN");
  try {
    Insert({rows.begin(), rows.begin() + static_cast<std::ptrdiff_t>(split)}, &xid);
    InsertOther(spec.other_table_rows / 2);
    if (!phantoms.empty()) {
      pg_.Exec("SAVEPOINT it_sp");
      Insert(phantoms, nullptr);
      pg_.Exec("ROLLBACK TO SAVEPOINT it_sp");
    }
    // After ROLLBACK TO the savepoint still exists: these rows commit from a subtransaction.
    Insert({rows.begin() + static_cast<std::ptrdiff_t>(split), rows.end()}, &xid);
    InsertOther(spec.other_table_rows - spec.other_table_rows / 2);
  } catch (...) {
    try {
      pg_.Exec("ROLLBACK");
    } catch (...) {
    }
    throw;
  }
  if (spec.rollback) {
    pg_.Exec("ROLLBACK");
    ledger_->CountAborted();
    ledger_->AddRolledBack(std::move(rows));
    ledger_->AddRolledBack(std::move(phantoms));
    return false;
  }
  for (auto& r : rows) r.xid = xid;
  try {
    pg_.Exec("COMMIT");
  } catch (...) {
    // No answer to the COMMIT: it may have committed. The savepoint's rows
    // are rolled back either way.
    ledger_->AddInDoubt(std::move(rows));
    ledger_->AddRolledBack(std::move(phantoms));
    throw;
  }
  ledger_->AddCommitted(xid, std::move(rows));
  ledger_->AddRolledBack(std::move(phantoms));
  return true;
}

void Writer::OtherTableOnly(int rows) {
  pg_.Exec("BEGIN");
  InsertOther(rows);
  pg_.Exec("COMMIT");
}

// ---- LoadGenerator ------------------------------------------------------------------------

LoadGenerator::LoadGenerator(WorkloadOptions options, Ledger* ledger, int writers, NextTx next,
                             std::chrono::microseconds pause, OnFailure on_failure)
    : options_(std::move(options)),
      ledger_(ledger),
      writers_(writers),
      next_(std::move(next)),
      pause_(pause),
      on_failure_(on_failure) {}

LoadGenerator::~LoadGenerator() { Stop(); }

void LoadGenerator::Start() {
  stop_ = false;
  const uint64_t base = seed_.value_or(std::random_device{}());
  for (int w = 0; w < writers_; ++w) {
    uint64_t seed = base * 7919ull + static_cast<uint64_t>(w);
    fmt::print("load: writer {} seed {}\n", w, seed);
    threads_.emplace_back([this, seed] { Write(seed); });
  }
}

void LoadGenerator::Write(uint64_t seed) {
  std::mt19937_64 rng(seed ^ 0x9E3779B97F4A7C15ull);
  uint64_t writer_seed = seed;
  while (!stop_.load()) {
    try {
      Writer writer(options_, ledger_, -1, writer_seed);
      while (!stop_.load()) {
        writer.Transaction(next_(rng));
        transactions_.fetch_add(1);
        if (pause_.count() > 0) std::this_thread::sleep_for(pause_);
      }
    } catch (const std::exception& e) {
      failures_.fetch_add(1);
      std::lock_guard lock(mu_);
      if (error_.empty()) error_ = e.what();
    }
    if (on_failure_ == OnFailure::kStop) return;
    if (!stop_.load()) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    writer_seed = rng();  // new aggregates for the new connection
  }
}

std::string LoadGenerator::Stop() {
  stop_ = true;
  for (auto& t : threads_) t.join();
  threads_.clear();
  std::lock_guard lock(mu_);
  return error_;
}

}  // namespace outbox_test
