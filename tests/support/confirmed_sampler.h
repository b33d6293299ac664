// Samples a replication slot's confirmed_flush_lsn on its own connection (every
// 50 ms, and on demand) and counts every step backwards: the slot's only
// durable progress must never move back (a relay that starts from a stale
// position would move it back, and PostgreSQL 15 accepts that).
// Header-only, so the integration binary needs no CMake change for it.
#pragma once

#include <fmt/format.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <mutex>
#include <string>
#include <thread>

#include "support/pg.h"

namespace outbox_test {

class ConfirmedSampler {
 public:
  ConfirmedSampler(const std::string& url, std::string slot) : slot_(std::move(slot)), pg_(url) {
    thread_ = std::thread([this] { Loop(); });
  }
  ~ConfirmedSampler() { Stop(); }
  ConfirmedSampler(const ConfirmedSampler&) = delete;
  ConfirmedSampler& operator=(const ConfirmedSampler&) = delete;

  void Stop() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
  }
  // Takes one sample now (from the caller's thread, e.g. right after a kill).
  void SampleNow() {
    std::lock_guard lock(mu_);
    Sample();
  }
  // Forget the last value: the slot was dropped and recreated on purpose, so
  // its position starts afresh (a new slot may begin below the old one's).
  void Rebase() {
    std::lock_guard lock(mu_);
    last_ = 0;
  }
  size_t samples() const { return samples_; }
  size_t backwards() const { return backwards_; }
  std::string first_backwards() const {
    std::lock_guard lock(mu_);
    return first_backwards_;
  }
  uint64_t last() const { return last_; }

 private:
  void Loop() {
    while (!stop_) {
      {
        std::lock_guard lock(mu_);
        Sample();
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }
  void Sample() {
    try {
      auto s = QuerySlot(pg_, slot_);
      if (!s || !s->confirmed_flush_lsn) return;
      ++samples_;
      uint64_t v = *s->confirmed_flush_lsn;
      if (v < last_) {
        ++backwards_;
        if (first_backwards_.empty()) {
          first_backwards_ = fmt::format("{} -> {}", FormatLsn(last_), FormatLsn(v));
        }
      }
      if (v > last_) last_ = v;
    } catch (const std::exception& e) {
      std::fprintf(stderr, "[sampler] %s\n", e.what());
    }
  }

  std::string slot_;
  Pg pg_;
  mutable std::mutex mu_;
  std::atomic<bool> stop_{false};
  std::atomic<size_t> samples_{0};
  std::atomic<size_t> backwards_{0};
  std::atomic<uint64_t> last_{0};
  std::string first_backwards_;
  std::thread thread_;
};

}  // namespace outbox_test
