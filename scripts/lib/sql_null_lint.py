#!/usr/bin/env python3
"""Find SQL comparisons with NULL (`= NULL`, `!= NULL`, `<> NULL`, `<= NULL`, `>= NULL`).

`x = NULL` is never true in SQL (it yields NULL); the seed calls it out as a bug and the
project's CI rejects it: use `IS NULL` / `IS NOT NULL` / `IS [NOT] DISTINCT FROM`.

Where SQL is looked for:
  *.sql                      the whole file, minus comments and '...' literals
  *.cc *.h *.cpp *.hpp       inside string literals only ("..." and raw R"d(...)d"); adjacent
                             literals ("UPDATE t SET " "x = NULL") are joined first, so C++
                             code such as `ptr == NULL` outside strings is never flagged
  *.py                       inside string literals (Python's own tokenizer finds them)
  *.sh, bash scripts         inside '...', "..." and here-documents

Not flagged: `IS NULL`, `IS NOT NULL`, `:=`/`=>`/`==`, and assignments in an UPDATE's SET
list (`UPDATE t SET col = NULL WHERE ...`, `ON CONFLICT ... DO UPDATE SET col = NULL`),
which are legitimate SQL. A line containing `lint:allow-null-compare` is skipped.

Usage: sql_null_lint.py FILE...      exit 1 if anything is found
       sql_null_lint.py --self-test  check the rules above on built-in examples
"""
from __future__ import annotations

import io
import os
import re
import sys
import tokenize
from dataclasses import dataclass

# A comparison operator followed by NULL. The look-behind keeps `:=`, `==`, `!=`'s `=`, `<=`'s
# `=` etc. from matching on their second character; `=>` never matches (`>` before NULL).
COMPARE_NULL = re.compile(r"(?<![:=!<>])(<>|!=|<=|>=|=)\s*NULL\b", re.IGNORECASE)
# The nearest of these before a match decides whether it is an UPDATE ... SET assignment.
CLAUSE = re.compile(
    r"\b(SET|WHERE|FROM|RETURNING|SELECT|WHEN|ON|HAVING|AND|OR|NOT|THEN|ELSE|JOIN|USING|IF|"
    r"CHECK|VALUES)\b|;",
    re.IGNORECASE,
)
ALLOW_MARK = "lint:allow-null-compare"

CPP_EXT = (".cc", ".h", ".cpp", ".hpp", ".cxx", ".hh")


@dataclass
class Unit:
    """A piece of text that may hold SQL, with the 1-based line of each character."""

    text: str
    lines: list[int]


@dataclass
class Finding:
    path: str
    line: int
    match: str
    source_line: str


class UnitBuilder:
    def __init__(self) -> None:
        self.chars: list[str] = []
        self.lines: list[int] = []

    def add(self, text: str, line: int) -> None:
        for ch in text:
            self.chars.append(ch)
            self.lines.append(line)
            if ch == "\n":
                line += 1

    def sep(self) -> None:
        # Joined literals are separated by a space so "SET" "x" does not become "SETx".
        if self.chars:
            self.chars.append(" ")
            self.lines.append(self.lines[-1])

    def take(self) -> Unit | None:
        if not self.chars:
            return None
        unit = Unit("".join(self.chars), self.lines)
        self.chars, self.lines = [], []
        return unit


def is_assignment(text: str, pos: int) -> bool:
    last = None
    for m in CLAUSE.finditer(text, 0, pos):
        last = m
    return last is not None and last.group(1) is not None and last.group(1).upper() == "SET"


def scan_units(units: list[Unit], path: str, raw_lines: list[str]) -> list[Finding]:
    out = []
    for unit in units:
        for m in COMPARE_NULL.finditer(unit.text):
            if is_assignment(unit.text, m.start()):
                continue
            line = unit.lines[m.start()]
            src = raw_lines[line - 1] if 0 < line <= len(raw_lines) else ""
            if ALLOW_MARK in src:
                continue
            out.append(Finding(path, line, re.sub(r"\s+", " ", m.group(0)), src.strip()))
    return out


