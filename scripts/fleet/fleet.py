#!/usr/bin/env python3
"""Fleet benchmark: R `kvgpt serve` replicas behind vllm-router or nginx, policy by policy.

    python3 scripts/fleet/fleet.py --front vllm-router --kvgpt target/release/kvgpt --model /tmp/distilgpt2-random \\
        [--replicas 3] [--replica-threads 1] [--policies round_robin,cache_aware,kv_aware] [--rounds 2] \\
        [--fault] [--drain] [--json out.json]
    python3 scripts/fleet/fleet.py --front nginx --kvgpt target/release/kvgpt --model /tmp/distilgpt2-random [--fault] [--drain]

(scripts/fleet/fleet_vllm_router.sh and scripts/fleet/fleet_nginx.sh are these two commands, building what is
missing first.) Standard library only; the workload, the request loop and the statistics are
scripts/bench/bench_serve.py's, imported from its folder.

The script starts R replicas of `kvgpt serve -t T --parallel P --cache-mb M` on loopback ports it
picks (with --front vllm-router also `--kv-events` and `--kv-events-replay`, for kv_aware), one more
`kvgpt serve` alone with the same binary and flags (the identity reference, never behind the front),
and the front:

  vllm-router  vllm-router 0.1.17, pip-installed into --router-venv (default .venv-router in the
               repository, reused when it holds 0.1.17); a fresh router per cell: `--policy P
               --health-check-interval-secs 1 --health-failure-threshold 2 --health-success-threshold 1
               --worker-startup-check-interval 1`, kv_aware with the replicas' event endpoints given
               (`--kv-event-source`, `--kv-event-replay-source`, `--kv-event-model`), so the router
               routes on what the replicas' prompt caches hold. Policies: any of vllm-router's.
  nginx        Debian's nginx (apt-get installs it when `nginx` is missing), one process with a
               config in the log folder (no daemon, worker_processes 1) and two upstreams of the
               replicas: consistent_hash (`hash $http_x_session_id consistent`; every request
               carries `X-Session-Id: g<its group>`) and round_robin (the baseline). Unbuffered
               (SSE), HTTP/1.1 with keep-alive to the replicas, and `proxy_next_upstream error timeout
               http_503 non_idempotent`: a dead replica's or a draining one's requests go to another
               (non_idempotent: without it nginx never passes a POST on once it was sent, so a
               draining replica's 503 would reach the client).

A cell is one policy: every replica's prompt cache is flushed (POST /flush_cache), then the
shared-prefix workload (bench_serve's: G groups x K requests, an S-token system prompt per group + a
Q-token question, O output tokens, token ids fresh per cell) goes through the front from C client
threads; every request is streamed, greedy (temperature 0), ignore_eos. Per cell: requests ok and
failed, output tok/s over the cell's wall time, TTFT p50/p99, the fleet's prompt-cache hit ratio
twice (sum cached_tokens / sum prompt_tokens from the responses' usage, and from the replicas'
/metrics deltas of kvgpt_prompt_cached_tokens_total / kvgpt_prompt_tokens_total), how many requests
each replica served (its kvgpt_requests_total{endpoint="/v1/completions",status="200"} delta), and
the requests the front retried (vllm-router: vllm_router_retries_total; nginx: access-log lines whose
$upstream_addr lists more than one replica). Expected hit ratios: one server alone, (S/(S+Q))(1-G/N)
(the first request of each group misses); round robin over R, (S/(S+Q))(1-M/N) with M the
(group, replica) pairs when request i goes to replica i mod R in sending order (each group's first
request on each replica misses; concurrent requests of a group on one replica may both miss, which
makes the measured ratio lower). --rounds N repeats the policy list, its order reversed every other
round.

Identity: every completed answer must be the text the single server gives the same request alone
(it gets each distinct prompt once, after each cell); a difference, or a request that fails there,
makes the exit status 1.

--fault: one more cell under the first policy (--fault-policy), --fault-requests requests: once
--fault-kill-after of them have completed, the replica running the most requests is SIGKILLed; the
rest keep coming (spread over 2 x (--fault-restart-after + 3) s after the kill, so that they span the
outage and the restart; a slower model is slower than that anyway), and the replica is restarted on
the same ports --fault-restart-after seconds after the kill. Reported: sent, completed, failed
(non-200, or a stream cut short: no [DONE] or no finish_reason), retried by the front, wrong
(completed with another text than the single server's: must be 0), and what the replica served after
its restart. Checked: wrong = 0 and failed <= the requests in flight at the kill.

--drain: the same with SIGTERM instead: a long request (--drain-hold-tokens) is sent to that replica
directly and, once it streams, the replica gets SIGTERM; /health is polled until the replica exits.
Checked: /health answered 503 {"status":"draining"}; the long request and every request of the run
completed; the replica served (200) no completion that reached it after /health said draining (its
log); it exited 0. Reported: the completions it refused with 503 (the front sent them on), when it was
last sent one, when vllm-router marked it unhealthy; then it is restarted.

With random weights (/tmp/distilgpt2-random) the texts are gibberish, but the caching and routing are
real. Every loop is bounded in count and time (--request-timeout per request, --max-minutes for the
run: cells that would start later are skipped and listed); every process started here is stopped
at exit (SIGTERM, then SIGKILL); everything listens on 127.0.0.1; logs go into a temporary folder
printed at the end.

Exit status: 0 ok; 1 a wrong answer, a failed request outside --fault, or a check failed; 2 a process
could not start.
"""

