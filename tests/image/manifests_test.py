#!/usr/bin/env python3
"""docs/deploy/*.yaml against the Kubernetes OpenAPI schemas, offline.

The validator is kubectl-validate (sigs.k8s.io/kubectl-validate, built from the Go module
proxy by `scripts/image tool kubectl-validate`): it runs the API server's own validation
(types, required fields, formats, names and labels) against the OpenAPI v3 schemas of
Kubernetes 1.23-1.30 built into it, so no cluster and no download is involved. The
Prometheus Operator's resources (PodMonitor, and docs/alerts.yml as the PrometheusRule that
docs/deploy/monitoring.yaml says to wrap it in) are checked against the operator's CRDs, taken
from its Go module (github.com/prometheus-operator/prometheus-operator, example/
prometheus-operator-crd).

A validator that accepts anything would pass too, so broken copies of the Deployment must be
refused. (The schemas check types, required and unknown fields; the API server's hand-written
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
        # The hot-standby file is a strategic-merge patch, not a whole object: checked merged
        # into the Deployment below.
        whole = [p for p in paths if not p.endswith("deployment-hot-standby.yaml")]
        p = self.validate(*whole)
        print(p.stdout)
        self.assertEqual(p.returncode, 0, p.stdout)

    def test_hot_standby_patch_gives_a_valid_deployment(self):
        with open(os.path.join(DEPLOY, "deployment.yaml"), encoding="utf-8") as f:
            (deployment,) = [d for d in yaml.safe_load_all(f) if d]
        with open(os.path.join(DEPLOY, "deployment-hot-standby.yaml"), encoding="utf-8") as f:
            (patch,) = [d for d in yaml.safe_load_all(f) if d]
        merged = strategic_merge(deployment, patch)
        path = os.path.join(self.tmp, "deployment-hot-standby-merged.yaml")
        with open(path, "w", encoding="utf-8") as f:
            yaml.safe_dump(merged, f)
        p = self.validate(path)
        self.assertEqual(p.returncode, 0, p.stdout)
        self.assertEqual(merged["spec"]["replicas"], patch["spec"]["replicas"])

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
            (deployment,) = [d for d in yaml.safe_load_all(f) if d]
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


def strategic_merge(base, patch):
    """The part of a strategic-merge patch the hot-standby file uses: maps merge, lists of
    named objects (containers, env) merge by name, other values replace."""
    if isinstance(base, dict) and isinstance(patch, dict):
        out = dict(base)
        for k, v in patch.items():
            out[k] = strategic_merge(base[k], v) if k in base else v
        return out
    if (isinstance(base, list) and isinstance(patch, list) and
            all(isinstance(x, dict) and "name" in x for x in base + patch)):
        out = list(base)
        for item in patch:
            names = [x["name"] for x in out]
            if item["name"] in names:
                i = names.index(item["name"])
                out[i] = strategic_merge(out[i], item)
            else:
                out.append(item)
        return out
    return patch


if __name__ == "__main__":
    unittest.main(verbosity=2)
