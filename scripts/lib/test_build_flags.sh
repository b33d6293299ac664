# shellcheck shell=bash
# scripts/lib/test_build_flags.sh — the compile flags of the `build` directory, sourced by
# scripts/test and scripts/demo: the demo builds its binary with the same flags, so a later
# ./scripts/test reuses its objects instead of reconfiguring and compiling them again.
#
# The test builds (build, and build-tsan) compile with -O1 and line tables only (-g1): half the
# compile time of RelWithDebInfo's -O2 -g on this 2-core machine (src/app/relay.cc: 13 s against
# 29-35 s), which is most of a fresh run's build step. The image suite builds the shipped -O2
# binary from docker/Dockerfile and runs it too. OUTBOX_TEST_CXX_FLAGS overrides. The test
# programs' own files (unit, integration, network, image) compile at -O0 instead
# (OUTBOX_TEST_CODE_FLAGS, tests/CMakeLists.txt): 30-40% less compile time for those files
# (tests/unit/ops/ops_commands_test.cc: 10.4 s against 16.8 s), most of the build. (With
# -fsanitize=thread at -O1, GCC 12 reports a false -Wmismatched-new-delete in
# tests/unit/pgoutput/alloc_test.cc's replaced operator delete: tests/CMakeLists.txt turns that
# warning off for that file in ThreadSanitizer builds.)
# shellcheck disable=SC2034 # used by the scripts that source this file
TEST_BUILD_FLAGS=("-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=${OUTBOX_TEST_CXX_FLAGS:--O1 -g1 -DNDEBUG}"
  "-DOUTBOX_TEST_CODE_FLAGS=${OUTBOX_TEST_CODE_FLAGS:--O0}")
