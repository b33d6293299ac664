// RecordMapper::Map does not allocate once its buffers have grown (DESIGN §5:
// memory must not grow with traffic, and the hot path stays cheap).
//
// Counts calls to the global operator new, replaced for this test binary.
// Counting is switched on only inside the measured region, so gtest's own
// allocations do not matter. simdjson allocates its buffers with
// new(std::nothrow), which lands here too.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <new>
#include <string>
#include <vector>

#include "outbox_relay/outbox/dead_letter.h"
#include "outbox_relay/outbox/record.h"

namespace {
std::atomic<bool> g_counting{false};
std::atomic<long> g_allocations{0};

void* CountedAlloc(std::size_t size) {
  if (g_counting.load(std::memory_order_relaxed)) {
    g_allocations.fetch_add(1, std::memory_order_relaxed);
  }
  if (size == 0) size = 1;
  return std::malloc(size);
}

// Out of line, so GCC does not see `new` paired with an inlined free() and
// warn about a mismatch (-Wmismatched-new-delete).
[[gnu::noinline]] void CountedFree(void* p) noexcept { std::free(p); }
}  // namespace

void* operator new(std::size_t size) {
  if (void* p = CountedAlloc(size)) return p;
  throw std::bad_alloc();
}
void* operator new[](std::size_t size) {
  if (void* p = CountedAlloc(size)) return p;
  throw std::bad_alloc();
}
void* operator new(std::size_t size, const std::nothrow_t&) noexcept { return CountedAlloc(size); }
void* operator new[](std::size_t size, const std::nothrow_t&) noexcept {
  return CountedAlloc(size);
}
void operator delete(void* p) noexcept { CountedFree(p); }
void operator delete[](void* p) noexcept { CountedFree(p); }
void operator delete(void* p, std::size_t) noexcept { CountedFree(p); }
void operator delete[](void* p, std::size_t) noexcept { CountedFree(p); }
void operator delete(void* p, const std::nothrow_t&) noexcept { CountedFree(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept { CountedFree(p); }

namespace outbox_relay::outbox {
namespace {

using pgoutput::TupleData;
using pgoutput::TupleValue;

class CountAllocations {
 public:
  CountAllocations() {
    g_allocations = 0;
    g_counting = true;
  }
  ~CountAllocations() { g_counting = false; }
  long count() const { return g_allocations.load(); }
};

TupleValue Text(std::string_view s) { return TupleValue{TupleValue::Kind::kText, s}; }

TEST(RecordMapperAllocations, SteadyStateMapDoesNotAllocate) {
  MapperOptions options;
  options.commit_lsn_header = "outbox_commit_lsn";
  auto mapper = RecordMapper::Create(options);
  ASSERT_TRUE(mapper.has_value());
  const ColumnMap columns{.uuid = 0, .payload = 1, .metadata = 2, .transaction_id = 3, .offset = 4};

  // Different rows of a similar size, as a stream brings them.
  std::vector<std::string> uuids, payloads, metadatas, xids, offsets;
  for (int i = 0; i < 64; ++i) {
    uuids.push_back(fmt::format("01HQZX3V5K8Y2M4N6P7R9S{:04}", i));
    payloads.push_back(fmt::format(R"({{"review_id":"r-{}","rating":{},"text":"{}"}})", i, i % 5,
                                   std::string(200 + i % 7, 'x')));
    metadatas.push_back(
        fmt::format(R"({{"Aggregate-Id":"r-{}","Correlation-Id":"c-{}","Event-Type":"review.{}",)"
                    R"("Published-At":"2024-03-01T12:00:{:02}Z","Schema-Version":"1",)"
                    R"("Source-Service":"review","traceparent":"00-{:032}-00f067aa0ba902b7-01"}})",
                    i, i * 7, i % 2 ? "created" : "updated", i % 60, i));
    xids.push_back(std::to_string(5000000000ull + i));
    offsets.push_back(std::to_string(1000 + i));
  }
  std::vector<TupleData> rows;
  for (int i = 0; i < 64; ++i) {
    rows.push_back(TupleData{
        {Text(uuids[i]), Text(payloads[i]), Text(metadatas[i]), Text(xids[i]), Text(offsets[i])}});
  }

  // Warm up: buffers grow to the largest row.
  for (const TupleData& row : rows) {
    auto mapped = mapper->Map(columns, row, Lsn(0xFFFFFFFF'FFFFFFFFull));
    ASSERT_TRUE(mapped.has_value() && mapped->record != nullptr);
  }

  long allocations = 0;
  size_t headers = 0;
  {
    CountAllocations counter;
    for (int round = 0; round < 100; ++round) {
      for (const TupleData& row : rows) {
        auto mapped = mapper->Map(columns, row, Lsn(0x16B3748 + round));
        if (mapped && mapped->record) headers += mapped->record->headers.size();
      }
    }
    allocations = counter.count();
  }
  EXPECT_EQ(allocations, 0);
  EXPECT_EQ(headers, 100u * 64 * 10);
}

TEST(RecordMapperAllocations, TheCounterSeesAllocations) {
  long allocations = 0;
  {
    CountAllocations counter;
    auto* s = new std::string(100, 'x');
    delete s;
    allocations = counter.count();
  }
  EXPECT_GE(allocations, 1);
}

}  // namespace
}  // namespace outbox_relay::outbox
