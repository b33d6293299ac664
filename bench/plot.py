#!/usr/bin/python3
"""Renders bench/results/<run>/result.json as a PNG (4 panels):
  drain events/s per backlog and contender (with the ratio to pg_recvlogical),
  drain throughput over time (the 100-row backlog), live-load throughput and retained WAL over
  time, and the commit-to-Kafka latency CDF per rate.

    /usr/bin/python3 bench/plot.py bench/results/<run>/result.json [out.png]
"""

import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import matplotlib.ticker  # noqa: E402

COLORS = {"pg_recvlogical": "#555555", "relay-null": "#1f77b4", "relay-kafka": "#d62728",
          "relay-kafka-nomark": "#ff9896"}
LABELS = {"pg_recvlogical": "pg_recvlogical → /dev/null", "relay-null": "relay, null sink",
          "relay-kafka": "relay → Kafka, marking on",
          "relay-kafka-nomark": "relay → Kafka, marking off"}


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
    ax.set_ylabel("events/s")
    ax.set_title("Backlog drain (label: ratio to pg_recvlogical)", fontsize=10)
    ax.legend(fontsize=7, loc="upper left")
    ax.grid(axis="y", alpha=0.3)
    ymax = max((r["events_per_s"] for s in sizes for r in drain[s]["contenders"].values()),
               default=1)
    ax.set_ylim(0, ymax * 1.3)


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
        ax.text((r["t_start"] + r["t_end"]) / 2, 0, f"{pct}%", ha="center", va="bottom",
                fontsize=8)
        first = False
    ax.set_xlabel("seconds")
    ax.set_ylabel("events/s")
    ax2 = ax.twinx()
    ax2.plot(s["t"], [b / 2**20 for b in s["retained_wal_bytes"]], color="#2ca02c", lw=1,
             label="slot retained WAL (restart_lsn)")
    ax2.plot(s["t"], [b / 2**20 for b in s["unconfirmed_wal_bytes"]], ":", color="#2ca02c",
             lw=1, label="WAL past confirmed_flush_lsn")
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
                label=f"{pct}% ({r['target_inserts_per_s']:,}/s): p50 {lat['p50']:.0f}, "
                      f"p99 {lat['p99']:.0f}, p99.9 {lat['p999']:.0f} ms")
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
    ax.set_title("Latency CDF per rate (commit time from pgoutput Commit,\n"
                 "ack = broker LogAppendTime)", fontsize=10)
    ax.legend(fontsize=7, loc="lower right")
    ax.grid(alpha=0.3, which="both")


def render(result, path):
    fig, axes = plt.subplots(2, 2, figsize=(15, 10))
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
    m = result.get("machine", {})
    micro = result.get("micro", {}).get("benchmarks", {}).get("BM_DecodeAndMapRow", {})
    dm = micro.get("rows_per_s_median")
    fig.suptitle(f"outbox-relay benchmark {result.get('run_id')} ({result.get('mode')}) — "
                 f"{m.get('cpus')} CPUs, load avg at start {m.get('load_avg_at_start', [0])[0]:.1f}"
                 + (f" — decode+map {dm / 1e6:.2f} M rows/s/core" if dm else ""), fontsize=12)
    fig.tight_layout(rect=(0, 0, 1, 0.97))
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    with open(sys.argv[1]) as f:
        res = json.load(f)
    out = sys.argv[2] if len(sys.argv) > 2 else sys.argv[1].rsplit("/", 1)[0] + "/plot.png"
    render(res, out)
    print(out)
