"""What scripts/openai/openai_client.py's checks compare against: the prompts, `kvgpt generate --json`
run as a subprocess (the independent reference), and the helpers that read a stream and compare
log-probabilities."""

import json
import subprocess

from openai_checks import expect, expect_eq

MAX_CHUNKS = 2000  # bound on the chunks read from any one stream
LOGPROB_TOL = 1e-9
PROMPT = "The quick brown fox"
CHAT_MESSAGES = [
    {"role": "system", "content": "You are a terse assistant."},
    {"role": "user", "content": "Name three colours."},
    {"role": "assistant", "content": "Red, green, blue."},
    {"role": "user", "content": "And three animals?"},
]
CHAT_MESSAGES_2 = [
    {"role": "developer", "content": "Answer briefly."},
    {"role": "user", "content": "hi"},
]
SAMPLING = dict(temperature=0.8, top_p=0.95, seed=7)  # with top_k 40 in extra_body: the seeded-sampling checks


class Cli:
    """`kvgpt generate ... --json`, the independent reference."""

    def __init__(self, binary, model):
        self.binary = binary
        self.model = model
        self.memo = {}

    def generate(self, prompt, n, *, temperature=None, top_p=None, top_k=None, seed=None,
                 logprobs=None, ignore_eos=True, presence_penalty=None, frequency_penalty=None,
                 repetition_penalty=None):
        args = [self.binary, "generate", prompt, "--model", self.model, "-n", str(n), "--json"]
        if ignore_eos:
            args.append("--ignore-eos")
        for flag, v in (("--temperature", temperature), ("--top-p", top_p), ("--top-k", top_k),
                        ("--seed", seed), ("--logprobs", logprobs), ("--presence-penalty", presence_penalty),
                        ("--frequency-penalty", frequency_penalty), ("--repetition-penalty", repetition_penalty)):
            if v is not None:
                args += [flag, str(v)]
        key = tuple(args)
        if key not in self.memo:
            p = subprocess.run(args, capture_output=True, text=True, timeout=120, check=False)
            if p.returncode != 0:
                raise AssertionError(f"`{' '.join(args)}` exited {p.returncode}: {p.stderr.strip()}")
            self.memo[key] = json.loads(p.stdout)
        return self.memo[key]


def collect_stream(stream):
    chunks = []
    for chunk in stream:
        chunks.append(chunk)
        if len(chunks) > MAX_CHUNKS:
            stream.close()
            raise AssertionError(f"stream did not end within {MAX_CHUNKS} chunks")
    return chunks


def compare_logprobs(got_tokens, got_lps, got_tops, cli_lps, what):
    """Server's per-token logprobs against the CLI's. Returns the largest difference."""
    expect_eq(len(got_lps), len(cli_lps), f"{what}: number of logprobs")
    worst = 0.0
    for i, (tok, lp, top, ref) in enumerate(zip(got_tokens, got_lps, got_tops, cli_lps)):
        expect_eq(tok, ref["token"], f"{what}: token {i}")
        d = abs(lp - ref["logprob"])
        worst = max(worst, d)
        expect(d <= LOGPROB_TOL, f"{what}: logprob {i}: got {lp!r}, CLI {ref['logprob']!r}")
        want_top = {}
        for t in ref["top"]:
            want_top.setdefault(t["token"], t["logprob"])
        expect_eq(sorted(top), sorted(want_top), f"{what}: top tokens at {i}")
        for t, v in top.items():
            d = abs(v - want_top[t])
            worst = max(worst, d)
            expect(d <= LOGPROB_TOL, f"{what}: top logprob of {t!r} at {i}: got {v!r}, CLI {want_top[t]!r}")
    return worst


def fmt_diff(worst):
    return "exact" if worst == 0.0 else f"max |diff| {worst:.3g}"
