#!/usr/bin/python3
"""bench/harness.py: starts the benchmark harness, the package outbox_bench/ next to it
(bench/run runs this with the harness's options; see outbox_bench/__init__.py)."""

import sys

from outbox_bench.cli import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
