"""python3 -m outbox_bench (from bench/): the same as bench/harness.py."""

import sys

from .cli import main

sys.exit(main(sys.argv[1:]))
