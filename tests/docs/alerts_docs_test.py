#!/usr/bin/env python3
"""docs/alerts.yml, docs/grafana-dashboard.json and the prose in README.md and docs/ name
only what exists: metrics the relay registers (src/metrics/metrics.cc) with labels it sets,
commands and flags its --help lists, links and runbook sections that are there. The seed's
alert rules are present with its thresholds. SQL in the docs compares with NULL only by
IS [NOT] NULL."""

import glob
import json
import os
import re
import shutil
import subprocess
import sys
import unittest

import yaml

import support

DOCS = os.path.join(support.REPO, "docs")
# Metrics that are not the relay's: the service's own, postgres_exporter's, Prometheus's.
EXTERNAL_METRICS = {"up", "http_requests_total", "outbox_table_bytes"}


def read(path):
    with open(path, encoding="utf-8") as f:
        return f.read()


def markdown_files():
    return [os.path.join(support.REPO, "README.md")] + sorted(
        glob.glob(os.path.join(DOCS, "**", "*.md"), recursive=True))


class Rules(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.doc = yaml.safe_load(read(os.path.join(DOCS, "alerts.yml")))
        cls.rules = [r for g in cls.doc["groups"] for r in g["rules"]]
        cls.by_name = {r["alert"]: r for r in cls.rules}

    def check_expr(self, where, expr):
        known = support.relay_series_names() | EXTERNAL_METRICS
        for name in support.promql_metric_names(expr):
            self.assertIn(name, known, f"{where}: {name} is not a metric the relay exports")
        labels = support.relay_label_names() | support.SCRAPE_LABELS
        for metric, matchers in support.promql_selectors(expr):
            if metric in support.relay_series_names():
                for label in matchers:
                    self.assertIn(label, labels, f"{where}: {metric} has no label {label}")

    def test_structure(self):
        self.assertEqual(len(self.by_name), len(self.rules), "alert names are unique")
        for r in self.rules:
            self.assertIn(r["labels"]["severity"], ("page", "ticket"), r["alert"])
            self.assertTrue(r["annotations"]["summary"], r["alert"])
            self.assertRegex(r.get("for", "0m"), r"^[0-9]+[smhd]$")

    def test_every_metric_is_exported(self):
        for r in self.rules:
            self.check_expr(r["alert"], r["expr"])

    def test_runbook_sections_exist(self):
        anchors = support.markdown_anchors(os.path.join(DOCS, "runbook.md"))
        for r in self.rules:
            page, _, anchor = r["annotations"]["runbook"].partition("#")
            self.assertEqual(page, "docs/runbook.md")
            self.assertIn(anchor, anchors, f"{r['alert']}: docs/runbook.md#{anchor}")

    def test_the_seeds_rules(self):
        def norm(e):
            return re.sub(r"\s+", "", e)

        exprs = {norm(r["expr"]): r for r in self.rules}
        # (expression, for, severity) as the seed states them.
        seed = [
            ("rate(outbox_forwarder_errors_total[5m]) > 0", "10m", "ticket"),
            ("outbox_forwarder_lag_seconds > 60", "5m", "ticket"),
            ('outbox_rows_total{status="unacked"} > 1000', None, "ticket"),
            ('outbox_rows_total{status="acked"} > 1000000', None, "ticket"),
            ('outbox_rows_total{status="pending"} > 10000', "5m", "page"),
        ]
        for expr, duration, severity in seed:
            self.assertTrue(norm(expr) in exprs, f"the seed's rule {expr}")
            rule = exprs[norm(expr)]
            self.assertEqual(rule.get("for"), duration, expr)
            self.assertEqual(rule["labels"]["severity"], severity, expr)
        traffic = self.by_name["OutboxNoPublicationsWithTraffic"]["expr"]
        self.assertIn('http_requests_total{endpoint="/v1/reviews", method="POST", status="201"}',
                      traffic)
        self.assertIn('events_published_total{event_type="review.created"}', traffic)
        self.assertIn("outbox_table_bytes", " ".join(r["expr"] for r in self.rules))

    def test_replication_rules(self):
        exprs = " ".join(r["expr"] for r in self.rules)
        for metric in ("outbox_relay_slot_retained_wal_bytes", "outbox_relay_heartbeat_timestamp_seconds",
                       "outbox_relay_dead_lettered_total", "outbox_relay_streaming"):
            self.assertIn(metric, exprs)

    @unittest.skipUnless(shutil.which("promtool"), "promtool not installed")
    def test_promtool(self):
        proc = subprocess.run(["promtool", "check", "rules", os.path.join(DOCS, "alerts.yml")],
                              capture_output=True, text=True)
        self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)

    def test_dashboard(self):
        dash = json.loads(read(os.path.join(DOCS, "grafana-dashboard.json")))
        exprs = [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]
        self.assertGreaterEqual(len(exprs), 10)
        for e in exprs:
            self.check_expr("grafana-dashboard.json", e)
        joined = " ".join(exprs)
        for metric in ("outbox_forwarder_lag_seconds", "events_published_total",
                       "outbox_relay_commit_to_ack_seconds_bucket", "outbox_forwarder_errors_total",
                       "outbox_relay_slot_retained_wal_bytes", "outbox_relay_in_flight_messages",
                       "outbox_relay_dead_lettered_total"):
            self.assertIn(metric, joined)
        ids = [p["id"] for p in dash["panels"]]
        self.assertEqual(len(ids), len(set(ids)))


