#!/usr/bin/python3
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
import datetime
import json
import math
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
CLK_TCK = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")


def log(msg):
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


class BenchError(Exception):
    pass


# --------------------------------------------------------------------------------------------
# Process accounting (/proc)
# --------------------------------------------------------------------------------------------

def proc_cpu(pid):
    """utime + stime of the whole thread group, seconds; None when the process is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / CLK_TCK
    except (OSError, IndexError, ValueError):
        return None


def proc_children_cpu(pid):
    """cutime + cstime: CPU of the children `pid` has reaped (the postmaster reaps backends)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[13]) + int(fields[14])) / CLK_TCK
    except (OSError, IndexError, ValueError):
        return None


def proc_ppid(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def machine_busy_cpu():
    """CPU seconds all CPUs spent not idle (user+nice+system+irq+softirq+steal), /proc/stat."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    return (v[0] + v[1] + v[2] + v[5] + v[6] + v[7]) / CLK_TCK


def proc_status_kb(pid, key):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --------------------------------------------------------------------------------------------
# PostgreSQL through psql (psycopg is not a dependency): one long-lived psql for sampling,
# so polling costs one query on an open connection, not a process and a connection each time.
# --------------------------------------------------------------------------------------------

class Psql:
    END = "__bench_end__"

    def __init__(self, url, pg_bin):
        self.url = url
        self.pg_bin = pg_bin
        self.lock = threading.Lock()
        self.p = subprocess.Popen(
            [f"{pg_bin}/psql", "-X", "-q", "-A", "-t", "-F", "|", "-v", "ON_ERROR_STOP=0",
             "-d", url],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            text=True, bufsize=1)

    def query(self, sql):
        """Rows as lists of strings. Raises BenchError on an SQL error."""
        with self.lock:
            self.p.stdin.write(sql.rstrip().rstrip(";") + ";\n\\echo " + self.END + "\n")
            self.p.stdin.flush()
            rows, errors = [], []
            while True:
                line = self.p.stdout.readline()
                if line == "":
                    raise BenchError("psql exited")
                line = line.rstrip("\n")
                if line == self.END:
                    break
                if line.startswith(("ERROR:", "psql:", "FATAL:")):
                    errors.append(line)
                elif line.startswith(("NOTICE:", "WARNING:", "DETAIL:", "HINT:", "CONTEXT:",
                                      "LINE ", "INFO:")):
                    continue
                elif line:
                    rows.append(line.split("|"))
            if errors:
                raise BenchError(f"SQL failed: {sql[:200]}: {' '.join(errors)}")
            return rows

    def value(self, sql):
        rows = self.query(sql)
        return rows[0][0] if rows and rows[0] else None

    def run_script(self, text, timeout=3600):
        """Runs SQL text in a fresh psql (own session), stops at the first error."""
        r = subprocess.run([f"{self.pg_bin}/psql", "-X", "-q", "-v", "ON_ERROR_STOP=1",
                            "-d", self.url], input=text, text=True, capture_output=True,
                           timeout=timeout)
        if r.returncode != 0:
            raise BenchError(f"psql script failed: {r.stderr.strip()[:2000]}")
        return r.stdout

    def close(self):
        try:
            self.p.stdin.close()
            self.p.wait(timeout=5)
        except Exception:
            self.p.kill()


def lsn_int(text):
    hi, lo = text.split("/")
    return (int(hi, 16) << 32) | int(lo, 16)


def lsn_text(value):
    return f"{value >> 32:X}/{value & 0xFFFFFFFF:X}"


# --------------------------------------------------------------------------------------------
# The relay's /metrics (Prometheus text)
# --------------------------------------------------------------------------------------------

METRIC_LINE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{([^}]*)\})?\s+(\S+)')


def scrape(port, timeout=1.0):
    """{name: [(labels_dict, value)]} or None when the endpoint does not answer."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=timeout) as r:
            text = r.read().decode()
    except Exception:
        return None
    out = {}
    for line in text.splitlines():
        if not line or line[0] == "#":
            continue
        m = METRIC_LINE.match(line)
        if not m:
            continue
        labels = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', m.group(3) or ""))
        try:
            value = float(m.group(4))
        except ValueError:
            continue
        out.setdefault(m.group(1), []).append((labels, value))
    return out


def metric_sum(metrics, name):
    return sum(v for _, v in metrics.get(name, []))


def metric_one(metrics, name):
    vals = metrics.get(name, [])
    return vals[0][1] if vals else None


def histogram_buckets(metrics, name):
    """Cumulative bucket counts {le: count} summed over label sets."""
    buckets = {}
    for labels, value in metrics.get(name + "_bucket", []):
        le = labels.get("le")
        le = math.inf if le == "+Inf" else float(le)
        buckets[le] = buckets.get(le, 0) + value
    return dict(sorted(buckets.items()))


def histogram_quantile(buckets, q):
    """Prometheus-style linear interpolation inside the bucket (histogram_quantile)."""
    if not buckets:
        return None
    total = buckets.get(math.inf, max(buckets.values()))
    if total <= 0:
        return None
    rank = q * total
    prev_le, prev_count = 0.0, 0.0
    for le, count in buckets.items():
        if count >= rank:
            if le == math.inf:
                return prev_le
            if count == prev_count:
                return le
            return prev_le + (le - prev_le) * (rank - prev_count) / (count - prev_count)
        prev_le, prev_count = le, count
    return prev_le


def histogram_fraction_le(buckets, bound):
    total = buckets.get(math.inf, 0)
    if total <= 0 or bound not in buckets:
        return None
    return buckets[bound] / total


def histogram_delta(after, before):
    return {le: after.get(le, 0) - before.get(le, 0) for le in after}


def percentile(sorted_values, q):
    """Nearest-rank percentile of an ascending list."""
    if not sorted_values:
        return None
    k = max(0, min(len(sorted_values) - 1, math.ceil(q * len(sorted_values)) - 1))
    return sorted_values[k]


# --------------------------------------------------------------------------------------------
# The harness
# --------------------------------------------------------------------------------------------

CDF_QUANTILES = ([i / 100 for i in range(1, 100)] + [0.99 + i / 1000 for i in range(1, 10)]
                 + [0.9995, 0.9999, 1.0])

DRAIN_CONTENDERS = ["pg_recvlogical", "relay-null", "relay-kafka", "relay-kafka-nomark"]


class Harness:
    def __init__(self, args):
        self.args = args
        self.db = os.environ["DATABASE_URL"]
        self.brokers = os.environ["KAFKA_BROKERS"]
        self.pg_bin = os.environ.get("OUTBOX_PG_BIN", "/usr/lib/postgresql/15/bin")
        self.services_dir = os.environ.get("OUTBOX_SERVICES_DIR", "")
        build = os.path.join(REPO, args.build_dir)
        self.relay_bin = os.path.join(build, "outbox-relay")
        self.micro_bin = os.path.join(build, "bench", "bench_micro")
        self.admin_bin = os.path.join(build, "bench", "bench_kafka_admin")
        self.run_id = time.strftime("%Y%m%d-%H%M%S")
        self.topic_prefix = f"bench{self.run_id.replace('-', '')}."
        self.out = args.out or os.path.join(HERE, "results", self.run_id)
        os.makedirs(self.out, exist_ok=True)
        self.publication = "bench_outbox"
        self.sql = Psql(self.db, self.pg_bin)
        self.result = {
            "run_id": self.run_id,
            "started_at": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
            "mode": "quick" if args.quick else "full",
            "machine": self.machine(),
            "targets": {},
        }
        self.load_samples = []

    # ---- environment -----------------------------------------------------------------------

    def machine(self):
        info = {"cpus": os.cpu_count(), "load_avg_at_start": list(os.getloadavg())}
        try:
            with open("/proc/cpuinfo") as f:
                for line in f:
                    if line.startswith("model name"):
                        info["cpu_model"] = line.split(":", 1)[1].strip()
                        break
            with open("/proc/meminfo") as f:
                info["mem_total_kb"] = int(f.readline().split()[1])
        except OSError:
            pass
        if os.environ.get("OUTBOX_BENCH_GIT_COMMIT"):
            info["git_commit"] = os.environ["OUTBOX_BENCH_GIT_COMMIT"][:12]
            info["git_dirty"] = False
            info["source"] = "git archive of the commit (bench/run --ref)"
            return info
        try:
            info["git_commit"] = subprocess.run(
                ["git", "-C", REPO, "rev-parse", "--short", "HEAD"], capture_output=True,
                text=True).stdout.strip()
            info["git_dirty"] = bool(subprocess.run(
                ["git", "-C", REPO, "status", "--porcelain", "--", "src", "include"],
                capture_output=True, text=True).stdout.strip())
        except OSError:
            pass
        return info

    def note_load(self, where):
        self.load_samples.append({"where": where, "t": time.time(),
                                  "load_avg": list(os.getloadavg())})

    def kafka_pid(self):
        try:
            with open(os.path.join(self.services_dir, "kafka", "kafka.pid")) as f:
                return int(f.read().strip())
        except (OSError, ValueError):
            return None

    def wait_quiet(self):
        minutes = self.args.wait_quiet
        if minutes <= 0:
            return
        deadline = time.time() + minutes * 60
        while True:
            load1 = os.getloadavg()[0]
            if load1 < self.args.quiet_load:
                log(f"1-minute load average {load1:.2f} < {self.args.quiet_load}: measuring")
                self.result["machine"]["waited_for_quiet"] = {"quiet": True, "load1": load1}
                return
            if time.time() >= deadline:
                log(f"load average still {load1:.2f} after {minutes} min: measuring anyway")
                self.result["machine"]["waited_for_quiet"] = {"quiet": False, "load1": load1}
                return
            log(f"1-minute load average {load1:.2f} >= {self.args.quiet_load}: waiting 60 s")
            time.sleep(60)

    # ---- database state --------------------------------------------------------------------

    def setup_database(self):
        with open(os.path.join(HERE, "sql", "setup.sql")) as f:
            text = f.read().replace("\\ir ../../sql/outbox.sql",
                                    open(os.path.join(REPO, "sql", "outbox.sql")).read())
        self.sql.run_script("SET client_min_messages = warning;\n" + text)
        self.sql.run_script(
            "SET client_min_messages = warning;\n"
            f"DROP PUBLICATION IF EXISTS {self.publication};\n"
            f"CREATE PUBLICATION {self.publication} FOR TABLE public.outbox "
            "WITH (publish = 'insert');\n")
        settings = {}
        for name in ["server_version", "shared_buffers", "synchronous_commit", "fsync",
                     "wal_level", "logical_decoding_work_mem", "max_wal_size"]:
            settings[name] = self.sql.value(f"SHOW {name}")
        self.result["postgres"] = settings
        self.postmaster = proc_ppid(int(self.sql.value("SELECT pg_backend_pid()")))

    def drop_bench_slots(self):
        for (name, active_pid) in self.sql.query(
                "SELECT slot_name, coalesce(active_pid::text, '') FROM pg_replication_slots "
                "WHERE slot_name LIKE 'bench\\_%'"):
            if active_pid:
                self.sql.query(f"SELECT pg_terminate_backend({active_pid})")
                time.sleep(0.5)
            self.sql.query(f"SELECT pg_drop_replication_slot('{name}')")

    def reset_table(self):
        self.drop_bench_slots()
        self.sql.query("TRUNCATE outbox")
        self.sql.query("CREATE SCHEMA IF NOT EXISTS outbox_relay")
        exists = self.sql.value("SELECT to_regclass('outbox_relay.commits') IS NOT NULL")
        if exists == "t":
            self.sql.query("TRUNCATE outbox_relay.commits, outbox_relay.state")
        self.sql.query("CHECKPOINT")

    def create_slot(self, name):
        self.sql.query(f"SELECT pg_create_logical_replication_slot('{name}', 'pgoutput')")

    def generate_backlog(self, transactions, rows_per_tx):
        """Commits `transactions` transactions of `rows_per_tx` rows (synchronous_commit=off:
        only the WAL matters here, not how fast it was written)."""
        body = f"""
SET synchronous_commit = off;
DO $$
BEGIN
  FOR t IN 0..{transactions - 1} LOOP
    INSERT INTO outbox (uuid, payload, metadata)
      SELECT gen_random_uuid()::text, bench_payload(n), bench_metadata(n)
      FROM generate_series(t::bigint * {rows_per_tx} + 1, (t::bigint + 1) * {rows_per_tx}) AS n;
    COMMIT;
  END LOOP;
END $$;
"""
        t0 = time.time()
        self.sql.run_script(body)
        return time.time() - t0

    # ---- Kafka -----------------------------------------------------------------------------

    def create_topic(self, topic, *configs):
        r = subprocess.run([self.admin_bin, "create", self.brokers, topic, "3", *configs],
                           capture_output=True, text=True, timeout=60)
        if r.returncode != 0:
            raise BenchError(f"cannot create topic {topic}: {r.stderr.strip()}")

    def warm_up_broker(self):
        """One idempotent produce before anything is timed: the broker's first InitProducerId
        after a start costs about a second, which would otherwise fall on the first contender."""
        topic = f"{self.topic_prefix}warmup"
        self.create_topic(topic)
        r = subprocess.run(["kcat", "-P", "-b", self.brokers, "-t", topic,
                            "-X", "enable.idempotence=true", "-X", "acks=all"],
                           input="warm-up\n", capture_output=True, text=True, timeout=120)
        if r.returncode != 0:
            raise BenchError(f"warm-up produce failed: {r.stderr.strip()}")

    def delete_run_topics(self):
        r = subprocess.run([self.admin_bin, "delete", self.brokers, self.topic_prefix],
                           capture_output=True, text=True, timeout=120)
        if r.returncode != 0:
            log(f"warning: deleting topics {self.topic_prefix}*: {r.stderr.strip()}")

    # ---- the relay -------------------------------------------------------------------------

    def start_relay(self, slot, topic_template, sink, mark, logname, extra=()):
        port = free_port()
        cmd = [self.relay_bin, "run",
               "--database-url", self.db, "--kafka-brokers", self.brokers,
               "--table", "public.outbox", "--publication", self.publication,
               "--slot", slot, "--topic-template", topic_template,
               "--sink", sink, "--mark", "true" if mark else "false",
               "--backfill", "false", "--metrics-addr", f"127.0.0.1:{port}",
               "--log-format", "json", *extra]
        logf = open(os.path.join(self.out, logname), "w")
        p = subprocess.Popen(cmd, stdout=logf, stderr=subprocess.STDOUT)
        logf.close()
        return p, port

    def stop_relay(self, p):
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
            try:
                p.wait(timeout=40)
            except subprocess.TimeoutExpired:
                log("relay did not stop within 40 s of SIGTERM: killing it")
                p.kill()
                p.wait()
        return p.returncode

    def relay_backends(self):
        """Backends of the relay's normal connections (application_name outbox-relay*: marker, metrics sampler)."""
        return [int(r[0]) for r in self.sql.query(
            "SELECT pid FROM pg_stat_activity WHERE application_name LIKE 'outbox-relay%' "
            "AND backend_type = 'client backend'")]

    def walsender_pid(self, slot):
        v = self.sql.value(
            f"SELECT active_pid FROM pg_replication_slots WHERE slot_name = '{slot}'")
        return int(v) if v else None

    # ---- phase: microbenchmarks ------------------------------------------------------------

    def phase_micro(self):
        log("microbenchmarks (bench_micro)")
        self.note_load("micro")
        path = os.path.join(self.out, "micro.json")
        cmd = [self.micro_bin, "--benchmark_format=json", f"--benchmark_out={path}",
               "--benchmark_out_format=json",
               f"--benchmark_repetitions={1 if self.args.quick else 5}",
               "--benchmark_report_aggregates_only=true"]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
        if r.returncode != 0:
            raise BenchError(f"bench_micro failed: {r.stderr[-2000:]}")
        with open(path) as f:
            data = json.load(f)
        out = {"context": {k: data["context"].get(k) for k in
                           ["num_cpus", "mhz_per_cpu", "cpu_scaling_enabled",
                            "library_build_type", "load_avg"]},
               "benchmarks": {}}
        for b in data["benchmarks"]:
            name = b.get("run_name", b["name"])
            agg = b.get("aggregate_name", "")
            if agg not in ("", "median", "max"):
                continue
            key = "median" if agg in ("", "median") else "max"
            entry = out["benchmarks"].setdefault(name, {})
            entry[f"rows_per_s_{key}"] = b.get("items_per_second")
            if key == "median":
                entry["ns_per_row"] = b.get("real_time") if b.get("time_unit") == "ns" else None
        self.result["micro"] = out
        dm = out["benchmarks"].get("BM_DecodeAndMapRow", {}).get("rows_per_s_median")
        self.result["targets"]["micro_decode_map_rows_per_s"] = {
            "target": ">= 1,000,000 rows/s on one core", "value": dm,
            "met": dm is not None and dm >= 1e6}

    # ---- phase: backlog drain --------------------------------------------------------------

    def drain_sizes(self):
        a = self.args
        sizes = [
            {"name": "tx1", "label": "1-row transactions", "tx": a.rows_tx1, "rows_per_tx": 1,
             "contenders": DRAIN_CONTENDERS},
            {"name": "tx100", "label": "100-row transactions", "tx": a.rows_tx100 // 100,
             "rows_per_tx": 100, "contenders": DRAIN_CONTENDERS},
            {"name": "tx200k", "label": f"one {a.rows_big:,}-row transaction", "tx": 1,
             "rows_per_tx": a.rows_big, "contenders": DRAIN_CONTENDERS},
            {"name": "rss1m", "label": f"{a.rows_rss:,} rows in 100-row transactions (peak RSS)",
             "tx": a.rows_rss // 100, "rows_per_tx": 100,
             "contenders": ["pg_recvlogical", "relay-kafka"]},
        ]
        only = set(a.sizes.split(",")) if a.sizes else None
        return [s for s in sizes if only is None or s["name"] in only]

    def phase_drain(self):
        self.result["drain"] = {}
        for size in self.drain_sizes():
            self.drain_size(size)

    def drain_size(self, size):
        rows = size["tx"] * size["rows_per_tx"]
        log(f"drain {size['name']}: {size['label']}, {rows:,} rows")
        self.reset_table()
        slots = {c: f"bench_{size['name']}_{c.replace('-', '_')}" for c in size["contenders"]}
        for slot in slots.values():
            self.create_slot(slot)  # before the load: every contender reads the same WAL
        start_lsn = lsn_int(self.sql.value("SELECT pg_current_wal_lsn()"))
        gen_s = self.generate_backlog(size["tx"], size["rows_per_tx"])
        end_lsn = lsn_int(self.sql.value("SELECT pg_current_wal_lsn()"))
        # A record past the end, so that pg_recvlogical -E (and the relay's idle rule) see a
        # WAL position >= end even when nothing else writes WAL.
        self.sql.query("SELECT pg_logical_emit_message(false, 'bench', 'end')")
        count = int(self.sql.value("SELECT count(*) FROM outbox"))
        if count != rows:
            raise BenchError(f"backlog has {count} rows, expected {rows}")
        entry = {"label": size["label"], "rows": rows, "transactions": size["tx"],
                 "rows_per_transaction": size["rows_per_tx"],
                 "wal_bytes": end_lsn - start_lsn, "generate_seconds": round(gen_s, 2),
                 "start_lsn": lsn_text(start_lsn), "end_lsn": lsn_text(end_lsn),
                 "contenders": {}}
        log(f"  backlog: {entry['wal_bytes'] / 2**20:.0f} MiB of WAL in {gen_s:.1f} s")
        self.result["drain"][size["name"]] = entry
        for contender in size["contenders"]:
            self.note_load(f"drain {size['name']} {contender}")
            if contender == "pg_recvlogical":
                r = self.drain_recvlogical(slots[contender], start_lsn, end_lsn, rows)
            else:
                r = self.drain_relay(size["name"], contender, slots[contender], start_lsn,
                                     end_lsn, rows)
            entry["contenders"][contender] = r
            log(f"  {contender:20s} {r['events_per_s']:>10,.0f} events/s  "
                f"wall {r['wall_seconds']:.2f} s  cpu {r.get('client_cpu_seconds', 0):.2f} s  "
                f"walsender {r['walsender_cpu_seconds']:.2f} s"
                + (f"  peak RSS {r['peak_rss_kb'] / 1024:.1f} MiB" if r.get("peak_rss_kb")
                   else ""))
        base = entry["contenders"].get("pg_recvlogical", {}).get("events_per_s")
        for name, r in entry["contenders"].items():
            if base and name != "pg_recvlogical":
                r["ratio_to_pg_recvlogical"] = r["events_per_s"] / base
        on = entry["contenders"].get("relay-kafka", {}).get("events_per_s")
        off = entry["contenders"].get("relay-kafka-nomark", {}).get("events_per_s")
        if on and off:
            entry["marking_on_over_off"] = on / off
        self.sql.query("TRUNCATE outbox")  # the next phase starts from an empty table

    def drain_recvlogical(self, slot, start_lsn, end_lsn, rows):
        cmd = [f"{self.pg_bin}/pg_recvlogical", "-d", self.db, "--slot", slot, "--start",
               "--no-loop", "-o", "proto_version=1", "-o", f"publication_names={self.publication}",
               "-E", lsn_text(end_lsn), "-f", "/dev/null"]
        series = []
        reaped0 = proc_children_cpu(self.postmaster) if self.postmaster else None
        busy0 = machine_busy_cpu()
        t0 = time.time()
        p = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
        exit_info = {}

        def wait_child():
            # wait4, not Popen.wait: the child's exact CPU time comes with its exit status.
            _, status, usage = os.wait4(p.pid, 0)
            exit_info.update(t=time.time(), rc=os.waitstatus_to_exitcode(status),
                             cpu=usage.ru_utime + usage.ru_stime)
        waiter = threading.Thread(target=wait_child)
        waiter.start()
        ws_pid, ws_cpu = None, 0.0
        tick = 0
        while waiter.is_alive():
            if ws_pid is None:
                ws_pid = self.walsender_pid(slot)
            if ws_pid is not None:
                c = proc_cpu(ws_pid)
                if c is not None:
                    ws_cpu = c
            if tick % 4 == 0 and ws_pid is not None:
                sent = self.sql.value(
                    f"SELECT sent_lsn FROM pg_stat_replication WHERE pid = {ws_pid}")
                if sent:
                    frac = (lsn_int(sent) - start_lsn) / max(1, end_lsn - start_lsn)
                    series.append((time.time() - t0, min(rows, max(0.0, frac * rows))))
            tick += 1
            waiter.join(timeout=0.025)
            if time.time() - t0 > self.args.drain_timeout:
                p.kill()
                raise BenchError("pg_recvlogical did not reach the end in time")
        wall = exit_info["t"] - t0
        self_cpu = exit_info["cpu"]
        p.returncode = exit_info["rc"]
        if p.returncode != 0:
            raise BenchError(f"pg_recvlogical failed: {p.stderr.read()[-1000:]}")
        series.append((wall, rows))
        # The walsender exits right after its client; once the postmaster has reaped it, its
        # whole CPU time is in the postmaster's cutime/cstime (exact, where sampling /proc
        # every 25 ms would miss the last moments). Other backends exiting meanwhile would
        # count too: none do in the benchmark's own cluster.
        ws_sampled = ws_cpu
        deadline = time.time() + 5
        while ws_pid is not None and os.path.exists(f"/proc/{ws_pid}") and time.time() < deadline:
            time.sleep(0.01)
        time.sleep(0.05)
        if reaped0 is not None and ws_pid is not None and not os.path.exists(f"/proc/{ws_pid}"):
            reaped = proc_children_cpu(self.postmaster) - reaped0
            if reaped >= ws_sampled:
                ws_cpu = reaped
        busy = machine_busy_cpu() - busy0
        confirmed = self.sql.value(
            f"SELECT confirmed_flush_lsn FROM pg_replication_slots WHERE slot_name = '{slot}'")
        return {"wall_seconds": wall, "events_per_s": rows / wall,
                "walsender_cpu_seconds": ws_cpu,
                "walsender_cpu_seconds_sampled": ws_sampled,
                "machine_busy_cpu_seconds": busy,
                "foreign_cpu_seconds": max(0.0, busy - ws_cpu - self_cpu),
                "walsender_cpu_s_per_million": ws_cpu / rows * 1e6,
                "client_cpu_seconds": self_cpu,
                "client_cpu_s_per_million": self_cpu / rows * 1e6,
                "slot_confirmed_after": confirmed,
                "series": {"t": [round(t, 3) for t, _ in series],
                           "events": [round(e) for _, e in series],
                           "source": "walsender sent_lsn, scaled to rows"}}

    def drain_relay(self, size_name, contender, slot, start_lsn, end_lsn, rows):
        sink = "null" if contender == "relay-null" else "kafka"
        mark = contender == "relay-kafka"
        topic_base = f"{self.topic_prefix}{size_name}.{contender}"
        if sink == "kafka":
            # Topics exist before the clock starts: the run measures draining, not the
            # broker's topic auto-creation (both topics the template can produce).
            self.create_topic(f"{topic_base}.review")
        extra = []
        profile_proc = None
        busy0 = machine_busy_cpu()
        t0 = time.time()
        p, port = self.start_relay(slot, topic_base + ".{Event-Type:aggregate}", sink, mark,
                                   f"relay-{size_name}-{contender}.log", extra)
        if self.args.profile and size_name in self.args.profile.split(","):
            profile_proc = subprocess.Popen(
                ["perf", "record", "-F", "499", "--call-graph", "dwarf,16384", "-o",
                 os.path.join(self.out, f"perf-{size_name}-{contender}.data"), "-p", str(p.pid)],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        series = []
        ws_pid, ws_cpu = None, 0.0
        db_pids = {}  # the relay's own database sessions (marker, sampler): pid -> cpu
        kafka_pid = self.kafka_pid()
        kafka_cpu0 = proc_cpu(kafka_pid) if kafka_pid and sink == "kafka" else None
        first_event_t = None
        done_t = None
        tick = 0
        metrics = None
        try:
            while True:
                if p.poll() is not None:
                    raise BenchError(f"relay exited with {p.returncode} during the drain "
                                     f"(see relay-{size_name}-{contender}.log)")
                m = scrape(port)
                now = time.time()
                if m is not None:
                    metrics = m
                    delivered = metric_sum(m, "events_published_total")
                    confirmed = metric_one(m, "outbox_relay_confirmed_lsn") or 0
                    if delivered > 0 and first_event_t is None:
                        first_event_t = now - t0
                    series.append((now - t0, delivered))
                    if int(confirmed) >= end_lsn:
                        done_t = now
                        break
                if ws_pid is None and tick % 4 == 0:
                    ws_pid = self.walsender_pid(slot)
                if tick % 8 == 0:
                    for pid in self.relay_backends():
                        db_pids.setdefault(pid, 0.0)
                for pid in db_pids:
                    c = proc_cpu(pid)
                    if c is not None:
                        db_pids[pid] = c
                if ws_pid is not None:
                    c = proc_cpu(ws_pid)
                    if c is not None:
                        ws_cpu = c
                if now - t0 > self.args.drain_timeout:
                    raise BenchError(f"relay did not confirm {lsn_text(end_lsn)} within "
                                     f"{self.args.drain_timeout} s")
                tick += 1
                time.sleep(0.025)
            wall = done_t - t0
            relay_cpu = proc_cpu(p.pid)
            hwm = proc_status_kb(p.pid, "VmHWM")
            rss = proc_status_kb(p.pid, "VmRSS")
            if ws_pid is not None:
                ws_cpu = proc_cpu(ws_pid) or ws_cpu
            for pid in list(db_pids):
                c = proc_cpu(pid)
                if c is not None:
                    db_pids[pid] = c
            db_cpu = sum(db_pids.values())
            busy = machine_busy_cpu() - busy0
            kafka_cpu = (proc_cpu(kafka_pid) - kafka_cpu0) if kafka_cpu0 is not None else None
            delivered = metric_sum(metrics, "events_published_total")
            series.append((wall, delivered))
        finally:
            if profile_proc is not None:
                profile_proc.send_signal(signal.SIGINT)
                profile_proc.wait(timeout=60)
            rc = self.stop_relay(p)
        if rc != 0:
            raise BenchError(f"relay exited {rc} after SIGTERM (see relay-{size_name}-{contender}.log)")
        if delivered < rows:
            raise BenchError(f"{contender}: {delivered} events delivered, expected {rows}")
        r = {"wall_seconds": wall, "events_per_s": rows / wall,
             "startup_seconds": first_event_t,
             "events_per_s_after_first_event":
                 rows / (wall - first_event_t) if first_event_t and wall > first_event_t else None,
             "delivered": delivered,
             "relay_cpu_seconds": relay_cpu, "client_cpu_seconds": relay_cpu,
             "relay_cpu_s_per_million": relay_cpu / rows * 1e6,
             "walsender_cpu_seconds": ws_cpu,
             "walsender_cpu_s_per_million": ws_cpu / rows * 1e6,
             "peak_rss_kb": hwm, "rss_at_end_kb": rss,
             "sink": sink, "mark": mark,
             "series": {"t": [round(t, 3) for t, _ in series],
                        "events": [round(e) for _, e in series],
                        "source": "relay events_published_total (delivered)"}}
        r["machine_busy_cpu_seconds"] = busy
        r["foreign_cpu_seconds"] = max(0.0, busy - relay_cpu - ws_cpu - db_cpu - (kafka_cpu or 0))
        r["relay_db_sessions_cpu_seconds"] = db_cpu
        r["relay_db_sessions_cpu_s_per_million"] = db_cpu / rows * 1e6
        if kafka_cpu is not None:
            r["kafka_broker_cpu_seconds"] = kafka_cpu
            r["kafka_broker_cpu_s_per_million"] = kafka_cpu / rows * 1e6
        if mark:
            marked = self.sql.value("SELECT count(*) FROM outbox WHERE offset_acked IS NOT NULL")
            r["rows_marked"] = int(marked)
        if profile_proc is not None:
            r["perf_report"] = self.perf_report(f"perf-{size_name}-{contender}")
        return r

    def perf_report(self, base):
        """Flat (self) and inclusive (children) profiles of a perf.data as text files."""
        data = os.path.join(self.out, base + ".data")
        for kind, flags in [("self", ["--no-children"]), ("children", ["--children"])]:
            with open(os.path.join(self.out, f"{base}-{kind}.txt"), "w") as f:
                subprocess.run(["perf", "report", "-i", data, *flags, "--sort", "dso,symbol",
                                "--stdio", "-g", "none", "--percent-limit", "0.3"],
                               stdout=f, stderr=subprocess.DEVNULL, timeout=900)
        with open(os.path.join(self.out, f"{base}-threads.txt"), "w") as f:
            subprocess.run(["perf", "report", "-i", data, "--no-children", "--sort", "comm",
                            "--stdio", "-g", "none"], stdout=f, stderr=subprocess.DEVNULL,
                           timeout=900)
        return [f"{base}-self.txt", f"{base}-children.txt", f"{base}-threads.txt"]

    # ---- phase: live load ------------------------------------------------------------------

    def pgbench(self, seconds, rate=None, progress=False, tag="pgbench"):
        cmd = [f"{self.pg_bin}/pgbench", "-n", "-f", os.path.join(HERE, "sql", "insert1.sql"),
               "-c", str(self.args.clients), "-j", str(self.args.pgbench_threads),
               "-T", str(seconds)]
        if rate:
            cmd += ["-R", str(rate)]
        if progress:
            cmd += ["-P", "1"]
        env = dict(os.environ, PGOPTIONS="-c synchronous_commit=on")
        cmd += [self.db]
        return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env=env)

    @staticmethod
    def pgbench_tps(out):
        m = re.search(r"tps = ([0-9.]+) \((without initial connection time|excluding connections establishing)\)", out)
        if not m:
            m = re.search(r"tps = ([0-9.]+)", out)
        return float(m.group(1)) if m else None

    def phase_live(self):
        a = self.args
        log("live load")
        self.note_load("live capacity")
        self.reset_table()
        # What this machine sustains: pgbench flat out, synchronous_commit=on, no relay.
        p = self.pgbench(a.capacity_seconds)
        out, err = p.communicate()
        if p.returncode != 0:
            raise BenchError(f"pgbench failed: {err[-2000:]}")
        capacity = self.pgbench_tps(out)
        log(f"  capacity: {capacity:,.0f} inserts/s (1-row transactions, "
            f"synchronous_commit=on, {a.clients} clients)")
        with open(os.path.join(self.out, "pgbench-capacity.txt"), "w") as f:
            f.write(out + err)
        self.reset_table()
        slot = "bench_live"
        self.create_slot(slot)
        topic = f"{self.topic_prefix}live.review"
        # The broker stamps each record with its append time: that is the ack time we use.
        self.create_topic(topic, "message.timestamp.type=LogAppendTime")
        relay, port = self.start_relay(slot, self.topic_prefix + "live.{Event-Type:aggregate}",
                                       "kafka", True, "relay-live.log")
        live = {"capacity_inserts_per_s": capacity, "clients": a.clients,
                "seconds_per_rate": a.live_seconds, "topic": topic, "rates": {}}
        self.result["live"] = live
        samples = []  # (t, retained_restart, retained_confirmed, delivered, relay_cpu)
        stop_sampling = threading.Event()
        t_origin = time.time()
        relay_pid = relay.pid

        def sampler():
            while not stop_sampling.is_set():
                try:
                    row = self.sql.query(
                        "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), restart_lsn)::bigint, "
                        "pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn)::bigint "
                        f"FROM pg_replication_slots WHERE slot_name = '{slot}'")
                    m = scrape(port)
                    delivered = metric_sum(m, "events_published_total") if m else None
                    if row:
                        samples.append((time.time() - t_origin, int(row[0][0]), int(row[0][1]),
                                        delivered, proc_cpu(relay_pid)))
                except Exception as e:  # sampling must not kill the run
                    log(f"  sampler: {e}")
                stop_sampling.wait(0.5)

        try:
            deadline = time.time() + 60
            while True:
                m = scrape(port)
                if m and metric_one(m, "outbox_relay_streaming") == 1:
                    break
                if relay.poll() is not None or time.time() > deadline:
                    raise BenchError("relay did not start streaming (see relay-live.log)")
                time.sleep(0.1)
            th = threading.Thread(target=sampler, daemon=True)
            th.start()
            # Warm-up (not counted): connections, producer metadata, first batches.
            wp = self.pgbench(3, rate=max(1, int(capacity * 0.1)))
            wp.communicate()
            time.sleep(1)
            for pct in a.rates:
                rate = max(1, int(capacity * pct / 100))
                self.note_load(f"live {pct}%")
                log(f"  rate {pct}% = {rate:,} inserts/s for {a.live_seconds} s")
                hist0 = histogram_buckets(scrape(port) or {}, "outbox_relay_commit_to_ack_seconds")
                cpu0 = proc_cpu(relay_pid)
                del0 = metric_sum(scrape(port) or {}, "events_published_total")
                ws_pid = self.walsender_pid(slot)
                ws0 = proc_cpu(ws_pid) if ws_pid else None
                kpid = self.kafka_pid()
                k0 = proc_cpu(kpid) if kpid else None
                busy0 = machine_busy_cpu()
                t_start = time.time()
                pb = self.pgbench(a.live_seconds, rate=rate, progress=True)
                out, err = pb.communicate()
                t_end = time.time()
                busy = machine_busy_cpu() - busy0
                kcpu = (proc_cpu(kpid) - k0) if k0 is not None else None
                if pb.returncode != 0:
                    raise BenchError(f"pgbench failed: {err[-2000:]}")
                with open(os.path.join(self.out, f"pgbench-live-{pct}.txt"), "w") as f:
                    f.write(out + err)
                # Let the relay catch up before the next rate (and measure how long that took).
                end = lsn_int(self.sql.value("SELECT pg_current_wal_lsn()"))
                catch_deadline = time.time() + 120
                while True:
                    m = scrape(port)
                    if m and int(metric_one(m, "outbox_relay_confirmed_lsn") or 0) >= end:
                        break
                    if time.time() > catch_deadline:
                        raise BenchError("relay did not catch up within 120 s after the load")
                    time.sleep(0.05)
                t_caught = time.time()
                m = scrape(port) or {}
                hist = histogram_delta(
                    histogram_buckets(m, "outbox_relay_commit_to_ack_seconds"), hist0)
                delivered = metric_sum(m, "events_published_total") - del0
                cpu = proc_cpu(relay_pid) - cpu0
                ws_cpu = (proc_cpu(ws_pid) - ws0) if ws_pid and ws0 is not None else None
                progress = [(float(x), float(y)) for x, y in
                            re.findall(r"progress: ([0-9.]+) s, ([0-9.]+) tps", err)]
                live["rates"][str(pct)] = {
                    "target_inserts_per_s": rate,
                    "achieved_inserts_per_s": self.pgbench_tps(out),
                    "t_start": t_start - t_origin, "t_end": t_end - t_origin,
                    "unix_start": t_start, "unix_end": t_end,
                    "catch_up_seconds_after_load": t_caught - t_end,
                    "delivered": delivered,
                    "machine_busy_percent_of_one_cpu": busy / (t_end - t_start) * 100,
                    "kafka_broker_cpu_seconds": kcpu,
                    "relay_cpu_seconds": cpu,
                    "relay_cpu_s_per_million": cpu / delivered * 1e6 if delivered else None,
                    "walsender_cpu_seconds": ws_cpu,
                    "walsender_cpu_s_per_million":
                        ws_cpu / delivered * 1e6 if delivered and ws_cpu is not None else None,
                    "relay_histogram": {
                        "buckets": {("+Inf" if le == math.inf else str(le)): c
                                    for le, c in hist.items()},
                        "p50_ms": _ms(histogram_quantile(hist, 0.5)),
                        "p99_ms": _ms(histogram_quantile(hist, 0.99)),
                        "p999_ms": _ms(histogram_quantile(hist, 0.999)),
                        "fraction_le_50ms": histogram_fraction_le(hist, 0.05)},
                    "pgbench_progress": {"t": [x for x, _ in progress],
                                         "tps": [y for _, y in progress]},
                }
                time.sleep(2)
        finally:
            stop_sampling.set()
            rc = self.stop_relay(relay)
            log(f"  relay stopped (exit {rc})")
        live["samples"] = {"t": [round(s[0], 2) for s in samples],
                           "retained_wal_bytes": [s[1] for s in samples],
                           "unconfirmed_wal_bytes": [s[2] for s in samples],
                           "delivered": [s[3] for s in samples]}
        for pct, r in live["rates"].items():
            window = [s for s in samples if r["t_start"] <= s[0] <= r["t_end"]]
            if window:
                r["retained_wal_bytes_max"] = max(s[1] for s in window)
                r["retained_wal_bytes_mean"] = sum(s[1] for s in window) / len(window)
                r["unconfirmed_wal_bytes_max"] = max(s[2] for s in window)
        self.live_latency(slot, topic)

    def live_latency(self, slot, topic):
        """Per-row latency: broker append time (LogAppendTime, ms) minus the commit time the
        relay took from the pgoutput Commit message (recorded in outbox_relay.commits, us)."""
        live = self.result["live"]
        log("  consuming the live topic for per-record latency")
        path = os.path.join(self.out, "live-records.tsv")
        with open(path, "w") as f:
            r = subprocess.run(["kcat", "-C", "-b", self.brokers, "-t", topic, "-o", "beginning",
                                "-e", "-q", "-f", "%T\t%h\n"], stdout=f, stderr=subprocess.PIPE,
                               text=True, timeout=600)
        if r.returncode != 0:
            raise BenchError(f"kcat failed: {r.stderr[-1000:]}")
        append_ms = {}
        with open(path) as f:
            for line in f:
                ts, _, headers = line.rstrip("\n").partition("\t")
                for h in headers.split(","):
                    k, _, v = h.partition("=")
                    if k == "_watermill_message_uuid":
                        append_ms.setdefault(v, []).append(int(ts))
                        break
        commits = {}
        rows = self.sql.query(
            "SELECT o.uuid, (extract(epoch FROM c.commit_time) * 1000000)::bigint "
            "FROM (SELECT unnest(transaction_ids) AS xid, commit_time FROM outbox_relay.commits "
            f"      WHERE slot_name = '{slot}') c "
            "JOIN outbox o ON o.transaction_id = c.xid")
        for uuid, us in rows:
            commits[uuid] = int(us)
        duplicates = sum(len(v) - 1 for v in append_ms.values())
        lat_by_rate = {pct: [] for pct in live["rates"]}
        unmatched = 0
        for uuid, stamps in append_ms.items():
            cus = commits.get(uuid)
            if cus is None:
                unmatched += 1
                continue
            for pct, r in live["rates"].items():
                if r["unix_start"] * 1e6 <= cus <= r["unix_end"] * 1e6:
                    lat_by_rate[pct].append(min(stamps) - cus / 1000.0)
                    break
        live["records_consumed"] = sum(len(v) for v in append_ms.values())
        live["duplicates"] = duplicates
        live["records_without_commit_row"] = unmatched
        for pct, lats in lat_by_rate.items():
            lats.sort()
            r = live["rates"][pct]
            r["latency_ms"] = {
                "count": len(lats),
                "p50": percentile(lats, 0.5), "p90": percentile(lats, 0.9),
                "p99": percentile(lats, 0.99), "p999": percentile(lats, 0.999),
                "max": lats[-1] if lats else None,
                "mean": sum(lats) / len(lats) if lats else None}
            # A compact CDF for the plot, dense in the tail: [[quantile, ms], ...].
            r["latency_cdf_ms"] = [[q, percentile(lats, q)] for q in CDF_QUANTILES] if lats else []
        t50 = live["rates"].get("50", {}).get("latency_ms", {}).get("p99")
        self.result["targets"]["live_p99_at_50pct_ms"] = {
            "target": "p99 <= 50 ms at 50 % load", "value": t50,
            "met": t50 is not None and t50 <= 50}

    # ---- summary ---------------------------------------------------------------------------

    def evaluate_targets(self):
        t = self.result["targets"]
        drain = self.result.get("drain", {})
        worst = {"relay-kafka": None, "relay-null": None}
        for size in ["tx1", "tx100", "tx200k"]:
            for c in worst:
                ratio = drain.get(size, {}).get("contenders", {}).get(c, {}).get(
                    "ratio_to_pg_recvlogical")
                if ratio is not None:
                    t[f"drain_{c}_{size}_ratio"] = {
                        "target": f">= {0.8 if c == 'relay-kafka' else 0.95} x pg_recvlogical",
                        "value": ratio,
                        "met": ratio >= (0.8 if c == "relay-kafka" else 0.95)}
        rss = drain.get("rss1m", {}).get("contenders", {}).get("relay-kafka", {}).get(
            "peak_rss_kb")
        all_rss = [r.get("peak_rss_kb") for s in drain.values()
                   for r in s["contenders"].values() if r.get("peak_rss_kb")]
        if rss is not None:
            t["peak_rss_1m_drain_mb"] = {"target": "<= 64 MB", "value": rss / 1024,
                                         "met": rss <= 64 * 1024}
        if all_rss:
            t["peak_rss_any_drain_mb"] = {"target": "<= 64 MB", "value": max(all_rss) / 1024,
                                          "met": max(all_rss) <= 64 * 1024}
        for size, s in drain.items():
            r = s["contenders"].get("relay-kafka")
            if r:
                t[f"cpu_relay_below_walsender_{size}"] = {
                    "target": "relay CPU per event < walsender's",
                    "value": {"relay_s_per_million": r["relay_cpu_s_per_million"],
                              "walsender_s_per_million": r["walsender_cpu_s_per_million"]},
                    "met": r["relay_cpu_s_per_million"] < r["walsender_cpu_s_per_million"]}

    def summary(self):
        lines = []
        res = self.result
        m = res["machine"]
        lines.append(f"outbox-relay benchmark {res['run_id']} ({res['mode']}), "
                     f"{m.get('cpus')} CPUs {m.get('cpu_model', '')}, git {m.get('git_commit')}"
                     + (" (src dirty)" if m.get("git_dirty") else ""))
        lines.append(f"load average at start {m['load_avg_at_start'][0]:.2f}"
                     + (f"; waited for quiet: {m['waited_for_quiet']}" if "waited_for_quiet" in m
                        else ""))
        if self.load_samples:
            l1 = [s["load_avg"][0] for s in self.load_samples]
            lines.append(f"1-min load average during the run: min {min(l1):.2f}, "
                         f"max {max(l1):.2f}")
        drain = res.get("drain")
        if drain:
            lines.append("")
            lines.append("Backlog drain (wall time from process start to the end LSN confirmed)")
            lines.append("cpu s/M = CPU seconds per million events: the client (relay or "
                         "pg_recvlogical), its walsender, the relay's own DB sessions "
                         "(marking), the Kafka broker; foreign = CPU used by everything else "
                         "on the machine during the run, in % of one CPU (other users' "
                         "builds, PostgreSQL's background processes)")
            hdr = (f"{'backlog':8s} {'contender':20s} {'rows':>9s} {'events/s':>10s} "
                   f"{'x recv':>7s} {'wall s':>7s} {'client':>7s} {'walsnd':>7s} "
                   f"{'mark db':>7s} {'broker':>7s} {'peak RSS':>9s} {'foreign':>8s}")
            lines.append(hdr)
            lines.append("-" * len(hdr))
            for size, s in drain.items():
                for c, r in s["contenders"].items():
                    ratio = r.get("ratio_to_pg_recvlogical")
                    cpu = r.get("relay_cpu_s_per_million", r.get("client_cpu_s_per_million"))
                    dbc = r.get("relay_db_sessions_cpu_s_per_million")
                    kb = r.get("kafka_broker_cpu_s_per_million")
                    lines.append(
                        f"{size:8s} {c:20s} {s['rows']:>9,} {r['events_per_s']:>10,.0f} "
                        f"{(f'{ratio:.2f}' if ratio else '-'):>7s} {r['wall_seconds']:>7.2f} "
                        f"{cpu:>7.2f} {r['walsender_cpu_s_per_million']:>7.2f} "
                        f"{(f'{dbc:.2f}' if dbc is not None else '-'):>7s} "
                        f"{(f'{kb:.1f}' if kb is not None else '-'):>7s} "
                        + (f"{r['peak_rss_kb'] / 1024:>7.1f}MB" if r.get("peak_rss_kb")
                           else f"{'-':>9s}")
                        + (f" {r['foreign_cpu_seconds'] / r['wall_seconds'] * 100:>6.0f}%"
                           if r.get("foreign_cpu_seconds") is not None else ""))
                for c, r in s["contenders"].items():
                    if r.get("startup_seconds") is not None and r.get(
                            "events_per_s_after_first_event"):
                        lines.append(f"{'':8s}   {c}: first row delivered after "
                                     f"{r['startup_seconds']:.2f} s, then "
                                     f"{r['events_per_s_after_first_event']:,.0f} events/s")
                if s.get("marking_on_over_off"):
                    lines.append(f"{size:8s} marking on / off throughput: "
                                 f"{s['marking_on_over_off']:.2f}")
        live = res.get("live")
        if live:
            lines.append("")
            lines.append(f"Live load (capacity {live['capacity_inserts_per_s']:,.0f} inserts/s, "
                         f"synchronous_commit=on, {live['clients']} clients, "
                         f"{live['seconds_per_rate']} s per rate)")
            hdr = (f"{'rate':>5s} {'ins/s':>7s} {'rows':>7s} {'p50 ms':>7s} {'p99 ms':>7s} "
                   f"{'p99.9 ms':>8s} {'max ms':>7s} {'hist p99':>8s} {'<=50ms':>7s} "
                   f"{'WAL max':>9s} {'cpu s/M':>8s} {'walsnd':>7s} {'catchup':>7s}")
            lines.append(hdr)
            lines.append("-" * len(hdr))
            for pct, r in live["rates"].items():
                lat = r.get("latency_ms", {})
                h = r["relay_histogram"]

                def f(v, w=7, d=1):
                    return f"{v:>{w}.{d}f}" if v is not None else f"{'-':>{w}s}"
                lines.append(
                    f"{pct + '%':>5s} {r['achieved_inserts_per_s'] or 0:>7.0f} "
                    f"{lat.get('count', 0):>7,} {f(lat.get('p50'))} {f(lat.get('p99'))} "
                    f"{f(lat.get('p999'), 8)} {f(lat.get('max'))} {f(h['p99_ms'], 8)} "
                    f"{f((h['fraction_le_50ms'] or 0) * 100, 6, 2)}% "
                    f"{(r.get('retained_wal_bytes_max') or 0) / 2**20:>7.1f}MB "
                    f"{f(r.get('relay_cpu_s_per_million'), 8, 1)} "
                    f"{f(r.get('walsender_cpu_s_per_million'), 7, 1)} "
                    f"{f(r.get('catch_up_seconds_after_load'), 6, 2)}s")
            lines.append("p50/p99/p99.9/max: commit (pgoutput) -> broker LogAppendTime per "
                         "row; hist p99 and <=50ms: the relay's commit->ack histogram; WAL max: "
                         "slot retained WAL (restart_lsn); cpu s/M: relay and walsender CPU "
                         "per million events")
            lines.append(f"records consumed {live.get('records_consumed')}, duplicates "
                         f"{live.get('duplicates')}, without commit row "
                         f"{live.get('records_without_commit_row')}")
        micro = res.get("micro")
        if micro:
            lines.append("")
            lines.append("Microbenchmarks (one core, median of repetitions)")
            for name, b in micro["benchmarks"].items():
                v = b.get("rows_per_s_median")
                lines.append(f"  {name:32s} {v:>14,.0f} rows/s" if v else f"  {name}")
        if res["targets"]:
            lines.append("")
            lines.append("Targets")
            for name, t in res["targets"].items():
                v = t["value"]
                if isinstance(v, float):
                    v = f"{v:,.2f}"
                elif isinstance(v, dict):
                    v = ", ".join(f"{k}={x:.2f}" for k, x in v.items())
                lines.append(f"  {'MET ' if t['met'] else 'MISS'} {name}: {v} "
                             f"(target {t['target']})")
        return "\n".join(lines)

    # ---- main ------------------------------------------------------------------------------

    def run(self):
        a = self.args
        self.wait_quiet()
        self.result["machine"]["load_avg_at_measurement_start"] = list(os.getloadavg())
        self.setup_database()
        phases = a.phases.split(",")
        if "drain" in phases or "live" in phases:
            self.warm_up_broker()
        try:
            if "micro" in phases:
                self.phase_micro()
            if "drain" in phases:
                self.phase_drain()
            if "live" in phases:
                self.phase_live()
        finally:
            self.result["load_samples"] = self.load_samples
            self.result["finished_at"] = datetime.datetime.now().astimezone().isoformat(
                timespec="seconds")
            self.evaluate_targets()
            with open(os.path.join(self.out, "result.json"), "w") as f:
                json.dump(self.result, f, indent=1)
            text = self.summary()
            with open(os.path.join(self.out, "summary.txt"), "w") as f:
                f.write(text + "\n")
            try:
                import plot
                plot.render(self.result, os.path.join(self.out, "plot.png"))
            except Exception as e:
                log(f"plot failed: {e}")
            if not a.keep_topics:
                self.delete_run_topics()
            self.drop_bench_slots()
            self.sql.close()
        print(text)
        log(f"results in {self.out}")


def _ms(seconds):
    return seconds * 1000 if seconds is not None else None


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
    p.add_argument("--rates", default="25,50,80", help="percent of the sustained insert rate")
    p.add_argument("--live-seconds", type=int, default=60)
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
        a.capacity_seconds = min(a.capacity_seconds, 5)
    a.rates = [int(x) for x in a.rates.split(",") if x]
    return a


def main(argv):
    args = parse_args(argv)
    sys.path.insert(0, HERE)
    h = Harness(args)
    try:
        h.run()
    except BenchError as e:
        log(f"FAILED: {e}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
