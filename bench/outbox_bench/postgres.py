"""PostgreSQL: the harness's own psql session (Psql), LSNs, and the database work of a run
(DatabaseMixin): the benchmark's table, its variant and publications, the slots, the backlogs,
the table's statistics, and pgbench for the live load.

DatabaseMixin uses the Harness attributes args, sql (a Psql), db, pg_bin, result, publication
and debezium_publication; setup_database sets postmaster (the pid whose children are all of
PostgreSQL's processes).
"""

import os
import re
import subprocess
import threading
import time

from .common import BENCH_DIR, REPO, BenchError, log
from .processes import proc_ppid

# --table-variant: how the benchmark's outbox table is shaped (issue 13, target 2; the figures
# are in docs/migration.md). "seed" is sql/outbox.sql as it is. The others are what a team
# could do after migrating to the relay: nothing polls the table any more, so the forwarder's
# partial index on offset_acked (idx_outbox_acked ... WHERE offset_acked IS NULL) can go, and
# without an index on offset_acked the marking UPDATE may be a HOT update -- if the row's page
# has room for the new version, which a lower fillfactor leaves free. The fillfactor applies to
# pages written after it is set: the harness truncates the table before each backlog, so every
# backlog is written with it.
TABLE_VARIANTS = {
    "seed": {"acked_index": True, "fillfactor": None},
    "no-acked-index": {"acked_index": False, "fillfactor": None},
    "no-acked-index-ff70": {"acked_index": False, "fillfactor": 70},
    "no-acked-index-ff50": {"acked_index": False, "fillfactor": 50},
}


# PostgreSQL through psql (psycopg is not a dependency): one long-lived psql for sampling,
# so polling costs one query on an open connection, not a process and a connection each time.
class Psql:
    END = "__bench_end__"

    def __init__(self, url, pg_bin):
        self.url = url
        self.pg_bin = pg_bin
        self.lock = threading.Lock()
        self.p = subprocess.Popen(
            [f"{pg_bin}/psql", "-X", "-q", "-A", "-t", "-F", "|", "-v", "ON_ERROR_STOP=0",
             "-d", url],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            text=True, bufsize=1)

    def query(self, sql):
        """Rows as lists of strings. Raises BenchError on an SQL error."""
        with self.lock:
            self.p.stdin.write(sql.rstrip().rstrip(";") + ";\n\\echo " + self.END + "\n")
            self.p.stdin.flush()
            rows, errors = [], []
            while True:
                line = self.p.stdout.readline()
                if line == "":
                    raise BenchError("psql exited")
                line = line.rstrip("\n")
                if line == self.END:
                    break
                if line.startswith(("ERROR:", "psql:", "FATAL:")):
                    errors.append(line)
                elif line.startswith(("NOTICE:", "WARNING:", "DETAIL:", "HINT:", "CONTEXT:",
                                      "LINE ", "INFO:")):
                    continue
                elif line:
                    rows.append(line.split("|"))
            if errors:
                raise BenchError(f"SQL failed: {sql[:200]}: {' '.join(errors)}")
            return rows

    def value(self, sql):
        rows = self.query(sql)
        return rows[0][0] if rows and rows[0] else None

    def run_script(self, text, timeout=3600):
        """Runs SQL text in a fresh psql (own session), stops at the first error."""
        r = subprocess.run([f"{self.pg_bin}/psql", "-X", "-q", "-v", "ON_ERROR_STOP=1",
                            "-d", self.url], input=text, text=True, capture_output=True,
                           timeout=timeout)
        if r.returncode != 0:
            raise BenchError(f"psql script failed: {r.stderr.strip()[:2000]}")
        return r.stdout

    def close(self):
        try:
            self.p.stdin.close()
            self.p.wait(timeout=5)
        except Exception:
            self.p.kill()


def lsn_int(text):
    hi, lo = text.split("/")
    return (int(hi, 16) << 32) | int(lo, 16)


def lsn_text(value):
    return f"{value >> 32:X}/{value & 0xFFFFFFFF:X}"


