// Owning handles for C library objects: a unique_ptr whose deleter is the
// library's own destroy function, at no cost over the raw pointer.
//
//   using ConnHandle = CHandle<PGconn, PQfinish>;
//   using EventHandle = CHandle<rd_kafka_event_t, rd_kafka_event_destroy>;
//
// One template for every library (libpq, librdkafka, civetweb), so each
// handle type is one line next to the code that uses it.
#pragma once

#include <memory>

namespace outbox_relay {

template <auto Fn>
struct FnDeleter {
  template <typename T>
  void operator()(T* p) const {
    if (p != nullptr) Fn(p);
  }
};

template <typename T, auto Fn>
using CHandle = std::unique_ptr<T, FnDeleter<Fn>>;

}  // namespace outbox_relay
