"""The self-test the lint checkers (sql_null_lint.py, pure_include_lint.py) run first, so
that a broken checker cannot pass silently.

  cases:      (path, source, how many findings it must report)
  line_cases: (label, path, source, the line numbers the findings must have)
  lint(path, source) returns the findings; line_of(finding) its line number.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable


def run(title: str, lint: Callable[[str, str], list[Any]], line_of: Callable[[Any], int],
        cases: Iterable[tuple[str, str, int]],
        line_cases: Iterable[tuple[str, str, str, list[int]]]) -> int:
    cases, line_cases = list(cases), list(line_cases)
    failures = 0
    for path, src, expected in cases:
        got = lint(path, src)
        if len(got) != expected:
            failures += 1
            print(f"self-test FAILED: {path}: expected {expected}, got {len(got)}: {src!r}")
            for f in got:
                print(f"    found: {f}")
    for label, path, src, lines in line_cases:
        got = [line_of(f) for f in lint(path, src)]
        if got != lines:
            failures += 1
            print(f"self-test FAILED: {label}: lines {got}, expected {lines}")
    total = len(cases) + len(line_cases)
    print(f"{title} self-test: {total - failures} passed, {failures} failed")
    return 1 if failures else 0
