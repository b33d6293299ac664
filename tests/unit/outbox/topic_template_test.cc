// TopicTemplate: compiled from configuration once, rendered per row.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

#include "outbox_relay/outbox/record.h"

namespace outbox_relay::outbox {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr std::string_view kDefault = "kazmaps.{Source-Service}.{Event-Type:aggregate}";

Metadata Meta(std::string_view json) {
  Metadata m;
  auto st = m.Parse(json);
  EXPECT_TRUE(st.has_value()) << st.error().message;
  return m;
}

TopicTemplate MustCompile(std::string_view text) {
  auto t = TopicTemplate::Compile(text);
  EXPECT_TRUE(t.has_value()) << t.error().message;
  return std::move(*t);
}

std::string MustRender(const TopicTemplate& t, std::string_view json) {
  std::string out;
  auto st = t.Render(Meta(json), &out);
  EXPECT_TRUE(st.has_value()) << st.error().message;
  return out;
}

Error MustNotRender(const TopicTemplate& t, std::string_view json) {
  std::string out;
  auto st = t.Render(Meta(json), &out);
  EXPECT_FALSE(st.has_value()) << out;
  if (st) return Error{ErrorCode::kFatal, "rendered"};
  EXPECT_EQ(st.error().code, ErrorCode::kPoison);
  return st.error();
}

std::string CompileError(std::string_view text) {
  auto t = TopicTemplate::Compile(text);
  EXPECT_FALSE(t.has_value()) << text;
  if (t) return "";
  EXPECT_EQ(t.error().code, ErrorCode::kInvalidArgument);
  return t.error().message;
}

TEST(TopicTemplate, SeedExampleRendersPerAggregateTopic) {
  TopicTemplate t = MustCompile(kDefault);
  EXPECT_EQ(MustRender(t, R"({"Source-Service":"review","Event-Type":"review.created"})"),
            "kazmaps.review.review");
}

TEST(TopicTemplate, EventsOfOneAggregateShareATopic) {
  TopicTemplate t = MustCompile(kDefault);
  EXPECT_EQ(MustRender(t, R"({"Source-Service":"review","Event-Type":"review.updated"})"),
            MustRender(t, R"({"Source-Service":"review","Event-Type":"review.created"})"));
}

TEST(TopicTemplate, AggregateIsThePartBeforeTheFirstDot) {
  TopicTemplate t = MustCompile("{Event-Type:aggregate}");
  EXPECT_EQ(MustRender(t, R"({"Event-Type":"order.item.added"})"), "order");
}

TEST(TopicTemplate, AggregateOfAValueWithoutDotIsTheWholeValue) {
  TopicTemplate t = MustCompile(kDefault);
  EXPECT_EQ(MustRender(t, R"({"Source-Service":"geo","Event-Type":"heartbeat"})"),
            "kazmaps.geo.heartbeat");
}

TEST(TopicTemplate, PlainPlaceholderUsesTheWholeValue) {
  TopicTemplate t = MustCompile("events-{Event-Type}");
  EXPECT_EQ(MustRender(t, R"({"Event-Type":"review.created"})"), "events-review.created");
}

TEST(TopicTemplate, LiteralOnlyTemplateIsAFixedTopic) {
  TopicTemplate t = MustCompile("all_events");
  EXPECT_EQ(MustRender(t, "null"), "all_events");
  EXPECT_TRUE(t.keys().empty());
}

TEST(TopicTemplate, ReportsTheKeysItReadsOnce) {
  TopicTemplate t = MustCompile("{a}.{b:aggregate}.{a}");
  EXPECT_THAT(t.keys(), ElementsAre("a", "b"));
  EXPECT_EQ(t.text(), "{a}.{b:aggregate}.{a}");
}

TEST(TopicTemplate, RenderReplacesWhatTheOutputHeld) {
  TopicTemplate t = MustCompile("x.{k}");
  std::string out = "previous-topic-name";
  ASSERT_TRUE(t.Render(Meta(R"({"k":"v"})"), &out).has_value());
  EXPECT_EQ(out, "x.v");
}

TEST(TopicTemplateCompile, RejectsMalformedTemplates) {
  EXPECT_THAT(CompileError(""), HasSubstr("empty"));
  EXPECT_THAT(CompileError("kazmaps.{Source-Service"), HasSubstr("no matching '}'"));
  EXPECT_THAT(CompileError("kazmaps.{a{b}}"), HasSubstr("no matching '}'"));
  EXPECT_THAT(CompileError("kazmaps.Source-Service}"), HasSubstr("no matching '{'"));
  EXPECT_THAT(CompileError("kazmaps.{}"), HasSubstr("empty metadata key"));
  EXPECT_THAT(CompileError("kazmaps.{:aggregate}"), HasSubstr("empty metadata key"));
  EXPECT_THAT(CompileError("{Event-Type:upper}"), HasSubstr("unknown modifier \"upper\""));
  EXPECT_THAT(CompileError("{Event-Type:}"), HasSubstr("unknown modifier \"\""));
  EXPECT_THAT(CompileError("kaz maps.{a}"), HasSubstr("byte 0x20 at offset 3"));
  EXPECT_THAT(CompileError("kazmaps/{a}"), HasSubstr("byte 0x2f"));
  EXPECT_THAT(CompileError("."), HasSubstr("not a legal topic name"));
  EXPECT_THAT(CompileError(".."), HasSubstr("not a legal topic name"));
  EXPECT_THAT(CompileError(std::string(250, 'a')), HasSubstr("longer than 249"));
}

TEST(TopicTemplateCompile, ErrorNamesTheTemplate) {
  EXPECT_THAT(CompileError("a.{b"), HasSubstr("topic template \"a.{b\""));
}

TEST(TopicTemplateRender, MissingKeyIsPoisonNamingKeyAndTemplate) {
  TopicTemplate t = MustCompile(kDefault);
  Error e = MustNotRender(t, R"({"Event-Type":"review.created"})");
  EXPECT_EQ(e.message, "topic template \"" + std::string(kDefault) +
                           "\": metadata has no key \"Source-Service\"");
}

TEST(TopicTemplateRender, NoMetadataAtAllIsPoison) {
  TopicTemplate t = MustCompile(kDefault);
  EXPECT_THAT(MustNotRender(t, "null").message, HasSubstr("no key \"Source-Service\""));
}

TEST(TopicTemplateRender, EmptyValueIsPoison) {
  TopicTemplate t = MustCompile(kDefault);
  EXPECT_THAT(MustNotRender(t, R"({"Source-Service":"","Event-Type":"review.created"})").message,
              HasSubstr("metadata key \"Source-Service\" is empty"));
  EXPECT_THAT(MustNotRender(t, R"({"Source-Service":"review","Event-Type":null})").message,
              HasSubstr("metadata key \"Event-Type\" is empty"));
}

TEST(TopicTemplateRender, EmptyAggregateIsPoison) {
  TopicTemplate t = MustCompile(kDefault);
  EXPECT_THAT(MustNotRender(t, R"({"Source-Service":"review","Event-Type":".created"})").message,
              HasSubstr("empty aggregate"));
}

TEST(TopicTemplateRender, IllegalCharacterInAValueIsPoison) {
  TopicTemplate t = MustCompile(kDefault);
  EXPECT_THAT(MustNotRender(t, R"({"Source-Service":"re view","Event-Type":"a.b"})").message,
              HasSubstr("contains byte 0x20 at offset 10"));
  EXPECT_THAT(MustNotRender(t, R"({"Source-Service":"r/w","Event-Type":"a.b"})").message,
              HasSubstr("byte 0x2f"));
  EXPECT_THAT(MustNotRender(t, R"({"Source-Service":"r\u00e9","Event-Type":"a.b"})").message,
              HasSubstr("byte 0xc3"));
  EXPECT_THAT(MustNotRender(t, R"({"Source-Service":"r\u0000","Event-Type":"a.b"})").message,
              HasSubstr("byte 0x00"));
}

TEST(TopicTemplateRender, TooLongTopicIsPoison) {
  TopicTemplate t = MustCompile("kazmaps.{k}");
  EXPECT_THAT(MustNotRender(t, R"({"k":")" + std::string(242, 'a') + R"("})").message,
              HasSubstr("250 characters long"));
  EXPECT_EQ(MustRender(t, R"({"k":")" + std::string(241, 'a') + R"("})").size(), 249u);
}

TEST(TopicTemplateRender, DotAndDotDotArePoison) {
  TopicTemplate t = MustCompile("{k}");
  EXPECT_THAT(MustNotRender(t, R"({"k":"."})").message, HasSubstr("is not legal"));
  EXPECT_THAT(MustNotRender(t, R"({"k":".."})").message, HasSubstr("is not legal"));
  EXPECT_EQ(MustRender(t, R"({"k":"..."})"), "...");
}

}  // namespace
}  // namespace outbox_relay::outbox
