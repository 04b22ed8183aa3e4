"""scripts/bench/compare_peers.py's tests and results: the test keys and their labels, running a command
for the JSON it prints, and the log. Imports none of the other compare_peers modules."""

import json
import subprocess
import sys


def label(key):
    kind, ctx, n = key
    return f"prefill {n}" if kind == "pp" else f"decode {n} after {ctx}"


def plan_tests(prompts, n_gen, n_positions):
    """Test keys ("pp", p, p) and ("tg", context, n), and notes on those that don't fit."""
    tests, skipped = [], []
    for p in prompts:
        (tests if p <= n_positions else skipped).append(("pp", p, p))
    for ctx in sorted({4, *prompts}):
        (tests if ctx + n_gen <= n_positions else skipped).append(("tg", ctx, n_gen))
    notes = [f"{label(k)}: exceeds n_positions {n_positions}" for k in skipped]
    return tests, notes


def joined(tests, kind):
    """Comma-separated contexts of the planned tests of one kind ("pp" or "tg")."""
    return ",".join(str(ctx) for k, ctx, _ in tests if k == kind)


def tail(text, lines=3, first=False):
    """The last (or first) few non-blank lines of a command's output, joined on one line."""
    kept = [line.strip() for line in text.splitlines() if line.strip()]
    return " | ".join(kept[:lines] if first else kept[-lines:])


def run_json(cmd, timeout, env=None):
    """Run a command; return the JSON on its stdout (last parseable line or whole text)."""
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"exit {proc.returncode}: {tail(proc.stderr or proc.stdout)}")
    try:
        return json.loads(proc.stdout)
    except json.JSONDecodeError:
        for line in reversed(proc.stdout.strip().splitlines()):
            try:
                return json.loads(line)
            except json.JSONDecodeError:
                continue
    raise RuntimeError(f"no JSON on stdout: {tail(proc.stdout or proc.stderr)}")


def log(msg):
    print(f"[compare_peers] {msg}", file=sys.stderr, flush=True)