# ----------------------------------------------------------------------------- SQL files


def sql_units(src: str) -> list[Unit]:
    """The file as one unit with comments and '...' literals blanked (newlines kept)."""
    out = []
    i, n = 0, len(src)
    while i < n:
        c = src[i]
        if src.startswith("--", i):
            j = src.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif src.startswith("/*", i):
            j = src.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append(re.sub(r"[^\n]", " ", src[i:j]))
            i = j
        elif c == "'":
            j = i + 1
            while j < n:
                if src[j] == "'" and src.startswith("''", j):
                    j += 2
                    continue
                if src[j] == "'":
                    break
                j += 1
            j = min(j + 1, n)
            out.append(re.sub(r"[^\n]", " ", src[i:j]))
            i = j
        else:
            out.append(c)
            i += 1
    text = "".join(out)
    lines, line = [], 1
    for ch in text:
        lines.append(line)
        if ch == "\n":
            line += 1
    return [Unit(text, lines)]


# ----------------------------------------------------------------------------- C++ files

RAW_START = re.compile(r'(?:u8|u|U|L)?R"([^()\\\s"]{0,16})\(')


def cpp_units(src: str) -> list[Unit]:
    """String literal contents; adjacent literals (only whitespace/comments between) join."""
    units: list[Unit] = []
    b = UnitBuilder()
    i, n, line = 0, len(src), 1
    pending = False  # a literal ended and only whitespace/comments followed so far

    def flush() -> None:
        nonlocal pending
        u = b.take()
        if u:
            units.append(u)
        pending = False

    while i < n:
        c = src[i]
        if c == "\n":
            line += 1
            i += 1
        elif c in " \t\r\f\v":
            i += 1
        elif src.startswith("//", i):
            j = src.find("\n", i)
            i = n if j < 0 else j
        elif src.startswith("/*", i):
            j = src.find("*/", i + 2)
            j = n if j < 0 else j + 2
            line += src.count("\n", i, j)
            i = j
        elif (m := RAW_START.match(src, i)) and (i == 0 or not (src[i - 1].isalnum() or src[i - 1] == "_")):
            end = ")" + m.group(1) + '"'
            body_start = m.end()
            j = src.find(end, body_start)
            j = n if j < 0 else j
            line += src.count("\n", i, body_start)
            if pending:
                b.sep()
            b.add(src[body_start:j], line)
            line += src.count("\n", body_start, j)
            i = min(j + len(end), n)
            pending = True
        elif c == '"':
            j = i + 1
            while j < n and src[j] != '"' and src[j] != "\n":
                j += 2 if src[j] == "\\" else 1
            if pending:
                b.sep()
            b.add(src[i + 1 : min(j, n)], line)
            i = min(j + 1, n)
            pending = True
        elif c == "'":
            # A digit separator (1'000'000) or a character literal ('x', '\'', u8'x').
            k = i - 1
            while k >= 0 and (src[k].isalnum() or src[k] in "_'."):
                k -= 1
            token = src[k + 1 : i]
            if token[:1].isdigit():
                i += 1
                continue
            flush()
            j = i + 1
            while j < n and src[j] != "'" and src[j] != "\n":
                j += 2 if src[j] == "\\" else 1
            i = min(j + 1, n)
        else:
            if pending:
                flush()
            i += 1
    flush()
    return units


# ----------------------------------------------------------------------------- Python files

PY_STR = re.compile(r"^([rRbBuUfF]{0,2})('''|\"\"\"|'|\")(.*)\2$", re.DOTALL)