class DatabaseMixin:
    """The database state of a run: set-up, per-backlog reset, slots, backlogs, pgbench."""

    def setup_database(self):
        with open(os.path.join(BENCH_DIR, "sql", "setup.sql")) as f:
            text = f.read().replace("\\ir ../../sql/outbox.sql",
                                    open(os.path.join(REPO, "sql", "outbox.sql")).read())
        self.sql.run_script("SET client_min_messages = warning;\n" + text)
        self.apply_table_variant()
        for pub in (self.publication, self.debezium_publication):
            self.sql.run_script(
                "SET client_min_messages = warning;\n"
                f"DROP PUBLICATION IF EXISTS {pub};\n"
                f"CREATE PUBLICATION {pub} FOR TABLE public.outbox "
                "WITH (publish = 'insert');\n")
        if self.sql.value("SHOW track_commit_timestamp") != "on":
            raise BenchError("track_commit_timestamp is off: the live latency needs the commit "
                             "time of every row (bench/run turns it on in its own cluster)")
        settings = {}
        for name in ["server_version", "shared_buffers", "synchronous_commit", "fsync",
                     "wal_level", "logical_decoding_work_mem", "max_wal_size",
                     "track_commit_timestamp"]:
            settings[name] = self.sql.value(f"SHOW {name}")
        self.result["postgres"] = settings
        self.postmaster = proc_ppid(int(self.sql.value("SELECT pg_backend_pid()")))
        # A slot the bench did not make holds WAL back: segments are created instead of
        # recycled, and one left from a manual run (5.2 GB held) raised the marker's CPU by half.
        foreign = self.sql.query(
            "SELECT slot_name, coalesce(pg_wal_lsn_diff(pg_current_wal_lsn(), restart_lsn), 0)"
            "::bigint FROM pg_replication_slots WHERE slot_name NOT LIKE 'bench\\_%'")
        self.result["foreign_slots"] = {r[0]: int(r[1]) for r in foreign}
        for name, held in foreign:
            log(f"warning: replication slot {name} is not the bench's and holds "
                f"{int(held) / 1e6:,.0f} MB of WAL; the figures of this run may suffer from it "
                f"(drop it: SELECT pg_drop_replication_slot('{name}'))")

    def apply_table_variant(self):
        """Shapes the (already created) outbox table as --table-variant says. The seed's DDL is
        CREATE ... IF NOT EXISTS, so a table left by an earlier run with another variant is
        brought back to this one: the partial index created or dropped, the fillfactor set or
        reset (it takes effect on the pages written next; reset_table truncates before each
        backlog)."""
        name = self.args.table_variant
        v = TABLE_VARIANTS[name]
        stmts = ["SET client_min_messages = warning;"]
        if v["acked_index"]:
            stmts.append("CREATE INDEX IF NOT EXISTS idx_outbox_acked ON outbox (offset_acked) "
                         "WHERE offset_acked IS NULL;")
        else:
            stmts.append("DROP INDEX IF EXISTS idx_outbox_acked;")
        if v["fillfactor"]:
            stmts.append(f"ALTER TABLE outbox SET (fillfactor = {int(v['fillfactor'])});")
        else:
            stmts.append("ALTER TABLE outbox RESET (fillfactor);")
        self.sql.run_script("\n".join(stmts) + "\n")
        indexes = [r[0] for r in self.sql.query(
            "SELECT indexdef FROM pg_indexes WHERE schemaname = 'public' "
            "AND tablename = 'outbox' ORDER BY indexname")]
        reloptions = self.sql.value(
            "SELECT coalesce(array_to_string(reloptions, ','), '') FROM pg_class "
            "WHERE oid = 'public.outbox'::regclass")
        self.result["table_variant"] = {"name": name, "ddl": stmts[1:], "indexes": indexes,
                                        "reloptions": reloptions or ""}
        log(f"table variant {name}: reloptions [{reloptions or ''}], "
            f"{len(indexes)} index(es): " + "; ".join(indexes))

    def table_update_stats(self):
        """(n_tup_upd, n_tup_hot_upd) of the outbox table (cumulative, survives TRUNCATE)."""
        row = self.sql.query("SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables "
                             "WHERE relid = 'public.outbox'::regclass")
        return (int(row[0][0]), int(row[0][1])) if row else (0, 0)

    def table_sizes(self):
        row = self.sql.query(
            "SELECT pg_relation_size('public.outbox'), pg_indexes_size('public.outbox')")
        return {"heap_bytes": int(row[0][0]), "indexes_bytes": int(row[0][1])}

    def drop_bench_slots(self):
        for (name, active_pid) in self.sql.query(
                "SELECT slot_name, coalesce(active_pid::text, '') FROM pg_replication_slots "
                "WHERE slot_name LIKE 'bench\\_%'"):
            if active_pid:
                self.sql.query(f"SELECT pg_terminate_backend({active_pid})")
                time.sleep(0.5)
            self.sql.query(f"SELECT pg_drop_replication_slot('{name}')")

    def reset_table(self):
        self.drop_bench_slots()
        self.sql.query("TRUNCATE outbox")
        self.sql.query("CREATE SCHEMA IF NOT EXISTS outbox_relay")
        exists = self.sql.value("SELECT to_regclass('outbox_relay.commits') IS NOT NULL")
        if exists == "t":
            self.sql.query("TRUNCATE outbox_relay.commits, outbox_relay.state")
        # The Watermill forwarder's offsets table (its consumer groups are unique per run).
        if self.sql.value("SELECT to_regclass('watermill_offsets_outbox') IS NOT NULL") == "t":
            self.sql.query("TRUNCATE watermill_offsets_outbox")
        self.sql.query("CHECKPOINT")

    def unmark_backlog(self):
        """Every marking contender marks the whole backlog itself: the marker's UPDATE skips rows
        already marked (`offset_acked IS NULL`), so a contender after another marking one would
        otherwise be timed without its marking. The marks are cleared and the table vacuumed
        (its dead versions become free space, as a VACUUM between two drains would leave it),
        outside the clock. Returns the rows cleared."""
        upd0 = self.table_update_stats()
        cleared = self.sql.query("WITH c AS (UPDATE outbox SET offset_acked = NULL "
                                 "WHERE offset_acked IS NOT NULL RETURNING 1) "
                                 "SELECT count(*) FROM c")
        n = int(cleared[0][0]) if cleared else 0
        if n:
            self.sql.query("VACUUM outbox")
            self.sql.query("CHECKPOINT")
            # The table's UPDATE counters must include this UPDATE before the contender's are
            # read (a session reports its counters at most once a second, or when idle).
            try:
                self.sql.query("SELECT pg_stat_force_next_flush()")  # PostgreSQL 15+
            except BenchError:
                pass
            deadline = time.time() + 12
            while self.table_update_stats()[0] < upd0[0] + n and time.time() < deadline:
                self.sql.query("SELECT 1")
                time.sleep(0.2)
        return n

    def create_slot(self, name):
        self.sql.query(f"SELECT pg_create_logical_replication_slot('{name}', 'pgoutput')")

    def walsender_pid(self, slot):
        v = self.sql.value(
            f"SELECT active_pid FROM pg_replication_slots WHERE slot_name = '{slot}'")
        return int(v) if v else None

    def generate_backlog(self, transactions, rows_per_tx):
        """Commits `transactions` transactions of `rows_per_tx` rows (synchronous_commit=off:
        only the WAL matters here, not how fast it was written)."""
        sfx = "_small" if self.args.row == "small" else ""
        body = f"""
SET synchronous_commit = off;
DO $$
BEGIN
  FOR t IN 0..{transactions - 1} LOOP
    INSERT INTO outbox (uuid, payload, metadata)
      SELECT gen_random_uuid()::text, bench_payload{sfx}(n), bench_metadata{sfx}(n)
      FROM generate_series(t::bigint * {rows_per_tx} + 1, (t::bigint + 1) * {rows_per_tx}) AS n;
    COMMIT;
  END LOOP;
END $$;
"""
        t0 = time.time()
        self.sql.run_script(body)
        return time.time() - t0

    def pgbench(self, seconds, rate=None, progress=False, tag="pgbench"):
        cmd = [f"{self.pg_bin}/pgbench", "-n", "-f", os.path.join(BENCH_DIR, "sql", "insert1.sql"),
               "-c", str(self.args.clients), "-j", str(self.args.pgbench_threads),
               "-T", str(seconds)]
        if rate:
            cmd += ["-R", str(rate)]
        if progress:
            cmd += ["-P", "1"]
        env = dict(os.environ, PGOPTIONS="-c synchronous_commit=on")
        cmd += [self.db]
        return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env=env)

    @staticmethod
    def pgbench_tps(out):
        m = re.search(r"tps = ([0-9.]+) \((without initial connection time|excluding connections establishing)\)", out)
        if not m:
            m = re.search(r"tps = ([0-9.]+)", out)
        return float(m.group(1)) if m else None
