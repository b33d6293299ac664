// spdlog setup: text for people, one JSON object per line for collectors.
#pragma once

#include "outbox_relay/app/config.h"

namespace outbox_relay::app {

void SetupLogging(const LogConfig& config);

}  // namespace outbox_relay::app
