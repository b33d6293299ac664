// Go-compatible decoding for Watermill's tables (watermill.h has the rules).
//
// The forwarder's envelope is parsed with simdjson's DOM API (the whole
// document validated first, as for the metadata), and the Go rules are
// applied while walking its fields: case-folded field names, last value
// wins, null leaves strings alone and clears the []byte and the map, a
// repeated metadata object merges, and any type mismatch fails the whole
// envelope.
#include "outbox_relay/outbox/watermill.h"

#include <simdjson.h>

#include <algorithm>
#include <array>
#include <cstring>

#include "json_type.h"
#include "text.h"

namespace outbox_relay::outbox {

namespace {

int Hex4(const char* p) {
  int v = 0;
  for (int i = 0; i < 4; ++i) {
    char c = p[i];
    int d = 0;
    if (c >= '0' && c <= '9') {
      d = c - '0';
    } else if (c >= 'a' && c <= 'f') {
      d = c - 'a' + 10;
    } else if (c >= 'A' && c <= 'F') {
      d = c - 'A' + 10;
    } else {
      return -1;
    }
    v = (v << 4) | d;
  }
  return v;
}

bool IsHigh(int v) { return v >= 0xD800 && v <= 0xDBFF; }
bool IsLow(int v) { return v >= 0xDC00 && v <= 0xDFFF; }

// base64.StdEncoding's alphabet; -1 for bytes outside it.
constexpr std::array<int8_t, 256> kBase64 = [] {
  std::array<int8_t, 256> t{};
  t.fill(-1);
  const char* alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  for (int i = 0; i < 64; ++i) t[static_cast<unsigned char>(alphabet[i])] = static_cast<int8_t>(i);
  return t;
}();

std::unexpected<Error> BadBase64(size_t at) {
  return Fail(ErrorCode::kPoison, "illegal base64 data at input byte {}", at);
}

// bytes.EqualFold(key, field) for an all-lower-case ASCII `field`: ASCII
// letters fold, and the only non-ASCII runes that fold to ASCII letters are
// U+017F (to 's') and U+212A (to 'k').
bool FoldEquals(std::string_view key, std::string_view field) {
  size_t i = 0;
  for (char f : field) {
    if (i >= key.size()) return false;
    const auto c = static_cast<unsigned char>(key[i]);
    if (c < 0x80) {
      char lower = (c >= 'A' && c <= 'Z') ? static_cast<char>(c - 'A' + 'a') : static_cast<char>(c);
      if (lower != f) return false;
      ++i;
    } else if (f == 's' && key.substr(i, 2) == "\xC5\xBF") {
      i += 2;
    } else if (f == 'k' && key.substr(i, 3) == "\xE2\x84\xAA") {
      i += 3;
    } else {
      return false;
    }
  }
  return i == key.size();
}

}  // namespace

size_t ReplaceLoneSurrogateEscapes(char* json, size_t size) {
  size_t replaced = 0;
  size_t i = 0;
  while (i + 1 < size) {
    // Most documents have few escapes: jump from backslash to backslash.
    const void* next = std::memchr(json + i, '\\', size - i);
    if (next == nullptr) break;
    i = static_cast<size_t>(static_cast<const char*>(next) - json);
    if (i + 1 >= size) break;
    if (json[i + 1] != 'u' || i + 6 > size) {
      i += 2;  // \" \\ \n ..., or a truncated escape the parser rejects
      continue;
    }
    const int v = Hex4(json + i + 2);
    if (v < 0) {
      i += 2;
      continue;
    }
    if (IsHigh(v) && i + 12 <= size && json[i + 6] == '\\' && json[i + 7] == 'u' &&
        IsLow(Hex4(json + i + 8))) {
      i += 12;  // a valid pair
      continue;
    }
    if (IsHigh(v) || IsLow(v)) {
      std::memcpy(json + i, "\\ufffd", 6);
      ++replaced;
    }
    i += 6;
  }
  return replaced;
}

Status DecodeGoBase64(std::string_view src, std::string* out) {
  // encoding/base64 (*Encoding).Decode with StdEncoding, quantum by quantum.
  out->clear();
  out->reserve(src.size() / 4 * 3 + 3);
  size_t si = 0;
  auto skip_newlines = [&] {
    while (si < src.size() && (src[si] == '\n' || src[si] == '\r')) ++si;
  };
  while (si < src.size()) {
    uint32_t dbuf[4] = {0, 0, 0, 0};
    size_t dlen = 4;
    bool padded = false;
    for (size_t j = 0; j < 4; ++j) {
      if (si == src.size()) {
        if (j == 0) return Ok();   // only newlines were left
        return BadBase64(si - j);  // padding is required
      }
      const char in = src[si++];
      const int8_t v = kBase64[static_cast<unsigned char>(in)];
      if (v >= 0) {
        dbuf[j] = static_cast<uint32_t>(v);
        continue;
      }
      if (in == '\n' || in == '\r') {
        --j;
        continue;
      }
      if (in != '=') return BadBase64(si - 1);
      // Padding: "xx==" or "xxx=", and nothing but newlines after it.
      if (j < 2) return BadBase64(si - 1);
      if (j == 2) {
        skip_newlines();
        if (si == src.size()) return BadBase64(src.size());
        if (src[si] != '=') return BadBase64(si - 1);
        ++si;
      }
      skip_newlines();
      if (si < src.size()) return BadBase64(si);
      dlen = j;
      padded = true;
      break;
    }
    const uint32_t val = dbuf[0] << 18 | dbuf[1] << 12 | dbuf[2] << 6 | dbuf[3];
    out->push_back(static_cast<char>(val >> 16));
    if (dlen >= 3) out->push_back(static_cast<char>(val >> 8));
    if (dlen == 4) out->push_back(static_cast<char>(val));
    if (padded) return Ok();
  }
  return Ok();
}

bool IsKafkaTopicName(std::string_view topic) {
  if (topic.empty() || topic.size() > 249 || topic == "." || topic == "..") return false;
  return std::all_of(topic.begin(), topic.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
           c == '_' || c == '-';
  });
}

