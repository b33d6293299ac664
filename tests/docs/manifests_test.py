#!/usr/bin/env python3
"""docker/compose.yml, docker/Dockerfile, docker/prometheus.yml and docs/deploy/*.yaml agree
with the binary: every environment variable given to the relay's image is one that the
command it runs reads (from its --help), with a value the flag accepts; the grace periods
outlast --shutdown-timeout-ms; probes, ports and scrape targets use --metrics-addr's port;
the CronJobs are the seed's; the image ships the libraries the binary links."""

import glob
import os
import re
import shutil
import subprocess
import unittest

import yaml

import support

DOCKER = os.path.join(support.REPO, "docker")
DEPLOY = os.path.join(support.REPO, "docs", "deploy")
RELAY_IMAGE = re.compile(r"(^|/)outbox-relay(:|$)")


def load_yaml(path):
    with open(path, encoding="utf-8") as f:
        return [d for d in yaml.safe_load_all(f) if d is not None]


def read(path):
    with open(path, encoding="utf-8") as f:
        return f.read()


def metrics_port():
    addr = support.default_of(support.commands()["run"], "--metrics-addr")
    return int(addr.rsplit(":", 1)[1])


def shutdown_timeout_ms(env):
    run = support.commands()["run"]
    return int(env.get("OUTBOX_SHUTDOWN_TIMEOUT_MS")
               or support.default_of(run, "--shutdown-timeout-ms"))


def duration_seconds(text):
    total = 0.0
    for number, unit in re.findall(r"([0-9.]+)(ms|s|m|h)", str(text)):
        total += float(number) * {"ms": 0.001, "s": 1, "m": 60, "h": 3600}[unit]
    return total


def pod_specs(doc):
    """(path, pod spec) of a Deployment, Job or CronJob document."""
    kind = doc.get("kind")
    spec = doc.get("spec", {})
    if kind in ("Deployment", "StatefulSet", "DaemonSet", "Job"):
        return [(f"{kind} {doc['metadata']['name']}", spec["template"]["spec"])]
    if kind == "CronJob":
        return [(f"CronJob {doc['metadata']['name']}",
                 spec["jobTemplate"]["spec"]["template"]["spec"])]
    return []


def k8s_env(container):
    return {e["name"]: e.get("value") for e in container.get("env", [])}


class EnvChecks(unittest.TestCase):
    def check_relay_env(self, where, args, env):
        """env (name -> value or None for valueFrom) suits the command `args` runs."""
        cmd = support.command_for_args(args or ["run"])
        self.assertIsNotNone(cmd, f"{where}: {args} is not an outbox-relay command")
        by_env = support.options_by_env(cmd)
        for name, value in env.items():
            self.assertTrue(name in by_env,
                            f"{where}: {name} is not read by `outbox-relay {' '.join(cmd.path)}` "
                            f"(see its --help / docs/configuration.md)")
            if value is not None:
                problem = support.value_problem(by_env[name], value)
                self.assertIsNone(problem, f"{where}: {name}: {problem}")
        return cmd

    def check_other_env(self, where, env):
        for name in env:
            self.assertFalse(name.startswith("OUTBOX_"),
                             f"{where}: {name} set on a container that is not the relay")


