"""The run's report: the targets (issues 13, 14 and 5) judged MET / MISS / n/a, summary.txt
(printed at the end), result.json, db-cost.json and plot.png (bench/plot.py).

ReportMixin uses the Harness attributes args, result, run_id, peers, load_samples and out, and
live_peers (contenders.py).
"""

import json
import os

from .common import REPO, log
from .contenders import DRAIN_CONTENDERS, contender_kind

# Issue 13's targets 1 and 4 are stated at these two live rates.
TARGET_RATES = ("500/s", "50%")


class ReportMixin:
    """Targets, summary and the result files."""

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

    def write_results(self):
        """result.json, db-cost.json (when the live phase measured PostgreSQL's cost),
        summary.txt and plot.png in the run's directory; returns the summary's text."""
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
        return text
