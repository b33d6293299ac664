#!/usr/bin/python3
"""Renders bench/results/<run>/result.json as a PNG (6 panels):
  drain events/s per backlog and contender (with the ratio to pg_recvlogical; the peers too),
  drain throughput over time (the 100-row backlog), the relay's live-load throughput and
  retained WAL over time, the relay's commit-to-Kafka latency CDF per rate, and for the relay
  against the peers at the target rates: latency p50/p99 and PostgreSQL CPU per 1,000 events.

    /usr/bin/python3 bench/plot.py bench/results/<run>/result.json [out.png]
"""

import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import matplotlib.ticker  # noqa: E402

COLORS = {"pg_recvlogical": "#555555", "relay-null": "#1f77b4", "relay-kafka": "#d62728",
          "relay-kafka-nomark": "#ff9896", "relay-kafka-eos": "#8c564b", "watermill": "#2ca02c", "debezium": "#9467bd"}
LABELS = {"pg_recvlogical": "pg_recvlogical → /dev/null", "relay-null": "relay, null sink",
          "relay-kafka": "relay → Kafka, marking on",
          "relay-kafka-nomark": "relay → Kafka, marking off",
          "relay-kafka-eos": "relay → Kafka exactly-once, marking on",
          "watermill": "Watermill polling forwarder → Kafka",
          "debezium": "Debezium embedded + outbox router → Kafka"}
SESSION_COLORS = {"walsender": "#1f77b4", "outbox-relay-marker": "#d62728",
                  "outbox-relay-metrics": "#ff9896", "watermill-forwarder": "#2ca02c"}


def rate_label(key):
    """'500/s', '50%' (this harness) or '50' (earlier runs: a percentage)."""
    return key if key.endswith(("%", "/s")) else key + "%"


def rates(t, v, window=0.5):
    """Events/s over time from cumulative samples, one point per `window` seconds."""
    out_t, out_r = [], []
    if not t:
        return out_t, out_r
    last_t, last_v = t[0], v[0]
    for ti, vi in zip(t[1:], v[1:]):
        if vi is None:
            continue
        if last_v is None:
            last_t, last_v = ti, vi
            continue
        if ti - last_t >= window:
            out_t.append((ti + last_t) / 2)
            out_r.append((vi - last_v) / (ti - last_t))
            last_t, last_v = ti, vi
    return out_t, out_r


def panel_drain_bars(ax, drain):
    sizes = list(drain.keys())
    contenders = [c for c in COLORS if any(c in drain[s]["contenders"] for s in sizes)]
    width = 0.8 / max(1, len(contenders))
    for i, c in enumerate(contenders):
        xs, ys = [], []
        for j, s in enumerate(sizes):
            r = drain[s]["contenders"].get(c)
            if r:
                xs.append(j + (i - (len(contenders) - 1) / 2) * width)
                ys.append(r["events_per_s"])
                ratio = r.get("ratio_to_pg_recvlogical")
                if ratio:
                    ax.text(xs[-1], ys[-1], f"{ratio:.2f}×", ha="center", va="bottom",
                            fontsize=7, rotation=90)
        ax.bar(xs, ys, width, color=COLORS[c], label=LABELS[c])
    ax.set_xticks(range(len(sizes)))
    ax.set_xticklabels([f"{s}\n{drain[s]['rows']:,} rows" for s in sizes], fontsize=8)
    ax.set_ylabel("events/s (log)")
    ax.set_yscale("log")
    ax.set_title("Backlog drain (label: ratio to pg_recvlogical)", fontsize=10)
    ax.legend(fontsize=7, loc="upper right")
    ax.grid(axis="y", alpha=0.3, which="both")
    ymax = max((r["events_per_s"] for s in sizes for r in drain[s]["contenders"].values()),
               default=1)
    ax.set_ylim(top=ymax * 6)


def panel_drain_time(ax, drain):
    size = "tx100" if "tx100" in drain else next(iter(drain))
    for c, r in drain[size]["contenders"].items():
        s = r.get("series", {})
        t, rate = rates(s.get("t", []), s.get("events", []), window=0.5)
        style = "--" if c == "pg_recvlogical" else "-"
        ax.plot(t, rate, style, color=COLORS.get(c), label=LABELS.get(c, c), lw=1.2)
    ax.set_xlabel("seconds since start")
    ax.set_ylabel("events/s")
    ax.set_title(f"Drain throughput over time: {drain[size]['label']}\n"
                 "(pg_recvlogical estimated from the walsender's sent_lsn)", fontsize=10)
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)


