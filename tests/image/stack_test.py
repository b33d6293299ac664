#!/usr/bin/env python3
"""docker/compose.yml brought up as users bring it up, then the Deployment's pod started
beside it the way the kubelet starts it.

The stack runs on scripts/image's isolated engine: a Docker engine in a network namespace of
its own, so compose's bridge network, its addresses and its published ports (5432, 29092,
9464, 9090) exist only in there; the test reaches them with `scripts/image isolated-exec`.
The images are the test-only ones under the tags compose.yml names (tests/image/images/) and
outbox-relay:local.

In order (one class, numbered tests; a failure stops the rest):
  1. `docker-compose up -d`: every service starts, the relay becomes healthy (its healthcheck
     asks /readyz), postgres' init scripts ran;
  2. the writer's events arrive in Kafka: every acked row of the outbox table is a record of
     kazmaps.review.review with the row's uuid, key, value and headers, no record without a
     row, each review's versions in order;
  3. Prometheus scrapes the relay (target up, the seed's metrics with service="review") and
     loaded every rule of docs/alerts.yml;
  4. the Helm chart's Deployment (deploy/helm/outbox-relay rendered with
     deploy/helm/examples/review.yaml, which is docs/deploy/deployment.yaml too), its container
     started as the kubelet would (env with the Secret's value, args, security context,
     read-only root, resources, grace period) on the stack's network: liveness and readiness
     answer on the probes' port and paths (a standby while compose's relay holds the slot,
     ready once it stops), it publishes and marks rows (every acked row in Kafka: lost = 0,
     phantom = 0), and `docker stop` with the pod's grace period ends in exit 0;
  5. the chart's CronJobs' containers (the seed's cleanup and VACUUM), started the same way,
     run to completion with exit 0 against the stack's database;
  6. `docker-compose stop` ends every service cleanly, `docker-compose down -v` leaves no
     container, network or volume.

docker-compose is Debian's (1.29): it predates the compose spec's top-level `name`, so it runs
a copy of compose.yml without that key, with `-p <name>` and the same project directory.
"""

import json
import os
import re
import subprocess
import sys
import tempfile
import time
import unittest

import yaml

REPO = os.environ.get("OUTBOX_REPO_ROOT") or os.path.dirname(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
IMAGE_SCRIPT = os.path.join(REPO, "scripts", "image")
COMPOSE_FILE = os.path.join(REPO, "docker", "compose.yml")
CHART = os.path.join(REPO, "deploy", "helm", "outbox-relay")
CHART_VALUES = os.path.join(REPO, "deploy", "helm", "examples", "review.yaml")
ALERTS = os.path.join(REPO, "docs", "alerts.yml")
DOCKER = "/usr/bin/docker"
RELAY_IMAGE = os.environ.get("OUTBOX_IMAGE", "outbox-relay:local")


def sh(argv, timeout=120, check=True, env=None):
    p = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       timeout=timeout, env=env, check=False)
    if check and p.returncode != 0:
        raise AssertionError(f"{' '.join(argv)} exited {p.returncode}:\n{p.stdout[-4000:]}")
    return p


def in_netns(argv, timeout=60, check=True):
    """argv in the isolated engine's network namespace (its localhost has the published
    ports)."""
    return sh([IMAGE_SCRIPT, "isolated-exec"] + argv, timeout=timeout, check=check)


HTTP_GET = ("import sys, urllib.request, urllib.error\n"
            "try:\n"
            "    r = urllib.request.urlopen(sys.argv[1], timeout=float(sys.argv[2]))\n"
            "    print(r.status); sys.stdout.write(r.read().decode())\n"
            "except urllib.error.HTTPError as e:\n"
            "    print(e.code); sys.stdout.write(e.read().decode())\n"
            "except Exception as e:\n"
            "    print(0); print(e)\n")


