// libFuzzer target for the pgoutput v1 decoder.
//
// The property is the one the unit tests hold the decoder to: any input either decodes, and
// then Encode gives exactly the input back, or is rejected with a kProtocol error that names a
// byte offset. Anything else (a crash, a sanitizer report, a non-exact accept) is a finding.
//
// Build (clang >= 19: std::expected with libstdc++ needs it) and run, from the repo root:
//   CXX=clang++-19 cmake -S . -B build-fuzz -G Ninja -DOUTBOX_BUILD_BENCH=OFF \
//     -DOUTBOX_RDKAFKA_ROOT="$(scripts/librdkafka build)"
//   cmake --build build-fuzz --target pgoutput_fuzz
//   mkdir -p /tmp/pgoutput-corpus && grep -v '^#' tests/fixtures/pgoutput/stream_v1.hex |
//     cut -f3 | while read -r h; do echo "$h" | xxd -r -p >"/tmp/pgoutput-corpus/${h:0:24}"; done
//   ./build-fuzz/tests/fuzz/pgoutput_fuzz /tmp/pgoutput-corpus -max_total_time=300
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "outbox_relay/pgoutput/decoder.h"

namespace {

[[noreturn]] void Finding(const char* what, std::string_view detail) {
  std::fprintf(stderr, "pgoutput_fuzz: %s: %.*s\n", what, static_cast<int>(detail.size()),
               detail.data());
  std::abort();
}

void Check(std::string_view input, outbox_relay::pgoutput::DecodedMessage* out) {
  outbox_relay::Status s = outbox_relay::pgoutput::Decode(input, out);
  if (s) {
    if (outbox_relay::pgoutput::Encode(*out) != input) Finding("accepted but not exact", "");
    return;
  }
  if (s.error().code != outbox_relay::ErrorCode::kProtocol) {
    Finding("error is not kProtocol", s.error().message);
  }
  if (s.error().message.find(" at byte ") == std::string::npos) {
    Finding("error names no byte offset", s.error().message);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view input(reinterpret_cast<const char*>(data), size);
  // A fresh message, and one that keeps the storage of earlier inputs: the reuse paths.
  outbox_relay::pgoutput::DecodedMessage fresh;
  Check(input, &fresh);
  static outbox_relay::pgoutput::DecodedMessage reused;
  Check(input, &reused);
  return 0;
}
