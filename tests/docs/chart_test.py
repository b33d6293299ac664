#!/usr/bin/env python3
"""The Helm chart (deploy/helm/outbox-relay) against the binary: its generated parts are
current (scripts/gen-chart --check: values.schema.json, templates/_settings.tpl, appVersion,
the copies of docs/alerts.yml and the dashboard), every setting of the commands the chart runs
is reachable from values.yaml, and every bound the schema puts on a number is one the relay
itself enforces (a value just past it ends the command with exit 2 naming the flag). Helm
itself runs in tests/image/chart_test.py (lint, render, validation, refused values)."""

import json
import os
import subprocess
import sys
import unittest

import support

CHART = os.path.join(support.REPO, "deploy", "helm", "outbox-relay")
GEN_CHART = os.path.join(support.REPO, "scripts", "gen-chart")


def schema():
    with open(os.path.join(CHART, "values.schema.json"), encoding="utf-8") as f:
        return json.load(f)


class Chart(unittest.TestCase):
    def test_generated_files_are_current(self):
        p = subprocess.run([sys.executable, GEN_CHART, "--binary", support.BIN, "--no-manifests",
                            "--check"], capture_output=True, text=True)
        self.assertEqual(p.returncode, 0, p.stderr)

    def test_every_setting_is_reachable(self):
        s = schema()
        settings = s["$defs"]["settings"]["properties"]
        secret = set(s["$defs"]["secretSettings"]["enum"])
        checked = 0
        for name in ("run", "cleanup", "check"):
            for o in support.commands()[name].settings():
                if not o.env:
                    continue
                self.assertIn(o.env, settings, f"{name}: {o.env} has no place in the chart")
                entry = settings[o.env]
                if o.env in secret:
                    # Refused as a value: it comes from a Secret (secretEnv).
                    self.assertIn("secretEnv", entry["const"])
                elif "const" in entry:
                    self.assertIn("set by the chart", entry["const"])
                else:
                    self.assertIn(o.flag, entry["description"])
                    checked += 1
        self.assertGreater(checked, 60)
        # The credentials: a connection string or Kafka's properties never inline.
        for env in ("DATABASE_URL", "OUTBOX_KAFKA_PROPERTIES", "OUTBOX_REPLICATION_DATABASE_URL",
                    "OUTBOX_STANDBY_URL"):
            self.assertIn(env, secret)

    def test_types_and_choices_are_the_binarys(self):
        settings = schema()["$defs"]["settings"]["properties"]
        for name in ("run", "cleanup", "check"):
            for o in support.commands()[name].settings():
                entry = settings.get(o.env or "", {})
                if "const" in entry or not o.env:
                    continue
                if o.choices:
                    self.assertEqual(entry["enum"], o.choices.split(","), o.env)
                elif o.type == "INT":
                    self.assertEqual(entry["type"], "integer", o.env)
                elif o.type in ("BOOLEAN", ""):
                    self.assertEqual(entry["type"], "boolean", o.env)
                else:
                    self.assertEqual(entry["type"], "string", o.env)

    def test_every_bound_is_the_relays(self):
        """Each minimum/maximum of the schema, one past it, is refused by the relay at start
        (exit 2, naming the setting), without reaching a server."""
        settings = schema()["$defs"]["settings"]["properties"]
        env0 = {k: v for k, v in os.environ.items() if not k.startswith(("OUTBOX_", "PG"))}
        env0.update(DATABASE_URL="postgresql://nobody@127.0.0.1:1/none?connect_timeout=1",
                    KAFKA_BROKERS="127.0.0.1:1")
        checked = 0
        for env, entry in sorted(settings.items()):
            if "minimum" not in entry and "maximum" not in entry:
                continue
            flag, rest = entry["description"].split(" ", 1)
            command = rest[1:rest.index(")")].split(", ")[0]
            what = rest.split(": ", 1)[1]
            # Settings checked only in their mode.
            context = {}
            if what.startswith("Exactly-once"):
                context["OUTBOX_DELIVERY"] = "exactly-once"
            if what.startswith("watermill mode"):
                context.update(OUTBOX_TABLE_MODE="watermill", OUTBOX_WATERMILL_TABLES="watermill_x")
            bad = []
            if "minimum" in entry:
                bad.append(entry["minimum"] - 1)
            if "maximum" in entry:
                bad.append(entry["maximum"] + 1)
            for value in bad:
                with self.subTest(env=env, value=value):
                    p = subprocess.run([support.BIN, command], capture_output=True, text=True,
                                       env=dict(env0, **context, **{env: str(value)}),
                                       timeout=20)
                    self.assertEqual(p.returncode, 2, p.stderr[-500:])
                    self.assertTrue(flag in p.stderr or env in p.stderr, p.stderr[-500:])
                    checked += 1
        self.assertGreater(checked, 20)


if __name__ == "__main__":
    unittest.main()
