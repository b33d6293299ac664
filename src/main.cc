// outbox-relay: wiring only. Each subcommand lives in src/app/.
#include <spdlog/spdlog.h>

#include <CLI/CLI.hpp>
#include <atomic>
#include <cstdio>

#include "outbox_relay/app/commands.h"
#include "outbox_relay/app/config.h"
#include "outbox_relay/app/logging.h"
#include "outbox_relay/app/relay.h"
#include "outbox_relay/app/signals.h"
#include "outbox_relay/core/failpoint.h"
#include "outbox_relay/core/version.h"
#include "outbox_relay/ops/commands.h"

// The commit the binary is built from (generated/build_commit.cc, written at
// every build by cmake/build_commit.cmake).
extern const char kOutboxRelayCommit[];

int main(int argc, char** argv) {
  CLI::App app{
      "outbox-relay: publishes transactional-outbox rows from PostgreSQL to Kafka through "
      "logical replication, at least once, in commit order."};
  app.require_subcommand(1);
  app.set_version_flag("--version", std::string(outbox_relay::RelayVersion()));

  outbox_relay::app::RelayConfig config;
  CLI::App* run = app.add_subcommand("run", "Stream outbox INSERTs to Kafka until SIGTERM");
  outbox_relay::app::AddRunFlags(*run, config);
  outbox_relay::app::AddLogFlags(*run, config.log);

  // cleanup, replay, slot, check: each runs in its callback and ends a failure
  // with CLI::RuntimeError(exit code), which app.exit() below returns.
  outbox_relay::ops::AddOpsCommands(app);

  app.add_subcommand("version", "Print the version and the libraries it runs with")->callback([] {
    std::fputs(
        outbox_relay::ops::VersionReport(outbox_relay::RelayVersion(), kOutboxRelayCommit).c_str(),
        stdout);
  });

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int code = app.exit(e);  // prints help, the version, or what is wrong with which flag
    // A bad flag value is a bad setting like any other: exit 2. Help and
    // --version exit 0; a command's own RuntimeError carries its code.
    bool ours = dynamic_cast<const CLI::RuntimeError*>(&e) != nullptr;
    return code == 0 || ours ? code : 2;
  }

  if (run->parsed()) {
    outbox_relay::app::SetupLogging(config.log);
    if (auto fault = outbox_relay::failpoint::Requested();
        fault && !outbox_relay::failpoint::kCompiledIn) {
      spdlog::warn("{} is set and ignored: this build has no failpoints",
                   outbox_relay::failpoint::kVariable);
    }
    if (auto st = outbox_relay::app::Validate(config); !st) {
      spdlog::error("{}", st.error().message);
      return 2;
    }
    const std::atomic<bool>& stop = outbox_relay::app::InstallStopSignals();
    spdlog::info("outbox-relay {} (commit {}) starting: table {}, slot {}, publication {}, sink {}",
                 outbox_relay::RelayVersion(), kOutboxRelayCommit, config.table, config.slot,
                 config.publication,
                 config.sink == outbox_relay::app::SinkKind::kNull ? "null" : "kafka");
    outbox_relay::app::Relay relay(config);
    return relay.Run(stop);
  }
  return 0;
}