class Prose(unittest.TestCase):
    def test_metric_names_in_docs_exist(self):
        known = support.relay_series_names() | EXTERNAL_METRICS
        pattern = re.compile(r"\b(?!outbox_dlq_|outbox_replay_)((?:outbox|events)_[a-z0-9_]*_(?:total|seconds|bytes|messages|lsn|"
                             r"active|standby|streaming|bucket|sum|count))\b")
        for path in markdown_files() + glob.glob(os.path.join(DOCS, "deploy", "*.yaml")):
            for lineno, line in enumerate(read(path).splitlines(), 1):
                for name in pattern.findall(line):
                    self.assertIn(name, known, f"{os.path.relpath(path, support.REPO)}:{lineno}: "
                                  f"{name} is not a metric the relay exports")

    def test_commands_and_flags_in_docs_exist(self):
        cmds = support.commands()
        names = "|".join(sorted({n for c in cmds.values() for n, a, _ in c.subcommands} |
                                {a for c in cmds.values() for _, al, _ in c.subcommands for a in al},
                                key=len, reverse=True))
        invocation = re.compile(r"outbox-relay((?:\s+(?:" + names + r"))+)([^`|;&#\n]*)")
        checked = 0
        for path in markdown_files():
            if path.endswith("configuration.md"):
                continue  # generated from the same help
            for lineno, line in enumerate(read(path).splitlines(), 1):
                for m in invocation.finditer(line):
                    cmd = support.command_for_args(m.group(1).split())
                    where = f"{os.path.relpath(path, support.REPO)}:{lineno}"
                    self.assertIsNotNone(cmd, f"{where}: {m.group(0)}")
                    flags = support.options_by_flag(cmd)
                    for flag in re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", m.group(2)):
                        self.assertTrue(flag in flags, f"{where}: `outbox-relay "
                                      f"{' '.join(cmd.path)}` has no {flag}")
                    checked += 1
        self.assertGreater(checked, 10)

    def test_environment_variables_in_docs_exist(self):
        envs = {o.env for c in support.commands().values() for o in c.settings() if o.env}
        # The crash test's fault switch and the CMake option that compiles it in
        # (architecture.md); the PostgreSQL major and server programs of scripts/services
        # (README.md, postgresql.md).
        # The CMake settings of the version and the commit (upgrading.md).
        allowed = {"OUTBOX_TEST_FAULT", "OUTBOX_FAILPOINTS", "OUTBOX_PG_VERSION", "OUTBOX_PG_BIN",
                   "OUTBOX_PRERELEASE", "OUTBOX_GIT_COMMIT"}
        for path in markdown_files():
            for lineno, line in enumerate(read(path).splitlines(), 1):
                for name in re.findall(r"\b(OUTBOX_[A-Z0-9_]+)\b", line):
                    self.assertIn(name, envs | allowed,
                                  f"{os.path.relpath(path, support.REPO)}:{lineno}: {name}")

    def test_links_resolve(self):
        # Also the benchmark's guide and analyses and the Helm chart's page.
        others = sorted(glob.glob(os.path.join(support.REPO, "bench", "*.md")) +
                        glob.glob(os.path.join(support.REPO, "deploy", "**", "*.md"),
                                  recursive=True))
        self.assertGreaterEqual(len(others), 3)
        for path in markdown_files() + others:
            text = read(path)
            for target in re.findall(r"\]\(([^)\s]+)\)", text):
                if re.match(r"[a-z]+:", target):
                    continue
                file, _, anchor = target.partition("#")
                dest = os.path.normpath(os.path.join(os.path.dirname(path), file)) if file else path
                where = f"{os.path.relpath(path, support.REPO)}: {target}"
                self.assertTrue(os.path.exists(dest), where)
                if anchor and dest.endswith(".md"):
                    self.assertIn(anchor, support.markdown_anchors(dest), where)

    def test_sql_in_docs_never_compares_with_null(self):
        lint = support.load_script("sql_null_lint",
                                   os.path.join(support.REPO, "scripts", "lib", "sql_null_lint.py"))
        for path in markdown_files():
            blocks = re.findall(r"```sql\n(.*?)```", read(path), re.S)
            for block in blocks:
                findings = lint.lint_source("block.sql", block)
                self.assertEqual(findings, [], f"{os.path.relpath(path, support.REPO)}: "
                                 f"{[f.source_line for f in findings]}")

    def test_readme_has_exactly_the_two_commands(self):
        readme = read(os.path.join(support.REPO, "README.md"))
        section = readme.split("## Two commands", 1)[1].split("\n## ", 1)[0]
        (block,) = re.findall(r"```sh\n(.*?)```", section, re.S)
        commands = [l.split("#")[0].strip() for l in block.splitlines() if l.strip()]
        self.assertEqual(commands, ["./scripts/demo", "./scripts/test"])
        self.assertIn("## Performance", readme)
        performance = readme.split("## Performance", 1)[1].split("\n## ", 1)[0]
        self.assertIn("bench/run", performance)
        # One table, the details one click away (bench/analyses.md keeps every figure).
        self.assertEqual(len(re.findall(r"^\|---", performance, re.M)), 1)
        self.assertIn("](bench/analyses.md", performance)
        # The quick start against one's own database: check, then run.
        quick = readme.split("## Quick start", 1)[1].split("\n## ", 1)[0]
        (block,) = re.findall(r"```sh\n(.*?)```", quick, re.S)
        commands = [l.split("#")[0].split() for l in block.splitlines()]
        order = [c[1] for c in commands if c[:1] == ["outbox-relay"]]
        self.assertEqual(order[:2], ["check", "run"])
        self.assertLessEqual(len(block.splitlines()), 10)
        # Read in two minutes.
        self.assertLessEqual(len(readme.splitlines()), 130)


if __name__ == "__main__":
    unittest.main()