def py_units(src: str) -> list[Unit]:
    units: list[Unit] = []
    b = UnitBuilder()
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(src).readline))
    except (tokenize.TokenError, SyntaxError, IndentationError):
        return cpp_units(src)  # unparsable: fall back to plain "..." scanning
    prev_was_string = False
    # Python 3.12+ splits f-strings into FSTRING_START, MIDDLE..., END with the {expression}
    # tokens in between; keep the pieces together ({x} becomes a space).
    fs_start = getattr(tokenize, "FSTRING_START", -1)
    fs_middle = getattr(tokenize, "FSTRING_MIDDLE", -1)
    fs_end = getattr(tokenize, "FSTRING_END", -1)
    fstring_depth = 0
    for tok in tokens:
        if tok.type == fs_start:
            if fstring_depth == 0 and prev_was_string:
                b.sep()
            fstring_depth += 1
        elif tok.type == fs_middle:
            b.add(tok.string, tok.start[0])
        elif tok.type == fs_end:
            fstring_depth -= 1
            prev_was_string = fstring_depth == 0
        elif fstring_depth > 0:
            b.sep()
        elif tok.type == tokenize.STRING:
            m = PY_STR.match(tok.string)
            body = m.group(3) if m else tok.string
            start_line = tok.start[0] + (tok.string[: tok.string.find(body)].count("\n") if m else 0)
            if prev_was_string:
                b.sep()
            b.add(body, start_line)
            prev_was_string = True
        elif tok.type in (tokenize.NL, tokenize.NEWLINE, tokenize.COMMENT) and prev_was_string:
            # Implicit concatenation may continue on the next line inside brackets.
            if tok.type == tokenize.NEWLINE:
                u = b.take()
                if u:
                    units.append(u)
                prev_was_string = False
        else:
            u = b.take()
            if u:
                units.append(u)
            prev_was_string = False
    u = b.take()
    if u:
        units.append(u)
    return units


# ----------------------------------------------------------------------------- shell files

HEREDOC = re.compile(r"<<(-?)\s*(['\"]?)([A-Za-z_][A-Za-z0-9_]*)\2")


def sh_units(src: str) -> list[Unit]:
    """'...', "...", $'...' and here-document bodies; # comments skipped."""
    units: list[Unit] = []
    i, n, line = 0, len(src), 1
    heredocs: list[tuple[str, bool]] = []  # pending (delimiter, strip_tabs) for the next line
    while i < n:
        c = src[i]
        if c == "\n":
            line += 1
            i += 1
            # Here-document bodies start after the line that opened them.
            for delim, strip in heredocs:
                b = UnitBuilder()
                while i < n:
                    j = src.find("\n", i)
                    j = n if j < 0 else j
                    text = src[i:j]
                    if (text.lstrip("\t") if strip else text) == delim:
                        i = min(j + 1, n)
                        line += 1
                        break
                    b.add(text + "\n", line)
                    line += 1
                    i = j + 1
                u = b.take()
                if u:
                    units.append(u)
            heredocs = []
        elif c == "\\":
            if i + 1 < n and src[i + 1] == "\n":
                line += 1
            i += 2
        elif c == "#" and (i == 0 or src[i - 1] in " \t\n;|&()"):
            j = src.find("\n", i)
            i = n if j < 0 else j
        elif c in "'\"":
            ansi = c == "'" and i > 0 and src[i - 1] == "$"
            j = i + 1
            while j < n and src[j] != c:
                j += 2 if (src[j] == "\\" and (c == '"' or ansi)) else 1
            b = UnitBuilder()
            b.add(src[i + 1 : min(j, n)], line)
            u = b.take()
            if u:
                units.append(u)
            line += src.count("\n", i, min(j + 1, n))
            i = min(j + 1, n)
        elif (m := HEREDOC.match(src, i)) and not src.startswith("<<<", i):
            heredocs.append((m.group(3), m.group(1) == "-"))
            i = m.end()
        else:
            i += 1
    return units


# ----------------------------------------------------------------------------- driver


