// Called while the pipeline waits (for the sink's queue, for a Kafka
// commit), to keep the walsender content: the stream session sends its
// status updates.
#pragma once

#include "outbox_relay/core/result.h"

namespace outbox_relay::pipeline {

class KeepAlive {
 public:
  virtual ~KeepAlive() = default;
  virtual Status Touch() = 0;
};

}  // namespace outbox_relay::pipeline
