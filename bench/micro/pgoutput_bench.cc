// Decode speed of the pgoutput v1 decoder on a realistic outbox row. Reported as rows/s
// (items_per_second) and bytes/s. Speed is measured here, never asserted in a test.
#include <benchmark/benchmark.h>

#include <string>
#include <string_view>
#include <vector>

#include "outbox_relay/pgoutput/decoder.h"

namespace outbox_relay::pgoutput {
namespace {

// One row of the seed's outbox table as PostgreSQL 15 sends it: 7 columns, a 26-character
// ULID, a ~250-byte JSON payload and a ~300-byte JSON metadata envelope.
constexpr std::string_view kUuid = "01HZX3K4M5N6P7Q8R9S0T1V2W3";
constexpr std::string_view kCreatedAt = "2024-05-01 12:00:00.123456+00";
constexpr std::string_view kPayload =
    R"({"review_id":"0b6f8e0e-3c1f-4a57-9d2e-5f0f8b1c2d3e","place_id":"kz-almaty-000123",)"
    R"("author_id":"u-4821","rating":5,"text":"Great coffee, quick service. Will come back!",)"
    R"("created_at":"2024-05-01T12:00:00.123456Z","tags":["coffee","service","wifi"]})";
constexpr std::string_view kMetadata =
    R"({"Aggregate-Id":"review-0b6f8e0e-3c1f-4a57-9d2e-5f0f8b1c2d3e",)"
    R"("Correlation-Id":"7d1c9e2a-4b3f-4e8a-9c6d-1a2b3c4d5e6f","Event-Type":"review.created",)"
    R"("Published-At":"2024-05-01T12:00:00.123456Z","Schema-Version":"1",)"
    R"("Source-Service":"review","traceparent":"00-4bf92f3577b34da6a3ce929d0e0e4736-)"
    R"(00f067aa0ba902b7-01"})";

TupleValue Text(std::string_view s) { return {TupleValue::Kind::kText, s}; }

std::string OutboxInsert() {
  return Encode(Insert{16385, TupleData{{{TupleValue::Kind::kNull, {}},
                                         Text("1042"),
                                         Text(kUuid),
                                         Text(kCreatedAt),
                                         Text(kPayload),
                                         Text(kMetadata),
                                         Text("731")}}});
}

void SetCounters(benchmark::State& state, size_t bytes_per_row) {
  state.SetItemsProcessed(state.iterations());
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(bytes_per_row));
  state.SetLabel(fmt::format("{}-byte Insert", bytes_per_row));
}

// The relay's hot path: Insert after Insert into one reused DecodedMessage (no allocation).
void BM_DecodeInsert(benchmark::State& state) {
  const std::string bytes = OutboxInsert();
  DecodedMessage out;
  for (auto _ : state) {
    Status s = Decode(bytes, &out);
    benchmark::DoNotOptimize(s);
    benchmark::DoNotOptimize(out);
  }
  if (!Decode(bytes, &out)) state.SkipWithError("sample does not decode");
  SetCounters(state, bytes.size());
}
BENCHMARK(BM_DecodeInsert);

// The same without reuse: what a caller pays for a fresh DecodedMessage per row.
void BM_DecodeInsertFresh(benchmark::State& state) {
  const std::string bytes = OutboxInsert();
  for (auto _ : state) {
    DecodedMessage out;
    Status s = Decode(bytes, &out);
    benchmark::DoNotOptimize(s);
    benchmark::DoNotOptimize(out);
  }
  SetCounters(state, bytes.size());
}
BENCHMARK(BM_DecodeInsertFresh);

// A one-row transaction, B I C, with the Insert kept in its own slot. Counted per row.
void BM_DecodeOneRowTransaction(benchmark::State& state) {
  const std::vector<std::string> messages = {
      Encode(Begin{Lsn(0x16B374D848), PgTimestamp{767'880'000'000'000}, 731}), OutboxInsert(),
      Encode(Commit{0, Lsn(0x16B374D848), Lsn(0x16B374D878), PgTimestamp{767'880'000'000'000}})};
  DecodedMessage insert_slot;
  DecodedMessage other_slot;
  size_t bytes = 0;
  for (const std::string& m : messages) bytes += m.size();
  for (auto _ : state) {
    for (const std::string& m : messages) {
      Status s = Decode(m, m[0] == 'I' ? &insert_slot : &other_slot);
      benchmark::DoNotOptimize(s);
    }
    benchmark::DoNotOptimize(insert_slot);
  }
  state.SetItemsProcessed(state.iterations());
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(bytes));
}
BENCHMARK(BM_DecodeOneRowTransaction);

}  // namespace
}  // namespace outbox_relay::pgoutput