std::string TruncateIdentifier(std::string_view name) {
  if (name.size() <= kMaxIdentifierBytes) return std::string(name);
  size_t n = kMaxIdentifierBytes;
  while (n > 0 && (static_cast<unsigned char>(name[n]) & 0xC0) == 0x80) --n;
  return std::string(name.substr(0, n));
}

std::string WatermillMessagesTable(std::string_view topic) {
  return TruncateIdentifier(std::string("watermill_").append(topic));
}

std::string WatermillOffsetsTable(std::string_view topic) {
  return TruncateIdentifier(std::string("watermill_offsets_").append(topic));
}

std::optional<std::string> WatermillTopicOfTable(std::string_view table) {
  constexpr std::string_view kPrefix = "watermill_";
  if (table.size() >= kMaxIdentifierBytes || !table.starts_with(kPrefix) ||
      table.size() == kPrefix.size()) {
    return std::nullopt;
  }
  return std::string(table.substr(kPrefix.size()));
}

struct Envelope::Impl {
  simdjson::dom::parser parser;
  std::unique_ptr<char[]> input;  // the text plus SIMDJSON_PADDING zero bytes
  size_t input_capacity = 0;
};

Envelope::Envelope() : impl_(std::make_unique<Impl>()) {}
Envelope::~Envelope() = default;