class Compose(EnvChecks):
    @classmethod
    def setUpClass(cls):
        cls.path = os.path.join(DOCKER, "compose.yml")
        (cls.doc,) = load_yaml(cls.path)
        cls.services = cls.doc["services"]

    def env(self, service):
        env = self.services[service].get("environment", {})
        if isinstance(env, list):
            env = dict(item.split("=", 1) if "=" in item else (item, None) for item in env)
        return {k: (None if v is None else str(v)) for k, v in env.items()}

    def test_services(self):
        self.assertLessEqual({"postgres", "kafka", "relay", "writer", "prometheus"},
                             set(self.services))

    def test_every_relay_variable_is_real(self):
        relay = self.services["relay"]
        env = self.env("relay")
        cmd = self.check_relay_env("compose relay", relay.get("command", ["run"]), env)
        self.assertEqual(cmd.path, ["run"])
        for required in ("DATABASE_URL", "KAFKA_BROKERS", "OUTBOX_SERVICE"):
            self.assertIn(required, env)
        for name, service in self.services.items():
            if name != "relay" and not RELAY_IMAGE.search(str(service.get("image", ""))):
                self.check_other_env(f"compose {name}", self.env(name))

    def test_relay_image_and_stop(self):
        relay = self.services["relay"]
        build = relay["build"]
        self.assertTrue(os.path.isfile(os.path.join(DOCKER, build["context"], build["dockerfile"])))
        self.assertEqual(os.path.normpath(os.path.join(DOCKER, build["context"])), support.REPO)
        grace = duration_seconds(relay["stop_grace_period"])
        self.assertGreater(grace * 1000, shutdown_timeout_ms(self.env("relay")),
                           "stop_grace_period must outlast --shutdown-timeout-ms")
        self.assertEqual(str(relay.get("user", "")).split(":")[0], "10001")

    def test_relay_port_and_healthcheck(self):
        relay = self.services["relay"]
        port = metrics_port()
        addr = self.env("relay").get("OUTBOX_METRICS_ADDR")
        if addr:
            port = int(addr.rsplit(":", 1)[1])
        self.assertIn(f"{port}:{port}", [str(p) for p in relay["ports"]])
        test = " ".join(relay["healthcheck"]["test"])
        self.assertIn(f"/dev/tcp/127.0.0.1/{port}", test)
        self.assertRegex(test, r"GET /(readyz|healthz) ")
        self.assertIn("bash", relay["healthcheck"]["test"])

    def test_postgres_is_logical_with_the_seed_table(self):
        pg = self.services["postgres"]
        self.assertRegex(pg["image"], r"^postgres:15")
        self.assertIn("wal_level=logical", pg["command"])
        mounts = [v.split(":") for v in pg["volumes"]]
        initdb = {m[1]: m[0] for m in mounts if m[1].startswith("/docker-entrypoint-initdb.d/")}
        self.assertIn("../sql/outbox.sql", initdb.values())
        for target, source in initdb.items():
            self.assertTrue(os.path.isfile(os.path.join(DOCKER, source)), source)
        # Scripts run in name order: the table before the role that is granted on it.
        ordered = [initdb[t] for t in sorted(initdb)]
        self.assertEqual(ordered[0], "../sql/outbox.sql")

    def test_kafka_is_kraft_single_node_of_the_tested_version(self):
        kafka = self.services["kafka"]
        pom = read(os.path.join(support.REPO, "scripts", "kafka", "pom.xml"))
        version = re.search(r"<kafka.version>([^<]+)</kafka.version>", pom).group(1)
        self.assertEqual(kafka["image"], f"apache/kafka:{version}")
        env = self.env("kafka")
        self.assertEqual(set(env["KAFKA_PROCESS_ROLES"].split(",")), {"broker", "controller"})
        brokers = self.env("relay")["KAFKA_BROKERS"]
        self.assertIn(f"PLAINTEXT://{brokers}", env["KAFKA_ADVERTISED_LISTENERS"])

    def test_writer_writes_the_seed_format(self):
        writer = self.services["writer"]
        self.assertRegex(writer["image"], r"^postgres:15")
        (mount,) = [v.split(":") for v in writer["volumes"]]
        script = read(os.path.join(DOCKER, mount[0]))
        self.assertIn("INSERT INTO outbox (uuid, payload, metadata)", script)
        keys = re.findall(r'"([A-Za-z-]+)":', re.search(r"format\('(\{.*?)\)::json", script,
                                                          re.S).group(1))
        self.assertEqual(keys, sorted(keys), "metadata keys sorted, as Go's json.Marshal writes")
        self.assertLessEqual({"Event-Type", "Source-Service", "Aggregate-Id"}, set(keys))

    def test_prometheus_scrapes_the_relay_and_loads_the_alerts(self):
        prom = self.services["prometheus"]
        mounts = dict(reversed(v.split(":")[:2]) for v in prom["volumes"])
        (config,) = load_yaml(os.path.join(DOCKER, mounts["/etc/prometheus/prometheus.yml"]))
        for rule_file in config["rule_files"]:
            self.assertEqual(os.path.normpath(os.path.join(DOCKER, mounts[rule_file])),
                             os.path.join(support.REPO, "docs", "alerts.yml"))
        targets = [t for sc in config["scrape_configs"] for s in sc["static_configs"]
                   for t in s["targets"]]
        self.assertIn(f"relay:{metrics_port()}", targets)

    @unittest.skipUnless(shutil.which("promtool"), "promtool not installed")
    def test_promtool_accepts_the_prometheus_config(self):
        import tempfile
        (config,) = load_yaml(os.path.join(DOCKER, "prometheus.yml"))
        with tempfile.TemporaryDirectory() as tmp:
            config["rule_files"] = [os.path.join(support.REPO, "docs", "alerts.yml")]
            path = os.path.join(tmp, "prometheus.yml")
            with open(path, "w", encoding="utf-8") as f:
                yaml.safe_dump(config, f)
            proc = subprocess.run(["promtool", "check", "config", path], capture_output=True,
                                  text=True)
            self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)