def kind_of(path: str, src: str) -> str | None:
    low = path.lower()
    if low.endswith(".sql"):
        return "sql"
    if low.endswith(CPP_EXT):
        return "cpp"
    if low.endswith(".py"):
        return "py"
    if low.endswith((".sh", ".bash")):
        return "sh"
    first = src.split("\n", 1)[0]
    if first.startswith("#!"):
        if re.search(r"\b(ba|da|k|z)?sh\b", first):
            return "sh"
        if "python" in first:
            return "py"
    return None


def lint_source(path: str, src: str) -> list[Finding]:
    kind = kind_of(path, src)
    if kind is None:
        return []
    units = {"sql": sql_units, "cpp": cpp_units, "py": py_units, "sh": sh_units}[kind](src)
    return scan_units(units, path, src.split("\n"))


def lint_files(paths: list[str]) -> int:
    findings: list[Finding] = []
    for path in paths:
        try:
            with open(path, encoding="utf-8", errors="replace") as f:
                src = f.read()
        except OSError as e:
            print(f"{path}: cannot read: {e}", file=sys.stderr)
            return 2
        findings += lint_source(path, src)
    for f in findings:
        print(f"{f.path}:{f.line}: SQL compares with NULL ('{f.match}'): "
              f"use IS NULL / IS NOT NULL / IS [NOT] DISTINCT FROM\n    {f.source_line}")
    return 1 if findings else 0


