// JSON helpers private to the outbox module (metadata and Watermill envelopes).
#pragma once

#include <simdjson.h>

#include <string_view>

namespace outbox_relay::outbox {

// "an array", "a string", ...: a JSON value's type for an error message.
inline std::string_view DescribeType(simdjson::dom::element_type type) {
  using T = simdjson::dom::element_type;
  switch (type) {
    case T::ARRAY:
      return "an array";
    case T::OBJECT:
      return "an object";
    case T::INT64:
    case T::UINT64:
    case T::DOUBLE:
      return "a number";
    case T::STRING:
      return "a string";
    case T::BOOL:
      return "a boolean";
    case T::NULL_VALUE:
      return "null";
  }
  return "an unknown JSON type";
}

}  // namespace outbox_relay::outbox
