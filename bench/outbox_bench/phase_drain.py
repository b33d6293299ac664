"""Phase drain: the same WAL backlog read by every contender from its own slot, created before
the load: pg_recvlogical to /dev/null (the ceiling), the relay with the null sink, the relay with
Kafka (acks=all, marking on; exactly-once; marking off) and the peers. Also the untimed drains
that end the broker's warm-up.

DrainPhase uses the Harness attributes args, sql, brokers, peers, postmaster, topic_prefix, out
and result, and the methods of postgres.DatabaseMixin, kafka.KafkaMixin,
contenders.ContendersMixin and note_load.
"""

import os
import signal
import subprocess
import threading
import time

from .common import BenchError, log
from .contenders import DRAIN_CONTENDERS, PEERS, contender_kind, is_eos
from .postgres import lsn_int, lsn_text
from .processes import (machine_busy_cpu, proc_children_cpu, proc_cpu, proc_jit_cpu,
                        proc_status_kb)
from .prometheus import metric_labelled, metric_one, metric_sum, scrape
from .visibility import read_topic_uuids


class DrainPhase:
    """result["drain"]: one entry per backlog, one figure set per contender."""

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
            seen = read_topic_uuids(self.brokers, f"{topic_base}.review", read_committed=True)
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
