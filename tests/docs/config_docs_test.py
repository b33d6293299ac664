#!/usr/bin/env python3
"""docs/configuration.md is exactly what scripts/gen-config-docs writes from this build's
--help: a flag, default or environment variable added, renamed or removed in the code and
not regenerated fails here with the difference and the command that fixes it."""

import difflib
import os
import subprocess
import sys
import tempfile
import unittest

import support


class ConfigurationDocs(unittest.TestCase):
    def test_configuration_md_matches_the_binary(self):
        committed_path = os.path.join(support.REPO, "docs", "configuration.md")
        with tempfile.TemporaryDirectory() as tmp:
            fresh_path = os.path.join(tmp, "configuration.md")
            subprocess.run([sys.executable, os.path.join(support.REPO, "scripts", "gen-config-docs"),
                            "--binary", support.BIN, "--output", fresh_path],
                           check=True, capture_output=True, text=True)
            with open(fresh_path, encoding="utf-8") as f:
                fresh = f.read()
        committed = ""
        if os.path.exists(committed_path):
            with open(committed_path, encoding="utf-8") as f:
                committed = f.read()
        if fresh != committed:
            diff = "".join(difflib.unified_diff(
                committed.splitlines(keepends=True), fresh.splitlines(keepends=True),
                "docs/configuration.md (committed)", "generated from " + support.BIN))
            self.fail("docs/configuration.md is out of date: run scripts/gen-config-docs\n" + diff)

    def test_every_setting_of_every_command_is_documented(self):
        # Independent of the generator's output format: each environment variable and flag
        # of each command appears on the page.
        with open(os.path.join(support.REPO, "docs", "configuration.md"), encoding="utf-8") as f:
            page = f.read()
        for name, cmd in support.commands().items():
            if name:
                self.assertTrue(f"## outbox-relay {name}\n" in page,
                                f"docs/configuration.md has no section for {name}")
            for o in cmd.settings():
                self.assertTrue(f"`{o.flag}`" in page,
                                f"docs/configuration.md lacks {name or 'outbox-relay'} {o.flag}")
                if o.env:
                    self.assertTrue(f"`{o.env}`" in page,
                                    f"docs/configuration.md lacks {name}: {o.env}")

    def test_parser_sees_the_known_settings(self):
        # Guards the parser itself: if CLI11's help format changed and the parser silently
        # found nothing, the drift test above would compare two empty pages.
        cmds = support.commands()
        run = support.options_by_env(cmds["run"])
        for env in ("DATABASE_URL", "KAFKA_BROKERS", "OUTBOX_SERVICE", "OUTBOX_SLOT",
                    "OUTBOX_SHUTDOWN_TIMEOUT_MS", "OUTBOX_METRICS_ADDR", "OUTBOX_KAFKA_PROPERTIES"):
            self.assertIn(env, run)
        cleanup = support.options_by_env(cmds["cleanup"])
        # The seed's CronJob contract, with the seed's defaults.
        self.assertEqual(cleanup["OUTBOX_RETENTION_DAYS"].default, "7")
        self.assertEqual(cleanup["OUTBOX_BATCH_SIZE"].default, "10000")
        self.assertEqual(cleanup["OUTBOX_BATCH_SLEEP_MS"].default, "500")
        self.assertIn("DATABASE_URL", cleanup)
        self.assertIn("slot status", cmds)
        self.assertIn("slot drop", cmds)
        self.assertEqual(support.command_for_args(["outbox-cleanup"]).path, ["cleanup"])


if __name__ == "__main__":
    unittest.main()
