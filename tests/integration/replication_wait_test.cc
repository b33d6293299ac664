// The stream's loop waits on the replication socket for at most 100 ms when
// there is nothing to read. The marker marks on its own thread; at the end of
// a backlog the slot's new position then waited for that wait to end, and the
// server is quiet by then: up to 133 ms after the last statement, with both
// cores idle. The marker rings a doorbell (pg::Doorbell, an eventfd) that the
// wait watches next to the socket.
#include <fmt/format.h>

#include <thread>

#include "fixture.h"
#include "outbox_relay/pg/replication.h"

namespace outbox_test {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

class ReplicationWait : public RelayTest {};

TEST_F(ReplicationWait, ADoorbellEndsTheWaitOfAQuietStream) {
  using outbox_relay::pg::Connection;
  using outbox_relay::pg::Doorbell;
  using outbox_relay::pg::ReplicationStream;
  // A cluster of the test's own: the walsender sends keepalives while it
  // decodes other sessions' WAL, and the tests of the other lane write to the
  // shared cluster without pause (every one of five waits ended with a
  // message in one CI run).
  UseOwnCluster();
  CreateTables();
  db_->Exec(fmt::format("CREATE PUBLICATION {0} FOR TABLE {0} WITH (publish = 'insert')",
                        QuoteIdent(name_)));
  db_->Exec(fmt::format("SELECT pg_create_logical_replication_slot({}, 'pgoutput')",
                        QuoteLiteral(name_)));
  auto conn = Connection::Open(env_.database_url, Connection::Mode::kReplication, "outbox-it");
  ASSERT_TRUE(conn) << conn.error().message;
  auto stream = ReplicationStream::Start(std::move(*conn), name_, name_, outbox_relay::Lsn());
  ASSERT_TRUE(stream) << stream.error().message;
  Doorbell bell;
  ASSERT_GE(bell.fd(), 0);
  stream->set_doorbell(&bell);
  // A wait can also end because the server sent something (a keepalive, a
  // parameter status): only a wait that lasted until the ring and after which
  // nothing was there counts, up to five tries.
  constexpr milliseconds kRingAfter{200};
  constexpr milliseconds kLong{20000};
  bool rung_only = false;
  for (int attempt = 0; attempt < 5 && !rung_only; ++attempt) {
    while (true) {  // read what is there
      auto msg = stream->TryRead();
      ASSERT_TRUE(msg) << msg.error().message;
      if (!*msg) break;
    }
    bell.Clear();  // rung after an earlier try's wait had ended
    std::thread ringer([&] {
      std::this_thread::sleep_for(kRingAfter);
      bell.Ring();
    });
    auto started = std::chrono::steady_clock::now();
    auto waited = stream->Wait(kLong);
    auto took = std::chrono::steady_clock::now() - started;
    ringer.join();
    ASSERT_TRUE(waited) << waited.error().message;
    EXPECT_LT(took, kLong / 2) << "the wait did not end when the doorbell rang";
    auto msg = stream->TryRead();
    ASSERT_TRUE(msg) << msg.error().message;
    rung_only = !*msg && took >= kRingAfter - milliseconds(20);
  }
  EXPECT_TRUE(rung_only) << "every wait ended with a message from the server";
  // Rung and waited for, it is quiet again: the next wait runs to its end,
  // unless the server sent something.
  auto started = std::chrono::steady_clock::now();
  ASSERT_TRUE(stream->Wait(milliseconds(300)));
  if (std::chrono::steady_clock::now() - started < milliseconds(250)) {
    auto msg = stream->TryRead();
    ASSERT_TRUE(msg) << msg.error().message;
    EXPECT_TRUE(*msg) << "the doorbell still rings after the wait it ended";
  }
}

}  // namespace
}  // namespace outbox_test
