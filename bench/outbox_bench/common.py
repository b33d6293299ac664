"""What every module of the harness shares: where the benchmark's files are, the log line and
the error that ends a run."""

import os
import sys
import time

# bench/ (sql/, results/, plot.py) and the repository it belongs to.
BENCH_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REPO = os.path.dirname(BENCH_DIR)


def log(msg):
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


class BenchError(Exception):
    pass