import argparse
import http.client
import json
import os
import shutil
import signal
import threading
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(1, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bench"))  # bench_serve's modules
import serve_report  # noqa: E402  (the number formats)
import serve_servers  # noqa: E402  (the HTTP helpers, the machine and the binary)
import serve_workloads  # noqa: E402  (the workload, the request loop and the statistics)
from fleet_cells import drain_cell, fault_cell, run_cell, run_threads  # noqa: E402
from fleet_procs import HOST, REPO, ROUTER_VERSION, Proc, Replica, StartError, log, replica_cmd, stop_all  # noqa: E402
from fleet_fronts import Nginx, VllmRouter, ensure_nginx, ensure_vllm_router  # noqa: E402

POLICIES = {"vllm-router": "round_robin,cache_aware,kv_aware", "nginx": "consistent_hash,round_robin"}
VLLM_POLICIES = {"random", "round_robin", "cache_aware", "kv_aware", "power_of_two", "consistent_hash",
                 "sticky_least_loaded"}


# ---------------------------------------------------------------- report

fmt = serve_report.fmt
pct = serve_report.fmt_pct



class Identity:
    """Texts of one `kvgpt serve` alone, per (prompt, max_tokens), asked once each."""

    def __init__(self, a, server):
        self.a, self.server = a, server
        self.texts = {}
        self.checked = self.differ = self.failed = self.unchecked = 0
        self.samples = []

    def check(self, items, where, deadline):
        """items: [(prompt, max_tokens, text)] of completed answers; returns how many differ."""
        todo = []
        for prompt, n, _ in items:
            key = (tuple(prompt), n)
            if key not in self.texts and key not in todo:
                todo.append(key)
        lock = threading.Lock()
        queue = list(todo)

        def worker():
            while time.monotonic() < deadline:
                with lock:
                    if not queue:
                        return
                    key = queue.pop(0)
                r = serve_workloads.one_request(self.server.port, list(key[0]), key[1], self.a.request_timeout, 0.0)
                with lock:
                    self.texts[key] = None if r.get("error") or not r.get("finish") else r["text"]
                    if self.texts[key] is None:
                        self.failed += 1
                        self.samples.append(f"{where}: the single server failed: {r.get('error')}")

        run_threads(self.a, worker, deadline)
        differ = 0
        for prompt, n, text in items:
            want = self.texts.get((tuple(prompt), n))
            if want is None:  # the single server failed it, or the time limit came first
                self.unchecked += 1
                continue
            self.checked += 1
            if text != want:
                differ += 1
                self.samples.append(f"{where}: {len(prompt)}-token prompt: front {text!r:.100} vs alone {want!r:.100}")
        self.differ += differ
        return differ

def secs(x):
    return "–" if x is None else f"{x:.1f} s"


def report(a, header, results, front, replicas, identity):
    out = []
    out.append(f"## kvgpt fleet: {a.replicas} replicas behind {front.kind}")
    out.append("")
    out.append(f"- CPU: {header['cpu']} ({header['logical_cpus']} logical CPUs), load average at start "
               f"{' '.join(header['loadavg_at_start'] or ['?'])}"
               + (f", **also running: {', '.join(header['busy'])}**" if header["busy"] else ""))
    out.append(f"- kvgpt: {header['kvgpt_version']}" + (f" (git {header['git']})" if header["git"] else "")
               + f", `{a.kvgpt}`; {a.replicas} replicas × `serve -t {a.replica_threads} --parallel {a.parallel} "
               f"--cache-mb {a.cache_mb}" + (f" {' '.join(a.kvgpt_arg)}" if a.kvgpt_arg else "") + "`"
               + (", with --kv-events" if header["events"] else "") + f"; model {a.model}")
    out.append(f"- front: {front.describe()}")
    out.append(f"- workload: shared prefix, {a.groups} groups × {a.per_group} = {a.groups * a.per_group} requests, "
               f"system {a.system} + question {a.question} tokens, {a.output} output tokens, concurrency "
               f"{a.concurrency}, greedy, ignore_eos, streamed; token ids fresh per cell, prompt caches flushed before "
               f"each cell; {a.rounds} round(s), the policy order reversed every other round")
    out.append("- the weights are random: the texts are gibberish, but the prompt caching and the routing are real")
    out.append(f"- expected hit ratio: one server alone (S/(S+Q))·(1−G/N) = "
               f"{pct(serve_workloads.expected_hit(a, 'shared'))}; round robin over {a.replicas} (each group's first request "
               f"on each replica misses, in sending order) in the table")
    out.append("")
    cols = ["policy", "round", "ok", "failed", "out tok/s", "TTFT p50 ms", "TTFT p99 ms", "hit (usage)",
            "hit (/metrics)", "expected RR", "served per replica", "retried"]
    out.append("| " + " | ".join(cols) + " |")
    out.append("|" + "---|" * len(cols))
    order = {p: i for i, p in enumerate(a.policy_list)}
    for c in sorted(results["cells"], key=lambda c: (order.get(c["policy"], 99), c["round"])):
        s = c["summary"]
        served = " / ".join("–" if v is None else str(int(v)) for v in c["served"].values())
        out.append("| " + " | ".join([c["policy"], str(c["round"]), str(s["ok"]), str(s["errors"]),
                                      fmt(s.get("out_tok_per_s")), fmt(s.get("ttft_p50_ms")),
                                      fmt(s.get("ttft_p99_ms")), pct(s.get("hit_ratio")),
                                      pct(c["metrics_hit_ratio"]), pct(c["expected_round_robin"]), served,
                                      str(c["retried"])]) + " |")
    out.append("")
    f = results.get("fault")
    if f:
        out.append(f"### Fault: SIGKILL of a replica during a run ({f['policy']}, {f['requests']} requests, restart "
                   f"{a.fault_restart_after} s later)")
        out.append("")
        out.append("| sent | completed | failed | retried | wrong | killed | in flight at the kill | router: unhealthy / "
                   "healthy again | restarted healthy | served by it after restart | served by the others |")
        out.append("|---|---|---|---|---|---|---|---|---|---|---|")
        others = " / ".join("–" if v is None else str(int(v)) for k, v in f["served"].items() if k != f["killed"])
        router = ("–" if front.kind != "vllm-router" else
                  f"{secs(f['router_unhealthy_s'])} / {secs(f['router_healthy_again_s'])}")
        out.append(f"| {f['sent']} | {f['completed']} | {f['failed']} | {f['retried']} | {f['wrong']} | {f['killed']} "
                   f"after {f['completed_before_kill']} completed | {f['in_flight_at_kill']} | {router} | "
                   f"{secs(f['restart_ready_s'])} | {'–' if f['served_after_restart'] is None else int(f['served_after_restart'])} "
                   f"| {others} |")
        out.append("")
        if f["failed_samples"]:
            out.append(f"- failed (first): {f['failed_samples'][0][:300]}")
        out.append("- times are after the kill; failed = non-200 or a stream cut short (no [DONE] or no "
                   "finish_reason); wrong = completed with a text other than the single server's")
        out.append("")
    d = results.get("drain")
    if d:
        out.append(f"### Drain: SIGTERM to a replica during a run ({d['policy']}, {d['requests']} requests)")
        out.append("")
        out.append("| replica | /health 503 after | drained (exit code) | finished while draining | long request "
                   "in flight | refused with 503 (sent on) | last reached it | router: unhealthy | served after "
                   "draining | run: completed / failed / wrong | retried | restarted healthy |")
        out.append("|" + "---|" * 12)
        hold = d["hold"]
        out.append(f"| {d['replica']} | {fmt(d['health_503_after_ms'])} ms | {secs(d['drained_s'])} ({d['exit_code']}) "
                   f"| {d['finished_in_drain']} (running at SIGTERM: {fmt(d['running_at_term'], 0)}) | "
                   f"{hold['tokens']} tokens, {'completed' if hold['completed'] else 'FAILED'} "
                   f"({secs(hold['seconds'])}) | {d['refused_503']} | "
                   f"{'–' if d['last_arrival_s'] is None else '+' + secs(d['last_arrival_s'])} | "
                   f"{secs(d['router_unhealthy_s']) if front.kind == 'vllm-router' else '–'} | {d['served_after_draining']} "
                   f"| {d['completed']} / {d['failed']} / {d['wrong']} | {d['retried']} | {secs(d['restart_ready_s'])} |")
        out.append("")
        out.append(f"- /health answered {d['health_body']!s} while the requests in flight on it finished (the long "
                   f"one was sent to it directly; {d['in_flight_at_term']} of the run were in flight across the fleet); "
                   "times are after SIGTERM; refused = completions it answered 503 while draining, which the front "
                   "sent to another replica; served after draining = completions that reached it after /health said "
                   "draining and were answered 200 (must be 0)")
        out.append("- " + ("checks: all passed" if not d["checks_failed"] else
                           "checks FAILED: " + "; ".join(d["checks_failed"])))
        out.append("")
    out.append(f"- same text as one `kvgpt serve` alone (same binary and flags, not behind the front): "
               f"{identity.checked - identity.differ}/{identity.checked} completed answers"
               + (f", **{identity.differ} differ**" if identity.differ else "")
               + (f", **{identity.failed} failed on the single server**" if identity.failed else "")
               + (f"; {identity.unchecked} not compared (failed there, or the time limit)" if identity.unchecked else ""))
    for s in identity.samples[:5]:
        out.append(f"  - {s}")
    out.append(f"- run took {header['elapsed_s']:.0f} s; logs in {header['logdir']}")
    for s in results["skipped"]:
        out.append(f"- skipped: {s}")
    for p in results["problems"]:
        out.append(f"- problem: {p}")
    if results.get("fatal"):
        out.append(f"- fatal: {results['fatal']}")
    print("\n".join(out), flush=True)


# ---------------------------------------------------------------- main

def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--front", required=True, choices=["vllm-router", "nginx"])
    p.add_argument("--kvgpt", required=True, help="the kvgpt binary")
    p.add_argument("--model", required=True, help="model folder for kvgpt serve")
    p.add_argument("--replicas", type=int, default=3, help="R: kvgpt serve replicas")
    p.add_argument("--replica-threads", type=int, default=1, help="-t of every replica")
    p.add_argument("--parallel", type=int, default=16, help="kvgpt serve --parallel")
    p.add_argument("--cache-mb", type=int, default=512, help="kvgpt serve --cache-mb")
    p.add_argument("--kvgpt-arg", action="append", default=[], help="extra argument for every kvgpt serve (repeatable)")
    p.add_argument("--policies", help="comma-separated; vllm-router default round_robin,cache_aware,kv_aware, "
                                      "nginx: consistent_hash,round_robin")
    p.add_argument("--rounds", type=int, default=1, help="repeat the policy list, its order reversed every other round")
    p.add_argument("--groups", type=int, default=6, help="G: shared-prefix groups")
    p.add_argument("--per-group", type=int, default=8, help="K: requests per group")
    p.add_argument("--system", type=int, default=500, help="S: system prompt tokens")
    p.add_argument("--question", type=int, default=20, help="Q: question tokens")
    p.add_argument("--output", type=int, default=64, help="O: output tokens per request")
    p.add_argument("--concurrency", type=int, default=4, help="client threads")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--id-lo", type=int, default=1000, help="prompt token ids are drawn from [id-lo, id-hi)")
    p.add_argument("--id-hi", type=int, default=30000)
    p.add_argument("--router-venv", default=str(REPO / ".venv-router"),
                   help=f"venv with vllm-router {ROUTER_VERSION} (pip-installed there when missing)")
    p.add_argument("--router-arg", action="append", default=[], help="extra argument for vllm-router (repeatable; "
                                                                     "write --router-arg=--flag)")
    p.add_argument("--fault", action="store_true", help="also SIGKILL a replica during a run, and restart it")
    p.add_argument("--fault-policy", help="policy of the --fault and --drain runs (default: the first)")
    p.add_argument("--fault-requests", type=int, default=48, help="requests of the --fault and --drain runs")
    p.add_argument("--fault-kill-after", type=float, default=0.25,
                   help="kill (or SIGTERM) once this fraction of the run's requests has completed")
    p.add_argument("--fault-restart-after", type=float, default=5.0, help="seconds from the kill to the restart")
    p.add_argument("--drain", action="store_true", help="also SIGTERM a replica during a run, check the drain, restart it")
    p.add_argument("--drain-hold-tokens", type=int, default=0,
                   help="tokens of the long request in flight at SIGTERM (default: the context's room, at most 512)")
    p.add_argument("--request-timeout", type=float, default=300.0, help="seconds per request")
    p.add_argument("--startup-timeout", type=float, default=300.0, help="seconds for a process to become healthy")
    p.add_argument("--max-minutes", type=float, default=60.0, help="time limit of the whole run")
    p.add_argument("--json", dest="json_out", help="write the raw numbers here")
    a = p.parse_args()
    a.policy_list = [x.strip() for x in (a.policies or POLICIES[a.front]).split(",") if x.strip()]
    allowed = VLLM_POLICIES if a.front == "vllm-router" else {"consistent_hash", "round_robin"}
    bad = [x for x in a.policy_list if x not in allowed]
    if bad or not a.policy_list:
        p.error(f"--policies for {a.front}: {', '.join(sorted(allowed))} (not {', '.join(bad) or 'none'})")
    a.fault_policy = a.fault_policy or a.policy_list[0]
    if a.fault_policy not in allowed:
        p.error(f"--fault-policy {a.fault_policy}: not a {a.front} policy")
    if min(a.replicas, a.replica_threads, a.groups, a.per_group, a.system, a.question, a.output, a.concurrency,
           a.rounds, a.fault_requests) < 1:
        p.error("replicas, threads, G, K, S, Q, O, concurrency, rounds and fault requests must be >= 1")
    if not 0 < a.fault_kill_after < 1:
        p.error("--fault-kill-after is a fraction in (0, 1)")
    if not 0 <= a.id_lo < a.id_hi:
        p.error("need 0 <= id-lo < id-hi")
    a.kvgpt = str(Path(a.kvgpt).resolve()) if os.sep in a.kvgpt else (shutil.which(a.kvgpt) or a.kvgpt)
    a.model = str(Path(a.model).resolve()) if Path(a.model).exists() else a.model
    a.router_venv = str(Path(a.router_venv).resolve())
    return a


def on_signal(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


def main():
    a = parse_args()
    t_begin = time.monotonic()
    deadline = t_begin + a.max_minutes * 60
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGHUP, on_signal)
    logdir = tempfile.mkdtemp(prefix="fleet.")
    os.chmod(logdir, 0o755)
    busy = serve_servers.busy_processes()
    if busy:
        log(f"warning: {', '.join(busy)} running now; the numbers will be distorted")
    events = a.front == "vllm-router" and "kv_aware" in a.policy_list + [a.fault_policy] * (a.fault or a.drain)
    header = {"cpu": serve_servers.cpu_model(), "logical_cpus": os.cpu_count(), "busy": busy,
              "loadavg_at_start": Path("/proc/loadavg").read_text().split()[:3] if Path("/proc/loadavg").exists() else None,
              "kvgpt_version": serve_servers.version_of([a.kvgpt, "--version"]), "git": serve_servers.git_rev(a.kvgpt),
              "events": events, "logdir": logdir, "args": {k: v for k, v in vars(a).items()}}
    results = {"cells": [], "skipped": [], "problems": []}
    exit_code = 0
    replicas, front, identity = [], None, None
    try:
        if a.front == "vllm-router":  # the front's software first: nothing to stop if it cannot be had
            ensure_vllm_router(a)
        else:
            ensure_nginx()
        replicas = [Replica(i, a, logdir, events) for i in range(a.replicas)]
        alone = Proc("alone", replica_cmd(a, 0) + (["--kv-events", f"tcp://{HOST}:0"] if events else []), logdir, 0)
        for r in replicas:
            r.start()
        alone.start()
        for r in replicas:
            r.ready(a.startup_timeout)
        alone.wait_http("/health", a.startup_timeout)
        log(f"the single server (identity reference) ready on {HOST}:{alone.port}")
        info = json.loads(serve_servers.http_get(replicas[0].port, "/server_info")[1])
        a.served_name, a.context_length = info.get("served_model_name") or info.get("model_id"), info["context_length"]
        header["server_info"] = info
        if a.system + a.question + a.output > a.context_length:
            raise StartError(f"S+Q+O = {a.system + a.question + a.output} exceeds the model's {a.context_length} positions")
        identity = Identity(a, alone)
        front = (VllmRouter if a.front == "vllm-router" else Nginx)(a, replicas, logdir)
        header["front"] = {"kind": front.kind, "version": front.version}
        for rnd in range(1, a.rounds + 1):
            for policy in (a.policy_list if rnd % 2 else a.policy_list[::-1]):
                if time.monotonic() > deadline:
                    results["skipped"].append(f"{policy} round {rnd}: time limit")
                    continue
                run_cell(a, front, replicas, identity, policy, rnd, deadline, results)
        for flag, fn, name in ((a.fault, fault_cell, "fault"), (a.drain, drain_cell, "drain")):
            if not flag:
                continue
            if time.monotonic() > deadline:
                results["skipped"].append(f"{name}: time limit")
                continue
            dead = [r.name for r in replicas if not r.alive()]
            if dead:
                results["problems"].append(f"{name}: not run, {', '.join(dead)} not running")
                continue
            fn(a, front, replicas, identity, a.fault_policy, deadline, results)
        for r in replicas + [alone]:
            if not r.alive():
                results["problems"].append(f"{r.name} is not running at the end:\n{r.log_tail()}")
    except StartError as e:
        log(str(e))
        results["fatal"] = str(e)
        exit_code = 2
    except (RuntimeError, OSError, http.client.HTTPException, ValueError) as e:
        log(f"{type(e).__name__}: {e}")
        results["fatal"] = f"{type(e).__name__}: {e}"
        exit_code = 1
    except KeyboardInterrupt as e:
        results["fatal"] = f"interrupted ({e})"
        exit_code = 1
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        stop_all()
    header["elapsed_s"] = time.monotonic() - t_begin
    if front is not None and identity is not None:
        report(a, header, results, front, replicas, identity)
    else:
        print(f"fleet: {results.get('fatal')}\nlogs in {logdir}", flush=True)
    if identity is not None and (identity.differ or identity.failed):
        exit_code = max(exit_code, 1)
    if results["problems"] and exit_code == 0:
        exit_code = 1
    if a.json_out:
        out = {"header": header, **results,
               "identity": None if identity is None else {"checked": identity.checked, "differ": identity.differ,
                                                          "failed_alone": identity.failed, "unchecked": identity.unchecked,
                                                          "samples": identity.samples}}
        Path(a.json_out).write_text(json.dumps(out, indent=1, default=str))
        log(f"wrote {a.json_out}")
    log(f"exit status {exit_code}; logs in {logdir}")
    return exit_code


if __name__ == "__main__":
    sys.exit(main())
