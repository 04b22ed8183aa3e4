#!/usr/bin/env python3
"""scripts/fleet/fleet.py's runs: the request loop through a front (Runner) and the cells: run_cell (one
policy), fault_cell (--fault, SIGKILL) and drain_cell (--drain, SIGTERM), with their helpers.
Imports fleet_procs, never fleet.py or fleet_fronts.py (a front comes in as an argument)."""

import argparse
import datetime
import http.client
import math
import os
import re
import signal
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(1, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bench"))  # bench_serve's modules
import serve_report  # noqa: E402  (the number formats)
import serve_servers  # noqa: E402  (the HTTP helpers, the machine and the binary)
import serve_workloads  # noqa: E402  (the workload, the request loop and the statistics)
from fleet_procs import StartError, deltas, flush, log, replica_counts, snapshot  # noqa: E402


# ---------------------------------------------------------------- running requests

def run_threads(a, target, deadline):
    """C threads running `target`; each joined for the request timeout plus what is left until the deadline."""
    threads = [threading.Thread(target=target, daemon=True) for _ in range(a.concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(a.request_timeout + max(0.0, deadline - time.monotonic()) + 60)


class Runner:
    """Sends reqs through `port` from C threads, in order; `gate(i)` may hold request i back and
    `on_done(runner)` runs after every request. Bounded by the deadline and the request timeout."""

    def __init__(self, a, port, reqs, headers, deadline, gate=None, on_done=None):
        self.a, self.port, self.reqs, self.headers, self.deadline = a, port, reqs, headers, deadline
        self.gate, self.on_done = gate, on_done
        self.recs = [None] * len(reqs)
        self.lock = threading.Lock()
        self.next = self.started = self.finished = 0

    def in_flight(self):
        with self.lock:
            return self.started - self.finished

    def _worker(self):
        while time.monotonic() < self.deadline:
            with self.lock:
                i = self.next
                if i >= len(self.reqs):
                    return
                self.next += 1
            if self.gate:
                self.gate(i)
                if time.monotonic() > self.deadline:
                    return
            q = self.reqs[i]
            with self.lock:
                self.started += 1
            rec = serve_workloads.one_request(self.port, q["prompt"], self.a.output, self.a.request_timeout, 0.0,
                                          headers=self.headers(q))
            if not rec.get("error") and not rec.get("finish"):
                rec["error"] = "the stream had no finish_reason"
            with self.lock:
                self.recs[i] = rec
                self.finished += 1
            if self.on_done:
                self.on_done(self)

    def run(self):
        run_threads(self.a, self._worker, self.deadline)
        for i, r in enumerate(self.recs):
            if r is None:
                self.recs[i] = {"error": "not sent: the run's time limit was reached", "text": None, "itl": [],
                                "ttft": None, "prompt_len": len(self.reqs[i]["prompt"]), "not_sent": True}
        return self.recs


def hold_request(port, prompt, max_tokens, timeout, streaming, out):
    """A long streamed request straight to one replica; sets `streaming` at its first text."""
    t0 = time.monotonic()
    try:
        out.update(serve_workloads.one_request(port, prompt, max_tokens, timeout, on_text=streaming.set))
    finally:
        out["seconds"] = time.monotonic() - t0
        streaming.set()


# ---------------------------------------------------------------- identity

def completed_items(a, reqs, recs):
    return [(q["prompt"], a.output, r["text"]) for q, r in zip(reqs, recs) if not r.get("error")]


# ---------------------------------------------------------------- cells

def expected_rr(a, reqs, replicas):
    """Hit ratio when request i goes to replica i mod R: each (group, replica) pair's first request misses."""
    pairs = {(q["group"], i % replicas) for i, q in enumerate(reqs)}
    return (a.system / (a.system + a.question)) * (1 - len(pairs) / len(reqs))


def run_cell(a, front, replicas, identity, policy, rnd, deadline, results):
    reqs = serve_workloads.shared_workload(a, f"{policy}.{rnd}")
    flush(replicas)
    port = front.begin(policy, a.startup_timeout)
    try:
        before, mark = snapshot(replicas), front.mark()
        log(f"{policy} round {rnd}: {len(reqs)} requests at concurrency {a.concurrency} through {front.kind} :{port}")
        recs = Runner(a, port, reqs, front.headers, deadline).run()
        time.sleep(0.2)  # the replicas count a request once its response has gone out
        d = deltas(before, snapshot(replicas))
        retried, router = front.retries_since(mark), front.router_deltas(mark)
    finally:
        front.end()
    s = serve_workloads.summarize(recs, a.output)
    prompt = sum(x["prompt"] for x in d.values() if x)
    cached = sum(x["cached"] for x in d.values() if x)
    differ = identity.check(completed_items(a, reqs, recs), f"{policy} round {rnd}", deadline)
    cell = {"policy": policy, "round": rnd, "summary": s, "retried": retried, "front": router,
            "metrics_hit_ratio": cached / prompt if prompt else None, "metrics_prompt_tokens": prompt,
            "metrics_cached_tokens": cached, "served": {r.name: (d[r.index] or {}).get("served") for r in replicas},
            "expected_one_server": serve_workloads.expected_hit(a, "shared"),
            "expected_round_robin": expected_rr(a, reqs, len(replicas)), "identity_differ": differ,
            "requests": [strip(r, q) for r, q in zip(recs, reqs)]}
    results["cells"].append(cell)
    log(f"  {serve_report.fmt_summary(s)}; /metrics hit {serve_report.fmt_pct(cell['metrics_hit_ratio'])}; "
        f"served {list(cell['served'].values())}; retried {retried}; texts differing from the single server: {differ}")
    if s["errors"]:
        results["problems"].append(f"{policy} round {rnd}: {s['errors']} of {s['requests']} requests failed; "
                                   f"first: {s['error_samples'][0]}")


def strip(rec, req):
    r = {k: v for k, v in rec.items() if k not in ("t_start", "t_end", "itl")}
    r.update({"name": req["name"], "group": req["group"]})
    if rec.get("t_end") is not None:
        r["latency_s"] = rec["t_end"] - rec["t_start"]
    return r


def pick_busiest(replicas):
    """The replica running the most sequences now (then: the one that served most)."""
    counts = [(r, replica_counts(r) or {}) for r in replicas if r.alive()]
    return max(counts, key=lambda rc: ((rc[1].get("running") or 0), (rc[1].get("served") or 0)))[0]


def workload(a, tag, **changes):
    """bench_serve's shared-prefix workload for the run's arguments with `changes` made."""
    return serve_workloads.shared_workload(argparse.Namespace(**{**vars(a), **changes}), tag)


def disruption_workload(a, tag):
    n = a.fault_requests
    return workload(a, tag, per_group=max(1, math.ceil(n / a.groups)))[:n]


def paced_gate(a, k0, event, state, deadline):
    """Requests after the first k0 + C wait for the event, then start spread over the span."""
    n = a.fault_requests
    rest = max(1, n - k0 - a.concurrency)
    spacing = 2 * (a.fault_restart_after + 3) / rest

    def gate(i):
        if i < k0 + a.concurrency:
            return
        while not event.wait(0.1):
            if time.monotonic() > deadline:
                return
        t = state["t_event"] + (i - k0 - a.concurrency + 1) * spacing
        while time.monotonic() < min(t, deadline):
            time.sleep(min(0.05, max(0.0, t - time.monotonic())))

    return gate


def restart(a, r, at, state, front):
    """Restarts replica r at monotonic time `at`; records when it is healthy again."""
    while time.monotonic() < at:
        time.sleep(0.05)
    try:
        r.restarts += 1
        r.up(a.startup_timeout)
        state["restart_ready"] = time.monotonic()
    except StartError as e:
        state["restart_error"] = str(e)
        log(str(e))


def watch_router(front, r, state, stop):
    """vllm-router: when the router took r for unhealthy, and healthy again."""
    while not stop.is_set():
        h = front.worker_healthy(r)
        now = time.monotonic()
        if h is False and "router_unhealthy" not in state:
            state["router_unhealthy"] = now
        if h is True and "router_unhealthy" in state and "router_healthy_again" not in state:
            state["router_healthy_again"] = now
        stop.wait(0.2)


class Disruption:
    """What fault_cell and drain_cell do differently in disrupted_run: the requests `reqs`; after the
    first k0 + C of them, the rest wait for `event`, then come spread out (paced_gate); act(runner) runs
    once, when k0 have completed; join() waits for the threads it started; `state` collects the times
    and `stop_watch` stops the router watcher; `what` is the log line."""

    def __init__(self, reqs, k0, event, state, stop_watch, act, join, what):
        self.reqs, self.k0, self.event, self.state = reqs, k0, event, state
        self.stop_watch, self.act, self.join, self.what = stop_watch, act, join, what


def disrupted_run(a, front, replicas, policy, deadline, d):
    """fault_cell's and drain_cell's run through the front (see Disruption). Returns recs, before,
    after, retried, router."""
    reqs, k0, event, state, stop_watch, act, join, what = (d.reqs, d.k0, d.event, d.state, d.stop_watch, d.act,
                                                           d.join, d.what)
    once = threading.Lock()
    flush(replicas)
    port = front.begin(policy, a.startup_timeout)
    try:
        before, mark = snapshot(replicas), front.mark()

        def on_done(runner):
            if runner.finished >= k0 and once.acquire(blocking=False):
                act(runner)

        log(what)
        recs = Runner(a, port, reqs, front.headers, deadline, paced_gate(a, k0, event, state, deadline),
                      on_done).run()
        join()
        time.sleep(0.2)
        stop_watch.set()
        after = snapshot(replicas)
        retried, router = front.retries_since(mark), front.router_deltas(mark)
    finally:
        stop_watch.set()
        front.end()
    return recs, before, after, retried, router


def since_event(state, key):
    """Seconds from the SIGKILL or SIGTERM to state[key]; None when either is missing."""
    t0 = state.get("t_event")
    return None if key not in state or t0 is None else state[key] - t0


def fault_cell(a, front, replicas, identity, policy, deadline, results):
    reqs = disruption_workload(a, "fault")
    k0 = max(1, round(len(reqs) * a.fault_kill_after))
    killed, state, threads, stop_watch = threading.Event(), {}, [], threading.Event()

    def kill(runner):
        r = pick_busiest(replicas)
        state.update({"killed": r.name, "in_flight_at_kill": runner.in_flight(),
                      "completed_before_kill": runner.finished})
        r.signal(signal.SIGKILL)
        r.wait(10)
        state["t_event"] = time.monotonic()
        log(f"fault: SIGKILLed {r.name} after {state['completed_before_kill']} completed "
            f"({state['in_flight_at_kill']} in flight)")
        state["replica"] = r
        killed.set()
        t = threading.Thread(target=restart, args=(a, r, state["t_event"] + a.fault_restart_after, state, front),
                             daemon=True)
        t.start()
        threads.append(t)
        w = threading.Thread(target=watch_router, args=(front, r, state, stop_watch), daemon=True)
        w.start()
        threads.append(w)

    def join():  # the restart (the watcher stops with stop_watch)
        for t in threads[:1]:
            t.join(a.fault_restart_after + a.startup_timeout + 10)

    what = (f"fault ({policy}): {len(reqs)} requests at concurrency {a.concurrency}; SIGKILL a replica after "
            f"{k0} have completed, restart it {a.fault_restart_after} s later")
    recs, before, after, retried, router = disrupted_run(
        a, front, replicas, policy, deadline, Disruption(reqs, k0, killed, state, stop_watch, kill, join, what))
    r = state.get("replica")
    sent = sum(1 for x in recs if not x.get("not_sent"))
    failed = [x for x in recs if x.get("error") and not x.get("not_sent")]
    completed = [x for x in recs if not x.get("error")]
    wrong = identity.check(completed_items(a, reqs, recs), f"fault ({policy})", deadline)
    res = {"policy": policy, "requests": len(reqs), "sent": sent, "completed": len(completed), "failed": len(failed),
           "failed_samples": [x["error"] for x in failed[:5]], "retried": retried, "wrong": wrong, "front": router,
           "killed": state.get("killed"), "in_flight_at_kill": state.get("in_flight_at_kill"),
           "completed_before_kill": state.get("completed_before_kill"),
           "restart_ready_s": since_event(state, "restart_ready"), "restart_error": state.get("restart_error"),
           "router_unhealthy_s": since_event(state, "router_unhealthy"),
           "router_healthy_again_s": since_event(state, "router_healthy_again"),
           "served_after_restart": (after.get(r.index) or {}).get("served") if r else None,
           "served": {x.name: (None if x is r else (deltas(before, after).get(x.index) or {}).get("served"))
                      for x in replicas},
           "summary": serve_workloads.summarize(recs, a.output),
           "requests_detail": [strip(x, q) for x, q in zip(recs, reqs)]}
    results["fault"] = res
    log(f"fault: sent {sent}, completed {len(completed)}, failed {len(failed)}, retried {retried}, wrong {wrong}")
    if r is None:
        results["problems"].append("fault: no replica was killed (the run ended first)")
    if wrong:
        results["problems"].append(f"fault: {wrong} completed answers differ from the single server's")
    if r is not None and len(failed) > (state.get("in_flight_at_kill") or 0):
        results["problems"].append(f"fault: {len(failed)} requests failed, more than the {state['in_flight_at_kill']} "
                                   f"in flight at the kill; first: {failed[0]['error']}")
    if state.get("restart_error"):
        results["problems"].append(f"fault: the restart failed: {state['restart_error'][:500]}")


def drain_cell(a, front, replicas, identity, policy, deadline, results):
    reqs = disruption_workload(a, "drain")
    k0 = max(1, round(len(reqs) * a.fault_kill_after))
    termed, state, threads, stop_watch = threading.Event(), {"health": []}, [], threading.Event()
    hold = {}
    hold_prompt = workload(a, "hold", groups=1, per_group=1, system=4, question=1)[0]["prompt"]
    hold_tokens = a.drain_hold_tokens or max(1, min(512, a.context_length - len(hold_prompt) - 1))

    def drain(runner):
        r = pick_busiest(replicas)
        state["replica"] = r
        streaming = threading.Event()
        t = threading.Thread(target=hold_request, args=(r.port, hold_prompt, hold_tokens, a.request_timeout,
                                                        streaming, hold), daemon=True)
        t.start()
        threads.append(t)
        streaming.wait(a.request_timeout)
        state["counts_at_term"] = replica_counts(r)
        state["in_flight_at_term"] = runner.in_flight()
        state["log_offset"] = r.log_path.stat().st_size
        state["wall_term"] = time.time()
        r.signal(signal.SIGTERM)
        state["t_event"] = time.monotonic()
        state["completed_before_term"] = runner.finished
        log(f"drain: SIGTERM to {r.name} after {state['completed_before_term']} completed, with a {hold_tokens}-token request "
            f"streaming from it")
        termed.set()
        w = threading.Thread(target=watch_router, args=(front, r, state, stop_watch), daemon=True)
        w.start()
        # /health and /metrics until it exits (bounded by its --shutdown-timeout and more)
        limit = time.monotonic() + a.request_timeout + 60
        last = state["counts_at_term"]
        while r.alive() and time.monotonic() < limit:
            t_ask = time.time()
            try:
                status, body = serve_servers.http_get(r.port, "/health", timeout=1.0)
                state["health"].append((t_ask - state["wall_term"], status, body))
                if status == 503 and "draining" in body and "wall_draining" not in state:
                    state["wall_draining"] = t_ask
                    state["draining_body"] = body
            except (OSError, http.client.HTTPException):
                pass
            c = replica_counts(r)
            if c:
                last = c
            time.sleep(0.02)
        state["counts_last"] = last
        state["exit_code"] = r.wait(max(0.0, limit - time.monotonic()))
        state["drained_s"] = time.monotonic() - state["t_event"]
        state["restart_offset"] = r.log_path.stat().st_size
        log(f"drain: {r.name} exited with {state['exit_code']} {state['drained_s']:.2f} s after SIGTERM")
        restart(a, r, state["t_event"] + a.fault_restart_after, state, front)

    def on_k0(runner):
        t = threading.Thread(target=drain, args=(runner,), daemon=True)
        t.start()
        threads.insert(0, t)

    def join():
        for _ in range(2):  # the drain thread starts the long request's thread
            for t in list(threads):
                t.join(a.request_timeout + a.fault_restart_after + a.startup_timeout + 60)

    what = (f"drain ({policy}): {len(reqs)} requests at concurrency {a.concurrency}; SIGTERM a replica after "
            f"{k0} have completed")
    recs, _, after, retried, router = disrupted_run(
        a, front, replicas, policy, deadline, Disruption(reqs, k0, termed, state, stop_watch, on_k0, join, what))
    r = state.get("replica")
    failed = [x for x in recs if x.get("error")]
    wrong = identity.check(completed_items(a, reqs, recs), f"drain ({policy})", deadline)
    if hold.get("text") is not None and not hold.get("error"):
        wrong += identity.check([(hold_prompt, hold_tokens, hold["text"])], "drain (long request)", deadline)
    # The replica's own log: the completions that reached it after SIGTERM.
    served_late, refused, last_arrival, finished_in_drain = 0, 0, None, 0
    if r is not None and "log_offset" in state:
        text = r.log_text(state["log_offset"], state.get("restart_offset"))
        draining_at = state.get("wall_draining", state["wall_term"])
        for line in text.splitlines():
            m = re.match(r"(\S+Z)\s+\w+\s+request method=POST path=/v1/completions status=(\d+) .*total_ms=([\d.]+)",
                         line.strip())
            if not m:
                continue
            ts = datetime.datetime.strptime(m.group(1)[:26].rstrip("Z"), "%Y-%m-%dT%H:%M:%S.%f")
            arrival = ts.replace(tzinfo=datetime.timezone.utc).timestamp() - float(m.group(3)) / 1e3
            if arrival <= state["wall_term"]:
                finished_in_drain += m.group(2) == "200"
                continue
            last_arrival = arrival - state["wall_term"]
            if m.group(2) == "200" and arrival > draining_at:
                served_late += 1
            elif m.group(2) == "503":
                refused += 1
    c0, c1 = state.get("counts_at_term") or {}, state.get("counts_last") or {}
    res = {"policy": policy, "requests": len(reqs), "completed": len(recs) - len(failed), "failed": len(failed),
           "failed_samples": [x["error"] for x in failed[:5]], "retried": retried, "wrong": wrong, "front": router,
           "replica": r.name if r else None, "in_flight_at_term": state.get("in_flight_at_term"),
           "health_503_after_ms": (state["wall_draining"] - state["wall_term"]) * 1e3 if "wall_draining" in state
           else None, "health_body": state.get("draining_body"), "health_polls": len(state["health"]),
           "drained_s": state.get("drained_s"), "exit_code": state.get("exit_code"),
           "served_at_term": c0.get("served"), "served_last_seen": c1.get("served"), "running_at_term": c0.get("running"),
           "finished_in_drain": finished_in_drain,
           "refused_503": refused, "served_after_draining": served_late, "last_arrival_s": last_arrival,
           "router_unhealthy_s": since_event(state, "router_unhealthy"),
           "restart_ready_s": since_event(state, "restart_ready"),
           "restart_error": state.get("restart_error"),
           "served_after_restart": (after.get(r.index) or {}).get("served") if r else None,
           "hold": {"tokens": hold_tokens, "completed": bool(hold) and not hold.get("error"),
                    "seconds": hold.get("seconds"), "error": hold.get("error")},
           "summary": serve_workloads.summarize(recs, a.output),
           "requests_detail": [strip(x, q) for x, q in zip(recs, reqs)]}
    results["drain"] = res
    log(f"drain: /health 503 after {res['health_503_after_ms']} ms, drained in {res['drained_s']} s, exit "
        f"{res['exit_code']}, refused {refused}, served after draining {served_late}, run failed {len(failed)}, "
        f"wrong {wrong}")
    checks = [(r is not None, "no replica got SIGTERM (the run ended first)"),
              (res["health_503_after_ms"] is not None, "/health never answered 503 draining"),
              (res["hold"]["completed"], f"the long request in flight did not complete: {hold.get('error')}"),
              (served_late == 0, f"{served_late} completions reaching it after /health said draining were served"),
              (not failed, f"{len(failed)} requests of the run failed; first: {failed[0]['error'] if failed else ''}"),
              (wrong == 0, f"{wrong} answers differ from the single server's"),
              (res["exit_code"] == 0, f"it exited with {res['exit_code']}"),
              (not state.get("restart_error"), f"the restart failed: {str(state.get('restart_error'))[:300]}")]
    res["checks_failed"] = [msg for ok, msg in checks if not ok]
    for msg in res["checks_failed"]:
        results["problems"].append(f"drain: {msg}")
