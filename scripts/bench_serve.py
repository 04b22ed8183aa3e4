#!/usr/bin/env python3
"""Serving benchmark: `kvgpt serve` and, optionally, llama.cpp's `llama-server`, side by side.

    python3 scripts/bench_serve.py --kvgpt target/release/kvgpt --model /tmp/distilgpt2-random \\
        [--llama-server PATH/llama-server --gguf /tmp/distilgpt2-random-f32.gguf] \\
        -t 2 --concurrency 1,2,4,8,16 [--json out.json]

or kvgpt against kvgpt with other flags (e.g. speculative decoding), in the same interleaved way:

    python3 scripts/bench_serve.py --kvgpt target/release/kvgpt --model /tmp/distilgpt2-random \\
        --versus-arg=--draft --versus-arg=self:w8a8 --workloads unique --system 4 --question 4 --output 128

Standard library only. The script starts every server itself on a free loopback port (kvgpt with
`--port 0`, reading the port from its stderr; llama-server on a port picked here), waits for
`GET /health` to answer 200, runs the workloads, and stops it with SIGTERM. Both servers stay up for
the whole run and take turns: at every concurrency level each workload runs on one server and then
on the other (which one goes first alternates from level to level), so drift in the machine's speed
hits both alike. An idle server costs no CPU.

Workloads (prompts are lists of token ids drawn from a seeded RNG in [--id-lo, --id-hi), so both
servers see exactly the same tokens; every cell gets its own fresh ids, so each starts with none of
its prefixes in either server's cache):

  shared   G groups x K requests; a request = its group's system prompt of S tokens + its own
           question of Q tokens; O output tokens (SGLang's generated-shared-prefix set)
  unique   N = G*K requests with unique prompts of S+Q tokens (the control)

Requests go out in a shuffled fixed order; at concurrency C, C client threads each take the next
request. Every request is `POST /v1/completions` with {"prompt": ids, "max_tokens": O,
"temperature": 0 (or --temperature T, with "seed": 1), "ignore_eos": true, "stream": true,
"stream_options": {"include_usage": true}, "cache_prompt": true}. TTFT is the time to the first SSE chunk with text, ITL the gaps between
chunks with text (a chunk may hold more than one token: a server holds the bytes of a UTF-8
character split across tokens). Throughput is counted over the cell's wall time (first send to
last byte); output tokens are the servers' usage.completion_tokens. The prompt cache hit ratio is
sum(cached_tokens) / sum(prompt_tokens) from the final usage chunk (both servers fill
usage.prompt_tokens_details.cached_tokens; timings.cache_n/prompt_n are the fallback), shown next
to the expected ratio for the shared workload: (S/(S+Q)) * (1 - G/N), the first request of each
group missing.

Also measured:
  TTFT hit vs miss  a fresh S-token prefix + a Q-token question (miss), then the same prefix with
                    another question (hit), alone on the server, --hm-reps times with fresh
                    prefixes; reported: median miss TTFT / median hit TTFT
  scaling           output tok/s of the unique workload at concurrency 8 / at concurrency 1; with
                    the default 500-token prompts this is mostly prefill: for decode alone, run
                    --workloads unique --system 4 --question 4 --output 128 --concurrency 1,8
  bit identity      the shared cell's requests at concurrency 1 (served one at a time, first) are
                    sent again at --identity-concurrency (default 8), twice (the second pass finds
                    every prompt in the cache); kvgpt's texts must equal the concurrency-1 texts,
                    else the script exits 1. llama.cpp's agreement is reported, not enforced
                    (its docs say cached and uncached logits may differ).

With --versus-arg the second server is kvgpt again, with those flags added: its texts must equal
the first's in every cell (kvgpt's answers do not depend on its flags but the dtype), else exit 1.

Exit status: 0; 1 if a kvgpt text differed or a kvgpt request failed; 2 if a server could not start.

Before measuring, each server gets max(concurrency) unique requests at once (--warmup 0: none).

Every request loop is bounded in count (N requests per cell) and time (--request-timeout per
request, --max-minutes for the whole run: cells that would start later are skipped and listed).
"""

import argparse
import http.client
import json
import os
import random
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

HOST = "127.0.0.1"
NAMES = {"kvgpt": "kvgpt", "llama": "llama.cpp"}
BUSY_COMMANDS = {"cargo", "rustc", "cc1", "cc1plus", "ld", "lld", "mold"}


