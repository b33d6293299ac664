"""The contenders' /metrics (Prometheus text): one scrape as a dict, sums and single values,
histogram buckets and quantiles, and the nearest-rank percentile of a sorted list."""

import math
import re
import urllib.request

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
