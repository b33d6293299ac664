#include "outbox_relay/core/failpoint.h"

#include <gtest/gtest.h>

#include <cstdlib>

namespace outbox_relay::failpoint {
namespace {

TEST(Failpoint, ParseSplitsNameAndArgumentAtTheFirstColon) {
  EXPECT_FALSE(Parse("").has_value());
  auto plain = Parse("confirm-newest");
  ASSERT_TRUE(plain.has_value());
  EXPECT_EQ(plain->name, "confirm-newest");
  EXPECT_EQ(plain->argument, "");
  auto with = Parse("fatal-after:1500");
  ASSERT_TRUE(with.has_value());
  EXPECT_EQ(with->name, "fatal-after");
  EXPECT_EQ(with->argument, "1500");
  auto colons = Parse("x:a:b");
  ASSERT_TRUE(colons.has_value());
  EXPECT_EQ(colons->name, "x");
  EXPECT_EQ(colons->argument, "a:b");
}

// A test build compiles the failpoints in: only the named one is active, and
// only while the variable says so.
TEST(Failpoint, OnlyTheNamedFaultIsActive) {
  if constexpr (!kCompiledIn) GTEST_SKIP() << "a production build: ProductionBuildHasNone";
  ::setenv(kVariable, "fatal-after:7", 1);
  EXPECT_EQ(Active("fatal-after"), std::optional<std::string_view>("7"));
  EXPECT_FALSE(Active("fatal").has_value());
  EXPECT_FALSE(Active("confirm-newest").has_value());
  ::unsetenv(kVariable);
  EXPECT_FALSE(Active("fatal-after").has_value());
  EXPECT_FALSE(Requested().has_value());
}

// The production build (OUTBOX_FAILPOINTS=OFF, scripts/test's build-prod):
// the variable is seen, so that `run` can say it is ignored, and no fault is
// ever active.
TEST(Failpoint, ProductionBuildHasNone) {
  if constexpr (kCompiledIn) GTEST_SKIP() << "a test build: OnlyTheNamedFaultIsActive";
  ::setenv(kVariable, "fatal-after:7", 1);
  EXPECT_TRUE(Requested().has_value());
  EXPECT_FALSE(Active("fatal-after").has_value());
  ::unsetenv(kVariable);
}

}  // namespace
}  // namespace outbox_relay::failpoint