def panel_live_time(ax, live):
    s = live["samples"]
    t, rate = rates(s["t"], s["delivered"], window=1.0)
    ax.plot(t, rate, color="#d62728", lw=1.2, label="delivered to Kafka (relay)")
    first = True
    for pct, r in live["rates"].items():
        p = r.get("pgbench_progress", {})
        ax.plot([r["t_start"] + x - 0.5 for x in p.get("t", [])], p.get("tps", []), color="#444",
                lw=0.8, alpha=0.7, label="inserted (pgbench)" if first else None)
        ax.axvspan(r["t_start"], r["t_end"], color="#eee", zorder=0)
        ax.text((r["t_start"] + r["t_end"]) / 2, 0, rate_label(pct), ha="center",
                va="bottom", fontsize=8)
        first = False
    ax.set_xlabel("seconds")
    ax.set_ylabel("events/s")
    ax2 = ax.twinx()
    ax2.plot(s["t"], [(b or 0) / 2**20 for b in s["retained_wal_bytes"]], color="#2ca02c",
             lw=1, label="slot retained WAL (restart_lsn)")
    ax2.plot(s["t"], [(b or 0) / 2**20 for b in s["unconfirmed_wal_bytes"]], ":",
             color="#2ca02c", lw=1, label="WAL past confirmed_flush_lsn")
    ax2.set_ylabel("MiB", color="#2ca02c")
    ax2.set_ylim(bottom=0)
    h1, l1 = ax.get_legend_handles_labels()
    h2, l2 = ax2.get_legend_handles_labels()
    ax.legend(h1 + h2, l1 + l2, fontsize=7, loc="upper left")
    ax.set_title(f"Live load (capacity {live['capacity_inserts_per_s']:,.0f} inserts/s, "
                 "synchronous_commit=on)", fontsize=10)
    ax.grid(alpha=0.3)


def panel_latency(ax, live):
    colors = ["#1f77b4", "#ff7f0e", "#d62728", "#9467bd", "#8c564b"]
    for i, (pct, r) in enumerate(live["rates"].items()):
        cdf = [(q, v) for q, v in r.get("latency_cdf_ms", []) if q < 1.0]
        if not cdf:
            continue
        lat = r["latency_ms"]
        ax.plot([max(v, 0.1) for _, v in cdf], [q for q, _ in cdf], color=colors[i % 5],
                label=f"{rate_label(pct)} ({r['target_inserts_per_s']:,}/s): p50 "
                      f"{lat['p50']:.0f}, p99 {lat['p99']:.0f}, p99.9 {lat['p999']:.0f} ms")
    ax.axvline(50, color="#999", ls="--", lw=0.8)
    ax.text(50, 0.02, " 50 ms", fontsize=7, color="#666", transform=ax.get_xaxis_transform())
    ax.set_xscale("log")
    ax.set_yscale("logit")
    ax.set_ylim(0.01, 0.9995)
    ticks = [0.01, 0.1, 0.5, 0.9, 0.99, 0.999]
    ax.set_yticks(ticks)
    ax.set_yticklabels(["p1", "p10", "p50", "p90", "p99", "p99.9"])
    ax.yaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax.set_xlabel("commit → Kafka append (ms, log)")
    ax.set_ylabel("percentile of rows (logit scale)")
    ax.set_title("Relay latency CDF per rate (commit = pg_xact_commit_timestamp,\n"
                 "ack = broker LogAppendTime)", fontsize=10)
    ax.legend(fontsize=7, loc="lower right")
    ax.grid(alpha=0.3, which="both")


def live_contenders(live):
    return [(n, c) for n, c in live.get("contenders", {}).items()
            if c.get("rates") and not c.get("error")]