def log(msg):
    print(f"[bench_serve] {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------- servers

def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def http_get(port, path, timeout=5.0):
    conn = http.client.HTTPConnection(HOST, port, timeout=timeout)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        return resp.status, resp.read().decode("utf-8", "replace")
    finally:
        conn.close()


class Server:
    """One server process, its log file, and its port."""

    def __init__(self, key, cmd, port, logdir):
        self.key, self.cmd, self.port = key, cmd, port
        self.log_path = Path(logdir) / f"{key}.log"
        self.proc = None

    def log_tail(self, lines=15):
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def start(self, timeout):
        log(f"starting {NAMES[self.key]}: {' '.join(self.cmd)}")
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(self.cmd, stdin=subprocess.DEVNULL, stdout=self._log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{NAMES[self.key]} exited with {self.proc.returncode} while starting:\n"
                                   f"{self.log_tail()}")
            if self.port == 0:  # kvgpt --port 0: the chosen port is on its stderr
                m = re.search(r"listening on http://[0-9.]+:(\d+)", self.log_path.read_text(errors="replace"))
                if m:
                    self.port = int(m.group(1))
            if self.port:
                try:
                    status, _ = http_get(self.port, "/health", timeout=2.0)
                    if status == 200:
                        log(f"{NAMES[self.key]} ready on {HOST}:{self.port}")
                        return
                except (OSError, http.client.HTTPException):
                    pass
            time.sleep(0.2)
        raise RuntimeError(f"{NAMES[self.key]} did not answer /health with 200 within {timeout:.0f} s:\n"
                           f"{self.log_tail()}")

    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    def stop(self):
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                log(f"{NAMES[self.key]} did not exit 30 s after SIGTERM; killing it")
                self.proc.kill()
                self.proc.wait(timeout=10)
        log(f"{NAMES[self.key]} stopped (exit code {self.proc.returncode})")
        self._log.close()
        self.proc = None


def kvgpt_cmd(a):
    return [a.kvgpt, "serve", "--model", a.model, "--host", HOST, "--port", "0", "-t", str(a.threads),
            "--parallel", str(a.parallel), "--cache-mb", str(a.cache_mb), *a.kvgpt_arg]


def llama_cmd(a, port):
    cmd = [a.llama_server, "-m", a.gguf, "--host", HOST, "--port", str(port), "-t", str(a.threads),
           "-tb", str(a.threads), "-np", str(a.parallel), "-c", str(a.parallel * a.ctx_per_slot),
           "--no-kv-unified", "--cont-batching", "--cache-prompt", "--no-webui",
           "--cache-ram", str(a.llama_cache_ram if a.llama_cache_ram is not None else a.cache_mb)]
    if a.llama_kv != "default":
        cmd += ["-ctk", a.llama_kv, "-ctv", a.llama_kv]
    return cmd + a.llama_arg


def version_of(cmd):
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"? ({e})"
    text = (p.stdout + "\n" + p.stderr).strip()
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    keep = [ln for ln in lines if re.search(r"version|commit|kvgpt \d", ln, re.I)] or lines[:1]
    return "; ".join(keep[:2]) or "?"


def git_rev(path):
    try:
        root = Path(path).resolve().parent
        rev = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True,
                             text=True, timeout=10)
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10)
        if rev.returncode != 0:
            return None
        return rev.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.TimeoutExpired):
        return None


def cpu_model():
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "?"


def busy_processes():
    """Names of compilers etc. running now (their load would distort the numbers)."""
    found = set()
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                name = (d / "comm").read_text().strip()
            except OSError:
                continue
            if name in BUSY_COMMANDS:
                found.add(name)
    return sorted(found)


# ---------------------------------------------------------------- workloads

def ids(rng, n, a):
    return [rng.randrange(a.id_lo, a.id_hi) for _ in range(n)]


def shared_workload(a, tag):
    """G groups x K requests sharing the group's S-token system prompt, shuffled."""
    rng = random.Random(f"{a.seed}:shared:{tag}")
    reqs = []
    for g in range(a.groups):
        system = ids(rng, a.system, a)
        for k in range(a.per_group):
            reqs.append({"name": f"g{g}.q{k}", "group": g, "prompt": system + ids(rng, a.question, a)})
    rng.shuffle(reqs)
    return reqs


def unique_workload(a, tag):
    rng = random.Random(f"{a.seed}:unique:{tag}")
    return [{"name": f"u{i}", "group": None, "prompt": ids(rng, a.system + a.question, a)}
            for i in range(a.groups * a.per_group)]


def body_for(prompt, max_tokens, temperature):
    """Greedy at temperature 0; sampled otherwise, with a fixed seed (the same draws on every run)."""
    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": temperature, "ignore_eos": True,
            "stream": True, "stream_options": {"include_usage": True}, "cache_prompt": True}
    if temperature > 0:
        body["seed"] = 1
    return body


# ---------------------------------------------------------------- requests

