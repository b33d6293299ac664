// Helpers of the network fault tests (tests/network): addresses behind a
// proxy, the relay's log as a timeline, the slot's confirmation as the
// measure of recovery, and the figures every scenario prints (and appends to
// <build>/tests/integration/logs/network_figures.tsv for the table in the
// issue's closing note). Header-only.
#pragma once

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <chrono>
#include <ctime>
#include <fstream>
#include <memory>
#include <optional>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "support/delivery.h"
#include "support/env.h"
#include "support/pg.h"
#include "support/relay_process.h"
#include "support/workload.h"

namespace outbox_test::network {

using Clock = std::chrono::steady_clock;
using SysClock = std::chrono::system_clock;
using std::chrono::milliseconds;
using std::chrono::seconds;

// "host:port" of a postgresql:// URL with one host.
inline std::string HostPort(const std::string& url) {
  size_t at = url.find('@');
  size_t start = at == std::string::npos ? url.find("://") + 3 : at + 1;
  size_t end = url.find('/', start);
  return url.substr(start, end - start);
}

// `url` with its host:port replaced by `hosts` ("127.0.0.1:1,127.0.0.1:2").
inline std::string WithHosts(const std::string& url, const std::string& hosts) {
  std::string hp = HostPort(url);
  size_t at = url.find(hp);
  return url.substr(0, at) + hosts + url.substr(at + hp.size());
}

// Times of the relay's log lines containing `needle` (text log format:
// "2026-12-01T23:01:15.123456Z level message").
inline std::vector<SysClock::time_point> LogTimes(const std::string& log,
                                                  const std::string& needle) {
  std::vector<SysClock::time_point> out;
  size_t pos = 0;
  while ((pos = log.find(needle, pos)) != std::string::npos) {
    size_t line = log.rfind('\n', pos);
    line = line == std::string::npos ? 0 : line + 1;
    pos += needle.size();
    std::tm tm{};
    int micros = 0;
    if (std::sscanf(log.c_str() + line, "%4d-%2d-%2dT%2d:%2d:%2d.%6dZ", &tm.tm_year, &tm.tm_mon,
                    &tm.tm_mday, &tm.tm_hour, &tm.tm_min, &tm.tm_sec, &micros) != 7) {
      continue;
    }
    tm.tm_year -= 1900;
    tm.tm_mon -= 1;
    out.push_back(SysClock::from_time_t(timegm(&tm)) + std::chrono::microseconds(micros));
  }
  return out;
}

// Seconds from `since` to the first line with `needle` logged at or after it
// (nullopt: none).
inline std::optional<double> FirstLogAfter(const std::string& log, const std::string& needle,
                                           SysClock::time_point since) {
  for (auto t : LogTimes(log, needle)) {
    if (t >= since) return std::chrono::duration<double>(t - since).count();
  }
  return std::nullopt;
}

inline size_t CountLogAfter(const std::string& log, const std::string& needle,
                            SysClock::time_point since) {
  size_t n = 0;
  for (auto t : LogTimes(log, needle)) n += t >= since ? 1 : 0;
  return n;
}

// Polls the slot until its confirmed_flush_lsn reaches `lsn`: seconds taken,
// nullopt after `timeout`.
inline std::optional<double> SecondsUntilConfirmed(Pg& db, const std::string& slot, uint64_t lsn,
                                                   std::chrono::milliseconds timeout) {
  auto start = Clock::now();
  while (Clock::now() - start < timeout) {
    auto s = QuerySlot(db, slot);
    if (s && s->confirmed_flush_lsn && *s->confirmed_flush_lsn >= lsn) {
      return std::chrono::duration<double>(Clock::now() - start).count();
    }
    std::this_thread::sleep_for(milliseconds(100));
  }
  return std::nullopt;
}

// The opening of every scenario: once `relay` streams, the load starts (two
// writers of mixed transactions, a tenth rolled back, 5 ms apart) and runs
// for `warmup`. nullptr (and a failure) when the relay does not stream
// within `timeout`.
inline std::unique_ptr<LoadGenerator> LoadOnceStreaming(RelayProcess& relay,
                                                        const WorkloadOptions& workload,
                                                        Ledger* ledger, seconds warmup,
                                                        milliseconds timeout = seconds(60)) {
  if (!relay.WaitForLog("streaming from slot", timeout)) {
    ADD_FAILURE() << "the relay does not stream\n" << relay.LogTail();
    return nullptr;
  }
  auto load = std::make_unique<LoadGenerator>(
      workload, ledger, 2,
      [](std::mt19937_64& rng) {
        TxSpec tx;
        tx.rows = 1 + static_cast<int>(rng() % 20);
        tx.rollback = rng() % 10 == 0;
        return tx;
      },
      std::chrono::microseconds(5000));
  load->Start();
  std::this_thread::sleep_for(warmup);
  return load;
}

// What a scenario prints: the delivery check and the clock.
struct Figures {
  std::string scenario;
  DeliveryReport delivery;
  std::optional<double> detect_s;  // fault start -> the relay says so
  std::optional<double> bound_s;   // the documented bound it is held to
  std::optional<double> recover_s;
  std::string recover_what;  // what recover_s measures
  std::string notes;
};

inline std::string Seconds(const std::optional<double>& s) {
  return s ? fmt::format("{:.1f} s", *s) : std::string("-");
}

inline void PrintFigures(const Figures& f) {
  fmt::print(
      "FIGURES {}: lost={} phantom={} order_violations={} duplicates={} (committed={} "
      "consumed={}); detection {} (bound {}); recovery {} ({}){}{}\n",
      f.scenario, f.delivery.lost, f.delivery.phantom, f.delivery.order_violations,
      f.delivery.duplicates, f.delivery.committed, f.delivery.consumed, Seconds(f.detect_s),
      Seconds(f.bound_s), Seconds(f.recover_s), f.recover_what, f.notes.empty() ? "" : "; ",
      f.notes);
  std::ofstream out(LogDir() + "/network_figures.tsv", std::ios::app);
  out << f.scenario << '\t' << f.delivery.lost << '\t' << f.delivery.phantom << '\t'
      << f.delivery.order_violations << '\t' << f.delivery.duplicates << '\t'
      << f.delivery.committed << '\t' << Seconds(f.detect_s) << '\t' << Seconds(f.bound_s) << '\t'
      << Seconds(f.recover_s) << '\t' << f.recover_what << '\t' << f.notes << '\n';
}

// The assertions every scenario makes on its figures.
inline void ExpectClean(const Figures& f) {
  EXPECT_GT(f.delivery.committed, 0u) << f.scenario;
  EXPECT_EQ(f.delivery.lost, 0u) << f.scenario << "\n" << f.delivery.Samples();
  EXPECT_EQ(f.delivery.phantom, 0u) << f.scenario << "\n" << f.delivery.Samples();
  EXPECT_EQ(f.delivery.order_violations, 0u) << f.scenario << "\n" << f.delivery.Samples();
  EXPECT_EQ(f.delivery.split_aggregates, 0u) << f.scenario << "\n" << f.delivery.Samples();
  if (f.detect_s && f.bound_s) {
    EXPECT_LE(*f.detect_s, *f.bound_s) << f.scenario << ": detected later than its bound";
  }
}

}  // namespace outbox_test::network
