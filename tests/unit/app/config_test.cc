// RelayConfig: the Kafka property list and its secrets.
#include "outbox_relay/app/config.h"

#include <gtest/gtest.h>

#include <CLI/CLI.hpp>
#include <cstdlib>
#include <string>
#include <vector>

namespace outbox_relay::app {
namespace {

using Props = std::vector<std::string>;

TEST(SplitPropertyList, SemicolonsSeparateAndEscapedOnesStayInTheValue) {
  EXPECT_EQ(SplitPropertyList("a=1;b=2; c=3 ;"), (Props{"a=1", "b=2", "c=3"}));
  EXPECT_EQ(SplitPropertyList(R"(sasl.password=ab\;cd\\;linger.ms=5)"),
            (Props{R"(sasl.password=ab;cd\)", "linger.ms=5"}));
  // A backslash before anything else is kept as it is.
  EXPECT_EQ(SplitPropertyList(R"(ssl.ca.location=C:\x)"), (Props{R"(ssl.ca.location=C:\x)"}));
}

TEST(SplitPropertyList, OnePerLineTakesValuesVerbatim) {
  EXPECT_EQ(SplitPropertyList("sasl.password=a;b\\;c\r\nacks=all\n\n"),
            (Props{"sasl.password=a;b\\;c", "acks=all"}));
}

TEST(Validate, APropertyThatIsNotKeyValueIsRefusedWithoutRepeatingIt) {
  RelayConfig c;
  c.database_url = "postgresql://x@localhost/db";
  c.kafka_brokers = "localhost:9092";
  c.kafka_properties = {"linger.ms=5", "hunter2-the-password"};
  auto st = Validate(c);
  ASSERT_FALSE(st.has_value());
  EXPECT_NE(st.error().message.find("--kafka-property"), std::string::npos);
  EXPECT_NE(st.error().message.find("property 2 of 2"), std::string::npos) << st.error().message;
  EXPECT_EQ(st.error().message.find("hunter2"), std::string::npos) << st.error().message;
}

}  // namespace
}  // namespace outbox_relay::app