def one_request(port, prompt, max_tokens, timeout, temperature=0.0, headers=None, on_text=None):
    """One streamed completion; returns its timings, text, usage and any error. `headers`: extra
    request headers (scripts/fleet.py sends a session id for nginx's consistent hash); `on_text()` is
    called at every chunk with text."""
    rec = {"ttft": None, "itl": [], "text": "", "chunks": 0, "usage": None, "timings": None, "finish": None,
           "error": None, "prompt_len": len(prompt)}
    payload = json.dumps(body_for(prompt, max_tokens, temperature)).encode()
    rec["t_start"] = time.perf_counter()
    t0 = rec["t_start"]
    conn = http.client.HTTPConnection(HOST, port, timeout=timeout)
    done = False
    try:
        conn.request("POST", "/v1/completions", body=payload,
                     headers={"Content-Type": "application/json", **(headers or {})})
        resp = conn.getresponse()
        if resp.status != 200:
            rec["error"] = f"HTTP {resp.status}: {resp.read(4000).decode('utf-8', 'replace').strip()}"
        else:
            last = None
            while True:
                line = resp.readline()
                now = time.perf_counter()
                if not line:
                    break
                if now - t0 > timeout:
                    rec["error"] = f"request took longer than {timeout} s"
                    break
                line = line.strip()
                if not line.startswith(b"data:"):
                    continue
                data = line[5:].strip()
                if data == b"[DONE]":
                    done = True
                    break
                obj = json.loads(data)
                if "error" in obj:
                    rec["error"] = f"error event: {json.dumps(obj['error'])[:2000]}"
                    break
                for ch in obj.get("choices") or []:
                    text = ch.get("text") or ""
                    if text:
                        if rec["ttft"] is None:
                            rec["ttft"] = now - t0
                        else:
                            rec["itl"].append(now - last)
                        last = now
                        rec["text"] += text
                        rec["chunks"] += 1
                        if on_text:
                            on_text()
                    if ch.get("finish_reason"):
                        rec["finish"] = ch["finish_reason"]
                if obj.get("usage"):
                    rec["usage"] = obj["usage"]
                if obj.get("timings"):
                    rec["timings"] = obj["timings"]
            if rec["error"] is None and not done:
                rec["error"] = "the stream ended without data: [DONE]"
    except (OSError, http.client.HTTPException, ValueError) as e:
        rec["error"] = f"{type(e).__name__}: {e}"
    finally:
        conn.close()
    rec["t_end"] = time.perf_counter()
    return rec


def cache_counts(rec):
    """(cached prompt tokens, prompt tokens) from the final chunk, or None."""
    u = rec.get("usage") or {}
    details = u.get("prompt_tokens_details")
    if isinstance(details, dict) and "cached_tokens" in details and "prompt_tokens" in u:
        return details["cached_tokens"], u["prompt_tokens"]
    t = rec.get("timings") or {}
    if "cache_n" in t and "prompt_n" in t:
        return t["cache_n"], t["cache_n"] + t["prompt_n"]
    return None


def completion_tokens(rec, default):
    u = rec.get("usage") or {}
    if "completion_tokens" in u:
        return u["completion_tokens"]
    t = rec.get("timings") or {}
    return t.get("predicted_n", default)


def run_cell(port, reqs, concurrency, max_tokens, timeout, deadline, temperature=0.0):
    """Sends reqs in order from `concurrency` threads; returns the records in request order."""
    out = [None] * len(reqs)
    nxt = [0]
    lock = threading.Lock()

    def worker():
        while time.monotonic() < deadline:
            with lock:
                i = nxt[0]
                if i >= len(reqs):
                    return
                nxt[0] += 1
            out[i] = one_request(port, reqs[i]["prompt"], max_tokens, timeout, temperature)

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout + max(0.0, deadline - time.monotonic()) + 60)
    for i, r in enumerate(out):
        if r is None:
            out[i] = {"error": "not sent: the run's time limit was reached", "text": None, "itl": [],
                      "ttft": None, "prompt_len": len(reqs[i]["prompt"])}
    return out


# ---------------------------------------------------------------- statistics

def pct(xs, q):
    """Percentile q in [0, 100] by linear interpolation; None for no data."""
    xs = sorted(x for x in xs if x is not None)
    if not xs:
        return None
    k = (len(xs) - 1) * q / 100.0
    lo = int(k)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def summarize(recs, max_tokens):
    ok = [r for r in recs if not r.get("error")]
    errors = [r["error"] for r in recs if r.get("error")]
    s = {"requests": len(recs), "ok": len(ok), "errors": len(errors), "error_samples": errors[:3]}
    if ok:
        wall = max(r["t_end"] for r in ok) - min(r["t_start"] for r in ok)
        out_tok = sum(completion_tokens(r, max_tokens) for r in ok)
        s.update({
            "wall_s": wall,
            "req_per_s": len(ok) / wall if wall > 0 else None,
            "out_tok_per_s": out_tok / wall if wall > 0 else None,
            "output_tokens": out_tok,
            "ttft_p50_ms": ms(pct([r["ttft"] for r in ok], 50)),
            "ttft_p99_ms": ms(pct([r["ttft"] for r in ok], 99)),
            "itl_p50_ms": ms(pct([x for r in ok for x in r["itl"]], 50)),
            "itl_p99_ms": ms(pct([x for r in ok for x in r["itl"]], 99)),
            "chunks_per_request": statistics.mean(r["chunks"] for r in ok),
        })
        counts = [cache_counts(r) for r in ok]
        if all(c is not None for c in counts):
            cached = sum(c[0] for c in counts)
            prompt = sum(c[1] for c in counts)
            s.update({"cached_tokens": cached, "prompt_tokens": prompt, "hit_ratio": cached / prompt if prompt else None})
        # Speculative decoding (kvgpt serve --draft): drafted tokens the model accepted.
        details = [(r.get("usage") or {}).get("completion_tokens_details") or {} for r in ok]
        acc = sum(d.get("accepted_prediction_tokens", 0) for d in details)
        rej = sum(d.get("rejected_prediction_tokens", 0) for d in details)
        if acc + rej:
            s.update({"accepted_tokens": acc, "drafted_tokens": acc + rej, "acceptance": acc / (acc + rej)})
    return s