def http_get(url, timeout=3):
    """(status, body) of a GET from inside the namespace; status 0: no answer."""
    p = in_netns(["/usr/bin/python3", "-c", HTTP_GET, url, str(timeout)], check=False,
                 timeout=timeout + 30)
    status, _, body = p.stdout.partition("\n")
    return int(status or 0), body


def wait_for(what, probe, timeout, interval=1.0):
    """Calls probe() until it returns a true value; fails with `what` after `timeout` s."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = probe()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"{what}: not within {timeout} s (last: {last!r})")


class Stack(unittest.TestCase):
    failed = False

    @classmethod
    def setUpClass(cls):
        with open(COMPOSE_FILE, encoding="utf-8") as f:
            cls.compose = yaml.safe_load(f)
        cls.project = cls.compose.get("name", "docker")
        sh([IMAGE_SCRIPT, "isolated-up", "--owner", "ctest"], timeout=900)
        host = sh([IMAGE_SCRIPT, "isolated-env"]).stdout.strip()
        cls.env = dict(os.environ, DOCKER_HOST=host.split("=", 1)[1])
        # Debian's docker-compose 1.29: the same file without the top-level `name`.
        spec = {k: v for k, v in cls.compose.items() if k != "name"}
        fd, cls.compose_copy = tempfile.mkstemp(prefix="compose-", suffix=".yml")
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            yaml.safe_dump(spec, f, sort_keys=False)
        cls.compose_cmd = ["docker-compose", "-p", cls.project, "-f", cls.compose_copy,
                           "--project-directory", os.path.dirname(COMPOSE_FILE)]
        # A stack left over by an interrupted run.
        cls.dc(["down", "-v", "--remove-orphans"], check=False)

    @classmethod
    def tearDownClass(cls):
        if getattr(cls, "compose_copy", None):
            if cls.failed:
                p = cls.dc(["logs", "--no-color", "--tail", "60"], check=False, timeout=120)
                sys.stderr.write(f"---- docker-compose logs ----\n{p.stdout}\n")
            cls.dc(["down", "-v", "--remove-orphans"], check=False, timeout=300)
            os.unlink(cls.compose_copy)

    def setUp(self):
        if Stack.failed:
            self.skipTest("an earlier step of the stack failed")

    def run(self, result=None):
        before = len(result.failures) + len(result.errors) if result else 0
        out = super().run(result)
        if result and len(result.failures) + len(result.errors) > before:
            Stack.failed = True
        return out

    @classmethod
    def dc(cls, args, timeout=300, check=True):
        return sh(cls.compose_cmd + args, timeout=timeout, check=check, env=cls.env)

    @classmethod
    def docker(cls, args, timeout=120, check=True):
        return sh([DOCKER] + args, timeout=timeout, check=check, env=cls.env)

    def container(self, service):
        cid = self.dc(["ps", "-q", service]).stdout.strip()
        self.assertTrue(cid, f"no container for service {service}")
        return cid

    def inspect(self, cid, fmt):
        return self.docker(["inspect", "-f", fmt, cid]).stdout.strip()

    def psql(self, sql):
        return self.dc(["exec", "-T", "postgres", "psql", "-X", "-q", "-v", "ON_ERROR_STOP=1",
                        "-U", "postgres", "-d", "review", "-tAc", sql]).stdout

    def test_1_up(self):
        t0 = time.monotonic()
        self.dc(["up", "-d", "--no-build"], timeout=600)
        relay = self.container("relay")
        wait_for("the relay container healthy (its healthcheck asks /readyz)",
                 lambda: self.inspect(relay, "{{.State.Health.Status}}") == "healthy",
                 timeout=240, interval=2)
        for service in self.compose["services"]:
            cid = self.container(service)
            self.assertEqual(self.inspect(cid, "{{.State.Status}}"), "running", service)
        print(f"stack: up and the relay healthy in {time.monotonic() - t0:.1f} s")
        # What 20-relay-role.sql made: the relay's role, its publication.
        self.assertEqual(self.psql("SELECT rolreplication FROM pg_roles WHERE rolname = 'relay'")
                         .strip(), "t")
        self.assertEqual(self.psql("SELECT count(*) FROM pg_publication_tables "
                                   "WHERE pubname = 'outbox_relay'").strip(), "1")

    def acked_rows(self):
        out = self.psql("SELECT json_build_object('uuid', uuid, 'payload', payload::text, "
                        "'metadata', metadata::text, 'offset', offset_consumed) "
                        "FROM outbox WHERE offset_acked IS NOT NULL ORDER BY offset_consumed")
        return [json.loads(line) for line in out.splitlines() if line.strip()]

    def records(self):
        """Every record of kazmaps.review.review, read through the host listener compose.yml
        documents for kcat (localhost:29092), with its headers as a list of pairs."""
        p = in_netns(["kcat", "-b", "localhost:29092", "-C", "-t", "kazmaps.review.review",
                      "-o", "beginning", "-e", "-q", "-J"], timeout=120)
        records = [json.loads(line) for line in p.stdout.splitlines() if line.startswith("{")]
        for r in records:
            h = r.get("headers") or []
            r["headers_list"] = list(zip(h[0::2], h[1::2]))
        return records

    def delivery(self, rows, records=None):
        """(lost, phantom, duplicates) of the acked rows against the topic: lost = acked
        rows without a record, phantom = records of no row in the table."""
        if records is None:
            records = self.records()
        by_uuid = {}
        duplicates = 0
        for r in records:
            uuid = dict(r["headers_list"]).get("_watermill_message_uuid")
            if uuid in by_uuid:
                duplicates += 1
            by_uuid.setdefault(uuid, r)
        self.by_uuid = by_uuid
        table_uuids = set(self.psql("SELECT uuid FROM outbox").split())
        lost = [row for row in rows if row["uuid"] not in by_uuid]
        phantom = [u for u in by_uuid if u not in table_uuids]
        return lost, phantom, duplicates

    def test_2_writer_events_arrive_in_kafka(self):
        wait_for("50 of the writer's rows acked by the relay",
                 lambda: int(self.psql("SELECT count(*) FROM outbox "
                                       "WHERE offset_acked IS NOT NULL")) >= 50,
                 timeout=120, interval=2)
        rows = self.acked_rows()
        records = self.records()
        lost, phantom, duplicates = self.delivery(rows, records)
        by_uuid = self.by_uuid
        mismatches = []
        for row in rows:
            r = by_uuid.get(row["uuid"])
            if r is None:
                continue
            metadata = json.loads(row["metadata"])
            want_headers = ([("_watermill_message_uuid", row["uuid"])] +
                            sorted(list(metadata.items()) +
                                   [("partition_key", metadata["Aggregate-Id"])]))
            if (r["key"] != metadata["Aggregate-Id"] or r["payload"] != row["payload"] or
                    r["headers_list"] != want_headers):
                mismatches.append((row, r))
        # Each review's versions in the order it wrote them (one key, one partition).
        order_violations = 0
        last_version = {}
        for r in sorted(records, key=lambda r: (r["partition"], r["offset"])):
            version = json.loads(r["payload"])["version"]
            if version <= last_version.get(r["key"], 0):
                order_violations += 1
            last_version[r["key"]] = version
        print(f"stack: {len(rows)} acked rows, {len(records)} records in kazmaps.review.review: "
              f"lost={len(lost)} phantom={len(phantom)} duplicates={duplicates} "
              f"mismatches={len(mismatches)} order_violations={order_violations}")
        self.assertEqual(lost, [])
        self.assertEqual(phantom, [])
        self.assertEqual(mismatches[:3], [])
        self.assertEqual(order_violations, 0)

    def prometheus(self, path):
        status, body = http_get("http://localhost:9090" + path)
        self.assertEqual(status, 200, body)
        return json.loads(body)["data"]

    def test_3_prometheus_scrapes_the_relay(self):
        def relay_target_up():
            targets = self.prometheus("/api/v1/targets")["activeTargets"]
            relay = [t for t in targets if t["labels"].get("job") == "outbox-relay"]
            return relay and relay[0]["health"] == "up" and relay[0]
        target = wait_for("Prometheus' outbox-relay target up", relay_target_up, timeout=90,
                          interval=3)
        self.assertEqual(target["scrapeUrl"], "http://relay:9464/metrics")
        for query in ('outbox_rows_total{service="review"}',
                      'events_published_total{service="review",topic="kazmaps.review.review"}'):
            result = wait_for(f"{query} in Prometheus",
                              lambda: self.prometheus("/api/v1/query?query=" +
                                                      urllib_quote(query))["result"],
                              timeout=60, interval=3)
            self.assertTrue(result, query)
        with open(ALERTS, encoding="utf-8") as f:
            want = sorted(r["alert"] for g in yaml.safe_load(f)["groups"] for r in g["rules"]
                          if "alert" in r)
        groups = self.prometheus("/api/v1/rules")["groups"]
        loaded = sorted(r["name"] for g in groups for r in g["rules"] if r["type"] == "alerting")
        unhealthy = [r["name"] for g in groups for r in g["rules"] if r.get("health") == "err"]
        print(f"stack: Prometheus scrapes {target['scrapeUrl']}, {len(loaded)} alert rules "
              f"loaded from docs/alerts.yml")
        self.assertEqual(loaded, want)
        self.assertEqual(unhealthy, [])

    @classmethod
    def chart(cls):
        """The Helm chart rendered with the values docs/deploy is rendered with (the review
        service: its Secrets' names are those of SECRETS below)."""
        if getattr(cls, "rendered", None) is None:
            helm = sh([IMAGE_SCRIPT, "tool", "helm"], timeout=1800).stdout.strip().splitlines()[-1]
            out = sh([helm, "template", "review", CHART, "--namespace", "review", "-f",
                      CHART_VALUES]).stdout
            cls.rendered = [d for d in yaml.safe_load_all(out) if d]
        return cls.rendered

    def test_4_deployment_pod_runs_as_the_kubelet_starts_it(self):
        pod = KubeletStyle(self, self.chart(), "Deployment")
        acked_before = int(self.psql("SELECT count(*) FROM outbox WHERE offset_acked IS NOT NULL"))
        pod.start()
        try:
            pod.check()
        finally:
            pod.remove()
        # What the chart's pod published: every row it marked is in Kafka (with all the
        # earlier ones), none that is not in the table.
        rows = self.acked_rows()
        self.assertGreater(len(rows), acked_before)
        lost, phantom, duplicates = self.delivery(rows)
        print(f"pod: {len(rows) - acked_before} more rows acked while the chart's pod ran; "
              f"all {len(rows)} acked: lost={len(lost)} phantom={len(phantom)} "
              f"duplicates={duplicates}")
        self.assertEqual(lost, [])
        self.assertEqual(phantom, [])

    def test_5_cronjobs_run_as_the_kubelet_starts_them(self):
        # The seed's nightly cleanup (the relay's image, its role) and weekly VACUUM (the
        # postgres image, the table's owner), each to completion, with the Job's deadline.
        for component, expect in (("cleanup", r"cleanup: done in"),
                                  ("vacuum", r"INFO:\s+vacuuming")):
            (doc,) = [d for d in self.chart() if d["kind"] == "CronJob" and
                      d["metadata"]["labels"]["app.kubernetes.io/component"] == component]
            job = KubeletStyle(self, [doc], "CronJob")
            deadline = job.doc["spec"]["jobTemplate"]["spec"].get("activeDeadlineSeconds", 600)
            try:
                code, out = job.run_to_completion(min(deadline, 300))
            finally:
                job.remove()
            print(f"job {job.name}: exit {code}, {len(out.splitlines())} lines of output")
            self.assertEqual(code, 0, out[-3000:])
            self.assertRegex(out, expect)

    def test_6_stop_and_down_leave_nothing(self):
        ids = {s: self.container(s) for s in self.compose["services"]}
        t0 = time.monotonic()
        self.dc(["stop"], timeout=300)
        print(f"stack: docker-compose stop in {time.monotonic() - t0:.1f} s")
        self.assertEqual(self.inspect(ids["relay"], "{{.State.ExitCode}}"), "0",
                         "the relay did not exit 0 on compose's SIGTERM")
        self.dc(["down", "-v", "--remove-orphans"], timeout=300)
        label = f"label=com.docker.compose.project={self.project}"
        self.assertEqual(self.docker(["ps", "-aq", "--filter", label]).stdout.strip(), "")
        self.assertEqual(self.docker(["network", "ls", "-q", "--filter", label]).stdout.strip(),
                         "")
        self.assertEqual(self.docker(["volume", "ls", "-q", "--filter", label]).stdout.strip(),
                         "")


def expand(text, env):
    """The kubelet's expansion of command, args and env values: $(NAME) becomes the value of
    an earlier variable (left as it is when there is none), $$ becomes $."""
    return re.sub(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)",
                  lambda m: "$" if m.group(0) == "$$" else env.get(m.group(1), m.group(0)),
                  text)


