// What this build is: the relay's release version, CMake's project version
// with a pre-release tag between releases ("0.2.0-dev"; CMakeLists.txt,
// docs/upgrading.md). The commit it was built from is the binary's own
// (`outbox-relay version`); libraries read only the version.
#pragma once

#include <string_view>

namespace outbox_relay {

std::string_view RelayVersion();

}  // namespace outbox_relay
