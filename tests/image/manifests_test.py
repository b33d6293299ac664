#!/usr/bin/env python3
"""docs/deploy/*.yaml against the Kubernetes OpenAPI schemas, offline.

The validator is kubectl-validate (sigs.k8s.io/kubectl-validate, built from the Go module
proxy by `scripts/image tool kubectl-validate`): it runs the API server's own validation
(types, required fields, formats, names and labels) against the OpenAPI v3 schemas of
Kubernetes 1.23-1.30 built into it, so no cluster and no download is involved. The
Prometheus Operator's resources (PodMonitor, and docs/alerts.yml as a PrometheusRule) are
checked against the operator's CRDs, taken
from its Go module (github.com/prometheus-operator/prometheus-operator, example/
prometheus-operator-crd).

docs/deploy is the Helm chart's rendering (scripts/gen-chart); tests/image/chart_test.py
validates the chart's other variants the same way. A validator that accepts anything would
pass too, so broken copies of the Deployment must be refused. (The schemas check types, required and unknown fields; the API server's hand-written
checks, such as the syntax of a port name, are not part of them.)
"""

import glob
import json
import os
import shutil
import subprocess
import tempfile
import unittest

import yaml

REPO = os.environ.get("OUTBOX_REPO_ROOT") or os.path.dirname(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEPLOY = os.path.join(REPO, "docs", "deploy")
KUBERNETES_VERSION = "1.30"  # the newest whose schemas kubectl-validate carries
OPERATOR_MODULE = "github.com/prometheus-operator/prometheus-operator@v0.85.0"
OPERATOR_CRDS = ("monitoring.coreos.com_podmonitors.yaml",
                 "monitoring.coreos.com_prometheusrules.yaml")


def sh(argv, timeout=900, check=True):
    p = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       timeout=timeout, check=False)
    if check and p.returncode != 0:
        raise AssertionError(f"{' '.join(argv)} exited {p.returncode}:\n{p.stdout[-4000:]}")
    return p


class Manifests(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.validator = sh([os.path.join(REPO, "scripts", "image"), "tool",
                            "kubectl-validate"]).stdout.strip().splitlines()[-1]
        module = json.loads(sh(["go", "mod", "download", "-json", OPERATOR_MODULE]).stdout)
        cls.tmp = tempfile.mkdtemp(prefix="manifests-")
        cls.crds = os.path.join(cls.tmp, "crds")
        os.mkdir(cls.crds)
        for name in OPERATOR_CRDS:
            shutil.copy(os.path.join(module["Dir"], "example", "prometheus-operator-crd", name),
                        cls.crds)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def validate(self, *paths):
        return sh([self.validator, "--version", KUBERNETES_VERSION, "--local-crds", self.crds,
                   "--output", "human"] + list(paths), check=False)

    def test_every_manifest_is_valid(self):
        paths = sorted(glob.glob(os.path.join(DEPLOY, "*.yaml")))
        self.assertGreaterEqual(len(paths), 5)
        p = self.validate(*paths)
        print(p.stdout)
        self.assertEqual(p.returncode, 0, p.stdout)

    def test_hot_standby_is_the_deployment_with_two_replicas(self):
        # The chart renders both files (scripts/gen-chart): the same Deployment, but for the
        # replicas, the rollout's maxUnavailable, the anti-affinity and the budget.
        def load(name):
            with open(os.path.join(DEPLOY, name), encoding="utf-8") as f:
                return {d["kind"]: d for d in yaml.safe_load_all(f) if d}
        one, two = load("deployment.yaml"), load("deployment-hot-standby.yaml")
        self.assertEqual(two["Deployment"]["spec"]["replicas"], 2)
        self.assertEqual(two["Deployment"]["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"], 2)
        anti = two["Deployment"]["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"]
        (term,) = anti["requiredDuringSchedulingIgnoredDuringExecution"]
        self.assertEqual(term["topologyKey"], "kubernetes.io/hostname")
        self.assertEqual(two["PodDisruptionBudget"]["spec"]["maxUnavailable"], 2)
        for doc in (one, two):
            doc["Deployment"]["spec"].pop("replicas")
            doc["Deployment"]["spec"].pop("strategy")
            doc["Deployment"]["spec"]["template"]["spec"].pop("affinity", None)
            doc["PodDisruptionBudget"]["spec"].pop("maxUnavailable")
        self.assertEqual(one, two)

    def test_alert_rules_as_a_prometheus_rule(self):
        with open(os.path.join(REPO, "docs", "alerts.yml"), encoding="utf-8") as f:
            rules = yaml.safe_load(f)
        doc = {"apiVersion": "monitoring.coreos.com/v1", "kind": "PrometheusRule",
               "metadata": {"name": "outbox-relay", "namespace": "review"}, "spec": rules}
        path = os.path.join(self.tmp, "prometheus-rule.yaml")
        with open(path, "w", encoding="utf-8") as f:
            yaml.safe_dump(doc, f)
        p = self.validate(path)
        self.assertEqual(p.returncode, 0, p.stdout)

    def test_a_broken_manifest_is_refused(self):
        with open(os.path.join(DEPLOY, "deployment.yaml"), encoding="utf-8") as f:
            (deployment,) = [d for d in yaml.safe_load_all(f) if d and d["kind"] == "Deployment"]
        broken = {
            "replicas as a string": lambda d: d["spec"].__setitem__("replicas", "one"),
            "unknown field in the container": lambda d: d["spec"]["template"]["spec"][
                "containers"][0].__setitem__("imagePullPolice", "Always"),
            "containerPort as a string": lambda d: d["spec"]["template"]["spec"][
                "containers"][0]["ports"][0].__setitem__("containerPort", "9464"),
            "probe timeout as a string": lambda d: d["spec"]["template"]["spec"][
                "containers"][0]["readinessProbe"].__setitem__("timeoutSeconds", "3s"),
        }
        for what, change in broken.items():
            with self.subTest(what):
                doc = json.loads(json.dumps(deployment))
                change(doc)
                path = os.path.join(self.tmp, "broken.yaml")
                with open(path, "w", encoding="utf-8") as f:
                    yaml.safe_dump(doc, f)
                self.assertNotEqual(self.validate(path).returncode, 0, what)


if __name__ == "__main__":
    unittest.main(verbosity=2)
