// Row -> Kafka record throughput on one core (DESIGN §8: speed is measured
// here, never asserted in a test). Target: >= 1,000,000 rows/s for pgoutput
// decode + map together.
//
// The row is the seed's table (DESIGN §3) as pgoutput sends it: offset_acked
// NULL, a bigserial offset, a 26-char ULID, created_at, a ~250-byte JSON
// payload, ~300 bytes of metadata with the seven envelope keys as Go's
// json.Marshal writes them, and an xid8 above 2^32.
//
//   BM_MetadataParse     simdjson parse + sort of the metadata alone
//   BM_MapRow            RecordMapper::Map of an already decoded row
//   BM_DecodeAndMapRow   pgoutput::Decode of the 'I' message + Map
#include <benchmark/benchmark.h>

#include <string>
#include <string_view>
#include <variant>

#include "outbox_relay/outbox/record.h"
#include "outbox_relay/pgoutput/decoder.h"

namespace outbox_relay::outbox {
namespace {

using pgoutput::TupleValue;

constexpr std::string_view kUuid = "01HQZX3V5K8Y2M4N6P7R9S0T1U";
constexpr std::string_view kPayload =
    R"({"review_id":"01HQZX3T9QF2W8E7D6C5B4A3Z2","place_id":"01HQZX2M1N0P9Q8R7S6T5U4V3W",)"
    R"("author_id":"01HQZX1A2B3C4D5E6F7G8H9J0K","rating":5,"text":"Great coffee, friendly )"
    R"(staff, will come back","created_at":"2024-03-01T12:00:00.123456Z","visible":true})";
constexpr std::string_view kMetadata =
    R"({"Aggregate-Id":"01HQZX3T9QF2W8E7D6C5B4A3Z2","Correlation-Id":"9f1c2e7a-4b8d-4c21-)"
    R"(a3f6-2d9e8b7c6a51","Event-Type":"review.created","Published-At":"2024-03-01T12:00:00)"
    R"(.123456Z","Schema-Version":"1","Source-Service":"review","traceparent":"00-4bf92f35)"
    R"(77b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"})";

TupleValue Text(std::string_view s) { return TupleValue{TupleValue::Kind::kText, s}; }

pgoutput::Relation SeedRelation() {
  pgoutput::Relation r;
  r.relation_id = 16390;
  r.nspname = "public";
  r.relname = "outbox";
  for (const char* name : {"offset_acked", "offset_consumed", "uuid", "created_at", "payload",
                           "metadata", "transaction_id"}) {
    r.columns.push_back(pgoutput::RelationColumn{0, name, 25, -1});
  }
  return r;
}

pgoutput::Insert SeedInsert() {
  pgoutput::Insert insert;
  insert.relation_id = 16390;
  insert.new_tuple.values = {
      TupleValue{},   Text("123456789"), Text(kUuid),       Text("2024-03-01 12:00:00.123456+00"),
      Text(kPayload), Text(kMetadata),   Text("5000001234")};
  return insert;
}

struct Fixture {
  Fixture() {
    columns = *ColumnMap::Resolve(SeedRelation(), ColumnNames{});
    mapper.emplace(*RecordMapper::Create(MapperOptions{}));
  }
  ColumnMap columns;
  std::optional<RecordMapper> mapper;
};

void BM_MetadataParse(benchmark::State& state) {
  Metadata metadata;
  for (auto _ : state) {
    auto st = metadata.Parse(kMetadata);
    benchmark::DoNotOptimize(st);
    benchmark::DoNotOptimize(metadata.entries().data());
  }
  state.SetItemsProcessed(state.iterations());
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(kMetadata.size()));
}
BENCHMARK(BM_MetadataParse);

void BM_MapRow(benchmark::State& state) {
  Fixture f;
  pgoutput::Insert insert = SeedInsert();
  for (auto _ : state) {
    auto mapped = f.mapper->Map(f.columns, insert.new_tuple, Lsn(0x1'6B374800ull));
    if (!mapped || mapped->record == nullptr) {
      state.SkipWithError("row did not map");
      break;
    }
    benchmark::DoNotOptimize(mapped->record->headers.data());
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_MapRow);

void BM_DecodeAndMapRow(benchmark::State& state) {
  Fixture f;
  const std::string wire = pgoutput::Encode(SeedInsert());
  pgoutput::DecodedMessage message;
  for (auto _ : state) {
    if (!pgoutput::Decode(wire, &message)) {
      state.SkipWithError("decode failed");
      break;
    }
    const auto& insert = std::get<pgoutput::Insert>(message);
    auto mapped = f.mapper->Map(f.columns, insert.new_tuple, Lsn(0x1'6B374800ull));
    if (!mapped || mapped->record == nullptr) {
      state.SkipWithError("row did not map");
      break;
    }
    benchmark::DoNotOptimize(mapped->record->headers.data());
  }
  state.SetItemsProcessed(state.iterations());
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(wire.size()));
  state.counters["wire_bytes"] = static_cast<double>(wire.size());
}
BENCHMARK(BM_DecodeAndMapRow);

}  // namespace
}  // namespace outbox_relay::outbox

// bench_micro links benchmark::benchmark, not benchmark_main, and several
// files share the binary: weak, so that any other file's main() takes over
// and there is exactly one either way.
[[gnu::weak]] int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