def ms(x):
    return None if x is None else x * 1e3


def expected_hit(a, workload):
    if workload != "shared":
        return 0.0
    n = a.groups * a.per_group
    return (a.system / (a.system + a.question)) * (1 - a.groups / n)


# ---------------------------------------------------------------- the run

def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--kvgpt", required=True, help="the kvgpt binary")
    p.add_argument("--model", required=True, help="model folder for kvgpt (HF layout)")
    p.add_argument("--llama-server", help="llama.cpp's llama-server binary (optional)")
    p.add_argument("--gguf", help="the same model as a GGUF, for llama-server")
    p.add_argument("-t", "--threads", type=int, default=os.cpu_count() or 1)
    p.add_argument("--concurrency", default="1,2,4,8,16", help="comma-separated levels (1 is always run first)")
    p.add_argument("--groups", type=int, default=4, help="G: shared-prefix groups")
    p.add_argument("--per-group", type=int, default=8, help="K: requests per group")
    p.add_argument("--system", type=int, default=500, help="S: system prompt tokens")
    p.add_argument("--question", type=int, default=20, help="Q: question tokens")
    p.add_argument("--output", type=int, default=64, help="O: output tokens per request")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--temperature", type=float, default=0.0,
                   help="0: greedy; above: sampled at this temperature (request seed 1), to time the sampler")
    p.add_argument("--id-lo", type=int, default=1000, help="prompt token ids are drawn from [id-lo, id-hi)")
    p.add_argument("--id-hi", type=int, default=30000)
    p.add_argument("--parallel", type=int, default=16, help="server slots (kvgpt --parallel, llama-server -np)")
    p.add_argument("--cache-mb", type=int, default=512, help="kvgpt --cache-mb")
    p.add_argument("--ctx-per-slot", type=int, default=1024, help="llama-server context per slot (-c = parallel x this)")
    p.add_argument("--llama-kv", default="f32", choices=["f32", "f16", "bf16", "q8_0", "default"],
                   help="llama-server K/V cache type (kvgpt keeps K/V in f32); default: the server's own (f16)")
    p.add_argument("--llama-cache-ram", type=int, default=None,
                   help="llama-server --cache-ram MiB (its host-memory prompt cache); default: --cache-mb")
    p.add_argument("--kvgpt-arg", action="append", default=[], help="extra argument for kvgpt serve (repeatable)")
    p.add_argument("--llama-arg", action="append", default=[], help="extra argument for llama-server (repeatable)")
    p.add_argument("--versus-arg", action="append", default=[],
                   help="compare with a second kvgpt serve that also takes this argument (repeatable; "
                        "write --versus-arg=--flag), instead of llama-server")
    p.add_argument("--workloads", default="shared,unique", help="subset of shared,unique")
    p.add_argument("--warmup", type=int, default=1, choices=[0, 1],
                   help="1: before measuring, send each server max(concurrency) unique requests at once")
    p.add_argument("--hm-reps", type=int, default=5, help="TTFT hit-vs-miss repetitions (0: skip)")
    p.add_argument("--hm-output", type=int, default=4, help="output tokens of the hit-vs-miss requests")
    p.add_argument("--identity-concurrency", type=int, default=8)
    p.add_argument("--request-timeout", type=float, default=300.0, help="seconds per request")
    p.add_argument("--startup-timeout", type=float, default=300.0, help="seconds for a server to become healthy")
    p.add_argument("--max-minutes", type=float, default=90.0, help="time limit of the whole run")
    p.add_argument("--json", dest="json_out", help="write the raw numbers here")
    a = p.parse_args()
    a.levels = []
    for x in [1] + [int(v) for v in a.concurrency.split(",") if v.strip()]:
        if x < 1:
            p.error("concurrency levels must be >= 1")
        if x not in a.levels:
            a.levels.append(x)
    a.workload_list = [w.strip() for w in a.workloads.split(",") if w.strip()]
    if any(w not in ("shared", "unique") for w in a.workload_list) or not a.workload_list:
        p.error("--workloads takes shared and/or unique")
    if bool(a.llama_server) != bool(a.gguf):
        p.error("--llama-server and --gguf go together")
    if a.llama_server and a.versus_arg:
        p.error("--versus-arg compares two kvgpt servers; leave out --llama-server")
    if a.system + a.question + max(a.output, a.hm_output) > a.ctx_per_slot:
        p.error(f"S+Q+O = {a.system + a.question + a.output} exceeds the context per slot ({a.ctx_per_slot})")
    if a.groups < 1 or a.per_group < 1 or a.system < 1 or a.question < 1 or a.output < 1:
        p.error("G, K, S, Q and O must be >= 1")
    if not 0 <= a.id_lo < a.id_hi:
        p.error("need 0 <= id-lo < id-hi")
    return a