def urllib_quote(s):
    from urllib.parse import quote
    return quote(s, safe="")


class KubeletStyle:
    """The Deployment's pod, started with `docker run` the way the kubelet starts it, on the
    compose stack's network (the pod's own network namespace and address, as in a cluster).

    What the kubelet does with each field of the container spec and how it maps here:
      image                       -> the local image of that name (outbox-relay:local for the
                                     manifest's example registry, the test postgres:15)
      command/args                -> entrypoint/command (args only: the image's ENTRYPOINT)
      env value, command, args    -> unchanged but for the kubelet's $(NAME) and $$ expansion
      env valueFrom.secretKeyRef  -> the Secret's value (test Secrets below); an optional
                                     reference to a missing Secret is left out, as the kubelet
                                     does
      pod/container securityContext runAsUser/runAsGroup -> --user; runAsNonRoot -> the user
                                     must not be 0; readOnlyRootFilesystem -> --read-only;
                                     allowPrivilegeEscalation false -> no-new-privileges;
                                     capabilities.drop ALL -> --cap-drop ALL; seccomp
                                     RuntimeDefault -> the engine's default profile
      resources.limits            -> --memory, --cpus
      volumes (emptyDir)          -> --tmpfs at the mount path; other kinds fail the test
      automountServiceAccountToken false -> no token mounted
      terminationGracePeriodSeconds -> docker stop -t
      probes (httpGet)            -> GET http://<pod address>:<port>/<path>, port by name or
                                     number, success 200-399
    The cluster addresses of KAFKA_BROKERS are kept and resolve to the stack's broker
    (--add-host), as cluster DNS would resolve them.
    """

    # The Secrets the manifests reference, with the compose stack's credentials: the relay's
    # least-privilege role, and the table's owner for the VACUUM job.
    SECRETS = {
        ("review-outbox-relay-db", "url"): "postgresql://relay:relay@postgres:5432/review",
        ("review-db-owner", "url"): "postgresql://postgres:postgres@postgres:5432/review",
    }
    # The public images the manifests name and the local ones standing in for them.
    IMAGES = {"outbox-relay": RELAY_IMAGE, "postgres": "postgres:15"}

    def __init__(self, test, docs, kind):
        self.t = test
        (self.doc,) = [d for d in docs if d["kind"] == kind]
        spec = self.doc["spec"]
        if kind == "CronJob":
            spec = spec["jobTemplate"]["spec"]
        self.pod = spec["template"]["spec"]
        (self.c,) = self.pod["containers"]
        self.name = f"{self.doc['metadata']['name']}-test"
        image = re.sub(r"^.*/", "", self.c["image"]).split(":")[0]
        self.t.assertIn(image, self.IMAGES, self.c["image"])
        self.image = self.IMAGES[image]

    def security(self):
        pod_sc = self.pod.get("securityContext", {})
        sc = dict(pod_sc, **self.c.get("securityContext", {}))
        args = []
        uid = sc.get("runAsUser")
        gid = sc.get("runAsGroup")
        if uid is not None:
            args += ["--user", f"{uid}:{gid}" if gid is not None else str(uid)]
        if sc.get("runAsNonRoot"):
            user = str(uid) if uid is not None else self.t.docker(
                ["image", "inspect", "-f", "{{.Config.User}}", self.image]).stdout.strip()
            self.t.assertRegex(user.split(":")[0], r"^[1-9][0-9]*$",
                               "runAsNonRoot: the kubelet refuses a user it cannot verify as "
                               "non-root (a name, or 0)")
        if sc.get("readOnlyRootFilesystem"):
            args.append("--read-only")
        if sc.get("allowPrivilegeEscalation") is False:
            args += ["--security-opt", "no-new-privileges"]
        caps = sc.get("capabilities", {})
        for cap in caps.get("drop", []):
            args += ["--cap-drop", cap]
        for cap in caps.get("add", []):
            args += ["--cap-add", cap]
        seccomp = sc.get("seccompProfile", {}).get("type")
        self.t.assertIn(seccomp, (None, "RuntimeDefault"), "seccomp profile")
        return args

    def env_values(self):
        values = {}
        for e in self.c.get("env", []):
            if "value" in e:
                values[e["name"]] = expand(str(e["value"]), values)
                continue
            ref = e["valueFrom"]["secretKeyRef"]
            value = self.SECRETS.get((ref["name"], ref["key"]))
            if value is None:
                self.t.assertTrue(ref.get("optional"),
                                  f"{e['name']}: Secret {ref['name']} is required")
                continue
            values[e["name"]] = value
        return values

    def env(self):
        return [a for k, v in self.env_values().items() for a in ("-e", f"{k}={v}")]

    def command(self):
        """--entrypoint and the arguments after the image, with the kubelet's $(VAR)
        expansion."""
        env = self.env_values()
        command = [expand(a, env) for a in self.c.get("command", [])]
        args = [expand(a, env) for a in self.c.get("args", [])]
        if command:
            return ["--entrypoint", command[0]], [self.image] + command[1:] + args
        return [], [self.image] + args

    def volumes(self):
        by_name = {v["name"]: v for v in self.pod.get("volumes", [])}
        args = []
        for m in self.c.get("volumeMounts", []):
            v = by_name[m["name"]]
            self.t.assertIn("emptyDir", v, f"volume {m['name']}: only emptyDir is mapped")
            args += ["--tmpfs", m["mountPath"]]
        return args

    def resources(self):
        limits = self.c.get("resources", {}).get("limits", {})
        args = []
        if "memory" in limits:
            m = re.fullmatch(r"(\d+)(Mi|Gi)", str(limits["memory"]))
            self.t.assertIsNotNone(m, limits["memory"])
            args += ["--memory", f"{int(m[1]) * (1024 if m[2] == 'Gi' else 1)}m"]
        if "cpu" in limits:
            cpu = str(limits["cpu"])
            args += ["--cpus", str(int(cpu[:-1]) / 1000 if cpu.endswith("m") else float(cpu))]
        return args

    def run_argv(self, detach):
        t = self.t
        kafka_ip = t.inspect(t.container("kafka"),
                             "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}")
        hosts = []
        for broker in self.env_values().get("KAFKA_BROKERS", "").split(","):
            if broker:
                hosts += ["--add-host", f"{broker.rsplit(':', 1)[0]}:{kafka_ip}"]
        network = f"{t.project}_default"
        entrypoint, rest = self.command()
        argv = ["run"] + (["-d"] if detach else []) + [
            "--name", self.name, "--hostname", self.name, "--network", network]
        argv += self.security() + self.env() + self.volumes() + self.resources() + hosts
        return argv + entrypoint + rest

    def start(self):
        t = self.t
        t.docker(["rm", "-f", self.name], check=False)
        t.docker(self.run_argv(detach=True))
        self.ip = wait_for("the pod's address", lambda: t.inspect(
            self.name, "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}"), timeout=10)

    def run_to_completion(self, deadline):
        """A Job's pod: runs until it exits; (exit code, output)."""
        self.t.docker(["rm", "-f", self.name], check=False)
        p = self.t.docker(self.run_argv(detach=False), timeout=deadline, check=False)
        return p.returncode, p.stdout

    def probe_url(self, probe):
        get = probe["httpGet"]
        port = get["port"]
        if isinstance(port, str):
            (port,) = [p["containerPort"] for p in self.c["ports"] if p.get("name") == port]
        return f"http://{self.ip}:{port}{get.get('path', '/')}", probe.get("timeoutSeconds", 1)

    def probe(self, kind):
        url, timeout = self.probe_url(self.c[kind])
        status, body = http_get(url, timeout)
        return status, body

    def check(self):
        t = self.t
        # Liveness: up within the probes' first period, also as a standby.
        live = wait_for("livenessProbe answers 200-399",
                        lambda: 200 <= self.probe("livenessProbe")[0] < 400 and "ok",
                        timeout=60)
        # Compose's relay holds the slot: the pod is the standby, not ready.
        status, body = self.probe("readinessProbe")
        t.assertEqual(status, 503, f"a standby must not be ready: {body}")
        # The hand-over of a rollout: the active relay stops, the pod takes the slot.
        acked_before = int(t.psql("SELECT count(*) FROM outbox WHERE offset_acked IS NOT NULL"))
        t.dc(["stop", "relay"], timeout=120)
        ready = wait_for("readinessProbe 200 after the active relay stopped",
                         lambda: self.probe("readinessProbe")[0] == 200 and "ready", timeout=60)
        wait_for("the pod publishes and marks the writer's rows",
                 lambda: int(t.psql("SELECT count(*) FROM outbox "
                                    "WHERE offset_acked IS NOT NULL")) > acked_before + 20,
                 timeout=60, interval=2)
        user = t.inspect(self.name, "{{.Config.User}} {{.HostConfig.ReadonlyRootfs}}")
        print(f"pod: liveness {live}, readiness {ready} on "
              f"{self.probe_url(self.c['readinessProbe'])[0]} ({user})")
        # The memory limit is in force (the engine applies it), and the relay's peak so far.
        limit = int(t.inspect(self.name, "{{.HostConfig.Memory}}"))
        want = [a for a in self.resources() if a.endswith("m") and a[:-1].isdigit()]
        if want:
            t.assertEqual(limit, int(want[0][:-1]) * 1024 * 1024, "memory limit not applied")
        pid = t.inspect(self.name, "{{.State.Pid}}")
        with open(f"/proc/{pid}/status", encoding="utf-8") as f:
            peak = [line.split()[1] for line in f if line.startswith("VmHWM:")][0]
        print(f"pod: memory limit {limit >> 20} MiB, the relay's peak RSS {int(peak) >> 10} MiB")
        grace = self.pod.get("terminationGracePeriodSeconds", 30)
        t0 = time.monotonic()
        t.docker(["stop", "-t", str(grace), self.name], timeout=grace + 60)
        took = time.monotonic() - t0
        print(f"pod: docker stop -t {grace} took {took:.1f} s")
        t.assertEqual(t.inspect(self.name, "{{.State.ExitCode}}"), "0",
                      t.docker(["logs", "--tail", "40", self.name]).stdout)
        t.assertLess(took, grace)
        # Compose's relay back, for the last step.
        t.dc(["start", "relay"], timeout=120)

    def remove(self):
        self.t.docker(["rm", "-f", self.name], check=False)


if __name__ == "__main__":
    unittest.main(verbosity=2, failfast=True)
