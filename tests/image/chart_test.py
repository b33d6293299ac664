#!/usr/bin/env python3
"""The Helm chart (deploy/helm/outbox-relay) with Helm itself.

Helm 4 (helm.sh/helm/v4) and kubectl-validate are built from the Go module proxy into the
cache by `scripts/image tool` (no cluster, no registry, no download at run time besides the
Go modules). In order:
  - `helm lint --strict` of the default values and of every documented variant
    (deploy/helm/examples/);
  - each variant rendered (`helm template`, the `helm test` pod included) and validated against
    the Kubernetes 1.30 OpenAPI schemas and the Prometheus Operator's CRDs, as
    tests/image/manifests_test.py validates docs/deploy; every relay container carries only
    variables its command reads, credentials only from Secrets, integers as integers;
  - docs/deploy/*.yaml are exactly the chart's rendering of examples/review.yaml
    (scripts/gen-chart --check), so the plain manifests never drift from the chart;
  - values the chart must refuse (a misspelt setting, a wrong type, a value out of the relay's
    range, a credential inline, a grace period shorter than the drain, ...) are refused, each
    with a message naming what is wrong, while the same values without the fault render.
The chart's pod itself runs against the compose stack in tests/image/stack_test.py.
"""

import glob
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import unittest

import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "docs"))
import support  # noqa: E402  (tests/docs: what the binary reads)

# This directory's manifests_test (the validator, the Operator's CRDs); tests/docs has one of
# the same name.
manifests_test = support.load_script("image_manifests_test",
                                     os.path.join(HERE, "manifests_test.py"))

REPO = manifests_test.REPO
CHART = os.path.join(REPO, "deploy", "helm", "outbox-relay")
EXAMPLES = os.path.join(REPO, "deploy", "helm", "examples")
SECRET_SETTINGS = {"DATABASE_URL", "OUTBOX_KAFKA_PROPERTIES", "OUTBOX_REPLICATION_DATABASE_URL",
                   "OUTBOX_STANDBY_URL"}
# The documented variants: values files on top of the chart's defaults (README.md there).
VARIANTS = {
    "default": [],
    "review": ["review.yaml"],
    "review, hot standby": ["review.yaml", "hot-standby.yaml"],
    "prometheus-operator": ["prometheus-operator.yaml"],
    "exactly-once-tls": ["exactly-once-tls.yaml"],
    "watermill": ["watermill.yaml"],
}
COMMAND_OF = {"relay": "run", "cleanup": "cleanup", "check": "check"}

sh = manifests_test.sh


def helm_tool():
    return sh([os.path.join(REPO, "scripts", "image"), "tool", "helm"],
              timeout=1800).stdout.strip().splitlines()[-1]


