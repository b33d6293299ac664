"""The run's Kafka broker (KafkaMixin): its pid (for its CPU), the run's topics (created before
any clock starts, deleted at the end) and its warm-up before anything is timed.

KafkaMixin uses the Harness attributes args, brokers, admin_bin, services_dir, run_id and
topic_prefix, and eos_will_run (contenders.py).
"""

import os
import subprocess
import time

from .common import BenchError, log
from .processes import proc_jit_cpu


class KafkaMixin:
    """The broker: its pid, topics, warm-up."""

    def kafka_pid(self):
        try:
            with open(os.path.join(self.services_dir, "kafka", "kafka.pid")) as f:
                return int(f.read().strip())
        except (OSError, ValueError):
            return None

    def create_topic(self, topic, *configs, partitions=3):
        r = subprocess.run([self.admin_bin, "create", self.brokers, topic, str(partitions),
                            *configs],
                           capture_output=True, text=True, timeout=60)
        if r.returncode != 0:
            raise BenchError(f"cannot create topic {topic}: {r.stderr.strip()}")

    def warm_up_broker(self):
        """One idempotent produce before anything is timed: the broker's first InitProducerId
        after a start costs about a second, which would otherwise fall on the first contender."""
        topic = f"{self.topic_prefix}warmup"
        self.create_topic(topic)
        r = subprocess.run(["kcat", "-P", "-b", self.brokers, "-t", topic,
                            "-X", "enable.idempotence=true", "-X", "acks=all"],
                           input="warm-up\n", capture_output=True, text=True, timeout=120)
        if r.returncode != 0:
            raise BenchError(f"warm-up produce failed: {r.stderr.strip()}")
        if self.eos_will_run():
            # The broker's first transactional producer creates the transaction state log
            # (__transaction_state, 50 partitions): not on the exactly-once contender's clock.
            t0 = time.time()
            r = subprocess.run([self.admin_bin, "txn-warmup", self.brokers, topic,
                                f"bench-warmup-{self.run_id}"],
                               capture_output=True, text=True, timeout=180)
            if r.returncode != 0:
                raise BenchError(f"transactional warm-up failed: {r.stderr.strip()}")
            log(f"transactional warm-up: {time.time() - t0:.1f} s")
        if self.args.broker_warmup_seconds > 0:
            # The broker's JIT: a fresh broker compiles its produce path during the first
            # million records or so, and its transaction paths during the first exactly-once
            # ones; without this the compilers took 0.5-0.9 CPU-s of a 200,000-row drain on
            # two cores, charged to whichever contender ran those paths first.
            t0 = time.time()
            cmd = [self.admin_bin, "warm-load", self.brokers, topic,
                   str(self.args.broker_warmup_seconds)]
            if self.eos_will_run():
                cmd.append(f"bench-warmload-{self.run_id}")
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
            if r.returncode != 0:
                raise BenchError(f"broker warm-up load failed: {r.stderr.strip()}")
            kpid = self.kafka_pid()
            log(f"broker warm-up load: {r.stdout.strip()} in {time.time() - t0:.1f} s"
                + (f"; the broker's JIT compilers so far: {proc_jit_cpu(kpid):.1f} CPU-s"
                   if kpid else ""))

    def delete_run_topics(self):
        r = subprocess.run([self.admin_bin, "delete", self.brokers, self.topic_prefix],
                           capture_output=True, text=True, timeout=120)
        if r.returncode != 0:
            log(f"warning: deleting topics {self.topic_prefix}*: {r.stderr.strip()}")