# (path, source, expected number of findings)
SELF_TEST: list[tuple[str, str, int]] = [
    # SQL files
    ("a.sql", "SELECT * FROM outbox WHERE offset_acked = NULL;\n", 1),
    ("a.sql", "SELECT * FROM outbox WHERE offset_acked != NULL;\n", 1),
    ("a.sql", "DELETE FROM outbox WHERE offset_acked <> null;\n", 1),
    ("a.sql", "SELECT 1 WHERE a >= NULL OR b <=NULL;\n", 2),
    ("a.sql", "SELECT * FROM outbox WHERE offset_acked =\n  NULL;\n", 1),
    ("a.sql", "SELECT * FROM outbox WHERE offset_acked IS NULL AND x IS NOT NULL;\n", 0),
    ("a.sql", "CREATE INDEX i ON outbox (offset_acked) WHERE offset_acked IS NULL;\n", 0),
    ("a.sql", "UPDATE outbox SET offset_acked = NULL WHERE transaction_id = ANY($1);\n", 0),
    ("a.sql", "UPDATE outbox SET a = 1, offset_acked = NULL;\n", 0),
    ("a.sql", "UPDATE outbox SET a = NULL WHERE b = NULL;\n", 1),
    ("a.sql", "INSERT INTO t VALUES (1) ON CONFLICT (id) DO UPDATE SET x = NULL;\n", 0),
    ("a.sql", "UPDATE t SET a = (SELECT b FROM u WHERE c = NULL);\n", 1),
    ("a.sql", "UPDATE t SET a = CASE WHEN b = NULL THEN 1 END;\n", 1),
    ("a.sql", "-- never write x = NULL\nSELECT 1;\n", 0),
    ("a.sql", "SELECT 'x = NULL' AS s;\n", 0),
    ("a.sql", "/* x = NULL */ SELECT NULLIF(a, '') = b, c = NULLS;\n", 0),
    ("a.sql", "DO $$ BEGIN v := NULL; PERFORM f(a => NULL); END $$;\n", 0),
    ("a.sql", "DO $$ BEGIN IF v = NULL THEN RETURN; END IF; END $$;\n", 1),
    ("a.sql", "SELECT 1 WHERE x = NULL; -- lint:allow-null-compare\n", 0),
    ("a.sql", "SELECT NULL = NULL;\n", 1),
    # C++: only inside string literals
    ("a.cc", 'if (ptr == NULL) return;\nint* p = NULL;\nif (p != NULL) {}\n', 0),
    ("a.cc", 'auto q = "SELECT * FROM outbox WHERE offset_acked = NULL";\n', 1),
    ("a.cc", 'auto q = "DELETE FROM outbox WHERE a <> NULL";\n', 1),
    ("a.cc", 'auto q = "SELECT 1 WHERE offset_acked IS NULL";\n', 0),
    ("a.h", 'constexpr auto q = R"sql(\n  SELECT *\n  FROM outbox\n  WHERE x != NULL\n)sql";\n', 1),
    ("a.h", 'constexpr auto q = R"(SELECT 1 WHERE y = NULL)";\n', 1),
    ("a.h", 'constexpr auto q = R"(SELECT 1 WHERE y IS NULL)";\n', 0),
    ("a.cc", 'auto q = "UPDATE outbox SET "\n         "offset_acked = NULL";\n', 0),
    ("a.cc", 'auto q = "SELECT * FROM outbox "\n  // comment\n  "WHERE a = NULL";\n', 1),
    ("a.cc", '// "WHERE a = NULL" in a comment\n/* "x = NULL" */ int a = 1\'000\'000;\n', 0),
    ("a.cc", "char c = '\"'; auto s = \"fine\"; if (x == NULL) {}\n", 0),
    ("a.cc", "char c = '\"'; auto s = \"WHERE a = NULL\";\n", 1),
    ("a.cc", 'auto s = "escaped \\" quote WHERE a = NULL";\n', 1),
    ("a.cc", 'auto s = fmt::format("UPDATE {} SET {} = NULL WHERE {} IS NULL", t, c, c);\n', 0),
    ("a.cc", 'auto s = "x = NULL"; // lint:allow-null-compare\n', 0),
    ("a.cc", '#include "a.h"\nbool b = p == NULL && q != NULL;\n', 0),
    # Python
    ("a.py", 'if x == None:\n    pass\ny = None\n', 0),
    ("a.py", 'cur.execute("SELECT * FROM outbox WHERE offset_acked = NULL")\n', 1),
    ("a.py", "cur.execute('''\n  SELECT 1\n  WHERE a <> NULL\n''')\n", 1),
    ("a.py", 'q = ("UPDATE outbox SET "\n     "offset_acked = NULL")\n', 0),
    ("a.py", 'q = f"SELECT 1 WHERE {col} IS NULL"  # x = NULL\n', 0),
    # shell
    ("a.sh", 'psql -c "SELECT count(*) FROM outbox WHERE offset_acked = NULL"\n', 1),
    ("a.sh", "psql -c 'SELECT 1 WHERE a != NULL'\n", 1),
    ("a.sh", "psql <<SQL\nSELECT 1\nWHERE a = NULL;\nSQL\necho done\n", 1),
    ("a.sh", "psql <<-'EOF'\n\tSELECT 1 WHERE a IS NULL;\n\tEOF\n", 0),
    ("a.sh", '# comment: x = NULL\n[ "$a" = "" ] && echo ok\n', 0),
    ("a.sh", 'x=NULL; [ "$x" = NULL ] && echo ${#x}\n', 0),
    ("run", "#!/usr/bin/env bash\npsql -c \"DELETE FROM t WHERE a = NULL\"\n", 1),
    ("README", "x = NULL\n", 0),
]


def self_test() -> int:
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import lint_selftest  # beside this file; loaded only for the self-test

    # Line numbers must point at the offending line.
    return lint_selftest.run(
        "sql-null lint", lint_source, lambda f: f.line, SELF_TEST,
        [("line number", "a.cc", 'a();\nauto q = "SELECT 1 "\n  "FROM t "\n  "WHERE a = NULL";\n', [4]),
         ("heredoc line number", "a.sh", "echo\npsql <<SQL\nSELECT 1\nWHERE a = NULL;\nSQL\n", [4])])


def main(argv: list[str]) -> int:
    if argv[1:2] == ["--self-test"]:
        return self_test()
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    return lint_files(argv[1:])


if __name__ == "__main__":
    sys.exit(main(sys.argv))