def main():
    a = parse_args()
    t_begin = time.monotonic()
    deadline = t_begin + a.max_minutes * 60
    busy = busy_processes()
    if busy:
        log(f"warning: {', '.join(busy)} running now; the numbers will be distorted")
    header = {
        "cpu": cpu_model(), "logical_cpus": os.cpu_count(), "threads": a.threads,
        "loadavg_at_start": Path("/proc/loadavg").read_text().split()[:3] if Path("/proc/loadavg").exists() else None,
        "busy_at_start": busy,
        "kvgpt": {"version": version_of([a.kvgpt, "--version"]), "git": git_rev(a.kvgpt), "cmd": None},
        "workload": {"G": a.groups, "K": a.per_group, "S": a.system, "Q": a.question, "O": a.output,
                     "N": a.groups * a.per_group, "seed": a.seed, "id_range": [a.id_lo, a.id_hi]},
        "levels": a.levels,
    }
    keys = ["kvgpt"] + (["llama"] if a.llama_server else ["kvgpt_b"] if a.versus_arg else [])
    NAMES["kvgpt_b"] = "kvgpt " + " ".join(a.versus_arg)
    logdir = tempfile.mkdtemp(prefix="bench_serve.")
    servers = {}
    results = {"cells": [], "identity": [], "hit_vs_miss": {}, "skipped": [], "server_errors": []}
    exit_code = 0
    busy_seen = set(busy)
    try:
        servers["kvgpt"] = Server("kvgpt", kvgpt_cmd(a), 0, logdir)
        header["kvgpt"]["cmd"] = servers["kvgpt"].cmd
        if a.versus_arg:
            servers["kvgpt_b"] = Server("kvgpt_b", kvgpt_cmd(a) + a.versus_arg, 0, logdir)
            header["kvgpt_b"] = {"cmd": servers["kvgpt_b"].cmd}
        if a.llama_server:
            port = free_port()
            servers["llama"] = Server("llama", llama_cmd(a, port), port, logdir)
            header["llama"] = {"version": version_of([a.llama_server, "--version"]),
                               "kv_cache": "f16 (server default)" if a.llama_kv == "default" else a.llama_kv,
                               "cmd": servers["llama"].cmd}
        for k in keys:
            servers[k].start(a.startup_timeout)
        if a.warmup:
            # One-time costs (first allocations, page faults, graph set-up) out of the first cell.
            c = max(a.levels)
            reqs = unique_workload(a, "warmup")[:c]
            for k in keys:
                log(f"{NAMES[k]}: warm-up, {len(reqs)} unique requests at concurrency {c} (not reported)")
                note_errors(results, k, "warm-up", run_cell(servers[k].port, reqs, c, a.output, a.request_timeout,
                                                            deadline), servers[k])

        texts_c1 = {}  # (server, workload tag) -> texts of the concurrency-1 shared cell, and its requests
        for li, c in enumerate(a.levels):
            order = keys if li % 2 == 0 else keys[::-1]
            for w in a.workload_list:
                reqs = (shared_workload if w == "shared" else unique_workload)(a, f"c{c}")
                for k in order:
                    if time.monotonic() > deadline:
                        results["skipped"].append(f"{NAMES[k]} {w} C={c}: time limit")
                        continue
                    if not servers[k].alive():
                        results["skipped"].append(f"{NAMES[k]} {w} C={c}: server not running")
                        continue
                    log(f"{NAMES[k]}: {w} x{len(reqs)} at concurrency {c}")
                    busy_seen.update(busy_processes())
                    recs = run_cell(servers[k].port, reqs, c, a.output, a.request_timeout, deadline, a.temperature)
                    s = summarize(recs, a.output)
                    note_errors(results, k, f"{w} C={c}", recs, servers[k])
                    results["cells"].append({"server": k, "workload": w, "concurrency": c, "summary": s,
                                             "expected_hit": expected_hit(a, w),
                                             "requests": [strip(r, q) for r, q in zip(recs, reqs)]})
                    log(f"  {fmt_summary(s)}")
                    if w == "shared" and c == 1:
                        texts_c1[k] = (reqs, [r.get("text") if not r.get("error") else None for r in recs])
                    if w == "shared" and c == a.identity_concurrency and k in texts_c1:
                        identity(a, results, servers[k], k, texts_c1[k], deadline)
        for k in keys:
            if "shared" in a.workload_list and k in texts_c1 and a.identity_concurrency not in a.levels:
                identity(a, results, servers[k], k, texts_c1[k], deadline)
        if a.hm_reps > 0:
            hit_vs_miss(a, results, servers, keys, deadline)
    except RuntimeError as e:
        log(str(e))
        results["fatal"] = str(e)
        exit_code = 2
    finally:
        for k in keys:
            if k in servers:
                if servers[k].proc is not None and servers[k].proc.poll() is not None:
                    results["server_errors"].append(f"{NAMES[k]} exited on its own with code "
                                                    f"{servers[k].proc.returncode}:\n{servers[k].log_tail()}")
                servers[k].stop()
    header["busy_during_run"] = sorted(busy_seen)
    header["elapsed_s"] = time.monotonic() - t_begin
    header["server_logs"] = logdir
    report(a, header, results, keys)
    kv_ident = [x for x in results["identity"] if x["server"].startswith("kvgpt")]
    if any(x["matched"] != x["total"] for x in kv_ident) or results.get("kvgpt_failed") or versus_differs(results):
        exit_code = max(exit_code, 1)
    if a.json_out:
        Path(a.json_out).write_text(json.dumps({"header": header, **results}, indent=1))
        log(f"wrote {a.json_out}")
    return exit_code


