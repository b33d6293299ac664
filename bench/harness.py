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
import urllib.parse
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

def stat_cpu(path):
    """utime + stime from a /proc stat file, seconds; None when it is gone."""
    try:
        with open(path) as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / CLK_TCK
    except (OSError, IndexError, ValueError):
        return None


def proc_cpu(pid):
    """utime + stime of the whole thread group, seconds; None when the process is gone."""
    return stat_cpu(f"/proc/{pid}/stat")


def proc_jit_cpu(pid):
    """utime + stime of a JVM's JIT compiler threads ("C1 CompilerThre", "C2 CompilerThre"),
    seconds; None when the process is gone."""
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return None
    total = 0.0
    for t in tasks:
        try:
            with open(f"/proc/{pid}/task/{t}/comm") as f:
                if "CompilerThre" not in f.read():
                    continue
        except OSError:
            continue  # a thread that ended meanwhile
        total += stat_cpu(f"/proc/{pid}/task/{t}/stat") or 0.0
    return total


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


def children_cpu(parent):
    """{pid: cpu seconds} of the live children of `parent` (the postmaster's: every backend,
    walsender and background process of the cluster)."""
    out = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            if int(fields[1]) == parent:
                out[int(name)] = (int(fields[11]) + int(fields[12])) / CLK_TCK
        except (OSError, IndexError, ValueError):
            continue
    return out


def socket_inodes(pid):
    """Inodes of the sockets process `pid` holds."""
    inodes = set()
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    except OSError:
        return set()
    return inodes


def unix_peer_pids(pid):
    """Pids at the other end of the Unix-socket connections process `pid` holds (`ss -xp`
    knows each connected socket's peer inode and owner): the contender's PostgreSQL backends
    when it connects through the server's socket."""
    mine = socket_inodes(pid)
    if not mine:
        return set()
    out = subprocess.run(["ss", "-xpnH"], capture_output=True, text=True).stdout
    peer_of, owner_of = {}, {}
    for line in out.splitlines():
        m = re.search(r"(\d+)\s+\S+\s+(\d+)\s+users:\(\(\"[^\"]*\",pid=(\d+)", line)
        if m:
            peer_of[m.group(1)] = m.group(2)
            owner_of[m.group(1)] = int(m.group(3))
    return {owner_of[peer_of[i]] for i in mine
            if i in peer_of and peer_of[i] in owner_of and owner_of[peer_of[i]] != pid}


def client_ports(pid, server_port):
    """Local ports of the TCP connections process `pid` holds to 127.0.0.1:`server_port`: how
    the harness finds a contender's PostgreSQL sessions whatever it calls them (the Java and Go
    peers name their sessions differently from the relay, and some not at all)."""
    inodes = socket_inodes(pid)
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                next(f)
                for line in f:
                    parts = line.split()
                    if len(parts) < 10 or parts[9] not in inodes:
                        continue
                    remote_port = int(parts[2].rsplit(":", 1)[1], 16)
                    if remote_port == server_port:
                        ports.add(int(parts[1].rsplit(":", 1)[1], 16))
        except OSError:
            continue
    return ports


# --------------------------------------------------------------------------------------------
# PostgreSQL through psql (psycopg is not a dependency): one long-lived psql for sampling,
# so polling costs one query on an open connection, not a process and a connection each time.
# --------------------------------------------------------------------------------------------

# --table-variant: how the benchmark's outbox table is shaped (issue 13, target 2; the figures
# are in docs/migration.md). "seed" is sql/outbox.sql as it is. The others are what a team
# could do after migrating to the relay: nothing polls the table any more, so the forwarder's
# partial index on offset_acked (idx_outbox_acked ... WHERE offset_acked IS NULL) can go, and
# without an index on offset_acked the marking UPDATE may be a HOT update -- if the row's page
# has room for the new version, which a lower fillfactor leaves free. The fillfactor applies to
# pages written after it is set: the harness truncates the table before each backlog, so every
# backlog is written with it.
TABLE_VARIANTS = {
    "seed": {"acked_index": True, "fillfactor": None},
    "no-acked-index": {"acked_index": False, "fillfactor": None},
    "no-acked-index-ff70": {"acked_index": False, "fillfactor": 70},
    "no-acked-index-ff50": {"acked_index": False, "fillfactor": 50},
}


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
    """{name: [(labels_dict, value)]} or None when the endpoint does not answer (or there is
    none: port None, as for pg_recvlogical)."""
    if port is None:
        return None
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


def metric_labelled(metrics, name, **want):
    """Sum of the samples of `name` whose labels include `want`."""
    return sum(v for labels, v in metrics.get(name, [])
               if all(labels.get(k) == x for k, x in want.items()))


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
# Commit -> visible: a consumer that runs during the live load and stamps each record when it
# receives it (exactly-once: records are only visible to read_committed consumers at the Kafka
# commit, after their LogAppendTime)
# --------------------------------------------------------------------------------------------

class VisibilityConsumer:
    """kcat -C from the beginning of one topic, unbuffered, one line (the record's headers) per
    record; a thread stamps each line with the host clock when it arrives. fetch.wait.max.ms=10
    bounds how long the broker holds a fetch when nothing is visible yet (it answers at once
    when something is). isolation.level=read_committed when asked (the exactly-once relay);
    otherwise kcat's settings are left as they are (librdkafka's default is read_committed too,
    which changes nothing for records written outside transactions)."""

    def __init__(self, brokers, topic, read_committed, errlog):
        cmd = ["kcat", "-C", "-b", brokers, "-t", topic, "-o", "beginning", "-u", "-q",
               "-f", "%h\n", "-X", "fetch.wait.max.ms=10"]
        if read_committed:
            cmd += ["-X", "isolation.level=read_committed"]
        self.cmd = cmd
        self.read_committed = read_committed
        self.seen = {}  # uuid -> first receive time (unix seconds)
        self.records = 0
        self.prefix = (UUID_HEADER["relay"] + "=").encode()
        errf = open(errlog, "w")
        # Buffered (not bufsize=0: a raw pipe's readline reads one byte per system call, too
        # slow for a thousand records a second); a buffered readline returns as soon as a line
        # is in the pipe, it does not wait for the buffer to fill.
        self.p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=errf, bufsize=1 << 16)
        errf.close()
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self):
        out = self.p.stdout
        while True:
            line = out.readline()
            if not line:
                return
            t = time.time()
            self.records += 1
            for h in line.rstrip(b"\n").split(b","):
                if h.startswith(self.prefix):
                    u = h[len(self.prefix):].decode()
                    if u not in self.seen:
                        self.seen[u] = t
                    break

    def wait_for(self, n, timeout):
        deadline = time.time() + timeout
        while len(self.seen) < n and time.time() < deadline:
            if self.p.poll() is not None:
                break
            time.sleep(0.05)
        return len(self.seen) >= n

    def stop(self):
        if self.p.poll() is None:
            self.p.terminate()
            try:
                self.p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait()
        self.thread.join(timeout=10)


# --------------------------------------------------------------------------------------------
# The harness
# --------------------------------------------------------------------------------------------

CDF_QUANTILES = ([i / 100 for i in range(1, 100)] + [0.99 + i / 1000 for i in range(1, 10)]
                 + [0.9995, 0.9999, 1.0])

# In this order: the Watermill forwarder reads the table, so it runs before relay-kafka's
# marking rewrites every row (autovacuum is off for the table); the WAL readers do not care.
# relay-kafka-eos (issue 14) is relay-kafka with --delivery exactly-once, right after it so that
# the two run as close together as possible.
DRAIN_CONTENDERS = ["pg_recvlogical", "relay-null", "watermill", "relay-kafka",
                    "relay-kafka-eos", "relay-kafka-nomark", "debezium"]
# Drain contenders that run the relay with --delivery exactly-once.
EOS_CONTENDERS = ("relay-kafka-eos",)
# Live contenders: the relay at-least-once ("relay", the name earlier runs used) and exactly-once
# ("relay-eos"); --contenders accepts either name or the drain contender's.
LIVE_RELAYS = {"relay": "relay-kafka", "relay-eos": "relay-kafka-eos"}
PEERS = ("watermill", "debezium")
KNOWN_CONTENDERS = set(DRAIN_CONTENDERS) | set(LIVE_RELAYS)
# The record header that carries the row's uuid: watermill-kafka's UUID header (the relay writes
# the same), and the outbox event router's event id header for Debezium.
UUID_HEADER = {"relay": "_watermill_message_uuid", "watermill": "_watermill_message_uuid",
               "debezium": "id"}
# Issue 13's targets 1 and 4 are stated at these two live rates.
TARGET_RATES = ("500/s", "50%")


def is_eos(name):
    """The relay with --delivery exactly-once (drain relay-kafka-eos, live relay-eos)."""
    return name in EOS_CONTENDERS or name == "relay-eos"


def contender_kind(name):
    """relay | watermill | debezium | pg_recvlogical, from a contender name."""
    for kind in ("relay", "watermill", "debezium"):
        if name == kind or name.startswith(kind + "-"):
            return kind
    return name


def parse_duration_ms(text):
    """'10ms', '500ms', '1s' -> milliseconds."""
    m = re.fullmatch(r"([0-9.]+)(ms|s)", text)
    if not m:
        raise ValueError(f"bad duration {text!r} (e.g. 10ms, 1s)")
    return float(m.group(1)) * (1 if m.group(2) == "ms" else 1000)


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


