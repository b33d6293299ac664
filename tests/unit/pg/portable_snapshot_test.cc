// PortableSnapshot: the slot's snapshot as text ::pg_snapshot accepts.
#include <gtest/gtest.h>

#include "outbox_relay/pg/relay_schema.h"

namespace outbox_relay::pg {
namespace {

TEST(PortableSnapshot, XminAboveXmaxRaisesXmaxToXmin) {
  // Printed by pg_current_snapshot() after SET TRANSACTION SNAPSHOT of a
  // slot's exported snapshot on PostgreSQL 14.
  EXPECT_EQ(PortableSnapshot("14533:14532:"), "14533:14533:");
  EXPECT_EQ(PortableSnapshot("100:7:"), "100:100:");
}

TEST(PortableSnapshot, OrdinarySnapshotsAreUnchanged) {
  EXPECT_EQ(PortableSnapshot("8405:8405:"), "8405:8405:");
  EXPECT_EQ(PortableSnapshot("10:20:12,15"), "10:20:12,15");
  EXPECT_EQ(PortableSnapshot("18446744073709551614:18446744073709551615:"),
            "18446744073709551614:18446744073709551615:");
}

TEST(PortableSnapshot, TextThatIsNotASnapshotIsLeftForTheServerToRefuse) {
  EXPECT_EQ(PortableSnapshot(""), "");
  EXPECT_EQ(PortableSnapshot("garbage"), "garbage");
  EXPECT_EQ(PortableSnapshot("9:x:"), "9:x:");
  EXPECT_EQ(PortableSnapshot("-9:1:"), "-9:1:");
}

}  // namespace
}  // namespace outbox_relay::pg
