"""Phase live: fixed insert rates (N/s, or a percentage of what pgbench sustains with
synchronous_commit=on) with one contender streaming at a time: commit-to-Kafka-append latency
per row, commit -> visible, CPU per 1,000 events (the contender, its PostgreSQL sessions, all of
PostgreSQL, the broker), retained WAL.

LivePhase uses the Harness attributes args, sql, brokers, postmaster, topic_prefix, out and
result, and the methods of postgres.DatabaseMixin, kafka.KafkaMixin, contenders.ContendersMixin
and note_load.
"""

import math
import os
import re
import subprocess
import threading
import time

from .common import BenchError, log
from .contenders import PEERS, UUID_HEADER, contender_kind, is_eos
from .postgres import lsn_int
from .processes import children_cpu, machine_busy_cpu, proc_children_cpu, proc_cpu, proc_status_kb
from .prometheus import (histogram_buckets, histogram_delta, histogram_fraction_le,
                         histogram_quantile, metric_labelled, metric_one, metric_sum, percentile,
                         scrape)
from .visibility import VisibilityConsumer

CDF_QUANTILES = ([i / 100 for i in range(1, 100)] + [0.99 + i / 1000 for i in range(1, 10)]
                 + [0.9995, 0.9999, 1.0])


def parse_duration_ms(text):
    """'10ms', '500ms', '1s' -> milliseconds."""
    m = re.fullmatch(r"([0-9.]+)(ms|s)", text)
    if not m:
        raise ValueError(f"bad duration {text!r} (e.g. 10ms, 1s)")
    return float(m.group(1)) * (1 if m.group(2) == "ms" else 1000)


def rate_inserts(label, capacity):
    if label.endswith("/s"):
        return int(label[:-2])
    return max(1, int(capacity * int(label[:-1]) / 100))


def _ms(seconds):
    return seconds * 1000 if seconds is not None else None


class LivePhase:
    """result["live"]: the sustained rate, then one entry per contender with its rates."""

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
