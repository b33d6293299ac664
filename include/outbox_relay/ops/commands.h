// The operations subcommands of outbox-relay (DESIGN §6, §7): `cleanup`,
// `replay`, `slot status|drop` and `check`, registered on main's CLI11 app.
// Their exit codes and the command-line helpers they share with `run` are
// app/commands.h's.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace CLI {
class App;
class Option;
}  // namespace CLI

namespace outbox_relay::ops {

// Registers cleanup, replay, slot status|drop and check on `app`.
void AddOpsCommands(CLI::App& app);

// --- shared by the ops commands ---------------------------------------------

// What a command prints its result as (--output, OUTBOX_OUTPUT).
enum class OutputFormat { kText, kJson };

CLI::Option* AddOutputOption(CLI::App& app, OutputFormat* value);

// `text` as a JSON string literal, quotes included (control characters,
// quotes and backslashes escaped; other bytes as they are).
std::string JsonQuote(std::string_view text);

// 1536 -> "1.5 KiB", 0 -> "0 B" (binary units, as pg_size_pretty but with one decimal).
std::string PrettyBytes(int64_t bytes);

// What `outbox-relay version` prints, one "name: value" line each after the
// first: the relay's version, the commit it was built from ("unknown" for a
// build outside git; "-dirty": with changes to tracked files), the versions of
// what it persists and which newer ones it runs against (docs/upgrading.md),
// then the libraries it runs with as they report themselves (librdkafka's
// rd_kafka_version_str() and builtin.features, libpq's PQlibVersion()) and
// whether the test-only faults are compiled in (core/failpoint.h; the shipped
// image has none).
//
//   outbox-relay 0.2.0
//   commit: 18da5fc1c6a0f9e2d4b7a8c3e5f1029384756abc
//   relay schema: 1 (runs against newer schemas that declare themselves readable by 1)
//   exactly-once progress record: format 2 (reads records readable by format 2 or older)
//   librdkafka: 2.14.2 (gzip, snappy, ssl, sasl, ..., oidc)
//   libpq: 15.13
//   failpoints: compiled in (OUTBOX_TEST_FAULT): a test build, not for production
std::string VersionReport(std::string_view relay_version, std::string_view commit);

}  // namespace outbox_relay::ops
