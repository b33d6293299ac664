#include "outbox_relay/core/version.h"

#ifndef OUTBOX_RELAY_VERSION
#error "CMakeLists.txt defines OUTBOX_RELAY_VERSION for this file"
#endif

namespace outbox_relay {

std::string_view RelayVersion() { return OUTBOX_RELAY_VERSION; }

}  // namespace outbox_relay
