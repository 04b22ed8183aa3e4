#!/usr/bin/env python3
"""Serving benchmark: `kvgpt serve` and, optionally, llama.cpp's `llama-server`, side by side.

    python3 scripts/bench/bench_serve.py --kvgpt target/release/kvgpt --model /tmp/distilgpt2-random \\
        [--llama-server PATH/llama-server --gguf /tmp/distilgpt2-random-f32.gguf] \\
        -t 2 --concurrency 1,2,4,8,16 [--json out.json]

or kvgpt against kvgpt with other flags (e.g. speculative decoding), in the same interleaved way:

    python3 scripts/bench/bench_serve.py --kvgpt target/release/kvgpt --model /tmp/distilgpt2-random \\
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
import json
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

from serve_servers import (NAMES, Server, busy_processes, cpu_model, free_port, git_rev, kvgpt_cmd, llama_cmd, log,
                           version_of)
from serve_workloads import (cache_counts, expected_hit, ids, ms, one_request, run_cell, shared_workload, summarize,
                             unique_workload)
from serve_report import fmt, fmt_pct, fmt_summary, report, versus_differs


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
    p.add_argument("--parallel", type=int, default=None,
                   help="server slots (kvgpt --parallel, llama-server -np); default: kvgpt's own default, llama-server 16")
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
    header = run_header(a, busy)
    keys = ["kvgpt"] + (["llama"] if a.llama_server else ["kvgpt_b"] if a.versus_arg else [])
    NAMES["kvgpt_b"] = "kvgpt " + " ".join(a.versus_arg)
    logdir = tempfile.mkdtemp(prefix="bench_serve.")
    servers = {}
    results = {"cells": [], "identity": [], "hit_vs_miss": {}, "skipped": [], "server_errors": []}
    exit_code = 0
    busy_seen = set(busy)
    try:
        start_servers(a, header, servers, keys, logdir)
        if a.warmup:
            warm_up(a, results, servers, keys, deadline)
        run_levels(a, results, servers, keys, deadline, busy_seen)
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


def run_header(a, busy):
    """What the report and the JSON say about the machine, the binary and the workload."""
    return {
        "cpu": cpu_model(), "logical_cpus": os.cpu_count(), "threads": a.threads,
        "loadavg_at_start": Path("/proc/loadavg").read_text().split()[:3] if Path("/proc/loadavg").exists() else None,
        "busy_at_start": busy,
        "kvgpt": {"version": version_of([a.kvgpt, "--version"]), "git": git_rev(a.kvgpt), "cmd": None},
        "workload": {"G": a.groups, "K": a.per_group, "S": a.system, "Q": a.question, "O": a.output,
                     "N": a.groups * a.per_group, "seed": a.seed, "id_range": [a.id_lo, a.id_hi]},
        "levels": a.levels,
    }


def start_servers(a, header, servers, keys, logdir):
    """Every server of the run, started and healthy; their commands go into the header."""
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


def warm_up(a, results, servers, keys, deadline):
    """One-time costs (first allocations, page faults, graph set-up) out of the first cell."""
    c = max(a.levels)
    reqs = unique_workload(a, "warmup")[:c]
    for k in keys:
        log(f"{NAMES[k]}: warm-up, {len(reqs)} unique requests at concurrency {c} (not reported)")
        note_errors(results, k, "warm-up", run_cell(servers[k].port, reqs, c, a.output, a.request_timeout,
                                                    deadline), servers[k])


def run_levels(a, results, servers, keys, deadline, busy_seen):
    """Every cell: each concurrency level, each workload, each server (the order alternating by level);
    the identity passes when their level comes (or after the last level)."""
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


if __name__ == "__main__":
    sys.exit(main())
