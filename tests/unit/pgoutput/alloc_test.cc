// Steady-state decoding allocates nothing: counted, not assumed.
//
// This file replaces the global operator new/delete for the whole unit_pgoutput binary with
// thin malloc/free wrappers that count calls made while a test has counting switched on.
// Nothing else changes for the other tests in the binary.
#include <gtest/gtest.h>

#include <cstdlib>
#include <new>
#include <string>
#include <vector>

#include "outbox_relay/pgoutput/decoder.h"

namespace {
thread_local bool g_counting = false;
thread_local long g_allocations = 0;

void* CountedAlloc(std::size_t size) {
  if (g_counting) ++g_allocations;
  if (size == 0) size = 1;
  if (void* p = std::malloc(size)) return p;
  throw std::bad_alloc();
}
}  // namespace

void* operator new(std::size_t size) { return CountedAlloc(size); }
void* operator new[](std::size_t size) { return CountedAlloc(size); }
void* operator new(std::size_t size, const std::nothrow_t&) noexcept {
  if (g_counting) ++g_allocations;
  return std::malloc(size == 0 ? 1 : size);
}
void* operator new[](std::size_t size, const std::nothrow_t&) noexcept {
  if (g_counting) ++g_allocations;
  return std::malloc(size == 0 ? 1 : size);
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
void operator delete(void* p, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept { std::free(p); }

namespace outbox_relay::pgoutput {
namespace {

// Counts the allocations made while it is alive.
class AllocationCounter {
 public:
  AllocationCounter() {
    g_allocations = 0;
    g_counting = true;
  }
  ~AllocationCounter() { g_counting = false; }
  long count() const { return g_allocations; }
};

TupleValue Text(std::string_view s) { return {TupleValue::Kind::kText, s}; }
TupleValue Null() { return {TupleValue::Kind::kNull, {}}; }

std::vector<std::string> Inserts() {
  return {
      Encode(Insert{16385, TupleData{{Null(), Text("1"), Text("01HZX3K4M5N6P7Q8R9S0T1V2W3"),
                                      Text("2024-05-01 12:00:00+00"), Text(R"({"a":1})"),
                                      Text(R"({"Event-Type":"review.created"})"), Text("731")}}}),
      Encode(
          Insert{16385, TupleData{{Null(), Text("2"), Text("01HZX3K4M5N6P7Q8R9S0T1V2W4"),
                                   Text("2024-05-01 12:00:01+00"), Null(), Null(), Text("732")}}}),
  };
}

TEST(DecodeAllocations, CounterSeesAllocations) {
  AllocationCounter counter;
  std::vector<int> v(10);
  EXPECT_GE(counter.count(), 1);
}

TEST(DecodeAllocations, InsertAfterInsertAllocatesNothing) {
  std::vector<std::string> inserts = Inserts();
  DecodedMessage out;
  ASSERT_TRUE(Decode(inserts[0], &out));  // the first one sizes the vector
  AllocationCounter counter;
  for (int i = 0; i < 1000; ++i) {
    Status s = Decode(inserts[static_cast<size_t>(i) % inserts.size()], &out);
    ASSERT_TRUE(s);
  }
  EXPECT_EQ(counter.count(), 0);
}

TEST(DecodeAllocations, RelationResentWithTheSameShapeAllocatesNothing) {
  Relation r;
  r.relation_id = 16385;
  r.nspname = "public";
  r.relname = "outbox_with_a_name_longer_than_the_small_string_buffer";
  r.replica_identity = 'd';
  r.columns = {{0, "offset_acked", 20, -1}, {1, "offset_consumed", 20, -1}};
  std::string bytes = Encode(r);
  DecodedMessage out;
  ASSERT_TRUE(Decode(bytes, &out));
  AllocationCounter counter;
  ASSERT_TRUE(Decode(bytes, &out));
  EXPECT_EQ(counter.count(), 0);
}

// A DecodedMessage holds one alternative at a time: decoding a Begin into the slot that held
// an Insert destroys the Insert's vector. A caller wanting zero allocations over B I C B I C
// keeps the hot message type in its own slot, chosen by the first byte.
TEST(DecodeAllocations, TransactionsAllocateNothingWhenInsertsHaveTheirOwnSlot) {
  std::vector<std::string> stream;
  for (int tx = 0; tx < 100; ++tx) {
    stream.push_back(Encode(Begin{Lsn(0x1000 + static_cast<uint64_t>(tx)), {}, 731}));
    for (const std::string& insert : Inserts()) stream.push_back(insert);
    stream.push_back(Encode(Commit{0, Lsn(0x1000), Lsn(0x1010), {}}));
  }
  DecodedMessage insert_slot;
  DecodedMessage other_slot;
  auto decode = [&](const std::string& bytes) {
    return Decode(bytes, bytes[0] == 'I' ? &insert_slot : &other_slot);
  };
  for (size_t i = 0; i < 4; ++i) ASSERT_TRUE(decode(stream[i]));  // warm up
  AllocationCounter counter;
  for (const std::string& bytes : stream) ASSERT_TRUE(decode(bytes));
  EXPECT_EQ(counter.count(), 0);
}

}  // namespace
}  // namespace outbox_relay::pgoutput