class Chart(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.helm = helm_tool()
        cls.validator = sh([os.path.join(REPO, "scripts", "image"), "tool",
                            "kubectl-validate"]).stdout.strip().splitlines()[-1]
        module = json.loads(sh(["go", "mod", "download", "-json",
                                manifests_test.OPERATOR_MODULE]).stdout)
        cls.tmp = tempfile.mkdtemp(prefix="chart-")
        cls.crds = os.path.join(cls.tmp, "crds")
        os.mkdir(cls.crds)
        for name in manifests_test.OPERATOR_CRDS + ("monitoring.coreos.com_servicemonitors.yaml",):
            shutil.copy(os.path.join(module["Dir"], "example", "prometheus-operator-crd", name),
                        cls.crds)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def values_args(self, files):
        return [a for f in files for a in ("-f", os.path.join(EXAMPLES, f))]

    def template(self, files=(), sets=(), check=True):
        argv = [self.helm, "template", "review", CHART, "--namespace", "review"]
        argv += self.values_args(files)
        for s in sets:
            argv += ["--set", s]
        return sh(argv, check=check, timeout=120)

    def test_lint(self):
        for name, files in VARIANTS.items():
            with self.subTest(name):
                p = sh([self.helm, "lint", "--strict", CHART] + self.values_args(files),
                       check=False)
                self.assertEqual(p.returncode, 0, p.stdout)
                self.assertIn("0 chart(s) failed", p.stdout)

    def test_every_variant_renders_valid_objects(self):
        kinds = set()
        for name, files in VARIANTS.items():
            with self.subTest(name):
                text = self.template(files).stdout
                docs = [d for d in yaml.safe_load_all(text) if d]
                kinds |= {d["kind"] for d in docs}
                path = os.path.join(self.tmp, re.sub(r"\W+", "-", name) + ".yaml")
                with open(path, "w", encoding="utf-8") as f:
                    f.write(text)
                p = sh([self.validator, "--version", manifests_test.KUBERNETES_VERSION,
                        "--local-crds", self.crds, "--output", "human", path], check=False)
                self.assertEqual(p.returncode, 0, p.stdout)
                self.check_containers(name, docs)
        # Together the variants cover every object the chart makes.
        self.assertLessEqual({"Deployment", "Service", "PodMonitor", "ServiceMonitor",
                              "PrometheusRule", "ConfigMap", "PodDisruptionBudget", "CronJob",
                              "Pod"}, kinds)

    def check_containers(self, variant, docs):
        """Every relay container: only variables its command reads, credentials only by
        secretKeyRef; numbers as the relay parses them."""
        relay_containers = 0
        for d in docs:
            spec = d.get("spec", {})
            if d["kind"] == "CronJob":
                spec = spec["jobTemplate"]["spec"]["template"]["spec"]
            elif d["kind"] == "Deployment":
                spec = spec["template"]["spec"]
            elif d["kind"] != "Pod":
                continue
            for c in spec["containers"]:
                where = f"{variant}: {d['kind']} {d['metadata']['name']}: {c['name']}"
                env = c.get("env", [])
                if c["name"] not in COMMAND_OF:
                    continue
                relay_containers += 1
                self.assertEqual(c["args"][0], COMMAND_OF[c["name"]], where)
                cmd = support.commands()[COMMAND_OF[c["name"]]]
                reads = support.options_by_env(cmd)
                for e in env:
                    if e["name"].startswith("PG"):
                        continue  # libpq's own (extraEnv)
                    self.assertIn(e["name"], reads, f"{where}: {e['name']} is not read by "
                                  f"`outbox-relay {COMMAND_OF[c['name']]}`")
                    if e["name"] in SECRET_SETTINGS:
                        self.assertNotIn("value", e, f"{where}: {e['name']} inline")
                        self.assertIn("secretKeyRef", e["valueFrom"], where)
                    elif "value" in e:
                        problem = support.value_problem(reads[e["name"]], e["value"])
                        self.assertIsNone(problem, f"{where}: {e['name']}: {problem}")
                names = [e["name"] for e in env]
                self.assertIn("DATABASE_URL", names, where)
        self.assertGreaterEqual(relay_containers, 2, variant)

    def test_large_integers_and_kafka_properties(self):
        docs = [d for d in yaml.safe_load_all(self.template(["exactly-once-tls.yaml"]).stdout)
                if d]
        (dep,) = [d for d in docs if d["kind"] == "Deployment"]
        (c,) = dep["spec"]["template"]["spec"]["containers"]
        env = {e["name"]: e.get("value") for e in c["env"]}
        # YAML numbers reach templates as floats: 4194304 must not become 4.194304e+06.
        self.assertEqual(env["OUTBOX_MAX_IN_FLIGHT_BYTES"], "4194304")
        self.assertEqual(env["OUTBOX_DELIVERY"], "exactly-once")
        self.assertIn("--kafka-property=compression.type=zstd", c["args"])
        self.assertIn("--kafka-property=security.protocol=SASL_SSL", c["args"])
        (repl,) = [e for e in c["env"] if e["name"] == "OUTBOX_REPLICATION_DATABASE_URL"]
        self.assertEqual(repl["valueFrom"]["secretKeyRef"]["name"], "orders-outbox-relay-repl")

    def test_docs_deploy_is_the_charts_rendering(self):
        p = sh([sys.executable, os.path.join(REPO, "scripts", "gen-chart"), "--binary",
                support.BIN, "--helm", self.helm, "--check"], check=False)
        self.assertEqual(p.returncode, 0, p.stdout)
        self.assertGreaterEqual(len(glob.glob(os.path.join(REPO, "docs", "deploy", "*.yaml"))), 5)

    def test_bad_values_are_refused(self):
        # (--set of the fault, a pattern the error must contain). Each also rendered without
        # the fault: the refusal is the fault's.
        bad = {
            "a misspelt setting": ("config.OUTBOX_MAX_INFLIGHT=5", r"OUTBOX_MAX_INFLIGHT"),
            "a number as text": ("config.OUTBOX_MAX_IN_FLIGHT=lots",
                                 r"/config/OUTBOX_MAX_IN_FLIGHT.*want integer"),
            "below the relay's minimum": ("config.OUTBOX_MAX_IN_FLIGHT=0",
                                          r"/config/OUTBOX_MAX_IN_FLIGHT.*minimum"),
            "the seed's retention floor": ("config.OUTBOX_RETENTION_DAYS=2",
                                           r"/config/OUTBOX_RETENTION_DAYS.*minimum"),
            "not one of the choices": ("config.OUTBOX_DELIVERY=twice",
                                       r"/config/OUTBOX_DELIVERY.*at-least-once"),
            "a connection string inline": ("config.DATABASE_URL=postgresql://relay:pw@db/review",
                                           r"/config/DATABASE_URL.*secretEnv"),
            "a setting only the chart sets": ("config.OUTBOX_METRICS_ADDR=0.0.0.0:1",
                                              r"OUTBOX_METRICS_ADDR.*metrics\.port"),
            "an unknown secretEnv": ("secretEnv.OUTBOX_SLOT.key=x", r"OUTBOX_SLOT"),
            "a Kafka password inline": ("kafka.properties.sasl\\.password=x",
                                        r"sasl\.password"),
            "a credential in extraEnv": ("extraEnv[0].name=PGPASSWORD,extraEnv[0].value=x",
                                         r"/extraEnv/0.*valueFrom"),
            "a relay setting in extraEnv": ("extraEnv[0].name=OUTBOX_SLOT,extraEnv[0].value=x",
                                            r"/extraEnv/0/name"),
            "no replica": ("replicaCount=0", r"/replicaCount.*minimum"),
            "a grace period shorter than the drain": ("config.OUTBOX_SHUTDOWN_TIMEOUT_MS=60000",
                                                      r"terminationGracePeriodSeconds"),
            "a budget that blocks drains": ("replicaCount=2,podDisruptionBudget.maxUnavailable=1",
                                            r"podDisruptionBudget\.maxUnavailable"),
            "a schedule that is not cron": ("cleanup.schedule=nightly", r"/cleanup/schedule"),
            "an unknown value": ("replicas=2", r"replicas"),
        }
        self.template(["review.yaml"])  # the base renders
        for what, (fault, pattern) in bad.items():
            with self.subTest(what):
                p = self.template(["review.yaml"], [fault], check=False)
                self.assertNotEqual(p.returncode, 0, f"{what}: rendered:\n{p.stdout[:2000]}")
                self.assertRegex(p.stdout, pattern, what)


if __name__ == "__main__":
    unittest.main(verbosity=2)
