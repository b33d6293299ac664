"""outbox-relay benchmark harness (issue 5). Run it through bench/run, which installs the
dependencies, builds, starts dedicated services and exports their environment.

Phases (each can be skipped):
  micro  Google Benchmark microbenchmarks (decode + map per row).
  drain  The same WAL backlog read by every contender from its own slot, created before the
         load: pg_recvlogical to /dev/null (the ceiling), the relay with the null sink, the
         relay with Kafka (acks=all, marking on) and with Kafka and marking off. Backlogs:
         1-row transactions, 100-row transactions, one 200,000-row transaction, and a
         1,000,000-row backlog for peak RSS.
  live   Fixed insert rates (25/50/80 % of what pgbench sustains with synchronous_commit=on)
         with the relay running: commit-to-Kafka-append latency per row, retained WAL.

Writes <out>/result.json, <out>/plot.png, <out>/summary.txt and logs; prints the summary.
Everything it measures is described in bench/README.md.
"""

import argparse
import re
import sys

from .common import BENCH_DIR, BenchError, log
from .contenders import DRAIN_CONTENDERS, KNOWN_CONTENDERS, LIVE_RELAYS, PEERS, contender_kind
from .postgres import TABLE_VARIANTS
from .runner import Harness


def parse_rates(text):
    """'500/s,25,50' -> ['500/s', '25%', '50%'] (a bare number is a percentage of capacity)."""
    out = []
    for x in text.split(","):
        x = x.strip()
        if not x:
            continue
        if x.endswith("/s"):
            int(x[:-2])
            out.append(x)
        else:
            int(x.rstrip("%"))
            out.append(x.rstrip("%") + "%")
    return out


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true",
                   help="small sizes for a smoke run (20k-row backlogs, 10 s per rate)")
    p.add_argument("--phases", default="micro,drain,live")
    p.add_argument("--sizes", default="", help="drain backlogs to run: tx1,tx100,tx200k,rss1m")
    p.add_argument("--rows-tx1", type=int, default=100_000)
    p.add_argument("--rows-tx100", type=int, default=200_000)
    p.add_argument("--rows-big", type=int, default=200_000)
    p.add_argument("--rows-rss", type=int, default=1_000_000)
    p.add_argument("--row", choices=["seed", "small"], default="seed",
                   help="drain rows: the seed's (~250-byte payload, ~300-byte metadata) or "
                        "small ones (~20 bytes, two metadata keys)")
    p.add_argument("--table-variant", choices=list(TABLE_VARIANTS), default="seed",
                   help="the outbox table's shape: seed (sql/outbox.sql), no-acked-index (without "
                        "the partial index idx_outbox_acked), no-acked-index-ff70 / -ff50 (that "
                        "and fillfactor 70 / 50, so the marking UPDATE can be HOT)")
    p.add_argument("--rates", default="500/s,25,50,80",
                   help="the relay's live rates: N/s, or a percentage of the sustained rate")
    p.add_argument("--live-seconds", type=int, default=60, help="per rate, the relay")
    p.add_argument("--eos-rates", default="500/s,50",
                   help="live rates of the exactly-once relay (relay-eos), like --rates")
    p.add_argument("--txn-interval-ms", type=int, default=0,
                   help="the exactly-once relay's --txn-interval-ms (0: the relay's default)")
    p.add_argument("--contenders", default="",
                   help="run only these contenders (comma-separated; empty: all): drain "
                        "pg_recvlogical, relay-null, watermill, relay-kafka, relay-kafka-eos, "
                        "relay-kafka-nomark, debezium; live relay (= relay-kafka), relay-eos "
                        "(= relay-kafka-eos), and the peers' live contenders by name or by peer "
                        "(watermill, debezium)")
    p.add_argument("--peers", default="watermill,debezium",
                   help="peers to run next to the relay (empty: none)")
    p.add_argument("--live-peers",
                   default="watermill-1s,watermill-500ms,watermill-100ms,watermill-10ms,"
                           "debezium-500ms,debezium-10ms",
                   help="live contenders among the peers, <peer>-<poll interval>")
    p.add_argument("--peer-rates", default="500/s,50")
    p.add_argument("--peer-drain-rows", type=int, default=20_000,
                   help="the Watermill forwarder drains this many rows of each backlog (0: all)")
    p.add_argument("--peer-live-seconds", type=int, default=30, help="per rate, each peer")
    p.add_argument("--live-warmup-seconds", type=int, default=3,
                   help="load before the measured rates, at 10 %% of capacity")
    p.add_argument("--jvm-warmup-seconds", type=int, default=30,
                   help="Debezium's warm-up load, at 50 %% of capacity")
    p.add_argument("--broker-warmup-seconds", type=float, default=8,
                   help="before anything is timed, load the broker for this long as the "
                        "at-least-once relay does and (exactly-once contenders to run) as long "
                        "again in Kafka transactions, so that its JIT has compiled those paths "
                        "(0: one record each)")
    p.add_argument("--broker-warmup-drains", type=int, default=3,
                   help="then drain this many untimed 200,000-row backlogs (100-row "
                        "transactions) through each Kafka relay contender to run (0: none)")
    p.add_argument("--catch-up-timeout", type=float, default=300)
    p.add_argument("--db-cost-baseline", default="bench/baseline/db-cost-3982f78.json",
                   help="db-cost.json of a run at the commit target 1 compares with")
    p.add_argument("--pg-transport", choices=["tcp", "unix"], default="tcp",
                   help="how pg_recvlogical, the relay and the Watermill forwarder reach "
                        "PostgreSQL: tcp (127.0.0.1) or unix (the server's socket: the "
                        "walsender's sends then skip the loopback TCP stack, whose receiving "
                        "half a real network runs on the client's host). pgbench, the "
                        "harness and Debezium (JDBC) stay on TCP")
    p.add_argument("--capacity-seconds", type=int, default=20)
    p.add_argument("--clients", type=int, default=8)
    p.add_argument("--pgbench-threads", type=int, default=2)
    p.add_argument("--drain-timeout", type=float, default=900)
    p.add_argument("--wait-quiet", type=float, default=0,
                   help="minutes to wait for the 1-min load average to drop below --quiet-load")
    p.add_argument("--quiet-load", type=float, default=1.5)
    p.add_argument("--profile", default="",
                   help="perf record the relay-kafka contender of these backlogs (e.g. tx100)")
    p.add_argument("--keep-topics", action="store_true")
    p.add_argument("--keep-services", action="store_true", help="(handled by bench/run)")
    p.add_argument("--build-dir", default="build-bench")
    p.add_argument("--out", default="")
    a = p.parse_args(argv)
    if a.quick:
        a.rows_tx1 = min(a.rows_tx1, 20_000)
        a.rows_tx100 = min(a.rows_tx100, 20_000)
        a.rows_big = min(a.rows_big, 20_000)
        a.rows_rss = min(a.rows_rss, 50_000)
        a.live_seconds = min(a.live_seconds, 10)
        a.peer_live_seconds = min(a.peer_live_seconds, 10)
        a.capacity_seconds = min(a.capacity_seconds, 5)
    a.rates = parse_rates(a.rates)
    a.eos_rates = parse_rates(a.eos_rates)
    a.contenders = [c.strip() for c in a.contenders.split(",") if c.strip()]
    for c in a.contenders:
        if c not in KNOWN_CONTENDERS and contender_kind(c) not in PEERS:
            p.error(f"--contenders: unknown contender {c} "
                    f"({', '.join(DRAIN_CONTENDERS + list(LIVE_RELAYS))})")
    a.peer_rates = parse_rates(a.peer_rates)
    for c in a.live_peers.split(","):
        if c and (contender_kind(c) not in PEERS or "-" in c and not re.fullmatch(
                r"[0-9.]+m?s", c.split("-", 1)[1])):
            p.error(f"--live-peers: {c} is not <watermill|debezium>[-<poll interval>]")
    return a


def main(argv):
    args = parse_args(argv)
    sys.path.insert(0, BENCH_DIR)
    try:
        h = Harness(args)
        h.run()
    except BenchError as e:
        log(f"FAILED: {e}")
        return 1
    return 0
