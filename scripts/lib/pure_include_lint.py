#!/usr/bin/env python3
"""Pure modules include no I/O.

The lower floors of the product (core, pgoutput, walproto, tracking, outbox) are
pure: bytes in, values out, tested in microseconds without a server. CMake links
them with no I/O library; this check keeps their sources from including one, or a
module above them:

  - PostgreSQL, Kafka, logging, metrics and HTTP libraries (libpq, librdkafka,
    spdlog, prometheus-cpp, Boost.Asio/Beast);
  - streams, files and the C I/O library (<iostream>, <fstream>, <cstdio>,
    <filesystem>, <stdio.h>);
  - sockets and the OS (<sys/...>, <unistd.h>, <netinet/...>, <arpa/...>,
    <poll.h>, <fcntl.h>, <netdb.h>);
  - the I/O modules' own headers (outbox_relay/{pg,kafka,marker,metrics,
    pipeline,app}/).

Usage: pure_include_lint.py FILE...   (files outside the pure modules are ignored)
       pure_include_lint.py --self-test
Prints file:line: the include, and why; exits 1 when any is found.
"""

from __future__ import annotations

import os
import re
import sys

PURE_MODULES = ("core", "pgoutput", "walproto", "tracking", "outbox")
IO_MODULES = ("pg", "kafka", "marker", "metrics", "pipeline", "app")

INCLUDE = re.compile(r'^\s*#\s*include\s*[<"]([^>"]+)[>"]')

FORBIDDEN = [
    (re.compile(r"^libpq"), "PostgreSQL's client library"),
    (re.compile(r"^librdkafka/"), "librdkafka"),
    (re.compile(r"^spdlog/"), "logging (return an error; the caller logs)"),
    (re.compile(r"^prometheus/"), "metrics"),
    (re.compile(r"^(civetweb|CivetServer|boost/(asio|beast))"), "the HTTP server"),
    (re.compile(r"^(iostream|fstream|istream|ostream|cstdio|stdio\.h|filesystem)$"),
     "streams and files"),
    (re.compile(r"^(sys/|netinet/|arpa/)"), "the operating system's I/O"),
    (re.compile(r"^(unistd|poll|fcntl|netdb)\.h$"), "the operating system's I/O"),
    (re.compile(r"^outbox_relay/(" + "|".join(IO_MODULES) + r")/"), "an I/O module"),
]


def module_of(path: str) -> str | None:
    """The pure module a file belongs to, or None."""
    for m in PURE_MODULES:
        if path.startswith(f"src/{m}/") or path.startswith(f"include/outbox_relay/{m}/"):
            return m
    return None


def lint_source(path: str, text: str) -> list[tuple[int, str, str]]:
    if module_of(path) is None:
        return []
    found = []
    for n, line in enumerate(text.splitlines(), 1):
        m = INCLUDE.match(line)
        if not m:
            continue
        for pattern, why in FORBIDDEN:
            if pattern.search(m.group(1)):
                found.append((n, m.group(1), why))
                break
    return found


SELF_TEST = [
    ("src/core/a.cc", "#include <spdlog/spdlog.h>\n", 1),
    ("src/tracking/a.cc", '#include "outbox_relay/pg/connection.h"\n', 1),
    ("include/outbox_relay/outbox/a.h", "#include <fstream>\n#include <string>\n", 1),
    ("src/walproto/a.cc", "#  include <sys/socket.h>\n", 1),
    ("src/pgoutput/a.cc", "#include <librdkafka/rdkafka.h>\n#include <cstdio>\n", 2),
    ("src/outbox/a.cc", '#include "outbox_relay/outbox/record.h"\n#include <cstdlib>\n', 0),
    ("src/core/a.cc", "#include <string_view>\n#include <fmt/format.h>\n", 0),
    # not a pure module: anything goes
    ("src/app/a.cc", "#include <spdlog/spdlog.h>\n#include <fstream>\n", 0),
    ("src/pg/a.cc", "#include <libpq-fe.h>\n", 0),
]


def self_test() -> int:
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import lint_selftest  # beside this file; loaded only for the self-test

    return lint_selftest.run(
        "pure-module include lint", lint_source, lambda f: f[0], SELF_TEST,
        [("line number", "src/core/a.cc", "#include <string>\n\n#include <iostream>\n", [3])])


def main(argv: list[str]) -> int:
    if argv[1:2] == ["--self-test"]:
        return self_test()
    bad = 0
    for path in argv[1:]:
        with open(path, encoding="utf-8", errors="replace") as f:
            for line, header, why in lint_source(path, f.read()):
                print(f"{path}:{line}: #include <{header}> in the pure module "
                      f"{module_of(path)}: {why}")
                bad += 1
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