def versus_differs(results):
    """With --versus-arg: the cells where the second kvgpt's texts are not the first's."""
    cells = {(c["server"], c["workload"], c["concurrency"]): c for c in results["cells"]}
    bad = []
    for (k, w, c), cell in cells.items():
        other = cells.get(("kvgpt", w, c))
        if k == "kvgpt_b" and other:
            texts = [[r.get("text") for r in x["requests"]] for x in (cell, other)]
            if texts[0] != texts[1]:
                bad.append(f"{w} C={c}")
    return bad


def strip(rec, req):
    """A request's record for the JSON: no absolute clock values."""
    r = {k: v for k, v in rec.items() if k not in ("t_start", "t_end")}
    r["name"] = req["name"]
    if rec.get("t_end") is not None:
        r["latency_s"] = rec["t_end"] - rec["t_start"]
    return r


def note_errors(results, k, where, recs, server):
    errs = [r["error"] for r in recs if r.get("error")]
    if errs:
        msg = f"{NAMES[k]} {where}: {len(errs)} of {len(recs)} requests failed; first: {errs[0]}"
        log(msg)
        results["server_errors"].append(msg)
        if k.startswith("kvgpt"):
            results["kvgpt_failed"] = True
        if not server.alive():
            results["server_errors"].append(f"{NAMES[k]} is no longer running; log tail:\n{server.log_tail()}")


def identity(a, results, server, k, c1, deadline):
    """Replays the concurrency-1 shared cell at --identity-concurrency, twice, and compares texts."""
    reqs, base = c1
    c = a.identity_concurrency
    for p in (1, 2):
        if time.monotonic() > deadline or not server.alive():
            results["skipped"].append(f"{NAMES[k]} identity pass {p}: time limit or server down")
            return
        log(f"{NAMES[k]}: identity pass {p}: the concurrency-1 shared requests again at concurrency {c}")
        recs = run_cell(server.port, reqs, c, a.output, a.request_timeout, deadline, a.temperature)
        note_errors(results, k, f"identity pass {p}", recs, server)
        s = summarize(recs, a.output)
        differ = []
        for q, b, r in zip(reqs, base, recs):
            if b is None or r.get("error") or r.get("text") != b:
                differ.append({"name": q["name"], "alone": b, "batched": r.get("text"), "error": r.get("error")})
        results["identity"].append({"server": k, "pass": p, "concurrency": c, "total": len(reqs),
                                    "matched": len(reqs) - len(differ), "hit_ratio": s.get("hit_ratio"),
                                    "differ": differ})
        log(f"  {len(reqs) - len(differ)}/{len(reqs)} texts equal to the concurrency-1 run "
            f"(hit ratio {fmt_pct(s.get('hit_ratio'))})")