Status Envelope::Parse(std::string_view json) {
  destination_topic_.clear();
  uuid_.clear();
  payload_.clear();
  has_payload_ = false;
  (void)metadata_.Parse(std::nullopt);

  Impl& im = *impl_;
  const size_t needed = json.size() + simdjson::SIMDJSON_PADDING;
  if (needed > im.input_capacity) {
    const size_t capacity = std::max(needed, im.input_capacity * 2);
    im.input = std::make_unique<char[]>(capacity);
    im.input_capacity = capacity;
  }
  if (!json.empty()) std::memcpy(im.input.get(), json.data(), json.size());
  std::memset(im.input.get() + json.size(), 0, simdjson::SIMDJSON_PADDING);
  ReplaceLoneSurrogateEscapes(im.input.get(), json.size());

  simdjson::dom::element root;
  if (auto err = im.parser.parse(im.input.get(), json.size(), false).get(root);
      err != simdjson::SUCCESS) {
    return Fail(ErrorCode::kPoison, "the envelope is not valid JSON: {}",
                simdjson::error_message(err));
  }
  const auto root_type = root.type();
  if (root_type != simdjson::dom::element_type::OBJECT &&
      root_type != simdjson::dom::element_type::NULL_VALUE) {
    return Fail(ErrorCode::kPoison, "the envelope is {}, not an object", DescribeType(root_type));
  }
  std::optional<Error> type_error;
  auto mismatch = [&](std::string_view field, simdjson::dom::element_type type,
                      std::string_view wanted) {
    if (!type_error) {
      type_error = Error{ErrorCode::kPoison, fmt::format("the envelope's \"{}\" is {}, expected {}",
                                                         field, DescribeType(type), wanted)};
    }
  };
  if (root_type == simdjson::dom::element_type::OBJECT) {
    simdjson::dom::object object;
    if (auto err = root.get_object().get(object); err != simdjson::SUCCESS) {
      return Fail(ErrorCode::kPoison, "the envelope: {}", simdjson::error_message(err));
    }
    using T = simdjson::dom::element_type;
    for (simdjson::dom::key_value_pair field : object) {
      const T type = field.value.type();
      if (FoldEquals(field.key, "destination_topic") || FoldEquals(field.key, "uuid")) {
        std::string& target =
            FoldEquals(field.key, "uuid") ? uuid_ : destination_topic_;  // null: no effect
        if (type == T::STRING) {
          target.assign(field.value.get_string().value_unsafe());
        } else if (type != T::NULL_VALUE) {
          mismatch(field.key, type, "a string");
        }
      } else if (FoldEquals(field.key, "payload")) {
        if (type == T::STRING) {
          if (auto st = DecodeGoBase64(field.value.get_string().value_unsafe(), &payload_); !st) {
            if (!type_error) {
              type_error = Error{ErrorCode::kPoison,
                                 fmt::format("the envelope's payload: {}", st.error().message)};
            }
          } else {
            has_payload_ = true;
          }
        } else if (type == T::NULL_VALUE) {
          has_payload_ = false;  // a nil []byte
          payload_.clear();
        } else {
          mismatch(field.key, type, "a base64 string");
        }
      } else if (FoldEquals(field.key, "metadata")) {
        if (type == T::NULL_VALUE) {
          (void)metadata_.Parse(std::nullopt);  // a nil map
        } else if (type == T::OBJECT) {
          // Decoded into the existing map: a repeated object merges. (A named
          // object: ranging over a temporary's member would dangle.)
          simdjson::dom::object entries;
          if (field.value.get_object().get(entries) != simdjson::SUCCESS) {
            mismatch(field.key, type, "an object of strings");
            continue;
          }
          for (simdjson::dom::key_value_pair entry : entries) {
            const T entry_type = entry.value.type();
            if (entry_type == T::STRING) {
              metadata_.Set(entry.key, entry.value.get_string().value_unsafe());
            } else if (entry_type == T::NULL_VALUE) {
              metadata_.Set(entry.key, "");
            } else if (!type_error) {
              type_error = Error{
                  ErrorCode::kPoison,
                  fmt::format("the envelope's metadata value for key \"{}{}\" is "
                              "{}, expected a string",
                              Shorten(entry.key), Ellipsis(entry.key), DescribeType(entry_type))};
            }
          }
        } else {
          mismatch(field.key, type, "an object of strings");
        }
      }
      // Any other key: ignored, as Go ignores unknown fields.
    }
  }
  if (type_error) return std::unexpected(std::move(*type_error));
  if (destination_topic_.empty()) {
    return Fail(ErrorCode::kPoison,
                "the envelope has no destination_topic (the forwarder's \"unknown destination "
                "topic\")");
  }
  if (!IsKafkaTopicName(destination_topic_)) {
    return Fail(ErrorCode::kPoison,
                "the envelope's destination_topic \"{}{}\" is not a legal Kafka topic name "
                "(1..249 of A-Z a-z 0-9 . _ -)",
                Shorten(destination_topic_), Ellipsis(destination_topic_));
  }
  return Ok();
}

}  // namespace outbox_relay::outbox
