// QualifiedName::Parse: what --table (OUTBOX_TABLE) accepts.
#include <gtest/gtest.h>

#include "outbox_relay/pg/connection.h"

namespace outbox_relay::pg {
namespace {

TEST(QualifiedName, PlainNamesFoldToLowerCaseAndDefaultToPublic) {
  auto n = QualifiedName::Parse("Outbox");
  ASSERT_TRUE(n.has_value());
  EXPECT_EQ(n->schema, "public");
  EXPECT_EQ(n->name, "outbox");
  n = QualifiedName::Parse("App.Outbox");
  ASSERT_TRUE(n.has_value());
  EXPECT_EQ(n->ToString(), "app.outbox");
}

TEST(QualifiedName, QuotedPartsKeepCaseDotsAndDoubledQuotes) {
  auto n = QualifiedName::Parse(R"("My Schema"."a.b""c")");
  ASSERT_TRUE(n.has_value()) << n.error().message;
  EXPECT_EQ(n->schema, "My Schema");
  EXPECT_EQ(n->name, R"(a.b"c)");
  EXPECT_EQ(n->Quoted(), R"("My Schema"."a.b""c")");
}

TEST(QualifiedName, MalformedQuotingIsRefused) {
  for (const char* bad : {R"("a"b")", R"("a)", R"(a"b)", R"("")", R"(s."t"x")", "a.b.c", "", "."}) {
    auto n = QualifiedName::Parse(bad);
    EXPECT_FALSE(n.has_value()) << bad << " was accepted as " << n->schema << "." << n->name;
  }
}

}  // namespace
}  // namespace outbox_relay::pg