def hit_vs_miss(a, results, servers, keys, deadline):
    """TTFT of a fresh prefix (miss) and of the same prefix with another question (hit)."""
    samples = {k: {"miss": [], "hit": [], "miss_cached": [], "hit_cached": []} for k in keys}
    for rep in range(a.hm_reps):
        rng = random.Random(f"{a.seed}:hm:{rep}")
        prefix = ids(rng, a.system, a)
        q1, q2 = ids(rng, a.question, a), ids(rng, a.question, a)
        for k in (keys if rep % 2 == 0 else keys[::-1]):
            if time.monotonic() > deadline or not servers[k].alive():
                results["skipped"].append(f"{NAMES[k]} hit-vs-miss rep {rep}: time limit or server down")
                continue
            for kind, q in (("miss", q1), ("hit", q2)):
                r = one_request(servers[k].port, prefix + q, a.hm_output, a.request_timeout)
                if r.get("error"):
                    results["server_errors"].append(f"{NAMES[k]} hit-vs-miss {kind}: {r['error']}")
                    if k == "kvgpt":
                        results["kvgpt_failed"] = True
                    continue
                samples[k][kind].append(r["ttft"])
                cc = cache_counts(r)
                samples[k][kind + "_cached"].append(cc[0] if cc else None)
    for k in keys:
        m, h = samples[k]["miss"], samples[k]["hit"]
        med_m = statistics.median(m) if m else None
        med_h = statistics.median(h) if h else None
        results["hit_vs_miss"][k] = {**samples[k], "median_miss_ms": ms(med_m), "median_hit_ms": ms(med_h),
                                     "ratio": med_m / med_h if med_m and med_h else None}
        log(f"{NAMES[k]}: TTFT miss {fmt(ms(med_m))} ms, hit {fmt(ms(med_h))} ms "
            f"(cached tokens on hits: {samples[k]['hit_cached']})")


# ---------------------------------------------------------------- report

def fmt(x, digits=1):
    if x is None:
        return "–"
    if abs(x) >= 100:
        return f"{x:.0f}"
    return f"{x:.{digits}f}"


def fmt_pct(x):
    return "–" if x is None else f"{100 * x:.1f}%"


def fmt_summary(s):
    return (f"{s['ok']}/{s['requests']} ok, {fmt(s.get('req_per_s'), 2)} req/s, {fmt(s.get('out_tok_per_s'))} tok/s, "
            f"TTFT p50 {fmt(s.get('ttft_p50_ms'))} ms, ITL p50 {fmt(s.get('itl_p50_ms'))} ms, "
            f"hit {fmt_pct(s.get('hit_ratio'))}")


def ratio(x, y):
    return x / y if x is not None and y else None


