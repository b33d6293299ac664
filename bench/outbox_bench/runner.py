"""Harness: one benchmark run. It holds what the phases share (the arguments, the environment's
paths and addresses, the psql session, the result being built) and runs the phases in order;
the work itself is in the mixins it is made of.
"""

import datetime
import os
import re
import subprocess
import time
import urllib.parse

from .common import BENCH_DIR, REPO, BenchError, log
from .contenders import PEERS, ContendersMixin
from .kafka import KafkaMixin
from .phase_drain import DrainPhase
from .phase_live import LivePhase
from .phase_micro import MicroPhase
from .postgres import DatabaseMixin, Psql
from .report import ReportMixin


class Harness(DatabaseMixin, KafkaMixin, ContendersMixin, MicroPhase, DrainPhase, LivePhase,
              ReportMixin):
    """One run: __init__ reads the environment bench/run exported and opens the psql session;
    run() sets up the database, warms the broker up, runs the phases asked for and, whatever
    happens, writes the results and cleans up (topics, slots)."""

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
        self.out = args.out or os.path.join(BENCH_DIR, "results", self.run_id)
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
            text = self.write_results()
            if not a.keep_topics:
                self.delete_run_topics()
            self.drop_bench_slots()
            self.sql.close()
        print(text)
        log(f"results in {self.out}")