class Kubernetes(EnvChecks):
    @classmethod
    def setUpClass(cls):
        cls.docs = {}
        for path in sorted(glob.glob(os.path.join(DEPLOY, "*.yaml"))):
            cls.docs[os.path.basename(path)] = load_yaml(path)

    def find(self, kind, file=None):
        return [d for f, docs in self.docs.items() if file in (None, f) for d in docs
                if d.get("kind") == kind]

    def test_every_variable_of_every_relay_container_is_real(self):
        checked = 0
        for file, docs in self.docs.items():
            for doc in docs:
                for where, spec in pod_specs(doc):
                    for c in spec["containers"]:
                        env = k8s_env(c)
                        if RELAY_IMAGE.search(c["image"]):
                            self.check_relay_env(f"{file}: {where}", c.get("args", []), env)
                            checked += 1
                        else:
                            self.check_other_env(f"{file}: {where}", env)
        self.assertGreaterEqual(checked, 2)

    def relay_deployment(self):
        (dep,) = self.find("Deployment", "deployment.yaml")
        (container,) = dep["spec"]["template"]["spec"]["containers"]
        return dep, dep["spec"]["template"]["spec"], container

    def test_deployment(self):
        dep, pod, c = self.relay_deployment()
        self.assertEqual(dep["spec"]["replicas"], 1)
        self.assertEqual(c.get("args", ["run"])[0], "run")
        env = k8s_env(c)
        self.assertGreater(pod["terminationGracePeriodSeconds"] * 1000, shutdown_timeout_ms(env))
        (db,) = [e for e in c["env"] if e["name"] == "DATABASE_URL"]
        self.assertIn("secretKeyRef", db["valueFrom"])
        port = metrics_port()
        if env.get("OUTBOX_METRICS_ADDR"):
            port = int(env["OUTBOX_METRICS_ADDR"].rsplit(":", 1)[1])
        ports = {p["name"]: p["containerPort"] for p in c["ports"]}
        self.assertEqual(ports["metrics"], port)
        self.assertEqual(c["livenessProbe"]["httpGet"]["path"], "/healthz")
        self.assertEqual(c["readinessProbe"]["httpGet"]["path"], "/readyz")
        for probe in ("livenessProbe", "readinessProbe"):
            self.assertIn(c[probe]["httpGet"]["port"], ("metrics", port))
        annotations = dep["spec"]["template"]["metadata"]["annotations"]
        self.assertEqual(annotations["prometheus.io/port"], str(port))
        # Non-root with the image's uid, read-only root filesystem.
        self.assertEqual(pod["securityContext"]["runAsUser"], 10001)
        self.assertTrue(pod["securityContext"]["runAsNonRoot"])
        self.assertTrue(c["securityContext"]["readOnlyRootFilesystem"])
        dockerfile = read(os.path.join(DOCKER, "Dockerfile"))
        self.assertRegex(dockerfile, r"\nUSER 10001(:10001)?\n")
        self.assertRegex(dockerfile, rf"\nEXPOSE {port}\n")
        # A few tens of MB: requests and limits set, limit at most 256 MiB.
        res = c["resources"]
        for part in ("requests", "limits"):
            self.assertIn("memory", res[part])
            self.assertIn("cpu", res[part])
        self.assertLessEqual(int(res["limits"]["memory"].rstrip("Mi")), 256)

    def test_rollouts_can_finish_while_only_the_active_pod_is_ready(self):
        # Only the pod holding the slot is ready; a rollout must be allowed to stop it while
        # its successor waits as standby: maxUnavailable >= replicas.
        dep, _, _ = self.relay_deployment()
        cases = [dep["spec"]]
        (standby,) = self.find("Deployment", "deployment-hot-standby.yaml")
        self.assertEqual(standby["spec"]["replicas"], 2)
        cases.append(standby["spec"])
        for spec in cases:
            self.assertGreaterEqual(spec["strategy"]["rollingUpdate"]["maxUnavailable"],
                                    spec["replicas"])

    def test_cleanup_cronjob_is_the_seeds(self):
        (cj,) = self.find("CronJob", "cleanup-cronjob.yaml")
        spec = cj["spec"]
        self.assertEqual(spec["schedule"], "0 3 * * *")
        self.assertEqual(spec["concurrencyPolicy"], "Forbid")
        self.assertIn("startingDeadlineSeconds", spec)
        job = spec["jobTemplate"]["spec"]
        self.assertEqual(job["activeDeadlineSeconds"], 1800)
        self.assertEqual(job["backoffLimit"], 2)
        pod = job["template"]["spec"]
        self.assertEqual(pod["restartPolicy"], "OnFailure")
        (c,) = pod["containers"]
        self.assertIn(c["args"][0], ("cleanup", "outbox-cleanup"))
        env = k8s_env(c)
        self.assertEqual(env["OUTBOX_RETENTION_DAYS"], "7")
        self.assertEqual(env["OUTBOX_BATCH_SIZE"], "10000")
        self.assertEqual(env["OUTBOX_BATCH_SLEEP_MS"], "500")
        self.assertIn("DATABASE_URL", env)

    def test_vacuum_cronjob_is_the_seeds(self):
        (cj,) = self.find("CronJob", "vacuum-cronjob.yaml")
        spec = cj["spec"]
        self.assertEqual(spec["schedule"], "0 4 * * 0")
        self.assertEqual(spec["concurrencyPolicy"], "Forbid")
        (c,) = spec["jobTemplate"]["spec"]["template"]["spec"]["containers"]
        script = " ".join(c.get("command", []) + c.get("args", []))
        # The relay's table (OUTBOX_TABLE's default: public.outbox).
        table = support.default_of(support.commands()["run"], "--table")
        self.assertIn(f"VACUUM (VERBOSE, ANALYZE) {table};", script)
        self.assertNotIn("FULL", script)
        # Kubernetes turns $$ into $ in command/args: a $$ dollar quote would break.
        self.assertNotIn("$$", script)

    def test_scraping_selects_the_relay_pods(self):
        dep, _, c = self.relay_deployment()
        pod_labels = dep["spec"]["template"]["metadata"]["labels"]
        (pm,) = self.find("PodMonitor")
        for k, v in pm["spec"]["selector"]["matchLabels"].items():
            self.assertEqual(pod_labels.get(k), v)
        port_names = {p["name"] for p in c["ports"]}
        for ep in pm["spec"]["podMetricsEndpoints"]:
            self.assertIn(ep["port"], port_names)
        (svc,) = self.find("Service")
        for k, v in svc["spec"]["selector"].items():
            self.assertEqual(pod_labels.get(k), v)
        # The CronJobs' pods are not scraped as relays.
        for cj in self.find("CronJob"):
            labels = cj["spec"]["jobTemplate"]["spec"]["template"]["metadata"]["labels"]
            self.assertFalse(all(labels.get(k) == v
                                 for k, v in pm["spec"]["selector"]["matchLabels"].items()))


