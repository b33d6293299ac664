"""Shared helpers of the tests in tests/docs: what the relay binary and its sources say.

The truth is the built binary's --help (parsed by scripts/gen-config-docs, the same parser
that writes docs/configuration.md) and src/metrics/metrics.cc; the tests compare the
documentation, the manifests and the rules with it.

Environment (set by tests/docs/CMakeLists.txt):
  OUTBOX_RELAY_BIN   the outbox-relay binary of this build
  OUTBOX_REPO_ROOT   the repository root
"""

import importlib.machinery
import importlib.util
import os
import re
import sys

REPO = os.environ.get("OUTBOX_REPO_ROOT") or os.path.dirname(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BIN = os.environ.get("OUTBOX_RELAY_BIN") or os.path.join(REPO, "build", "outbox-relay")


def load_script(name, path):
    loader = importlib.machinery.SourceFileLoader(name, path)
    spec = importlib.util.spec_from_loader(name, loader)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up there
    loader.exec_module(module)
    return module


gen = load_script("gen_config_docs", os.path.join(REPO, "scripts", "gen-config-docs"))

_commands = None


def commands():
    """Every command of the binary: {"run": Command, "slot status": Command, ...}."""
    global _commands
    if _commands is None:
        if not os.access(BIN, os.X_OK):
            sys.exit(f"no outbox-relay binary at {BIN} (OUTBOX_RELAY_BIN)")
        _commands = {" ".join(c.path): c for c in gen.collect(BIN)}
    return _commands


def command_for_args(args):
    """The command an argument list runs (["cleanup"] -> cleanup, ["slot", "status"] -> ...),
    following aliases (outbox-cleanup); None if the arguments name no command."""
    cmds = commands()
    path = []
    current = cmds[""]
    for arg in args:
        match = None
        for name, aliases, _ in current.subcommands:
            if arg == name or arg in aliases:
                match = name
        if match is None:
            break
        path.append(match)
        current = cmds[" ".join(path)]
    return current if path else None


def options_by_env(command):
    return {o.env: o for o in command.settings() if o.env}


def options_by_flag(command):
    out = {}
    for o in command.options:
        for n in o.names:
            out[n] = o
    return out


def default_of(command, flag):
    return options_by_flag(command)[flag].default


BOOLEAN_WORDS = {"true", "false", "1", "0", "on", "off", "yes", "no", "enable", "disable"}


def value_problem(option, value):
    """Why `value` is not acceptable for `option` (None if it is)."""
    value = str(value)
    if option.choices and value not in option.choices.split(","):
        return f"{value!r} is not one of {option.choices}"
    if option.type == "BOOLEAN" and value.lower() not in BOOLEAN_WORDS:
        return f"{value!r} is not a boolean"
    if option.type == "INT" and not re.fullmatch(r"-?[0-9]+", value):
        return f"{value!r} is not an integer"
    return None


# Metric families the relay registers, with their type: parsed from the registration code
# (BuildCounter()/BuildGauge()/BuildHistogram() ... .Name("...")).
def relay_metrics():
    src = open(os.path.join(REPO, "src", "metrics", "metrics.cc"), encoding="utf-8").read()
    found = {}
    for m in re.finditer(r"Build(Counter|Gauge|Histogram)\(\)\s*\.Name\(\"([a-z_:][a-z0-9_:]*)\"\)",
                         src):
        found[m.group(2)] = m.group(1).lower()
    if len(found) < 5:
        sys.exit("support.relay_metrics: found fewer than 5 metrics in src/metrics/metrics.cc: "
                 "has the registration code changed shape?")
    return found


def relay_series_names():
    """Names a query may use: families, plus _bucket/_sum/_count of histograms."""
    names = set()
    for name, kind in relay_metrics().items():
        names.add(name)
        if kind == "histogram":
            names.update({name + "_bucket", name + "_sum", name + "_count"})
    return names


def relay_label_names():
    src = open(os.path.join(REPO, "src", "metrics", "metrics.cc"), encoding="utf-8").read()
    return set(re.findall(r"\{\"([a-z_]+)\",", src))


PROMQL_WORDS = {
    # functions
    "abs", "absent", "absent_over_time", "avg", "avg_over_time", "ceil", "changes",
    "clamp_max", "clamp_min", "count", "count_over_time", "delta", "deriv", "floor",
    "histogram_quantile", "holt_winters", "idelta", "increase", "irate", "label_replace",
    "label_join", "max", "max_over_time", "min", "min_over_time", "predict_linear",
    "quantile", "quantile_over_time", "rate", "resets", "round", "scalar", "sort",
    "sort_desc", "stddev", "sum", "sum_over_time", "time", "timestamp", "topk", "bottomk",
    "vector", "last_over_time", "label_values",
    # keywords
    "and", "or", "unless", "by", "without", "on", "ignoring", "group_left", "group_right",
    "bool", "offset",
}


def promql_metric_names(expr):
    """Metric names a PromQL expression selects (strings, label matchers, ranges and label
    lists removed first)."""
    e = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    e = re.sub(r"\{[^}]*\}", " ", e)
    e = re.sub(r"\[[^\]]*\]", " ", e)
    e = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", e)
    names = set()
    for m in re.finditer(r"(?<![\w.$])([a-zA-Z_:][a-zA-Z0-9_:]*)", e):
        word = m.group(1)
        if word not in PROMQL_WORDS:
            names.add(word)
    return names


def promql_selectors(expr):
    """(metric, {label: value}) for each `metric{...}` in the expression."""
    out = []
    for m in re.finditer(r"([a-zA-Z_:][a-zA-Z0-9_:]*)\s*\{([^}]*)\}", expr):
        labels = {}
        for lm in re.finditer(r'([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"',
                              m.group(2)):
            labels[lm.group(1)] = lm.group(3)
        out.append((m.group(1), labels))
    return out


# Labels Prometheus itself or the scrape configuration adds.
SCRAPE_LABELS = {"job", "instance", "namespace", "pod", "le", "__name__"}


def github_anchor(heading):
    a = heading.strip().lower()
    a = re.sub(r"[^\w\- ]", "", a)
    return a.replace(" ", "-")


def markdown_anchors(path):
    anchors = set()
    in_code = False
    for line in open(path, encoding="utf-8"):
        if line.startswith("```"):
            in_code = not in_code
            continue
        if not in_code and line.startswith("#"):
            anchors.add(github_anchor(line.lstrip("#")))
    return anchors
