// Errors as values on the data path.
//
// Every fallible function on the data path returns `Status` or `Result<T>`
// (`std::expected<T, Error>`). An `Error` carries a code that decides what the
// caller does with it (see `Disposition`) and a message that says what went
// wrong and where. Exceptions are used only at the edges: configuration
// parsing and `main`.
#pragma once

#include <fmt/format.h>

#include <expected>
#include <string>
#include <string_view>
#include <utility>

namespace outbox_relay {

enum class ErrorCode {
  kProtocol,         // the peer sent bytes that violate the protocol grammar
  kInvalidArgument,  // a caller or an operator gave a value that cannot work
  kPoison,           // one row cannot be turned into a Kafka record
  kTransient,        // I/O that may succeed when retried (connection lost, timeout)
  kSlotInUse,        // the replication slot is held by another process (SQLSTATE 55006)
  kSlotLost,         // the replication slot is missing or invalidated
  kPermission,       // the database refused for lack of a privilege
  kCancelled,        // given up because the process was asked to stop (not a failure)
  kAborted,          // the Kafka transaction was aborted, or the idempotent producer failed
                     // for good and is replaced: what it held is sent again
  kDuplicateKey,     // a row the statement inserts is there already (SQLSTATE 23505)
  kFenced,           // another producer took the Kafka transactional.id over (exactly-once)
  kFatal,            // a state the process must not continue from
};

// What the caller does with an error; decided in exactly one place.
enum class Disposition { kRetry, kDeadLetter, kStop };

struct Error {
  ErrorCode code;
  std::string message;
};

inline Disposition DispositionOf(const Error& e) {
  switch (e.code) {
    case ErrorCode::kTransient:
    case ErrorCode::kSlotInUse:
    case ErrorCode::kAborted:
      return Disposition::kRetry;
    case ErrorCode::kPoison:
      return Disposition::kDeadLetter;
    case ErrorCode::kProtocol:
    case ErrorCode::kInvalidArgument:
    case ErrorCode::kSlotLost:
    case ErrorCode::kPermission:
    case ErrorCode::kCancelled:
    case ErrorCode::kDuplicateKey:
    case ErrorCode::kFenced:
    case ErrorCode::kFatal:
      return Disposition::kStop;
  }
  return Disposition::kStop;
}

std::string_view ErrorCodeName(ErrorCode code);

// std::expected that must not be dropped: a call whose Status or Result is
// ignored does not compile (cast to void where dropping it is the intent).
template <typename T>
class [[nodiscard]] Result : public std::expected<T, Error> {
 public:
  using Base = std::expected<T, Error>;
  using Base::Base;
  Result(const Base& other) : Base(other) {}        // NOLINT: implicit, as std::expected's
  Result(Base&& other) : Base(std::move(other)) {}  // NOLINT: implicit, as std::expected's
};

using Status = Result<void>;

template <typename... Args>
std::unexpected<Error> Fail(ErrorCode code, fmt::format_string<Args...> fmt, Args&&... args) {
  return std::unexpected<Error>(Error{code, fmt::format(fmt, std::forward<Args>(args)...)});
}

inline Status Ok() { return {}; }

}  // namespace outbox_relay
