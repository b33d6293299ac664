"""The contenders: their names and kinds, which of them run (--contenders, --peers), and how
each is started and stopped (the relay at-least-once or exactly-once, the Watermill forwarder,
Debezium embedded, pg_recvlogical), and the PostgreSQL sessions each one holds.

ContendersMixin uses the Harness attributes args, peers, sql, db, contender_db, pg_port, pg_bin,
brokers, relay_bin, watermill_bin, debezium_cp, debezium_java_opts, publication,
debezium_publication, run_id and out, create_topic (kafka.py) and drain_sizes
(phase_drain.py).
"""

import os
import signal
import subprocess

from .common import BenchError, log
from .processes import client_ports, free_port, unix_peer_pids

# In this order: the Watermill forwarder reads the table, so it runs before relay-kafka's
# marking rewrites every row (autovacuum is off for the table); the WAL readers do not care.
# relay-kafka-eos (issue 14) is relay-kafka with --delivery exactly-once, right after it so that
# the two run as close together as possible.
DRAIN_CONTENDERS = ["pg_recvlogical", "relay-null", "watermill", "relay-kafka",
                    "relay-kafka-eos", "relay-kafka-nomark", "debezium"]
# Drain contenders that run the relay with --delivery exactly-once.
EOS_CONTENDERS = ("relay-kafka-eos",)
# Live contenders: the relay at-least-once ("relay", the name earlier runs used) and exactly-once
# ("relay-eos"); --contenders accepts either name or the drain contender's.
LIVE_RELAYS = {"relay": "relay-kafka", "relay-eos": "relay-kafka-eos"}
PEERS = ("watermill", "debezium")
KNOWN_CONTENDERS = set(DRAIN_CONTENDERS) | set(LIVE_RELAYS)
# The record header that carries the row's uuid: watermill-kafka's UUID header (the relay writes
# the same), and the outbox event router's event id header for Debezium.
UUID_HEADER = {"relay": "_watermill_message_uuid", "watermill": "_watermill_message_uuid",
               "debezium": "id"}


def is_eos(name):
    """The relay with --delivery exactly-once (drain relay-kafka-eos, live relay-eos)."""
    return name in EOS_CONTENDERS or name == "relay-eos"


def contender_kind(name):
    """relay | watermill | debezium | pg_recvlogical, from a contender name."""
    for kind in ("relay", "watermill", "debezium"):
        if name == kind or name.startswith(kind + "-"):
            return kind
    return name