def panel_peer_latency(ax, live, labels=("500/s", "50%")):
    cs = live_contenders(live)
    width = 0.8 / max(1, len(labels) * 2)
    colors = {"p50": ["#9ecae1", "#fdae6b"], "p99": ["#3182bd", "#e6550d"]}
    for k, label in enumerate(labels):
        for q_i, q in enumerate(("p50", "p99")):
            xs, ys = [], []
            for j, (_, c) in enumerate(cs):
                v = c["rates"].get(label, {}).get("latency_ms", {}).get(q)
                if v is not None:
                    xs.append(j + (k * 2 + q_i - (len(labels) * 2 - 1) / 2) * width)
                    ys.append(max(v, 0.1))
            ax.bar(xs, ys, width, color=colors[q][k % 2], label=f"{q} at {label}")
            for x, y in zip(xs, ys):
                ax.text(x, y, f"{y:.0f}", ha="center", va="bottom", fontsize=6, rotation=90)
    ax.set_xticks(range(len(cs)))
    ax.set_xticklabels([n for n, _ in cs], fontsize=7, rotation=20)
    ax.set_yscale("log")
    ax.set_ylabel("commit → Kafka append, ms (log)")
    ax.set_title("Live latency: the relay against the peers", fontsize=10)
    ax.legend(fontsize=7, loc="upper left")
    ax.grid(axis="y", alpha=0.3, which="both")


def panel_db_cost(ax, live, labels=("500/s", "50%")):
    cs = live_contenders(live)
    width = 0.8 / max(1, len(labels))
    roles_seen = []
    for k, label in enumerate(labels):
        bottoms = [0.0] * len(cs)
        roles = sorted({role for _, c in cs for role in
                        c["rates"].get(label, {}).get("pg_sessions_cpu_ms_per_1k_events_by_role",
                                                      {})})
        for role in roles:
            xs, ys, bs = [], [], []
            for j, (_, c) in enumerate(cs):
                v = c["rates"].get(label, {}).get("pg_sessions_cpu_ms_per_1k_events_by_role",
                                                  {}).get(role)
                if v:
                    xs.append(j + (k - (len(labels) - 1) / 2) * width)
                    ys.append(v)
                    bs.append(bottoms[j])
                    bottoms[j] += v
            ax.bar(xs, ys, width * 0.9, bottom=bs, color=SESSION_COLORS.get(role, "#999"),
                   label=role if role not in roles_seen else None,
                   hatch="//" if k else None, edgecolor="white")
            if role not in roles_seen:
                roles_seen.append(role)
        for j, total in enumerate(bottoms):
            if total:
                ax.text(j + (k - (len(labels) - 1) / 2) * width, total, f"{label}\n{total:.0f}",
                        ha="center", va="bottom", fontsize=6)
    ax.set_xticks(range(len(cs)))
    ax.set_xticklabels([n for n, _ in cs], fontsize=7, rotation=20)
    ax.set_ylabel("PostgreSQL CPU ms per 1,000 events")
    ax.set_title("Database cost at a steady rate, by session (plain: 500/s, hatched: 50 %)",
                 fontsize=10)
    ax.legend(fontsize=7, loc="upper right")
    ax.grid(axis="y", alpha=0.3)


def render(result, path):
    fig, axes = plt.subplots(3, 2, figsize=(15, 15))
    drain = result.get("drain")
    live = result.get("live")
    if drain:
        panel_drain_bars(axes[0][0], drain)
        panel_drain_time(axes[0][1], drain)
    else:
        axes[0][0].set_axis_off()
        axes[0][1].set_axis_off()
    if live and live.get("samples"):
        panel_live_time(axes[1][0], live)
        panel_latency(axes[1][1], live)
    else:
        axes[1][0].set_axis_off()
        axes[1][1].set_axis_off()
    if live and len(live_contenders(live)) > 1:
        panel_peer_latency(axes[2][0], live)
        panel_db_cost(axes[2][1], live)
    else:
        axes[2][0].set_axis_off()
        axes[2][1].set_axis_off()
    m = result.get("machine", {})
    micro = result.get("micro", {}).get("benchmarks", {}).get("BM_DecodeAndMapRow", {})
    dm = micro.get("rows_per_s_median")
    fig.suptitle(f"outbox-relay benchmark {result.get('run_id')} ({result.get('mode')}) — "
                 f"{m.get('cpus')} CPUs, load avg at start {m.get('load_avg_at_start', [0])[0]:.1f}"
                 + (f" — decode+map {dm / 1e6:.2f} M rows/s/core" if dm else ""), fontsize=12)
    fig.tight_layout(rect=(0, 0, 1, 0.98))
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    with open(sys.argv[1]) as f:
        res = json.load(f)
    out = sys.argv[2] if len(sys.argv) > 2 else sys.argv[1].rsplit("/", 1)[0] + "/plot.png"
    render(res, out)
    print(out)