def rate_inserts(label, capacity):
    if label.endswith("/s"):
        return int(label[:-2])
    return max(1, int(capacity * int(label[:-1]) / 100))


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
        # Debezium gets a publication of its own (same definition), as in a real deployment
        # next to the relay; every contender has its own slot.
        self.debezium_publication = "bench_debezium"
        self.pg_port = int(re.search(r":(\d+)/", self.db).group(1))
        self.peers = [p for p in args.peers.split(",") if p]
        self.watermill_bin = os.environ.get("OUTBOX_BENCH_WATERMILL_BIN", "")
        self.debezium_cp = os.environ.get("OUTBOX_BENCH_DEBEZIUM_CP", "")
        self.debezium_java_opts = os.environ.get(
            "OUTBOX_BENCH_DEBEZIUM_JAVA_OPTS", "-Xmx1g").split()
        for peer in self.peers:
            if peer not in PEERS:
                raise BenchError(f"unknown peer {peer} (watermill, debezium)")
            if peer == "watermill" and not os.access(self.watermill_bin, os.X_OK):
                raise BenchError("OUTBOX_BENCH_WATERMILL_BIN is not set (bench/peers/build)")
            if peer == "debezium" and not self.debezium_cp:
                raise BenchError("OUTBOX_BENCH_DEBEZIUM_CP is not set (bench/peers/build)")
        self.sql = Psql(self.db, self.pg_bin)
        # How the contenders reach PostgreSQL (--pg-transport); pgbench and the harness's own
        # queries always over TCP.
        self.contender_db = self.db
        if args.pg_transport == "unix":
            sockdir = self.sql.value("SHOW unix_socket_directories").split(",")[0].strip()
            m = re.match(r"postgres(?:ql)?://([^@/]*)@[^/]*/([^?]*)", self.db)
            if not sockdir or not m:
                raise BenchError("--pg-transport unix: no socket directory, or DATABASE_URL "
                                 "is not postgresql://user@host:port/db")
            self.contender_db = (f"postgresql://{m.group(1)}@/{m.group(2)}?"
                                 f"host={urllib.parse.quote(sockdir, safe='/')}"
                                 f"&port={self.pg_port}")
        self.result = {
            "run_id": self.run_id,
            "started_at": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
            "mode": "quick" if args.quick else "full",
            "drain_row": args.row,
            "pg_transport": args.pg_transport,
            "machine": self.machine(),
            "targets": {},
        }
        self.load_samples = []

    # ---- which contenders run --------------------------------------------------------------

    def wanted(self, name):
        """--contenders: a drain contender by its name; a live relay by its name or its drain
        contender's (relay = relay-kafka, relay-eos = relay-kafka-eos); a live peer by its name
        or its peer's."""
        only = self.args.contenders
        if not only:
            return True
        return (name in only or LIVE_RELAYS.get(name) in only
                or (contender_kind(name) in PEERS and contender_kind(name) in only))

    def eos_will_run(self):
        phases = self.args.phases.split(",")
        drain = "drain" in phases and any(
            c in s["contenders"] and self.wanted(c)
            for s in self.drain_sizes() for c in EOS_CONTENDERS)
        live = "live" in phases and self.args.eos_rates and self.wanted("relay-eos")
        return bool(drain or live)

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
        self.apply_table_variant()
        for pub in (self.publication, self.debezium_publication):
            self.sql.run_script(
                "SET client_min_messages = warning;\n"
                f"DROP PUBLICATION IF EXISTS {pub};\n"
                f"CREATE PUBLICATION {pub} FOR TABLE public.outbox "
                "WITH (publish = 'insert');\n")
        if self.sql.value("SHOW track_commit_timestamp") != "on":
            raise BenchError("track_commit_timestamp is off: the live latency needs the commit "
                             "time of every row (bench/run turns it on in its own cluster)")
        settings = {}
        for name in ["server_version", "shared_buffers", "synchronous_commit", "fsync",
                     "wal_level", "logical_decoding_work_mem", "max_wal_size",
                     "track_commit_timestamp"]:
            settings[name] = self.sql.value(f"SHOW {name}")
        self.result["postgres"] = settings
        self.postmaster = proc_ppid(int(self.sql.value("SELECT pg_backend_pid()")))
        # A slot the bench did not make holds WAL back: segments are created instead of
        # recycled, and one left from a manual run (5.2 GB held) raised the marker's CPU by half.
        foreign = self.sql.query(
            "SELECT slot_name, coalesce(pg_wal_lsn_diff(pg_current_wal_lsn(), restart_lsn), 0)"
            "::bigint FROM pg_replication_slots WHERE slot_name NOT LIKE 'bench\\_%'")
        self.result["foreign_slots"] = {r[0]: int(r[1]) for r in foreign}
        for name, held in foreign:
            log(f"warning: replication slot {name} is not the bench's and holds "
                f"{int(held) / 1e6:,.0f} MB of WAL; the figures of this run may suffer from it "
                f"(drop it: SELECT pg_drop_replication_slot('{name}'))")

    def apply_table_variant(self):
        """Shapes the (already created) outbox table as --table-variant says. The seed's DDL is
        CREATE ... IF NOT EXISTS, so a table left by an earlier run with another variant is
        brought back to this one: the partial index created or dropped, the fillfactor set or
        reset (it takes effect on the pages written next; reset_table truncates before each
        backlog)."""
        name = self.args.table_variant
        v = TABLE_VARIANTS[name]
        stmts = ["SET client_min_messages = warning;"]
        if v["acked_index"]:
            stmts.append("CREATE INDEX IF NOT EXISTS idx_outbox_acked ON outbox (offset_acked) "
                         "WHERE offset_acked IS NULL;")
        else:
            stmts.append("DROP INDEX IF EXISTS idx_outbox_acked;")
        if v["fillfactor"]:
            stmts.append(f"ALTER TABLE outbox SET (fillfactor = {int(v['fillfactor'])});")
        else:
            stmts.append("ALTER TABLE outbox RESET (fillfactor);")
        self.sql.run_script("\n".join(stmts) + "\n")
        indexes = [r[0] for r in self.sql.query(
            "SELECT indexdef FROM pg_indexes WHERE schemaname = 'public' "
            "AND tablename = 'outbox' ORDER BY indexname")]
        reloptions = self.sql.value(
            "SELECT coalesce(array_to_string(reloptions, ','), '') FROM pg_class "
            "WHERE oid = 'public.outbox'::regclass")
        self.result["table_variant"] = {"name": name, "ddl": stmts[1:], "indexes": indexes,
                                        "reloptions": reloptions or ""}
        log(f"table variant {name}: reloptions [{reloptions or ''}], "
            f"{len(indexes)} index(es): " + "; ".join(indexes))

    def table_update_stats(self):
        """(n_tup_upd, n_tup_hot_upd) of the outbox table (cumulative, survives TRUNCATE)."""
        row = self.sql.query("SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables "
                             "WHERE relid = 'public.outbox'::regclass")
        return (int(row[0][0]), int(row[0][1])) if row else (0, 0)

    def table_sizes(self):
        row = self.sql.query(
            "SELECT pg_relation_size('public.outbox'), pg_indexes_size('public.outbox')")
        return {"heap_bytes": int(row[0][0]), "indexes_bytes": int(row[0][1])}

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
        # The Watermill forwarder's offsets table (its consumer groups are unique per run).
        if self.sql.value("SELECT to_regclass('watermill_offsets_outbox') IS NOT NULL") == "t":
            self.sql.query("TRUNCATE watermill_offsets_outbox")
        self.sql.query("CHECKPOINT")

    def unmark_backlog(self):
        """Every marking contender marks the whole backlog itself: the marker's UPDATE skips rows
        already marked (`offset_acked IS NULL`), so a contender after another marking one would
        otherwise be timed without its marking. The marks are cleared and the table vacuumed
        (its dead versions become free space, as a VACUUM between two drains would leave it),
        outside the clock. Returns the rows cleared."""
        upd0 = self.table_update_stats()
        cleared = self.sql.query("WITH c AS (UPDATE outbox SET offset_acked = NULL "
                                 "WHERE offset_acked IS NOT NULL RETURNING 1) "
                                 "SELECT count(*) FROM c")
        n = int(cleared[0][0]) if cleared else 0
        if n:
            self.sql.query("VACUUM outbox")
            self.sql.query("CHECKPOINT")
            # The table's UPDATE counters must include this UPDATE before the contender's are
            # read (a session reports its counters at most once a second, or when idle).
            try:
                self.sql.query("SELECT pg_stat_force_next_flush()")  # PostgreSQL 15+
            except BenchError:
                pass
            deadline = time.time() + 12
            while self.table_update_stats()[0] < upd0[0] + n and time.time() < deadline:
                self.sql.query("SELECT 1")
                time.sleep(0.2)
        return n

    def create_slot(self, name):
        self.sql.query(f"SELECT pg_create_logical_replication_slot('{name}', 'pgoutput')")

    def generate_backlog(self, transactions, rows_per_tx):
        """Commits `transactions` transactions of `rows_per_tx` rows (synchronous_commit=off:
        only the WAL matters here, not how fast it was written)."""
        sfx = "_small" if self.args.row == "small" else ""
        body = f"""
SET synchronous_commit = off;
DO $$
BEGIN
  FOR t IN 0..{transactions - 1} LOOP
    INSERT INTO outbox (uuid, payload, metadata)
      SELECT gen_random_uuid()::text, bench_payload{sfx}(n), bench_metadata{sfx}(n)
      FROM generate_series(t::bigint * {rows_per_tx} + 1, (t::bigint + 1) * {rows_per_tx}) AS n;
    COMMIT;
  END LOOP;
END $$;
"""
        t0 = time.time()
        self.sql.run_script(body)
        return time.time() - t0

    # ---- Kafka -----------------------------------------------------------------------------

    def create_topic(self, topic, *configs, partitions=3):
        r = subprocess.run([self.admin_bin, "create", self.brokers, topic, str(partitions),
                            *configs],
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
        if self.eos_will_run():
            # The broker's first transactional producer creates the transaction state log
            # (__transaction_state, 50 partitions): not on the exactly-once contender's clock.
            t0 = time.time()
            r = subprocess.run([self.admin_bin, "txn-warmup", self.brokers, topic,
                                f"bench-warmup-{self.run_id}"],
                               capture_output=True, text=True, timeout=180)
            if r.returncode != 0:
                raise BenchError(f"transactional warm-up failed: {r.stderr.strip()}")
            log(f"transactional warm-up: {time.time() - t0:.1f} s")
        if self.args.broker_warmup_seconds > 0:
            # The broker's JIT: a fresh broker compiles its produce path during the first
            # million records or so, and its transaction paths during the first exactly-once
            # ones; without this the compilers took 0.5-0.9 CPU-s of a 200,000-row drain on
            # two cores, charged to whichever contender ran those paths first.
            t0 = time.time()
            cmd = [self.admin_bin, "warm-load", self.brokers, topic,
                   str(self.args.broker_warmup_seconds)]
            if self.eos_will_run():
                cmd.append(f"bench-warmload-{self.run_id}")
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
            if r.returncode != 0:
                raise BenchError(f"broker warm-up load failed: {r.stderr.strip()}")
            kpid = self.kafka_pid()
            log(f"broker warm-up load: {r.stdout.strip()} in {time.time() - t0:.1f} s"
                + (f"; the broker's JIT compilers so far: {proc_jit_cpu(kpid):.1f} CPU-s"
                   if kpid else ""))

    def eos_flags(self, topic_base):
        """The relay's exactly-once flags, with a progress topic of the contender's own,
        created before the clock starts like the data topics: one partition, compacted, as the
        relay creates it when missing."""
        progress = f"{topic_base}.progress"
        self.create_topic(progress, "cleanup.policy=compact", partitions=1)
        flags = ["--delivery", "exactly-once", "--progress-topic", progress]
        if self.args.txn_interval_ms:
            flags += ["--txn-interval-ms", str(self.args.txn_interval_ms)]
        return flags

    def read_topic_uuids(self, topic, read_committed, path=None):
        """{uuid: count} of the records of `topic` (the relay's uuid header), read from the
        beginning to the end with kcat; isolation.level=read_committed when asked (an
        exactly-once contender: aborted records are not counted). Only the data topic: the
        progress topic (<base>.progress) is never read."""
        cmd = ["kcat", "-C", "-b", self.brokers, "-t", topic, "-o", "beginning", "-e", "-q",
               "-f", "%h\n"]
        if read_committed:
            cmd += ["-X", "isolation.level=read_committed"]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        if r.returncode != 0:
            raise BenchError(f"kcat failed reading {topic}: {r.stderr[-1000:]}")
        prefix = UUID_HEADER["relay"] + "="
        out = {}
        for line in r.stdout.splitlines():
            for h in line.split(","):
                if h.startswith(prefix):
                    u = h[len(prefix):]
                    out[u] = out.get(u, 0) + 1
                    break
        return out

    def delete_run_topics(self):
        r = subprocess.run([self.admin_bin, "delete", self.brokers, self.topic_prefix],
                           capture_output=True, text=True, timeout=120)
        if r.returncode != 0:
            log(f"warning: deleting topics {self.topic_prefix}*: {r.stderr.strip()}")

    # ---- the relay -------------------------------------------------------------------------

    def start_relay(self, slot, topic_template, sink, mark, logname, extra=()):
        port = free_port()
        cmd = [self.relay_bin, "run",
               "--database-url", self.contender_db, "--kafka-brokers", self.brokers,
               "--table", "public.outbox", "--publication", self.publication,
               "--slot", slot, "--topic-template", topic_template,
               "--sink", sink, "--mark", "true" if mark else "false",
               "--backfill", "false", "--metrics-addr", f"127.0.0.1:{port}",
               "--log-format", "json", *extra]
        logf = open(os.path.join(self.out, logname), "w")
        p = subprocess.Popen(cmd, stdout=logf, stderr=subprocess.STDOUT)
        logf.close()
        return p, port

    def stop_relay(self, p, what="relay"):
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
            try:
                p.wait(timeout=40)
            except subprocess.TimeoutExpired:
                log(f"{what} did not stop within 40 s of SIGTERM: killing it")
                p.kill()
                p.wait()
        return p.returncode

    def walsender_pid(self, slot):
        v = self.sql.value(
            f"SELECT active_pid FROM pg_replication_slots WHERE slot_name = '{slot}'")
        return int(v) if v else None

    def pg_sessions(self, pid):
        """{backend pid: role} of the PostgreSQL sessions process `pid` holds (by the client
        ports of its sockets): 'walsender' for a replication connection, else the session's
        application_name (outbox-relay-marker, outbox-relay-metrics, watermill-forwarder, ...)."""
        ports = client_ports(pid, self.pg_port)
        backends = unix_peer_pids(pid) if self.contender_db != self.db else set()
        if backends:
            rows = self.sql.query(
                "SELECT pid, backend_type, coalesce(nullif(application_name, ''), 'unnamed') "
                "FROM pg_stat_activity WHERE pid IN ("
                + ",".join(str(x) for x in sorted(backends)) + ")")
            return {int(r[0]): ("walsender" if r[1] == "walsender" else r[2]) for r in rows}
        if not ports:
            return {}
        rows = self.sql.query(
            "SELECT pid, backend_type, coalesce(nullif(application_name, ''), 'unnamed') "
            "FROM pg_stat_activity WHERE client_addr = '127.0.0.1' AND client_port IN ("
            + ",".join(str(x) for x in sorted(ports)) + ")")
        return {int(r[0]): ("walsender" if r[1] == "walsender" else r[2]) for r in rows}

    # ---- the peers -------------------------------------------------------------------------

    def start_peer(self, contender, slot, topic, logname, poll_ms=None, group=None):
        """Starts the Watermill forwarder or the Debezium peer; returns (Popen, metrics port).
        `topic` is the one Kafka topic the bench's rows go to (<base>.review)."""
        port = free_port()
        kind = contender_kind(contender)
        if kind == "watermill":
            cmd = [self.watermill_bin, "-database-url", self.contender_db,
                   "-kafka-brokers", self.brokers,
                   "-consumer-group", f"bench-{self.run_id}-{group or 'forwarder'}",
                   "-topic-prefix", topic.rsplit(".", 1)[0],
                   "-metrics-addr", f"127.0.0.1:{port}"]
            if poll_ms is not None:
                cmd += ["-poll-interval", f"{poll_ms:g}ms"]
        elif kind == "debezium":
            cmd = ["java", *self.debezium_java_opts,
                   "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn",
                   "-cp", self.debezium_cp, "outboxrelay.bench.DebeziumPeer",
                   "--database-url", self.db, "--kafka-brokers", self.brokers,
                   "--slot", slot, "--publication", self.debezium_publication,
                   "--topic", topic, "--metrics-addr", f"127.0.0.1:{port}"]
            # The harness's own end marker (pg_logical_emit_message, prefix 'bench') is not an
            # outbox row: Debezium would forward it to a topic of its own.
            cmd += ["--set", "message.prefix.exclude.list=bench"]
            if poll_ms is not None:
                cmd += ["--set", f"poll.interval.ms={poll_ms:g}"]
        else:
            raise BenchError(f"not a peer: {contender}")
        logf = open(os.path.join(self.out, logname), "w")
        p = subprocess.Popen(cmd, stdout=logf, stderr=subprocess.STDOUT)
        logf.close()
        return p, port

    def watermill_acked(self, group):
        """(transaction_id, offset) the Watermill consumer group has acknowledged, or None."""
        rows = self.sql.query(
            "SELECT last_processed_transaction_id::text, offset_acked "
            f"FROM watermill_offsets_outbox WHERE consumer_group = 'bench-{self.run_id}-{group}'")
        return (int(rows[0][0]), int(rows[0][1])) if rows else None

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
            "issue": 5, "target": ">= 1,000,000 rows/s on one core", "value": dm,
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
             "contenders": ["pg_recvlogical", "relay-kafka", "relay-kafka-eos"]},
        ]
        only = set(a.sizes.split(",")) if a.sizes else None
        return [s for s in sizes if only is None or s["name"] in only]

    def phase_drain(self):
        self.result["drain"] = {}
        for size in self.drain_sizes():
            self.drain_size(size)

    def warm_up_drains(self):
        """Untimed drains of the relay into Kafka before anything is timed, the last step of
        the broker's warm-up. A broker in service has run the relay's requests for days; a
        fresh one runs them interpreted or half-compiled at first: in the first timed tx100
        drains after a start its CPU was 7.1-8.5 CPU-s per million rows at-least-once and
        10.9-12.3 exactly-once, against 1.8-3.9 and 4.3-6.8 after this warm-up, on the two
        cores the relay and PostgreSQL share (bench/analyses.md, "The broker's warm-up")."""
        rounds = self.args.broker_warmup_drains
        contenders = [c for c in ("relay-kafka", "relay-kafka-eos") if self.wanted(c)]
        if rounds <= 0 or not contenders:
            return
        t0 = time.time()
        drains = []
        had_drain = "drain" in self.result
        self.result.setdefault("drain", {})
        for i in range(rounds):
            size = {"name": f"warmup{i + 1}", "label": "broker warm-up, not counted",
                    "tx": 2000, "rows_per_tx": 100, "contenders": contenders}
            self.drain_size(size)
            entry = self.result["drain"].pop(size["name"])
            drains.append({c: {k: r.get(k) for k in (
                "events_per_s", "kafka_broker_cpu_s_per_million",
                "kafka_broker_jit_cpu_seconds")} for c, r in entry["contenders"].items()})
        if not had_drain:
            del self.result["drain"]
        self.result["broker_warmup_drains"] = {"rounds": rounds, "rows_each": 200_000,
                                               "seconds": round(time.time() - t0, 1),
                                               "drains": drains}
        log(f"broker warm-up drains: {rounds} x {', '.join(contenders)} in "
            f"{time.time() - t0:.0f} s")

    def drain_size(self, size):
        rows = size["tx"] * size["rows_per_tx"]
        log(f"drain {size['name']}: {size['label']}, {rows:,} rows")
        self.reset_table()
        contenders = [c for c in size["contenders"]
                      if (contender_kind(c) not in PEERS or contender_kind(c) in self.peers)
                      and self.wanted(c)]
        # One slot per WAL reader (the Watermill forwarder reads the table).
        slots = {c: f"bench_{size['name']}_{c.replace('-', '_')}" for c in contenders
                 if contender_kind(c) != "watermill"}
        for slot in slots.values():
            self.create_slot(slot)  # before the load: every contender reads the same WAL
        # Insert positions, not pg_current_wal_lsn() (what is written): the backlog commits
        # with synchronous_commit=off, so its last commit record may not be written yet when
        # it returns, and a relay that follows the walsender through a 200,000-row
        # transaction's WAL (nothing sent before its commit) passed that "end" 0.8 s into a
        # 4 s drain.
        start_lsn = lsn_int(self.sql.value("SELECT pg_current_wal_insert_lsn()"))
        gen_s = self.generate_backlog(size["tx"], size["rows_per_tx"])
        end_lsn = lsn_int(self.sql.value("SELECT pg_current_wal_insert_lsn()"))
        # A record past the end, so that pg_recvlogical -E (and the relay's idle rule) see a
        # WAL position >= end even when nothing else writes WAL.
        self.sql.query("SELECT pg_logical_emit_message(false, 'bench', 'end')")
        count = int(self.sql.value("SELECT count(*) FROM outbox"))
        if count != rows:
            raise BenchError(f"backlog has {count} rows, expected {rows}")
        # (the alias: ORDER BY transaction_id must mean the xid8 column, not its text)
        # The Watermill forwarder drains the first --peer-drain-rows rows of the backlog (its
        # rate is one Kafka round trip per message, steady over a backlog: the whole of it
        # would take most of the run): its clock stops when its offsets row reaches that row.
        peer_rows = min(rows, self.args.peer_drain_rows) if self.args.peer_drain_rows else rows
        last = self.sql.query("SELECT transaction_id::text AS xid, offset_consumed FROM outbox "
                              "ORDER BY transaction_id, offset_consumed "
                              f"OFFSET {peer_rows - 1} LIMIT 1")[0]
        peer_last_row = (int(last[0]), int(last[1]))
        entry = {"label": size["label"], "rows": rows, "transactions": size["tx"],
                 "rows_per_transaction": size["rows_per_tx"],
                 "wal_bytes": end_lsn - start_lsn, "generate_seconds": round(gen_s, 2),
                 "start_lsn": lsn_text(start_lsn), "end_lsn": lsn_text(end_lsn),
                 "contenders": {}}
        log(f"  backlog: {entry['wal_bytes'] / 2**20:.0f} MiB of WAL in {gen_s:.1f} s")
        self.result["drain"][size["name"]] = entry
        for contender in contenders:
            self.note_load(f"drain {size['name']} {contender}")
            if contender == "pg_recvlogical":
                r = self.drain_recvlogical(slots[contender], start_lsn, end_lsn, rows)
            else:
                r = self.drain_client(size["name"], contender, slots.get(contender), start_lsn,
                                      end_lsn, rows, peer_rows, peer_last_row)
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
                if r.get("events_per_s_to_kafka"):
                    r["ratio_to_pg_recvlogical_to_kafka"] = r["events_per_s_to_kafka"] / base
        on = entry["contenders"].get("relay-kafka", {}).get("events_per_s")
        off = entry["contenders"].get("relay-kafka-nomark", {}).get("events_per_s")
        if on and off:
            entry["marking_on_over_off"] = on / off
        eos = entry["contenders"].get("relay-kafka-eos", {}).get("events_per_s")
        if on and eos:
            # Issue 14: exactly-once against at-least-once, both to marked and confirmed.
            entry["eos_over_alo"] = eos / on
            eos_k = entry["contenders"]["relay-kafka-eos"].get("events_per_s_to_kafka")
            alo_k = entry["contenders"]["relay-kafka"].get("events_per_s_to_kafka")
            if eos_k and alo_k:
                entry["eos_over_alo_to_kafka"] = eos_k / alo_k
            log(f"  exactly-once / at-least-once: {eos / on:.2f}")
        self.sql.query("TRUNCATE outbox")  # the next phase starts from an empty table

    def recvlogical_cmd(self, slot, *extra):
        """pg_recvlogical streaming the bench's publication from `slot` into /dev/null."""
        return [f"{self.pg_bin}/pg_recvlogical", "-d", self.contender_db, "--slot", slot,
                "--start", "-o", "proto_version=1",
                "-o", f"publication_names={self.publication}", *extra, "-f", "/dev/null"]

    def drain_recvlogical(self, slot, start_lsn, end_lsn, rows):
        cmd = self.recvlogical_cmd(slot, "--no-loop", "-E", lsn_text(end_lsn))
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

    def drain_client(self, size_name, contender, slot, start_lsn, end_lsn, rows, peer_rows,
                     peer_last_row):
        """One contender other than pg_recvlogical draining the backlog, from process start.

        The clock stops when the contender's own progress covers the whole backlog:
        relay     its confirmed LSN (outbox_relay_confirmed_lsn) >= the end LSN: every row is
                  in Kafka *and* marked, the slot confirmed (the confirmation rule);
        watermill its consumer group's offsets row reaches row `peer_rows` of the backlog in
                  (transaction_id, offset) order (watermill-sql acks a polled batch in the
                  database after Kafka acknowledged each message); figures are per those rows;
        debezium  every row acknowledged by Kafka (it confirms the slot only on its periodic
                  offset flush, offset.flush.interval.ms, and never touches the table).
        The time at which every row was in Kafka is recorded for all of them ("to Kafka")."""
        kind = contender_kind(contender)
        if kind == "watermill":
            rows = peer_rows
        sink = "null" if contender == "relay-null" else "kafka"
        eos = is_eos(contender)
        mark = contender == "relay-kafka" or eos
        topic_base = f"{self.topic_prefix}{size_name}.{contender}"
        extra = []
        if sink == "kafka":
            # Topics exist before the clock starts: the run measures draining, not the
            # broker's topic auto-creation.
            self.create_topic(f"{topic_base}.review")
        if eos:
            extra = self.eos_flags(topic_base)
        logname = f"{kind}-{size_name}-{contender}.log".replace(f"{kind}-{kind}", kind)
        if mark:
            cleared = self.unmark_backlog()
            if cleared:
                log(f"  (marks of {cleared:,} rows cleared and the table vacuumed for {contender})")
        upd0 = self.table_update_stats() if mark else None
        profile_proc = None
        busy0 = machine_busy_cpu()
        t0 = time.time()
        if kind == "relay":
            p, port = self.start_relay(slot, topic_base + ".{Event-Type:aggregate}", sink, mark,
                                       logname, extra)
        else:
            p, port = self.start_peer(contender, slot, f"{topic_base}.review", logname,
                                      group=size_name)
        if self.args.profile and size_name in self.args.profile.split(",") and kind == "relay":
            profile_proc = subprocess.Popen(
                ["perf", "record", "-F", "499", "--call-graph", "dwarf,16384", "-o",
                 os.path.join(self.out, f"perf-{size_name}-{contender}.data"), "-p", str(p.pid)],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        series = []
        ws_pid, ws_cpu = None, 0.0
        db_pids = {}  # the contender's own (non-replication) database sessions: pid -> [role, cpu]
        kafka_pid = self.kafka_pid()
        kafka_cpu0 = proc_cpu(kafka_pid) if kafka_pid and sink == "kafka" else None
        kafka_jit0 = proc_jit_cpu(kafka_pid) if kafka_cpu0 is not None else None
        first_event_t = None
        kafka_t = None
        done_t = None
        tick = 0
        delivered = 0
        try:
            while True:
                if p.poll() is not None:
                    raise BenchError(f"{contender} exited with {p.returncode} during the drain "
                                     f"(see {logname})")
                m = scrape(port)
                now = time.time()
                if m is not None:
                    delivered = metric_sum(m, "events_published_total")
                    if delivered > 0 and first_event_t is None:
                        first_event_t = now - t0
                    if delivered >= rows and kafka_t is None and sink == "kafka":
                        kafka_t = now
                    series.append((now - t0, delivered))
                    if kind == "relay":
                        done = int(metric_one(m, "outbox_relay_confirmed_lsn") or 0) >= end_lsn
                    elif kind == "watermill":
                        done = delivered >= rows and (
                            self.watermill_acked(size_name) or (0, 0)) >= peer_last_row
                    else:
                        done = delivered >= rows
                    if done:
                        done_t = now
                        break
                if ws_pid is None and slot and tick % 4 == 0:
                    ws_pid = self.walsender_pid(slot)
                if tick % 8 == 0:
                    for pid, role in self.pg_sessions(p.pid).items():
                        if role != "walsender":
                            db_pids.setdefault(pid, [role, 0.0])
                for pid, entry in db_pids.items():
                    c = proc_cpu(pid)
                    if c is not None:
                        entry[1] = c
                if ws_pid is not None:
                    c = proc_cpu(ws_pid)
                    if c is not None:
                        ws_cpu = c
                if now - t0 > self.args.drain_timeout:
                    raise BenchError(f"{contender} did not drain {rows:,} rows within "
                                     f"{self.args.drain_timeout} s")
                tick += 1
                time.sleep(0.025)
            wall = done_t - t0
            # The relay's counter can trail its confirmed LSN by a scrape: read it once more.
            settle = time.time() + 3
            while delivered < rows and time.time() < settle:
                time.sleep(0.05)
                delivered = metric_sum(scrape(port) or {}, "events_published_total") or delivered
            client_cpu = proc_cpu(p.pid)
            hwm = proc_status_kb(p.pid, "VmHWM")
            rss = proc_status_kb(p.pid, "VmRSS")
            if ws_pid is not None:
                ws_cpu = proc_cpu(ws_pid) or ws_cpu
            for pid, entry in db_pids.items():
                c = proc_cpu(pid)
                if c is not None:
                    entry[1] = c
            db_cpu = sum(e[1] for e in db_pids.values())
            db_by_role = {}
            for role, c in db_pids.values():
                db_by_role[role] = db_by_role.get(role, 0.0) + c
            busy = machine_busy_cpu() - busy0
            kafka_cpu = (proc_cpu(kafka_pid) - kafka_cpu0) if kafka_cpu0 is not None else None
            kafka_jit = (proc_jit_cpu(kafka_pid) - kafka_jit0) if kafka_jit0 is not None else None
            series.append((wall, delivered))
            txns = None
            # The marker's statements (each marks a batch of transactions): its PostgreSQL CPU
            # per statement and rows per statement explain the marker's cost per row.
            marker_statements = (metric_sum(scrape(port) or {},
                                            "outbox_relay_marker_statements_total")
                                 if kind == "relay" and mark else None)
            if eos:
                m = scrape(port) or {}
                txns = {"committed": metric_labelled(m, "outbox_relay_kafka_transactions_total",
                                                     result="committed"),
                        "aborted": metric_labelled(m, "outbox_relay_kafka_transactions_total",
                                                   result="aborted"),
                        "rows_already_in_kafka":
                            metric_sum(m, "outbox_relay_rows_already_in_kafka_total")}
        finally:
            if profile_proc is not None:
                profile_proc.send_signal(signal.SIGINT)
                profile_proc.wait(timeout=60)
            rc = self.stop_relay(p, contender)
        if rc != 0 and kind != "debezium":
            raise BenchError(f"{contender} exited {rc} after SIGTERM (see {logname})")
        if delivered < rows:
            raise BenchError(f"{contender}: {delivered} events delivered, expected {rows}")
        r = {"wall_seconds": wall, "events_per_s": rows / wall, "rows_measured": rows,
             "done_when": "confirmed LSN >= end (committed in Kafka and marked)" if eos else
                          {"relay": "confirmed LSN >= end (in Kafka and marked)",
                           "watermill": "offsets row at the last row (in Kafka, acked)",
                           "debezium": "every row acknowledged by Kafka"}[kind],
             "startup_seconds": first_event_t,
             "events_per_s_after_first_event":
                 rows / (wall - first_event_t) if first_event_t and wall > first_event_t else None,
             "delivered": delivered,
             "client_cpu_seconds": client_cpu,
             "client_cpu_s_per_million": client_cpu / rows * 1e6,
             "walsender_cpu_seconds": ws_cpu,
             "walsender_cpu_s_per_million": ws_cpu / rows * 1e6,
             "peak_rss_kb": hwm, "rss_at_end_kb": rss,
             "sink": sink, "mark": mark,
             "series": {"t": [round(t, 3) for t, _ in series],
                        "events": [round(e) for _, e in series],
                        "source": "events_published_total (acknowledged by Kafka)"}}
        if kind == "relay":
            r["relay_cpu_seconds"] = client_cpu
            r["relay_cpu_s_per_million"] = client_cpu / rows * 1e6
        if kafka_t is not None:
            r["kafka_wall_seconds"] = kafka_t - t0
            r["events_per_s_to_kafka"] = rows / (kafka_t - t0)
            # The rate over the second half of the rows (to Kafka): the steady state, past
            # start-up and, for the JVM, most of the JIT's warm-up.
            half = next((t for t, e in series if e >= rows / 2), None)
            if half is not None and kafka_t - t0 > half:
                r["events_per_s_second_half"] = (rows - rows / 2) / (kafka_t - t0 - half)
        r["machine_busy_cpu_seconds"] = busy
        r["foreign_cpu_seconds"] = max(0.0, busy - client_cpu - ws_cpu - db_cpu - (kafka_cpu or 0))
        r["db_sessions_cpu_seconds"] = db_cpu
        r["db_sessions_cpu_s_per_million"] = db_cpu / rows * 1e6
        r["db_sessions_cpu_seconds_by_role"] = db_by_role
        # Older name of the same figure (the relay's marker and sampler sessions).
        r["relay_db_sessions_cpu_seconds"] = db_cpu
        r["relay_db_sessions_cpu_s_per_million"] = db_cpu / rows * 1e6
        if kafka_cpu is not None:
            r["kafka_broker_cpu_seconds"] = kafka_cpu
            r["kafka_broker_cpu_s_per_million"] = kafka_cpu / rows * 1e6
            # Of it, the broker's JIT compiling code the contender's requests ran first (a
            # broker in service has compiled it long before): --broker-warmup-seconds.
            r["kafka_broker_jit_cpu_seconds"] = kafka_jit
        if mark:
            marked = self.sql.value("SELECT count(*) FROM outbox WHERE offset_acked IS NOT NULL")
            r["rows_marked"] = int(marked)
            # HOT share of the marking UPDATEs (--table-variant): the marker's backend reports
            # its counters when its transaction ends or, at the latest, when it exits after the
            # relay's stop; wait (up to 5 s) until they cover the marked rows.
            deadline = time.time() + 5
            while True:
                upd, hot = self.table_update_stats()
                if upd - upd0[0] >= int(marked) or time.time() >= deadline:
                    break
                time.sleep(0.1)
            r["table_updates"] = upd - upd0[0]
            r["table_hot_updates"] = hot - upd0[1]
            r["hot_share"] = (hot - upd0[1]) / (upd - upd0[0]) if upd > upd0[0] else None
            r["table_sizes_after"] = self.table_sizes()
            if marker_statements:
                r["marker_statements"] = marker_statements
                r["rows_per_marker_statement"] = int(marked) / marker_statements
        if eos:
            r["delivery"] = "exactly-once"
            r["progress_topic"] = f"{topic_base}.progress"
            # "to Kafka" counts delivery reports: appended to the log, not yet committed. The
            # clock (confirmed LSN) stops after the Kafka commit. After the run: what a
            # read_committed consumer sees of the data topic (the progress topic left out).
            r["to_kafka_means"] = "appended (delivery reports), before the Kafka commit"
            r["kafka_transactions"] = txns
            seen = self.read_topic_uuids(f"{topic_base}.review", read_committed=True)
            r["read_committed"] = {
                "records": sum(seen.values()), "distinct_uuids": len(seen),
                "duplicates": sum(n - 1 for n in seen.values()),
                "missing": max(0, rows - len(seen))}
            if r["read_committed"]["records"] != rows or r["read_committed"]["duplicates"]:
                log(f"  WARNING {contender}: a read_committed consumer sees "
                    f"{r['read_committed']['records']:,} records, "
                    f"{r['read_committed']['distinct_uuids']:,} distinct, for {rows:,} rows")
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

    def live_peers(self):
        return [c for c in self.args.live_peers.split(",")
                if c and contender_kind(c) in self.peers and self.wanted(c)]

    def phase_live(self):
        a = self.args
        log("live load")
        self.note_load("live capacity")
        self.reset_table()
        # What this machine sustains: pgbench flat out, synchronous_commit=on, no contender.
        p = self.pgbench(a.capacity_seconds)
        out, err = p.communicate()
        if p.returncode != 0:
            raise BenchError(f"pgbench failed: {err[-2000:]}")
        capacity = self.pgbench_tps(out)
        log(f"  capacity: {capacity:,.0f} inserts/s (1-row transactions, "
            f"synchronous_commit=on, {a.clients} clients)")
        with open(os.path.join(self.out, "pgbench-capacity.txt"), "w") as f:
            f.write(out + err)
        live = {"capacity_inserts_per_s": capacity, "clients": a.clients,
                "seconds_per_rate": a.live_seconds, "peer_seconds_per_rate": a.peer_live_seconds,
                "contenders": {}}
        self.result["live"] = live
        plan = []
        # The walsender's own bill at each rate (target 1): pg_recvlogical decoding the same
        # publication, writing nothing anywhere; every relay walsender figure compares to it.
        if self.wanted("pg_recvlogical"):
            plan.append(("pg_recvlogical", a.rates, a.live_seconds))
        if self.wanted("relay"):
            plan.append(("relay", a.rates, a.live_seconds))
        if a.eos_rates and self.wanted("relay-eos"):
            plan.append(("relay-eos", a.eos_rates, a.live_seconds))
        plan += [(c, a.peer_rates, a.peer_live_seconds) for c in self.live_peers()]
        for name, rates, seconds in plan:
            self.note_load(f"live {name}")
            try:
                live["contenders"][name] = self.live_contender(name, rates, seconds, capacity)
            except BenchError as e:
                if name == "relay":
                    raise
                log(f"  {name} failed: {e}")
                live["contenders"][name] = {"error": str(e), "rates": {}}
        relay = live["contenders"].get("relay", {})
        # The relay's figures where earlier runs kept them (plot.py, comparisons).
        for key in ("rates", "samples", "records_consumed", "duplicates",
                    "records_without_commit_row"):
            if key in relay:
                live[key] = relay[key]

    def live_snapshot(self, pid):
        """CPU counters at one instant: the contender, its PostgreSQL sessions (by role), every
        PostgreSQL process, the broker, the machine."""
        kpid = self.kafka_pid()
        sessions = {}
        for bpid, role in self.pg_sessions(pid).items():
            c = proc_cpu(bpid)
            if c is not None:
                sessions[bpid] = (role, c)
        return {"t": time.time(), "client": proc_cpu(pid), "sessions": sessions,
                "pg_children": children_cpu(self.postmaster),
                "pg_reaped": proc_children_cpu(self.postmaster),
                "pg_postmaster": proc_cpu(self.postmaster),
                "kafka": proc_cpu(kpid) if kpid else None, "busy": machine_busy_cpu()}

    @staticmethod
    def live_cost(s0, s1):
        """CPU seconds spent between two snapshots. PostgreSQL's total counts every process of
        the cluster, including backends that came and went in between (pgbench's: they are in
        the postmaster's reaped-children time)."""
        by_role = {}
        for bpid, (role, c1) in s1["sessions"].items():
            c0 = s0["sessions"].get(bpid, (role, 0.0))[1]
            by_role[role] = by_role.get(role, 0.0) + max(0.0, c1 - c0)
        pg_total = (s1["pg_postmaster"] - s0["pg_postmaster"]) + (s1["pg_reaped"] - s0["pg_reaped"])
        for bpid, c1 in s1["pg_children"].items():
            pg_total += c1 - s0["pg_children"].get(bpid, 0.0)
        for bpid, c0 in s0["pg_children"].items():
            if bpid not in s1["pg_children"]:
                pg_total -= c0  # died in between: its whole time is in the reaped delta
        return {"client": (s1["client"] or 0) - (s0["client"] or 0),
                "pg_sessions_by_role": by_role,
                "pg_sessions": sum(by_role.values()),
                "pg_total": pg_total,
                "kafka_broker": (s1["kafka"] - s0["kafka"]) if s0["kafka"] is not None
                and s1["kafka"] is not None else None,
                "machine_busy": s1["busy"] - s0["busy"]}

    def live_contender(self, name, rates, seconds, capacity):
        """One contender streaming a live load: its own fresh table, slot and topic (created
        with LogAppendTime), a warm-up that is not counted, then each rate for `seconds`,
        waiting after each until the contender has caught up."""
        a = self.args
        kind = contender_kind(name)
        eos = is_eos(name)
        poll_ms = parse_duration_ms(name.split("-", 1)[1]) if kind in PEERS and "-" in name \
            else None
        self.reset_table()
        slot = None
        if kind != "watermill":
            slot = f"bench_live_{name.replace('-', '_')}"
            self.create_slot(slot)
        topic_base = f"{self.topic_prefix}live.{name}"
        topic = f"{topic_base}.review"
        recvlogical = kind == "pg_recvlogical"
        if not recvlogical:
            # The broker stamps each record with its append time: the ack time we use.
            self.create_topic(topic, "message.timestamp.type=LogAppendTime")
        logname = f"{kind}-live.log" if name == kind else f"{kind}-live-{name}.log"
        extra = self.eos_flags(topic_base) if eos else []
        visible = None
        if kind == "relay":
            # Commit -> visible, for both delivery modes alike (exactly-once: read_committed).
            visible = VisibilityConsumer(self.brokers, topic, eos,
                                         os.path.join(self.out, f"kcat-visible-{name}.log"))
            proc, port = self.start_relay(slot, topic_base + ".{Event-Type:aggregate}", "kafka",
                                          True, logname, extra)
        elif recvlogical:
            # Status every second, as the relay's --status-interval-ms; -F 0: no fsync of
            # /dev/null, the written position is reported as flushed.
            cmd = self.recvlogical_cmd(slot, "-s", "1", "-F", "0")
            with open(os.path.join(self.out, logname), "w") as logf:
                proc = subprocess.Popen(cmd, stdout=logf, stderr=subprocess.STDOUT)
            port = None
        else:
            proc, port = self.start_peer(name, slot, topic, logname, poll_ms=poll_ms,
                                         group=f"live-{name}")
        log(f"  {name}: started (pid {proc.pid})")
        entry = {"kind": kind, "poll_interval_ms": poll_ms, "seconds_per_rate": seconds,
                 "topic": topic, "rates": {}}
        if eos:
            entry["delivery"] = "exactly-once"
            entry["progress_topic"] = f"{topic_base}.progress"
        if visible is not None:
            entry["visibility_consumer"] = "kcat -C " + " ".join(visible.cmd[6:])
        samples = []  # (t, retained_restart, retained_confirmed, delivered)
        stop_sampling = threading.Event()
        t_origin = time.time()

        def sampler():
            while not stop_sampling.is_set():
                try:
                    row = self.sql.query(
                        "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), restart_lsn)::bigint, "
                        "pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn)::bigint "
                        f"FROM pg_replication_slots WHERE slot_name = '{slot}'") if slot else []
                    m = scrape(port)
                    delivered = metric_sum(m, "events_published_total") if m else None
                    samples.append((time.time() - t_origin,
                                    int(row[0][0]) if row else None,
                                    int(row[0][1]) if row else None, delivered))
                except Exception as e:  # sampling must not kill the run
                    log(f"  sampler: {e}")
                stop_sampling.wait(0.5)

        def delivered_now():
            m = scrape(port)
            return metric_sum(m, "events_published_total") if m else None

        def wait_caught_up(rows_total, end_lsn, timeout):
            deadline = time.time() + timeout
            while True:
                if proc.poll() is not None:
                    raise BenchError(f"{name} exited with {proc.returncode} (see {logname})")
                if recvlogical:  # the walsender has read (decoded) the WAL up to the end
                    sent = self.sql.value("SELECT sent_lsn FROM pg_stat_replication WHERE "
                                          f"pid = (SELECT active_pid FROM pg_replication_slots "
                                          f"WHERE slot_name = '{slot}')")
                    if sent and lsn_int(sent) >= end_lsn:
                        return time.time()
                    if time.time() > deadline:
                        raise BenchError(f"{name} did not catch up within {timeout:.0f} s")
                    time.sleep(0.05)
                    continue
                m = scrape(port)
                if m is not None:
                    if kind == "relay":
                        if int(metric_one(m, "outbox_relay_confirmed_lsn") or 0) >= end_lsn:
                            return time.time()
                    elif metric_sum(m, "events_published_total") >= rows_total:
                        return time.time()
                if time.time() > deadline:
                    raise BenchError(f"{name} did not catch up within {timeout:.0f} s")
                time.sleep(0.05)

        try:
            deadline = time.time() + 60
            while True:
                if recvlogical:
                    if self.walsender_pid(slot) is not None:
                        break
                else:
                    m = scrape(port)
                    if m is not None and (kind != "relay"
                                          or metric_one(m, "outbox_relay_streaming") == 1):
                        break
                if proc.poll() is not None or time.time() > deadline:
                    raise BenchError(f"{name} did not start (see {logname})")
                time.sleep(0.1)
            th = threading.Thread(target=sampler, daemon=True)
            th.start()
            # Warm-up (not counted): connections, producer metadata, first batches. The JVM
            # needs tens of thousands of records before its JIT has compiled the hot paths
            # (a cold Debezium runs at a tenth of its warm rate): it gets a longer, heavier one.
            if kind == "debezium":
                wp = self.pgbench(a.jvm_warmup_seconds, rate=max(1, int(capacity * 0.5)))
            else:
                wp = self.pgbench(a.live_warmup_seconds, rate=max(1, int(capacity * 0.1)))
            wp.communicate()
            rows_total = int(self.sql.value("SELECT count(*) FROM outbox"))
            wait_caught_up(rows_total, lsn_int(self.sql.value("SELECT pg_current_wal_lsn()")),
                           180)
            if visible is not None and not visible.wait_for(rows_total, 30):
                log(f"  {name}: the visibility consumer saw {len(visible.seen):,} of the "
                    f"{rows_total:,} warm-up rows within 30 s")
            entry["ready_seconds"] = time.time() - t_origin
            time.sleep(1)
            for label in rates:
                rate = rate_inserts(label, capacity)
                self.note_load(f"live {name} {label}")
                log(f"  {name}: {label} = {rate:,} inserts/s for {seconds} s")
                hist0 = histogram_buckets(scrape(port) or {},
                                          "outbox_relay_commit_to_ack_seconds")
                rows0 = int(self.sql.value("SELECT count(*) FROM outbox"))
                del0 = delivered_now()
                snap0 = self.live_snapshot(proc.pid)
                t_start = time.time()
                pb = self.pgbench(seconds, rate=rate, progress=True)
                out, err = pb.communicate()
                t_end = time.time()
                if pb.returncode != 0:
                    raise BenchError(f"pgbench failed: {err[-2000:]}")
                tag = label.replace("/", "")
                with open(os.path.join(self.out, f"pgbench-live-{name}-{tag}.txt"), "w") as f:
                    f.write(out + err)
                rows_total = int(self.sql.value("SELECT count(*) FROM outbox"))
                end = lsn_int(self.sql.value("SELECT pg_current_wal_lsn()"))
                t_caught = wait_caught_up(rows_total, end, a.catch_up_timeout)
                snap1 = self.live_snapshot(proc.pid)
                cost = self.live_cost(snap0, snap1)
                events = rows_total - rows0
                delivered = (delivered_now() or 0) - (del0 or 0)
                per_1k = (lambda cpu: cpu / events * 1e6 if events else None)  # ms per 1,000
                progress = [(float(x), float(y)) for x, y in
                            re.findall(r"progress: ([0-9.]+) s, ([0-9.]+) tps", err)]
                r = {
                    "target_inserts_per_s": rate,
                    "achieved_inserts_per_s": self.pgbench_tps(out),
                    "t_start": t_start - t_origin, "t_end": t_end - t_origin,
                    "unix_start": t_start, "unix_end": t_end,
                    "catch_up_seconds_after_load": t_caught - t_end,
                    "events": events, "delivered": delivered,
                    "cpu_window_seconds": snap1["t"] - snap0["t"],
                    "machine_busy_percent_of_one_cpu":
                        cost["machine_busy"] / (snap1["t"] - snap0["t"]) * 100,
                    "kafka_broker_cpu_seconds": cost["kafka_broker"],
                    "client_cpu_seconds": cost["client"],
                    "client_cpu_ms_per_1k_events": per_1k(cost["client"]),
                    "pg_total_cpu_seconds": cost["pg_total"],
                    "pg_total_cpu_ms_per_1k_events": per_1k(cost["pg_total"]),
                    "pg_sessions_cpu_seconds": cost["pg_sessions"],
                    "pg_sessions_cpu_ms_per_1k_events": per_1k(cost["pg_sessions"]),
                    "pg_sessions_cpu_seconds_by_role": cost["pg_sessions_by_role"],
                    "pg_sessions_cpu_ms_per_1k_events_by_role":
                        {k: per_1k(v) for k, v in cost["pg_sessions_by_role"].items()},
                    "pgbench_progress": {"t": [x for x, _ in progress],
                                         "tps": [y for _, y in progress]},
                }
                # Names of earlier runs (the relay's CPU per million events).
                r["relay_cpu_s_per_million"] = cost["client"] / events * 1e6 if events else None
                ws = cost["pg_sessions_by_role"].get("walsender")
                r["walsender_cpu_seconds"] = ws
                r["walsender_cpu_s_per_million"] = ws / events * 1e6 \
                    if events and ws is not None else None
                if kind == "relay":
                    hist = histogram_delta(
                        histogram_buckets(scrape(port) or {},
                                          "outbox_relay_commit_to_ack_seconds"), hist0)
                    r["relay_histogram"] = {
                        "buckets": {("+Inf" if le == math.inf else str(le)): c
                                    for le, c in hist.items()},
                        "p50_ms": _ms(histogram_quantile(hist, 0.5)),
                        "p99_ms": _ms(histogram_quantile(hist, 0.99)),
                        "p999_ms": _ms(histogram_quantile(hist, 0.999)),
                        "fraction_le_50ms": histogram_fraction_le(hist, 0.05)}
                entry["rates"][label] = r
                time.sleep(2)
            entry["peak_rss_kb"] = proc_status_kb(proc.pid, "VmHWM")
            if eos:
                m = scrape(port) or {}
                entry["kafka_transactions"] = {
                    "committed": metric_labelled(m, "outbox_relay_kafka_transactions_total",
                                                 result="committed"),
                    "aborted": metric_labelled(m, "outbox_relay_kafka_transactions_total",
                                               result="aborted"),
                    "commit_seconds_p99": histogram_quantile(histogram_buckets(
                        m, "outbox_relay_kafka_transaction_commit_seconds"), 0.99)}
            if visible is not None:
                rows_total = int(self.sql.value("SELECT count(*) FROM outbox"))
                if not visible.wait_for(rows_total, 30):
                    log(f"  {name}: the visibility consumer saw {len(visible.seen):,} of "
                        f"{rows_total:,} rows")
        finally:
            stop_sampling.set()
            if visible is not None:
                visible.stop()
            rc = self.stop_relay(proc, name)
            log(f"  {name} stopped (exit {rc})")
        entry["samples"] = {"t": [round(s[0], 2) for s in samples],
                            "retained_wal_bytes": [s[1] for s in samples],
                            "unconfirmed_wal_bytes": [s[2] for s in samples],
                            "delivered": [s[3] for s in samples]}
        for r in entry["rates"].values():
            window = [s for s in samples if r["t_start"] <= s[0] <= r["t_end"]
                      and s[1] is not None]
            if window:
                r["retained_wal_bytes_max"] = max(s[1] for s in window)
                r["retained_wal_bytes_mean"] = sum(s[1] for s in window) / len(window)
                r["unconfirmed_wal_bytes_max"] = max(s[2] for s in window)
        if recvlogical:  # nothing goes to Kafka: no latency
            return entry
        self.live_latency(entry, name, topic, UUID_HEADER[kind], read_committed=eos,
                          visible=visible)
        return entry

    def live_latency(self, entry, name, topic, uuid_header, read_committed=False, visible=None):
        """Per-row latency: the broker's append time (LogAppendTime, ms) minus the row's commit
        time (pg_xact_commit_timestamp, us: the same timestamp the pgoutput Commit message
        carries, recorded by PostgreSQL for every transaction with track_commit_timestamp, so
        the relay and the peers are measured alike)."""
        log(f"  {name}: consuming {topic} for per-record latency")
        path = os.path.join(self.out, f"live-records-{name}.tsv")
        # The exactly-once relay's records are read as its consumers read them: read_committed
        # (an aborted transaction's records are not counted, a duplicate is a real one).
        cmd = ["kcat", "-C", "-b", self.brokers, "-t", topic, "-o", "beginning", "-e", "-q",
               "-f", "%T\t%h\n"]
        if read_committed:
            cmd += ["-X", "isolation.level=read_committed"]
        with open(path, "w") as f:
            r = subprocess.run(cmd, stdout=f, stderr=subprocess.PIPE, text=True, timeout=600)
        if r.returncode != 0:
            raise BenchError(f"kcat failed: {r.stderr[-1000:]}")
        append_ms = {}
        prefix = uuid_header + "="
        with open(path) as f:
            for line in f:
                ts, _, headers = line.rstrip("\n").partition("\t")
                for h in headers.split(","):
                    if h.startswith(prefix):
                        append_ms.setdefault(h[len(prefix):], []).append(int(ts))
                        break
        commits = {}
        rows = self.sql.query(
            "SELECT uuid, (extract(epoch FROM pg_xact_commit_timestamp("
            "(transaction_id::text::bigint & 4294967295)::text::xid)) * 1000000)::bigint "
            "FROM outbox")
        for uuid, us in rows:
            if us:
                commits[uuid] = int(us)
        lat_by_rate = {label: [] for label in entry["rates"]}
        unmatched = 0
        for uuid, stamps in append_ms.items():
            cus = commits.get(uuid)
            if cus is None:
                unmatched += 1
                continue
            for label, rr in entry["rates"].items():
                if rr["unix_start"] * 1e6 <= cus <= rr["unix_end"] * 1e6:
                    lat_by_rate[label].append(min(stamps) - cus / 1000.0)
                    break
        entry["records_consumed"] = sum(len(v) for v in append_ms.values())
        entry["duplicates"] = sum(len(v) - 1 for v in append_ms.values())
        entry["records_without_commit_row"] = unmatched
        entry["rows_without_record"] = sum(1 for u in commits if u not in append_ms)
        for label, lats in lat_by_rate.items():
            lats.sort()
            rr = entry["rates"][label]
            rr["latency_ms"] = {
                "count": len(lats),
                "p50": percentile(lats, 0.5), "p90": percentile(lats, 0.9),
                "p99": percentile(lats, 0.99), "p999": percentile(lats, 0.999),
                "max": lats[-1] if lats else None,
                "mean": sum(lats) / len(lats) if lats else None}
            # A compact CDF for the plot, dense in the tail: [[quantile, ms], ...].
            rr["latency_cdf_ms"] = [[q, percentile(lats, q)] for q in CDF_QUANTILES] \
                if lats else []
        if visible is None:
            return
        # Commit -> received by the consumer that ran during the load (read_committed for the
        # exactly-once relay): when the row became visible to consumers.
        entry["visible_records"] = visible.records
        entry["visible_rows"] = len(visible.seen)
        vis_by_rate = {label: [] for label in entry["rates"]}
        with open(os.path.join(self.out, f"live-visible-{name}.tsv"), "w") as f:
            for uuid, t in visible.seen.items():
                cus = commits.get(uuid)
                f.write(f"{uuid}\t{t * 1e6:.0f}\t{cus or ''}\n")
                if cus is None:
                    continue
                for label, rr in entry["rates"].items():
                    if rr["unix_start"] * 1e6 <= cus <= rr["unix_end"] * 1e6:
                        vis_by_rate[label].append(t * 1000.0 - cus / 1000.0)
                        break
        for label, lats in vis_by_rate.items():
            lats.sort()
            entry["rates"][label]["visible_latency_ms"] = {
                "count": len(lats),
                "p50": percentile(lats, 0.5), "p90": percentile(lats, 0.9),
                "p99": percentile(lats, 0.99), "p999": percentile(lats, 0.999),
                "max": lats[-1] if lats else None,
                "mean": sum(lats) / len(lats) if lats else None,
                "read_committed": visible.read_committed}

    # ---- summary ---------------------------------------------------------------------------

    def db_cost_baseline(self):
        """Target 1's reference: the relay's PostgreSQL CPU per 1,000 events at commit 3982f78
        (bench/baseline/, a db-cost.json of a run at that commit)."""
        path = self.args.db_cost_baseline
        if not path:
            return None
        if not os.path.isabs(path):
            path = os.path.join(REPO, path)
        try:
            with open(path) as f:
                return json.load(f)
        except (OSError, ValueError):
            return None

    def db_cost(self):
        """PostgreSQL CPU per 1,000 events of every live contender at each rate (the figures of
        target 1; written as db-cost.json so a run at one commit can be the baseline of another)."""
        live = self.result.get("live", {})
        out = {"commit": self.result["machine"].get("git_commit"), "run_id": self.run_id,
               "unit": "PostgreSQL CPU ms per 1,000 events", "contenders": {}}
        for name, c in live.get("contenders", {}).items():
            for label, r in c.get("rates", {}).items():
                if r.get("pg_sessions_cpu_ms_per_1k_events") is None:
                    continue
                out["contenders"].setdefault(name, {})[label] = {
                    "sessions_total": r["pg_sessions_cpu_ms_per_1k_events"],
                    "by_session": r["pg_sessions_cpu_ms_per_1k_events_by_role"],
                    "postgres_total": r["pg_total_cpu_ms_per_1k_events"],
                    "client": r["client_cpu_ms_per_1k_events"],
                    "inserts_per_s": r["achieved_inserts_per_s"]}
        return out

    def evaluate_targets(self):
        """Issue 13's five targets, then issue 5's (kept for comparison with earlier runs)."""
        t = self.result["targets"]
        drain = self.result.get("drain", {})
        live = self.result.get("live", {})
        lc = live.get("contenders", {})
        # 1. Database cost at a steady rate.
        base = self.db_cost_baseline()
        cost = self.db_cost()
        self.result["db_cost"] = cost
        for label in TARGET_RATES:
            relay = cost["contenders"].get("relay", {}).get(label)
            if relay is None:
                continue
            wm = cost["contenders"].get("watermill-100ms", {}).get(label)
            b = (base or {}).get("contenders", {}).get("relay", {}).get(label)
            limits = []
            met = True
            if b:
                limits.append(f"< {b['sessions_total']:.0f}/3 = {b['sessions_total'] / 3:.0f} "
                              f"(relay at {base.get('commit')}, measured at "
                              f"{b.get('inserts_per_s') or 0:.0f} inserts/s; this run "
                              f"{relay.get('inserts_per_s') or 0:.0f})")
                met = met and relay["sessions_total"] < b["sessions_total"] / 3
            else:
                limits.append("< 1/3 of the 3982f78 figure (no baseline file: not judged)")
                met = None
            if wm:
                limits.append(f"< {wm['sessions_total']:.0f} (watermill-100ms)")
                if met is not None:
                    met = met and relay["sessions_total"] < wm["sessions_total"]
            else:
                limits.append("< watermill-100ms (not measured)")
                met = None
            t[f"1_db_cost_{label}"] = {
                "issue": 13,
                "target": "relay's PostgreSQL CPU ms per 1,000 events (walsender + marker + "
                          "sampler) " + " and ".join(limits),
                "value": relay["sessions_total"], "met": met,
                "detail": {k: round(v, 1) for k, v in relay["by_session"].items()}}
            # What decoding alone costs at this rate, for any logical-replication client.
            recv = cost["contenders"].get("pg_recvlogical", {}).get(label)
            if recv:
                t[f"1_db_cost_{label}"]["walsender_of_pg_recvlogical"] = round(
                    recv["by_session"].get("walsender", 0.0), 1)
        # 2. Drain to marked >= 0.9 x pg_recvlogical.
        for size in ("tx1", "tx100"):
            r = drain.get(size, {}).get("contenders", {}).get("relay-kafka", {})
            if r.get("ratio_to_pg_recvlogical") is not None:
                t[f"2_drain_to_marked_{size}"] = {
                    "issue": 13, "target": ">= 0.9 x pg_recvlogical (in Kafka, marked, confirmed)",
                    "value": r["ratio_to_pg_recvlogical"],
                    "met": r["ratio_to_pg_recvlogical"] >= 0.9}
        # 3. Peak RSS draining 1,000,000 rows.
        rss = drain.get("rss1m", {}).get("contenders", {}).get("relay-kafka", {}).get(
            "peak_rss_kb")
        if rss is not None:
            t["3_peak_rss_1m_drain_mb"] = {"issue": 13, "target": "<= 32 MB",
                                           "value": rss / 1024, "met": rss <= 32 * 1024}
        # 4. Live latency.
        for label, limit in (("500/s", 10), ("50%", 30)):
            p99 = lc.get("relay", {}).get("rates", {}).get(label, {}).get(
                "latency_ms", {}).get("p99")
            if p99 is not None:
                t[f"4_live_p99_{label}"] = {"issue": 13,
                                            "target": f"p99 commit -> broker append <= {limit} ms",
                                            "value": p99, "met": p99 <= limit}
        # 5. The peers in the bench: figures for each peer in each phase that ran.
        if self.peers and (drain or lc):
            have, missing = [], []
            for size, s in drain.items():
                for c in DRAIN_CONTENDERS:
                    if contender_kind(c) in self.peers and size != "rss1m":
                        (have if c in s["contenders"] else missing).append(f"drain {size} {c}")
            if lc:
                for c in self.live_peers():
                    ok = lc.get(c, {}).get("rates") and not lc[c].get("error")
                    (have if ok else missing).append(f"live {c}")
            t["5_peers_in_the_bench"] = {
                "issue": 13, "target": "Watermill forwarder and Debezium on the same broker and "
                                       "backlogs: drain, latency, CPU, RSS",
                "value": f"{len(have)} of {len(have) + len(missing)} runs have figures"
                         + (f" (missing: {', '.join(missing)})" if missing else ""),
                "met": not missing}
        # Issue 14: exactly-once against at-least-once.
        ratio = drain.get("tx100", {}).get("eos_over_alo")
        if ratio is not None:
            t["14_drain_eos_over_alo_tx100"] = {
                "issue": 14, "target": ">= 0.8 x relay-kafka (exactly-once / at-least-once, "
                                       "events/s to marked and confirmed, 100-row transactions)",
                "value": ratio, "met": ratio >= 0.8}
        vis = lc.get("relay-eos", {}).get("rates", {}).get("50%", {}).get(
            "visible_latency_ms", {})
        if vis.get("p99") is not None:
            t["14_live_eos_p99_visible_50pct_ms"] = {
                "issue": 14, "target": "p99 commit -> visible to a read_committed consumer "
                                       "<= 50 ms at 50 % load (exactly-once)",
                "value": vis["p99"], "met": vis["p99"] <= 50}
        # Issue 5's targets.
        for size in ["tx1", "tx100", "tx200k"]:
            for c, limit in (("relay-kafka", 0.8), ("relay-null", 0.95)):
                ratio = drain.get(size, {}).get("contenders", {}).get(c, {}).get(
                    "ratio_to_pg_recvlogical")
                if ratio is not None:
                    t[f"drain_{c}_{size}_ratio"] = {
                        "issue": 5, "target": f">= {limit} x pg_recvlogical", "value": ratio,
                        "met": ratio >= limit}
        t50 = lc.get("relay", {}).get("rates", {}).get("50%", {}).get("latency_ms", {}).get("p99")
        if t50 is not None:
            t["live_p99_at_50pct_ms"] = {"issue": 5, "target": "p99 <= 50 ms at 50 % load",
                                         "value": t50, "met": t50 <= 50}
        all_rss = [r.get("peak_rss_kb") for s in drain.values()
                   for c, r in s["contenders"].items()
                   if r.get("peak_rss_kb") and contender_kind(c) == "relay"]
        if rss is not None:
            t["peak_rss_1m_drain_mb"] = {"issue": 5, "target": "<= 64 MB", "value": rss / 1024,
                                         "met": rss <= 64 * 1024}
        if all_rss:
            t["peak_rss_any_drain_mb"] = {"issue": 5, "target": "<= 64 MB",
                                          "value": max(all_rss) / 1024,
                                          "met": max(all_rss) <= 64 * 1024}
        for size, s in drain.items():
            r = s["contenders"].get("relay-kafka")
            if r:
                t[f"cpu_relay_below_walsender_{size}"] = {
                    "issue": 5, "target": "relay CPU per event < walsender's",
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
        if res.get("table_variant"):
            tv = res["table_variant"]
            lines.append(f"table variant {tv['name']}: reloptions [{tv['reloptions']}]; "
                         + "; ".join(tv["indexes"]))
        if res.get("pg_transport", "tcp") != "tcp":
            lines.append("contenders reach PostgreSQL through its Unix socket (--pg-transport "
                         "unix); pgbench, the harness and Debezium over TCP")
        lines.append(f"load average at start {m['load_avg_at_start'][0]:.2f}"
                     + (f"; waited for quiet: {m['waited_for_quiet']}" if "waited_for_quiet" in m
                        else ""))
        if self.load_samples:
            l1 = [s["load_avg"][0] for s in self.load_samples]
            lines.append(f"1-min load average during the run: min {min(l1):.2f}, "
                         f"max {max(l1):.2f}")

        def f(v, w=7, d=1):
            return f"{v:>{w},.{d}f}" if v is not None else f"{'-':>{w}s}"

        drain = res.get("drain")
        if drain:
            lines.append("")
            lines.append("Backlog drain (wall time from process start until the contender's "
                         "progress covers the backlog: relay = in Kafka, marked and confirmed; "
                         "watermill = in Kafka and acked in its offsets table; debezium and "
                         "'to Kafka' = every row acknowledged by Kafka; pg_recvlogical = end "
                         "LSN received)")
            lines.append("cpu s/M = CPU seconds per million events: the client (relay, peer or "
                         "pg_recvlogical), its walsender, its other database sessions (the "
                         "relay's marker and sampler, the forwarder's polling), the Kafka "
                         "broker; foreign = CPU used by everything else on the machine during "
                         "the run, in % of one CPU (other users' builds, PostgreSQL's "
                         "background processes)")
            hdr = (f"{'backlog':8s} {'contender':19s} {'rows':>9s} {'events/s':>9s} "
                   f"{'x recv':>6s} {'to Kafka':>9s} {'x recv':>6s} {'wall s':>7s} "
                   f"{'client':>7s} {'walsnd':>7s} {'db sess':>7s} {'broker':>7s} "
                   f"{'peak RSS':>9s} {'foreign':>7s}")
            lines.append(hdr)
            lines.append("-" * len(hdr))
            for size, s in drain.items():
                for c, r in s["contenders"].items():
                    ratio = r.get("ratio_to_pg_recvlogical")
                    kratio = r.get("ratio_to_pg_recvlogical_to_kafka")
                    cpu = r.get("client_cpu_s_per_million")
                    dbc = r.get("db_sessions_cpu_s_per_million",
                                r.get("relay_db_sessions_cpu_s_per_million"))
                    kb = r.get("kafka_broker_cpu_s_per_million")
                    lines.append(
                        f"{size:8s} {c:19s} {r.get('rows_measured', s['rows']):>9,} "
                        f"{r['events_per_s']:>9,.0f} "
                        f"{(f'{ratio:.2f}' if ratio else '-'):>6s} "
                        f"{f(r.get('events_per_s_to_kafka'), 9, 0)} "
                        f"{(f'{kratio:.2f}' if kratio else '-'):>6s} {r['wall_seconds']:>7.2f} "
                        f"{f(cpu, 7, 2)} {r['walsender_cpu_s_per_million']:>7.2f} "
                        f"{f(dbc, 7, 2)} {f(kb, 7, 1)} "
                        + (f"{r['peak_rss_kb'] / 1024:>7.1f}MB" if r.get("peak_rss_kb")
                           else f"{'-':>9s}")
                        + (f" {r['foreign_cpu_seconds'] / r['wall_seconds'] * 100:>6.0f}%"
                           if r.get("foreign_cpu_seconds") is not None else ""))
                for c, r in s["contenders"].items():
                    if r.get("startup_seconds") is not None and r.get(
                            "events_per_s_after_first_event"):
                        lines.append(
                            f"{'':8s}   {c}: first row delivered after "
                            f"{r['startup_seconds']:.2f} s, then "
                            f"{r['events_per_s_after_first_event']:,.0f} events/s"
                            + (f"; the second half of the rows reached Kafka at "
                               f"{r['events_per_s_second_half']:,.0f} events/s"
                               if r.get("events_per_s_second_half") else ""))
                if s.get("marking_on_over_off"):
                    lines.append(f"{size:8s} marking on / off throughput: "
                                 f"{s['marking_on_over_off']:.2f}")
                for c, r in s["contenders"].items():
                    if r.get("table_updates") is not None:
                        roles = r.get("db_sessions_cpu_seconds_by_role") or {}
                        mk = roles.get("outbox-relay-marker")
                        sz = r.get("table_sizes_after") or {}
                        lines.append(
                            f"{size:8s} {c}: {r['table_updates']:,} UPDATEs of the table, "
                            f"{r['table_hot_updates']:,} HOT"
                            + (f" ({r['hot_share'] * 100:.1f} %)" if r.get("hot_share")
                               is not None else "")
                            + (f"; marker backend {mk / r['rows_measured'] * 1e6:.1f} CPU-s "
                               f"per million rows" if mk is not None else "")
                            + (f", {r['marker_statements']:,.0f} statements "
                               f"({r['rows_per_marker_statement']:.1f} rows each)"
                               if r.get("marker_statements") else "")
                            + (f"; heap {sz['heap_bytes'] / 2**20:.1f} MiB, indexes "
                               f"{sz['indexes_bytes'] / 2**20:.1f} MiB after the drain"
                               if sz else ""))
                        if r.get("kafka_broker_jit_cpu_seconds") is not None:
                            lines.append(
                                f"{size:8s} {c}: the broker's JIT compilers used "
                                f"{r['kafka_broker_jit_cpu_seconds']:.2f} of its "
                                f"{r['kafka_broker_cpu_seconds']:.2f} CPU-s")
                        if r["table_updates"] < r.get("rows_measured", 0):
                            lines.append(f"{size:8s} {c}: WARNING: fewer UPDATEs than rows: it "
                                         "did not mark the whole backlog itself, its 'to "
                                         "marked' figure is not comparable")
                if s.get("eos_over_alo") is not None:
                    lines.append(
                        f"{size:8s} exactly-once / at-least-once (relay-kafka-eos / relay-kafka, "
                        f"to marked): {s['eos_over_alo']:.2f}"
                        + (f"; to Kafka (eos: appended, before the commit) "
                           f"{s['eos_over_alo_to_kafka']:.2f}"
                           if s.get("eos_over_alo_to_kafka") else "")
                        + ((" (target >= 0.80: " + ("MET" if s["eos_over_alo"] >= 0.8
                                                     else "MISS") + ")")
                           if size == "tx100" else ""))
                for c, r in s["contenders"].items():
                    rc = r.get("read_committed")
                    if rc is None:
                        continue
                    kt = r.get("kafka_transactions") or {}
                    lines.append(
                        f"{'':8s}   {c}: a read_committed consumer sees {rc['records']:,} "
                        f"records ({rc['distinct_uuids']:,} distinct uuids, "
                        f"{rc['duplicates']:,} duplicates, {rc['missing']:,} rows missing); "
                        f"Kafka transactions committed {kt.get('committed', 0):,.0f}, "
                        f"aborted {kt.get('aborted', 0):,.0f}")
        live = res.get("live")
        if live and live.get("contenders"):
            lines.append("")
            lines.append(f"Live load (capacity {live['capacity_inserts_per_s']:,.0f} inserts/s, "
                         f"synchronous_commit=on, {live['clients']} clients; relay "
                         f"{live['seconds_per_rate']} s per rate, peers "
                         f"{live.get('peer_seconds_per_rate')} s)")
            hdr = (f"{'contender':16s} {'rate':>6s} {'ins/s':>6s} {'rows':>7s} {'p50 ms':>7s} "
                   f"{'p99 ms':>7s} {'p99.9':>7s} {'max ms':>7s} {'catchup':>7s} "
                   f"{'client':>7s} {'PG own':>7s} {'PG all':>7s} {'peak RSS':>9s}")
            lines.append(hdr)
            lines.append("-" * len(hdr))
            for name, c in live["contenders"].items():
                if c.get("error"):
                    lines.append(f"{name:16s} failed: {c['error'][:100]}")
                    continue
                for label, r in c["rates"].items():
                    lat = r.get("latency_ms", {})
                    lines.append(
                        f"{name:16s} {label:>6s} {r['achieved_inserts_per_s'] or 0:>6.0f} "
                        f"{lat.get('count', 0):>7,} {f(lat.get('p50'))} {f(lat.get('p99'))} "
                        f"{f(lat.get('p999'))} {f(lat.get('max'))} "
                        f"{f(r.get('catch_up_seconds_after_load'), 6, 2)}s "
                        f"{f(r.get('client_cpu_ms_per_1k_events'), 7, 0)} "
                        f"{f(r.get('pg_sessions_cpu_ms_per_1k_events'), 7, 0)} "
                        f"{f(r.get('pg_total_cpu_ms_per_1k_events'), 7, 0)} "
                        + (f"{c['peak_rss_kb'] / 1024:>7.1f}MB" if c.get("peak_rss_kb")
                           else f"{'-':>9s}"))
            lines.append("p50..max: commit (pg_xact_commit_timestamp) -> broker LogAppendTime per "
                         "row; catchup: after the load until every row is in Kafka (relay: "
                         "confirmed); client / PG own / PG all: CPU ms per 1,000 events of the "
                         "contender's process, of its PostgreSQL sessions, and of all of "
                         "PostgreSQL (including the backends doing the inserts); peak RSS of the "
                         "contender over its whole live run")
            lines.append("records consumed / duplicates / records without a row / rows without "
                         "a record: " + ", ".join(
                             f"{n} {c.get('records_consumed')}/{c.get('duplicates')}/"
                             f"{c.get('records_without_commit_row')}/"
                             f"{c.get('rows_without_record')}"
                             for n, c in live["contenders"].items()
                             if not c.get("error") and "records_consumed" in c))
            relay = live["contenders"].get("relay")
            if relay and relay.get("rates"):
                lines.append("relay: " + "; ".join(
                    f"{label} hist p99 {f(r['relay_histogram']['p99_ms'], 0)} ms, "
                    f"<=50ms {(r['relay_histogram']['fraction_le_50ms'] or 0) * 100:.2f}%, "
                    f"retained WAL max {(r.get('retained_wal_bytes_max') or 0) / 2**20:.1f}MB"
                    for label, r in relay["rates"].items()))
            vis = [(n, c) for n, c in live["contenders"].items()
                   if not c.get("error") and any(r.get("visible_latency_ms")
                                                 for r in c.get("rates", {}).values())]
            if vis:
                lines.append("")
                lines.append("Commit -> visible to a consumer (issue 14): a kcat consumer runs "
                             "during the load and stamps each record on arrival (relay-eos: "
                             "isolation.level=read_committed, so a record counts once its Kafka "
                             "transaction committed); append = the LogAppendTime figures above")
                hdr = (f"{'contender':16s} {'rate':>6s} {'rows':>7s} {'p50 ms':>7s} "
                       f"{'p99 ms':>7s} {'max ms':>7s} {'append p50':>10s} {'append p99':>10s}")
                lines.append(hdr)
                lines.append("-" * len(hdr))
                for name, c in vis:
                    for label, r in c["rates"].items():
                        v = r.get("visible_latency_ms") or {}
                        ap = r.get("latency_ms") or {}
                        lines.append(
                            f"{name:16s} {label:>6s} {v.get('count', 0):>7,} {f(v.get('p50'))} "
                            f"{f(v.get('p99'))} {f(v.get('max'))} {f(ap.get('p50'), 10)} "
                            f"{f(ap.get('p99'), 10)}")
                    if c.get("kafka_transactions"):
                        kt = c["kafka_transactions"]
                        p99c = kt.get("commit_seconds_p99")
                        lines.append(f"{name:16s} Kafka transactions committed "
                                     f"{kt['committed']:,.0f}, aborted {kt['aborted']:,.0f}"
                                     + (f", commit call p99 {p99c * 1000:.1f} ms (histogram)"
                                        if p99c is not None else ""))
                eos50 = live["contenders"].get("relay-eos", {}).get("rates", {}).get(
                    "50%", {}).get("visible_latency_ms", {}).get("p99")
                if eos50 is not None:
                    lines.append(f"exactly-once p99 at 50 %: {eos50:.1f} ms (target <= 50 ms: "
                                 + ("MET" if eos50 <= 50 else "MISS") + ")")
            cost = res.get("db_cost", {}).get("contenders", {})
            if cost:
                lines.append("")
                lines.append("Database cost at a steady rate: PostgreSQL CPU ms per 1,000 events "
                             "in the contender's sessions (pids from pg_stat_activity, CPU from "
                             "/proc/<pid>/stat)")
                for label in TARGET_RATES:
                    for name, rates in cost.items():
                        r = rates.get(label)
                        if not r:
                            continue
                        parts = ", ".join(f"{k} {v:,.0f}" for k, v in
                                          sorted(r["by_session"].items(), key=lambda kv: -kv[1]))
                        lines.append(f"  {label:>6s} {name:16s} {r['sessions_total']:>7,.0f}  "
                                     f"({parts})")
        micro = res.get("micro")
        if micro:
            lines.append("")
            lines.append("Microbenchmarks (one core, median of repetitions)")
            for name, b in micro["benchmarks"].items():
                v = b.get("rows_per_s_median")
                lines.append(f"  {name:32s} {v:>14,.0f} rows/s" if v else f"  {name}")
        if res["targets"]:
            for issue, title in ((14, "Targets (issue 14, exactly-once)"),
                                 (13, "Targets (issue 13)"),
                                 (5, "Earlier targets (issue 5)")):
                items = [(n, t) for n, t in res["targets"].items() if t.get("issue") == issue]
                if not items:
                    continue
                lines.append("")
                lines.append(title)
                for name, t in items:
                    v = t["value"]
                    if isinstance(v, float):
                        v = f"{v:,.2f}"
                    elif isinstance(v, dict):
                        v = ", ".join(f"{k}={x:.2f}" for k, x in v.items())
                    verdict = "n/a " if t["met"] is None else ("MET " if t["met"] else "MISS")
                    lines.append(f"  {verdict} {name}: {v} (target {t['target']})"
                                 + (f" [{', '.join(f'{k} {x}' for k, x in t['detail'].items())}]"
                                    if t.get("detail") else "")
                                 + (f" [pg_recvlogical's walsender alone: "
                                    f"{t['walsender_of_pg_recvlogical']}]"
                                    if t.get("walsender_of_pg_recvlogical") is not None else ""))
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
            self.warm_up_drains()
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
            if self.result.get("db_cost", {}).get("contenders"):
                with open(os.path.join(self.out, "db-cost.json"), "w") as f:
                    json.dump(self.result["db_cost"], f, indent=1)
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
    sys.path.insert(0, HERE)
    try:
        h = Harness(args)
        h.run()
    except BenchError as e:
        log(f"FAILED: {e}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
