// TopicTemplate: the Kafka topic of a row, rendered from its metadata.
//
// Grammar (compiled once, at startup):
//   template    = 1*( literal / placeholder )
//   literal     = 1*( ALPHA / DIGIT / "." / "_" / "-" )   ; legal topic chars only
//   placeholder = "{" key [ ":aggregate" ] "}"            ; key: 1* any char but { } :
//
// `:aggregate` keeps the part of the value before the first '.', so that
// `review.created` and `review.updated` land in one topic and keep
// per-aggregate order (DESIGN §4). Rendering appends into the caller's string,
// so a reused string does not allocate once it has grown. A row whose
// metadata lacks a key, has it empty, or renders to an illegal topic name is
// kPoison: it goes to the dead-letter topic rather than stopping the stream.
#include <algorithm>
#include <array>

#include "outbox_relay/outbox/record.h"
#include "text.h"

namespace outbox_relay::outbox {

namespace {

constexpr size_t kMaxTopicLength = 249;  // Kafka's limit (Topic.MAX_NAME_LENGTH)
constexpr std::string_view kAggregate = "aggregate";

// [A-Za-z0-9._-], as a table: it runs over every byte of every rendered topic.
constexpr std::array<bool, 256> kTopicChars = [] {
  std::array<bool, 256> t{};
  for (int c = 'a'; c <= 'z'; ++c) t[c] = true;
  for (int c = 'A'; c <= 'Z'; ++c) t[c] = true;
  for (int c = '0'; c <= '9'; ++c) t[c] = true;
  t['.'] = t['_'] = t['-'] = true;
  return t;
}();

bool IsTopicChar(char c) { return kTopicChars[static_cast<unsigned char>(c)]; }

}  // namespace

Result<TopicTemplate> TopicTemplate::Compile(std::string_view text) {
  TopicTemplate t;
  t.text_ = std::string(text);
  if (text.empty()) return Fail(ErrorCode::kInvalidArgument, "topic template is empty");

  size_t literal_length = 0;
  size_t i = 0;
  while (i < text.size()) {
    const char c = text[i];
    if (c == '{') {
      const size_t close = text.find_first_of("{}", i + 1);
      if (close == std::string_view::npos || text[close] == '{') {
        return Fail(ErrorCode::kInvalidArgument,
                    "topic template \"{}\": '{{' at offset {} has no matching '}}'", text, i);
      }
      std::string_view inner = text.substr(i + 1, close - i - 1);
      const size_t colon = inner.find(':');
      std::string_view key = inner.substr(0, colon);
      if (key.empty()) {
        return Fail(ErrorCode::kInvalidArgument,
                    "topic template \"{}\": empty metadata key in placeholder at offset {}", text,
                    i);
      }
      bool aggregate = false;
      if (colon != std::string_view::npos) {
        std::string_view modifier = inner.substr(colon + 1);
        if (modifier != kAggregate) {
          return Fail(ErrorCode::kInvalidArgument,
                      "topic template \"{}\": unknown modifier \"{}\" at offset {} (known: {})",
                      text, modifier, i + 1 + colon + 1, kAggregate);
        }
        aggregate = true;
      }
      t.parts_.push_back(Part{true, aggregate, std::string(key)});
      i = close + 1;
    } else if (c == '}') {
      return Fail(ErrorCode::kInvalidArgument,
                  "topic template \"{}\": '}}' at offset {} has no matching '{{'", text, i);
    } else {
      if (!IsTopicChar(c)) {
        return Fail(ErrorCode::kInvalidArgument,
                    "topic template \"{}\": byte 0x{:02x} at offset {} is not allowed in a Kafka "
                    "topic name (allowed: A-Z a-z 0-9 . _ -)",
                    text, static_cast<unsigned char>(c), i);
      }
      if (t.parts_.empty() || t.parts_.back().is_key) t.parts_.push_back(Part{false, false, {}});
      t.parts_.back().text.push_back(c);
      ++literal_length;
      ++i;
    }
  }

  if (literal_length > kMaxTopicLength) {
    return Fail(ErrorCode::kInvalidArgument,
                "topic template \"{}\": its literal text alone is longer than {} characters", text,
                kMaxTopicLength);
  }
  if (t.parts_.size() == 1 && !t.parts_[0].is_key && (text == "." || text == "..")) {
    return Fail(ErrorCode::kInvalidArgument, "topic template \"{}\" is not a legal topic name",
                text);
  }
  return t;
}

Status TopicTemplate::Render(const Metadata& metadata, std::string* out) const {
  out->clear();
  for (const Part& part : parts_) {
    if (!part.is_key) {
      out->append(part.text);
      continue;
    }
    std::optional<std::string_view> value = metadata.Get(part.text);
    if (!value) {
      return Fail(ErrorCode::kPoison, "topic template \"{}\": metadata has no key \"{}\"", text_,
                  part.text);
    }
    if (value->empty()) {
      return Fail(ErrorCode::kPoison, "topic template \"{}\": metadata key \"{}\" is empty", text_,
                  part.text);
    }
    std::string_view piece = *value;
    if (part.aggregate) {
      piece = piece.substr(0, piece.find('.'));
      if (piece.empty()) {
        return Fail(ErrorCode::kPoison,
                    "topic template \"{}\": metadata key \"{}\" = \"{}{}\" has an empty "
                    "aggregate (the part before the first '.')",
                    text_, part.text, Shorten(*value), Ellipsis(*value));
      }
    }
    out->append(piece);
  }

  // The literals were checked at Compile; a bad byte can only come from a value.
  const std::string_view topic = *out;
  if (topic.size() > kMaxTopicLength) {
    return Fail(ErrorCode::kPoison,
                "topic template \"{}\": rendered topic \"{}...\" is {} characters long, Kafka "
                "allows at most {}",
                text_, Shorten(topic), topic.size(), kMaxTopicLength);
  }
  if (auto bad =
          std::find_if_not(topic.begin(), topic.end(), [](char c) { return IsTopicChar(c); });
      bad != topic.end()) {
    return Fail(ErrorCode::kPoison,
                "topic template \"{}\": rendered topic \"{}\" contains byte 0x{:02x} at offset "
                "{}, not allowed in a Kafka topic name (allowed: A-Z a-z 0-9 . _ -)",
                text_, topic, static_cast<unsigned char>(*bad), bad - topic.begin());
  }
  if (topic == "." || topic == "..") {
    return Fail(ErrorCode::kPoison, "topic template \"{}\": rendered topic \"{}\" is not legal",
                text_, topic);
  }
  return Ok();
}

std::vector<std::string> TopicTemplate::keys() const {
  std::vector<std::string> out;
  for (const Part& part : parts_) {
    if (part.is_key && std::find(out.begin(), out.end(), part.text) == out.end()) {
      out.push_back(part.text);
    }
  }
  return out;
}

}  // namespace outbox_relay::outbox
