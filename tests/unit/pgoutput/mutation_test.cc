// Deterministic random mutations of real pgoutput messages: the decoder must never crash, and
// must either reject the bytes with a kProtocol error that names a byte offset, or accept them
// exactly (Encode gives the same bytes back). Run it under -DOUTBOX_SANITIZE=ON: each input
// sits in a heap block of exactly its size, so a one-byte over-read is reported.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "golden_stream.h"
#include "outbox_relay/core/bytes.h"
#include "outbox_relay/pgoutput/decoder.h"

namespace outbox_relay::pgoutput {
namespace {

constexpr int kIterations = 100'000;
constexpr uint64_t kSeed = 0x5EED'0B0C'5EED'0001;

std::vector<std::string> Corpus() {
  std::vector<std::string> corpus;
  auto golden = golden::LoadGoldenStream(golden::GoldenStreamPath());
  EXPECT_TRUE(golden) << golden.error().message;
  if (golden) {
    for (const golden::GoldenLine& line : *golden) corpus.push_back(line.bytes);
  }
  // Shapes the recording does not have.
  corpus.push_back(Encode(Truncate{3, {16385, 16390, 16400}}));
  corpus.push_back(Encode(Update{16385, TupleData{{{TupleValue::Kind::kText, "k"}}}, true,
                                 TupleData{{{TupleValue::Kind::kUnchangedToast, {}}}}}));
  corpus.push_back(Encode(Insert{16385, TupleData{}}));
  corpus.push_back(Encode(Message{0, Lsn(1), "", ""}));
  return corpus;
}

class Mutator {
 public:
  explicit Mutator(uint64_t seed) : rng_(seed) {}

  // A number in [0, n); n > 0. Plain modulo: the bias does not matter here, and unlike the
  // std distributions it gives the same sequence with every standard library.
  size_t Below(size_t n) { return static_cast<size_t>(rng_() % n); }
  uint8_t Byte() { return static_cast<uint8_t>(rng_()); }

  void Mutate(std::string* s) {
    int rounds = 1 + static_cast<int>(Below(3));
    for (int i = 0; i < rounds; ++i) MutateOnce(s);
  }

 private:
  void MutateOnce(std::string* s) {
    switch (Below(9)) {
      case 0:  // overwrite a byte
        if (!s->empty()) (*s)[Below(s->size())] = static_cast<char>(Byte());
        break;
      case 1:  // flip a bit
        if (!s->empty()) (*s)[Below(s->size())] ^= static_cast<char>(1 << Below(8));
        break;
      case 2:  // truncate
        s->resize(Below(s->size() + 1));
        break;
      case 3:  // extend
        for (size_t n = 1 + Below(8); n > 0; --n) s->push_back(static_cast<char>(Byte()));
        break;
      case 4:  // insert a byte
        s->insert(s->begin() + static_cast<std::ptrdiff_t>(Below(s->size() + 1)),
                  static_cast<char>(Byte()));
        break;
      case 5:  // delete a range
        if (!s->empty()) {
          size_t at = Below(s->size());
          s->erase(at, 1 + Below(s->size() - at));
        }
        break;
      case 6:  // an interesting Int32 where a length or count may be
        Overwrite(s, Interesting32(s->size()), 4);
        break;
      case 7:  // an interesting Int16 where a column count may be
        Overwrite(s, Interesting16(), 2);
        break;
      case 8:  // duplicate a chunk (repeated columns, repeated tuples)
        if (!s->empty()) {
          size_t at = Below(s->size());
          std::string chunk = s->substr(at, 1 + Below(16));
          s->insert(Below(s->size() + 1), chunk);
        }
        break;
    }
  }

  uint32_t Interesting32(size_t size) {
    const uint32_t values[] = {0,          1,          0x7FFFFFFF,
                               0x80000000, 0xFFFFFFFF, static_cast<uint32_t>(size),
                               0x00010000, 0xFFFFFFFE};
    return values[Below(std::size(values))];
  }
  uint32_t Interesting16() {
    const uint32_t values[] = {0, 1, 0x7FFF, 0x8000, 0xFFFF, 0x0100, 7, 8};
    return values[Below(std::size(values))];
  }
  void Overwrite(std::string* s, uint32_t v, size_t width) {
    if (s->size() < width) return;
    size_t at = Below(s->size() - width + 1);
    for (size_t i = 0; i < width; ++i) {
      (*s)[at + i] = static_cast<char>((v >> (8 * (width - 1 - i))) & 0xFF);
    }
  }

  std::mt19937_64 rng_;
};

TEST(DecodeMutations, NeverCrashAndEitherRejectWithAnOffsetOrDecodeExactly) {
  std::vector<std::string> corpus = Corpus();
  ASSERT_GT(corpus.size(), 10u);
  Mutator mutator(kSeed);
  DecodedMessage reused;  // carries storage from one iteration to the next: the reuse paths
  int accepted = 0;
  int rejected = 0;
  for (int i = 0; i < kIterations; ++i) {
    std::string input = corpus[mutator.Below(corpus.size())];
    mutator.Mutate(&input);
    std::unique_ptr<char[]> exact(new char[input.size()]);
    std::memcpy(exact.get(), input.data(), input.size());
    std::string_view view(exact.get(), input.size());

    DecodedMessage fresh;
    DecodedMessage* out = (i % 2 == 0) ? &reused : &fresh;
    Status s = Decode(view, out);
    if (s) {
      ++accepted;
      ASSERT_EQ(Encode(*out), input) << "iteration " << i << ": accepted but not exact";
    } else {
      ++rejected;
      ASSERT_EQ(s.error().code, ErrorCode::kProtocol) << "iteration " << i;
      ASSERT_NE(s.error().message.find(" at byte "), std::string::npos)
          << "iteration " << i << ": " << s.error().message;
    }
  }
  // Both outcomes must be common, or the mutations are not exercising the decoder.
  EXPECT_GT(accepted, kIterations / 100);
  EXPECT_GT(rejected, kIterations / 2);
  RecordProperty("accepted", accepted);
  RecordProperty("rejected", rejected);
}

}  // namespace
}  // namespace outbox_relay::pgoutput