class ContendersMixin:
    """Which contenders run, and starting and stopping them."""

    def wanted(self, name):
        """--contenders: a drain contender by its name; a live relay by its name or its drain
        contender's (relay = relay-kafka, relay-eos = relay-kafka-eos); a live peer by its name
        or its peer's."""
        only = self.args.contenders
        if not only:
            return True
        return (name in only or LIVE_RELAYS.get(name) in only
                or (contender_kind(name) in PEERS and contender_kind(name) in only))

    def eos_will_run(self):
        phases = self.args.phases.split(",")
        drain = "drain" in phases and any(
            c in s["contenders"] and self.wanted(c)
            for s in self.drain_sizes() for c in EOS_CONTENDERS)
        live = "live" in phases and self.args.eos_rates and self.wanted("relay-eos")
        return bool(drain or live)

    def live_peers(self):
        return [c for c in self.args.live_peers.split(",")
                if c and contender_kind(c) in self.peers and self.wanted(c)]

    def eos_flags(self, topic_base):
        """The relay's exactly-once flags, with a progress topic of the contender's own,
        created before the clock starts like the data topics: one partition, compacted, as the
        relay creates it when missing."""
        progress = f"{topic_base}.progress"
        self.create_topic(progress, "cleanup.policy=compact", partitions=1)
        flags = ["--delivery", "exactly-once", "--progress-topic", progress]
        if self.args.txn_interval_ms:
            flags += ["--txn-interval-ms", str(self.args.txn_interval_ms)]
        return flags

    def recvlogical_cmd(self, slot, *extra):
        """pg_recvlogical streaming the bench's publication from `slot` into /dev/null."""
        return [f"{self.pg_bin}/pg_recvlogical", "-d", self.contender_db, "--slot", slot,
                "--start", "-o", "proto_version=1",
                "-o", f"publication_names={self.publication}", *extra, "-f", "/dev/null"]

    def start_relay(self, slot, topic_template, sink, mark, logname, extra=()):
        port = free_port()
        cmd = [self.relay_bin, "run",
               "--database-url", self.contender_db, "--kafka-brokers", self.brokers,
               "--table", "public.outbox", "--publication", self.publication,
               "--slot", slot, "--topic-template", topic_template,
               "--sink", sink, "--mark", "true" if mark else "false",
               "--backfill", "false", "--metrics-addr", f"127.0.0.1:{port}",
               "--log-format", "json", *extra]
        logf = open(os.path.join(self.out, logname), "w")
        p = subprocess.Popen(cmd, stdout=logf, stderr=subprocess.STDOUT)
        logf.close()
        return p, port

    def stop_relay(self, p, what="relay"):
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
            try:
                p.wait(timeout=40)
            except subprocess.TimeoutExpired:
                log(f"{what} did not stop within 40 s of SIGTERM: killing it")
                p.kill()
                p.wait()
        return p.returncode

    def pg_sessions(self, pid):
        """{backend pid: role} of the PostgreSQL sessions process `pid` holds (by the client
        ports of its sockets): 'walsender' for a replication connection, else the session's
        application_name (outbox-relay-marker, outbox-relay-metrics, watermill-forwarder, ...)."""
        ports = client_ports(pid, self.pg_port)
        backends = unix_peer_pids(pid) if self.contender_db != self.db else set()
        if backends:
            rows = self.sql.query(
                "SELECT pid, backend_type, coalesce(nullif(application_name, ''), 'unnamed') "
                "FROM pg_stat_activity WHERE pid IN ("
                + ",".join(str(x) for x in sorted(backends)) + ")")
            return {int(r[0]): ("walsender" if r[1] == "walsender" else r[2]) for r in rows}
        if not ports:
            return {}
        rows = self.sql.query(
            "SELECT pid, backend_type, coalesce(nullif(application_name, ''), 'unnamed') "
            "FROM pg_stat_activity WHERE client_addr = '127.0.0.1' AND client_port IN ("
            + ",".join(str(x) for x in sorted(ports)) + ")")
        return {int(r[0]): ("walsender" if r[1] == "walsender" else r[2]) for r in rows}

    def start_peer(self, contender, slot, topic, logname, poll_ms=None, group=None):
        """Starts the Watermill forwarder or the Debezium peer; returns (Popen, metrics port).
        `topic` is the one Kafka topic the bench's rows go to (<base>.review)."""
        port = free_port()
        kind = contender_kind(contender)
        if kind == "watermill":
            cmd = [self.watermill_bin, "-database-url", self.contender_db,
                   "-kafka-brokers", self.brokers,
                   "-consumer-group", f"bench-{self.run_id}-{group or 'forwarder'}",
                   "-topic-prefix", topic.rsplit(".", 1)[0],
                   "-metrics-addr", f"127.0.0.1:{port}"]
            if poll_ms is not None:
                cmd += ["-poll-interval", f"{poll_ms:g}ms"]
        elif kind == "debezium":
            cmd = ["java", *self.debezium_java_opts,
                   "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn",
                   "-cp", self.debezium_cp, "outboxrelay.bench.DebeziumPeer",
                   "--database-url", self.db, "--kafka-brokers", self.brokers,
                   "--slot", slot, "--publication", self.debezium_publication,
                   "--topic", topic, "--metrics-addr", f"127.0.0.1:{port}"]
            # The harness's own end marker (pg_logical_emit_message, prefix 'bench') is not an
            # outbox row: Debezium would forward it to a topic of its own.
            cmd += ["--set", "message.prefix.exclude.list=bench"]
            if poll_ms is not None:
                cmd += ["--set", f"poll.interval.ms={poll_ms:g}"]
        else:
            raise BenchError(f"not a peer: {contender}")
        logf = open(os.path.join(self.out, logname), "w")
        p = subprocess.Popen(cmd, stdout=logf, stderr=subprocess.STDOUT)
        logf.close()
        return p, port

    def watermill_acked(self, group):
        """(transaction_id, offset) the Watermill consumer group has acknowledged, or None."""
        rows = self.sql.query(
            "SELECT last_processed_transaction_id::text, offset_acked "
            f"FROM watermill_offsets_outbox WHERE consumer_group = 'bench-{self.run_id}-{group}'")
        return (int(rows[0][0]), int(rows[0][1])) if rows else None
