"""What a Kafka consumer sees, read with kcat.

Commit -> visible: VisibilityConsumer runs during the live load and stamps each record when it
receives it (exactly-once: records are only visible to read_committed consumers at the Kafka
commit, after their LogAppendTime). read_topic_uuids counts the records of a topic after a
drain.
"""

import subprocess
import threading
import time

from .common import BenchError
from .contenders import UUID_HEADER


class VisibilityConsumer:
    """kcat -C from the beginning of one topic, unbuffered, one line (the record's headers) per
    record; a thread stamps each line with the host clock when it arrives. fetch.wait.max.ms=10
    bounds how long the broker holds a fetch when nothing is visible yet (it answers at once
    when something is). isolation.level=read_committed when asked (the exactly-once relay);
    otherwise kcat's settings are left as they are (librdkafka's default is read_committed too,
    which changes nothing for records written outside transactions)."""

    def __init__(self, brokers, topic, read_committed, errlog):
        cmd = ["kcat", "-C", "-b", brokers, "-t", topic, "-o", "beginning", "-u", "-q",
               "-f", "%h\n", "-X", "fetch.wait.max.ms=10"]
        if read_committed:
            cmd += ["-X", "isolation.level=read_committed"]
        self.cmd = cmd
        self.read_committed = read_committed
        self.seen = {}  # uuid -> first receive time (unix seconds)
        self.records = 0
        self.prefix = (UUID_HEADER["relay"] + "=").encode()
        errf = open(errlog, "w")
        # Buffered (not bufsize=0: a raw pipe's readline reads one byte per system call, too
        # slow for a thousand records a second); a buffered readline returns as soon as a line
        # is in the pipe, it does not wait for the buffer to fill.
        self.p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=errf, bufsize=1 << 16)
        errf.close()
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self):
        out = self.p.stdout
        while True:
            line = out.readline()
            if not line:
                return
            t = time.time()
            self.records += 1
            for h in line.rstrip(b"\n").split(b","):
                if h.startswith(self.prefix):
                    u = h[len(self.prefix):].decode()
                    if u not in self.seen:
                        self.seen[u] = t
                    break

    def wait_for(self, n, timeout):
        deadline = time.time() + timeout
        while len(self.seen) < n and time.time() < deadline:
            if self.p.poll() is not None:
                break
            time.sleep(0.05)
        return len(self.seen) >= n

    def stop(self):
        if self.p.poll() is None:
            self.p.terminate()
            try:
                self.p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait()
        self.thread.join(timeout=10)


def read_topic_uuids(brokers, topic, read_committed):
    """{uuid: count} of the records of `topic` (the relay's uuid header), read from the
    beginning to the end with kcat; isolation.level=read_committed when asked (an
    exactly-once contender: aborted records are not counted). Only the data topic: the
    progress topic (<base>.progress) is never read."""
    cmd = ["kcat", "-C", "-b", brokers, "-t", topic, "-o", "beginning", "-e", "-q",
           "-f", "%h\n"]
    if read_committed:
        cmd += ["-X", "isolation.level=read_committed"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        raise BenchError(f"kcat failed reading {topic}: {r.stderr[-1000:]}")
    prefix = UUID_HEADER["relay"] + "="
    out = {}
    for line in r.stdout.splitlines():
        for h in line.split(","):
            if h.startswith(prefix):
                u = h[len(prefix):]
                out[u] = out.get(u, 0) + 1
                break
    return out