def report(a, header, results, keys):
    both = len(keys) == 2
    cells = {(c["server"], c["workload"], c["concurrency"]): c for c in results["cells"]}
    out = []
    versus = " ÷ ".join(NAMES[k] for k in keys)
    out.append("## Serving benchmark: kvgpt serve" + (f" vs {NAMES[keys[1]]}" if both else ""))
    out.append("")
    out.append(f"- CPU: {header['cpu']} ({header['logical_cpus']} logical CPUs), threads per server: {a.threads}, "
               f"load average at start {' '.join(header['loadavg_at_start'] or ['?'])}"
               + (f", **also running (seen before a cell): {', '.join(header['busy_during_run'])}**"
                  if header["busy_during_run"] else ""))
    kv = header["kvgpt"]
    out.append(f"- kvgpt: {kv['version']}" + (f" (git {kv['git']})" if kv["git"] else "")
               + f": `serve --parallel {a.parallel} --cache-mb {a.cache_mb}"
               + (f" {' '.join(a.kvgpt_arg)}" if a.kvgpt_arg else "") + "`, K/V f32")
    if "kvgpt_b" in keys:
        out.append(f"- {NAMES['kvgpt_b']}: the same server with `{' '.join(a.versus_arg)}`")
    if "llama" in keys:
        ll = header["llama"]
        out.append(f"- llama.cpp: {ll['version']}: `llama-server -np {a.parallel} -c {a.parallel * a.ctx_per_slot}` "
                   f"({a.ctx_per_slot} per slot, no unified KV), continuous batching, prompt cache on, "
                   f"--cache-ram {a.llama_cache_ram if a.llama_cache_ram is not None else a.cache_mb} MiB, "
                   f"K/V cache {ll['kv_cache']}" + (f", extra {' '.join(a.llama_arg)}" if a.llama_arg else ""))
    w = header["workload"]
    out.append(f"- workloads: shared = {w['G']} groups × {w['K']} requests, system {w['S']} + question {w['Q']} "
               f"tokens, {w['O']} output tokens (N = {w['N']}); unique = {w['N']} prompts of {w['S'] + w['Q']} "
               f"tokens; token ids from seed {w['seed']} in [{a.id_lo}, {a.id_hi}), fresh per cell, "
               f"temperature {a.temperature}" + (" (seed 1)" if a.temperature > 0 else "") + ", ignore_eos, streamed")
    if both:
        out.append(f"- each cell: {' / '.join(NAMES[k] for k in keys)} ({versus}); throughput: higher is better, "
                   "latency: lower is better. ITL = gaps between streamed chunks with text.")
    out.append("")
    cols = ["workload", "C", "req/s", "out tok/s", "TTFT p50 ms", "TTFT p99 ms", "ITL p50 ms", "ITL p99 ms",
            "cache hit (expected)", "failed"] + (["drafts accepted"] if "kvgpt_b" in keys else [])
    out.append("| " + " | ".join(cols) + " |")
    out.append("|" + "|".join("---" for _ in cols) + "|")
    metrics = [("req_per_s", 2), ("out_tok_per_s", 1), ("ttft_p50_ms", 1), ("ttft_p99_ms", 1), ("itl_p50_ms", 2),
               ("itl_p99_ms", 2)]
    for wl in a.workload_list:
        for c in a.levels:
            row = [wl, str(c)]
            got = [cells.get((k, wl, c)) for k in keys]
            if all(g is None for g in got):
                continue
            ss = [g["summary"] if g else {} for g in got]
            for m, d in metrics:
                vals = [s.get(m) for s in ss]
                cell = " / ".join(fmt(v, d) for v in vals)
                if both:
                    r = ratio(vals[0], vals[1])
                    cell += f" ({fmt(r, 2)}×)" if r is not None else ""
                row.append(cell)
            hits = " / ".join(fmt_pct(s.get("hit_ratio")) for s in ss)
            row.append(f"{hits} ({fmt_pct(expected_hit(a, wl))})")
            row.append(" / ".join(str(s.get("errors", "–")) for s in ss))
            if "kvgpt_b" in keys:
                row.append(" / ".join(fmt_pct(s.get("acceptance")) for s in ss))
            out.append("| " + " | ".join(row) + " |")
    out.append("")

    # Derived figures.
    out.append("| figure | " + " | ".join(NAMES[k] for k in keys) + (f" | {versus} |" if both else " |"))
    out.append("|---|" + "---|" * (len(keys) + (1 if both else 0)))
    hm = results["hit_vs_miss"]
    if hm:
        vals = [hm.get(k, {}).get("ratio") for k in keys]
        row = [f"TTFT miss ÷ hit ({a.system}-token prefix + {a.question}, medians of {a.hm_reps})"]
        row += [f"{fmt(v, 2)}× ({fmt(hm[k]['median_miss_ms'])} ms ÷ {fmt(hm[k]['median_hit_ms'])} ms)"
                if k in hm else "–" for k, v in zip(keys, vals)]
        if both:
            row.append(fmt(ratio(vals[0], vals[1]), 2) + "×" if ratio(vals[0], vals[1]) else "–")
        out.append("| " + " | ".join(row) + " |")
    if "unique" in a.workload_list and 8 in a.levels:
        vals = []
        for k in keys:
            c8, c1 = cells.get((k, "unique", 8)), cells.get((k, "unique", 1))
            vals.append(ratio(c8["summary"].get("out_tok_per_s"), c1["summary"].get("out_tok_per_s"))
                        if c8 and c1 else None)
        row = [f"scaling: unique out tok/s, C=8 ÷ C=1 (prompts of {a.system + a.question} tokens, {a.output} out)"] + [f"{fmt(v, 2)}×" for v in vals]
        if both:
            row.append(fmt(ratio(vals[0], vals[1]), 2) + "×" if ratio(vals[0], vals[1]) else "–")
        out.append("| " + " | ".join(row) + " |")
    for p in (1, 2):
        xs = {x["server"]: x for x in results["identity"] if x["pass"] == p}
        if xs:
            row = [f"same text as served alone, shared at C={a.identity_concurrency}, pass {p}"
                   + (" (prompts now cached)" if p == 2 else "")]
            row += [f"{xs[k]['matched']}/{xs[k]['total']} (hit {fmt_pct(xs[k]['hit_ratio'])})" if k in xs else "–"
                    for k in keys]
            if both:
                row.append("")
            out.append("| " + " | ".join(row) + " |")
    if both:
        k1 = cells.get(("kvgpt", "shared", 1))
        l1 = cells.get((keys[1], "shared", 1))
        if k1 and l1:
            same = sum(1 for x, y in zip(k1["requests"], l1["requests"])
                       if not x.get("error") and not y.get("error") and x.get("text") == y.get("text"))
            out.append(f"| same text in both engines (shared, C=1) | {same}/{len(k1['requests'])} | | |")
    out.append("")
    out.append(f"Run took {header['elapsed_s']:.0f} s; server logs in {header['server_logs']}.")
    for s in results["skipped"]:
        out.append(f"- skipped: {s}")
    for cell in versus_differs(results):
        out.append(f"- problem: {NAMES['kvgpt_b']} answered {cell} with other texts than kvgpt")
    for e in results["server_errors"]:
        out.append(f"- problem: {e}")
    for x in results["identity"]:
        if x["server"] == "kvgpt" and x["differ"]:
            d = x["differ"][0]
            out.append(f"- kvgpt identity pass {x['pass']}: {x['total'] - x['matched']} texts differ; first: "
                       f"{d['name']}: alone {d['alone']!r:.120} vs batched {d['batched']!r:.120}"
                       + (f" (error {d['error']})" if d.get("error") else ""))
    if "fatal" in results:
        out.append(f"- fatal: {results['fatal']}")
    print("\n".join(out), flush=True)


if __name__ == "__main__":
    sys.exit(main())
