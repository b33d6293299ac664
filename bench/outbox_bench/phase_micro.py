"""Phase micro: the Google Benchmark microbenchmarks (bench_micro: decode + map per row).

MicroPhase uses the Harness attributes args, micro_bin, out and result, and note_load."""

import json
import os
import subprocess

from .common import BenchError, log


class MicroPhase:
    """result["micro"] and issue 5's decode + map target."""

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
