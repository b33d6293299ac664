// Where the replication loop reads from: the CopyBoth stream of a walsender.
//
// An interface so that the loop runs on PostgreSQL (PgSource over
// pg::ReplicationStream) and, in tests, on a recorded stream in memory.
// Contract (as pg::ReplicationStream keeps it): TryRead never blocks; the
// returned view is valid until the next TryRead; Wait blocks at most
// `timeout` for something to read (or for pending output to drain).
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string_view>

#include "outbox_relay/core/result.h"
#include "outbox_relay/pg/replication.h"
#include "outbox_relay/walproto/walproto.h"

namespace outbox_relay::pipeline {

class ReplicationSource {
 public:
  virtual ~ReplicationSource() = default;
  // The next CopyData message, if one is there (a walproto server message).
  virtual Result<std::optional<std::string_view>> TryRead() = 0;
  virtual Status Wait(std::chrono::milliseconds timeout) = 0;
  virtual Status SendStatus(const walproto::StandbyStatusUpdate& update) = 0;
  // Ends the stream (CopyDone) and drains what the server still sends.
  virtual Status Finish(std::chrono::milliseconds timeout) = 0;
  // Bytes that reached the connection so far, read or not (nullopt: unknown;
  // then only whole messages tell that the server is there).
  virtual std::optional<uint64_t> BytesReceived() const { return std::nullopt; }
};

// The real thing: a started pg::ReplicationStream.
class PgSource final : public ReplicationSource {
 public:
  // `doorbell` (not owned, may be null): Wait also ends when it rings.
  explicit PgSource(pg::ReplicationStream stream, const pg::Doorbell* doorbell = nullptr)
      : stream_(std::move(stream)) {
    stream_.set_doorbell(doorbell);
  }
  Result<std::optional<std::string_view>> TryRead() override { return stream_.TryRead(); }
  Status Wait(std::chrono::milliseconds timeout) override { return stream_.Wait(timeout); }
  Status SendStatus(const walproto::StandbyStatusUpdate& update) override {
    return stream_.SendStatus(update);
  }
  Status Finish(std::chrono::milliseconds timeout) override { return stream_.Finish(timeout); }
  std::optional<uint64_t> BytesReceived() const override { return stream_.BytesReceived(); }

 private:
  pg::ReplicationStream stream_;
};

}  // namespace outbox_relay::pipeline