class Image(unittest.TestCase):
    def dockerfile(self):
        return read(os.path.join(DOCKER, "Dockerfile"))

    def apt_packages(self, stage):
        text = self.dockerfile().split("\nFROM ")[stage]
        m = re.search(r"apt-get install[^\n]*\\\n(.*?)\n &&", text, re.S)
        return set(m.group(1).replace("\\", " ").split())

    @unittest.skipUnless(shutil.which("dpkg-query") and shutil.which("readelf"),
                         "not Debian: no dpkg to map libraries to packages")
    def test_runtime_packages_are_the_binarys_libraries(self):
        out = subprocess.run(["readelf", "-d", support.BIN], capture_output=True, text=True,
                             check=True).stdout
        needed = re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", out)
        ldd = subprocess.run(["ldd", support.BIN], capture_output=True, text=True).stdout
        resolved = dict(re.findall(r"^\s*(\S+) => (/\S+)", ldd, re.M))
        packages = set()
        for lib in needed:
            if re.match(r"lib(asan|ubsan|tsan|lsan)\.", lib):
                continue  # a sanitizer build of the tests
            if re.match(r"ld-linux", lib):
                # The dynamic loader (libc6, in the base image), named by the static librdkafka's
                # position-independent code (its thread-locals go through __tls_get_addr); ldd
                # lists it without "=>".
                continue
            self.assertIn(lib, resolved, f"ldd cannot resolve {lib}")
            path = resolved[lib]
            # Merged /usr: dpkg may record either spelling of the directory.
            candidates = [path, os.path.realpath(path),
                          path[4:] if path.startswith("/usr/") else "/usr" + path]
            owner = None
            for candidate in candidates:
                proc = subprocess.run(["dpkg-query", "-S", candidate], capture_output=True,
                                      text=True)
                if proc.returncode == 0:
                    owner = proc.stdout.split(":")[0]
                    break
            self.assertIsNotNone(owner, f"no package owns {path}")
            packages.add(owner)
        base = {"libc6", "libstdc++6", "libgcc-s1"}
        runtime = self.apt_packages(2)
        self.assertEqual(runtime - {"ca-certificates"}, packages - base,
                         "docker/Dockerfile's runtime packages differ from the libraries the "
                         "binary links (readelf -d; dpkg -S)")

    def test_build_packages_are_in_scripts_deps(self):
        deps = read(os.path.join(support.REPO, "scripts", "deps"))
        listed = set(re.search(r"PACKAGES=\((.*?)\n\)", deps, re.S).group(1).split())
        self.assertLessEqual(self.apt_packages(1), listed)

    def test_build_context_keeps_what_the_build_copies(self):
        ignore = read(os.path.join(DOCKER, "Dockerfile.dockerignore")).split("\n")
        kept = {line[1:].rstrip("/") for line in ignore if line.startswith("!")}
        copied = re.findall(r"\nCOPY (?!--from)(\S+)", self.dockerfile())
        for src in copied:
            self.assertIn(src.rstrip("/"), kept)
            self.assertTrue(os.path.exists(os.path.join(support.REPO, src)))


if __name__ == "__main__":
    unittest.main()
