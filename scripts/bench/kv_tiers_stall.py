#!/usr/bin/env python3
"""What a load from the tiers under the pool costs the streams already running (issue #35):

    python3 scripts/bench/kv_tiers_stall.py --kvgpt BEFORE/kvgpt --kvgpt target/release/kvgpt \\
        --model /tmp/distilgpt2-random [-t 2] [--prefix 500] [--loads 8] [--rounds 3]

Starts a redis-server on a free loopback port (no persistence). For each build, a writer server
computes --loads fresh random --prefix-token prefixes (written through to Redis), then a second
server, which never saw them, streams one long greedy answer while the prefixes are asked of it one
at a time (each a Redis hit: the blocks are read, checked and placed). Printed per build: the
stream's gaps between tokens while the loads run (median, 99th percentile, largest), against the
same stream with no loads, and the loads' median time to the first token. Builds take turns,
round by round, so drift in the machine's speed hits all alike. --stopped stops Redis (SIGSTOP)
while the loads are asked: a Redis that hangs, each lookup waiting for the tier's timeout.
Standard library only.
"""

import argparse
import http.client
import json
import random
import shutil
import signal
import statistics
import tempfile
import threading
import time

from kv_ttft import ttft
from serve_servers import HOST, Server, cpu_model, git_rev, log
from kv_tiers_ttft import redis_server, settle


def server(binary, a, url, logdir, name):
    cmd = [binary, "serve", "--model", a.model, "--host", HOST, "--port", "0", "-t", str(a.threads),
           "--kv-redis", url]
    s = Server("kvgpt", cmd, 0, tempfile.mkdtemp(prefix=f"kv_stall_{name}_", dir=logdir))
    s.start(timeout=120)
    return s


def stream_gaps(port, stop, out):
    """Streams a long greedy answer (1000 tokens) until `stop` is set; appends the gaps between
    tokens to `out`."""
    body = {"prompt": [464, 3290, 318], "max_tokens": 1000, "temperature": 0, "stream": True, "ignore_eos": True}
    conn = http.client.HTTPConnection(HOST, port, timeout=120)
    conn.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
    resp = conn.getresponse()
    if resp.status != 200:
        raise RuntimeError(f"HTTP {resp.status}: {resp.read()[:300]!r}")
    last = None
    while not stop.is_set():
        line = resp.readline()
        if not line:
            break
        if line.startswith(b"data:"):
            now = time.monotonic()
            if last is not None:
                out.append(now - last)
            last = now
    conn.close()


def one_round(binary, a, url, rng, logdir, redis):
    writer = server(binary, a, url, logdir, "writer")
    prefixes = [[rng.randrange(300, 40000) for _ in range(a.prefix)] for _ in range(a.loads)]
    for p in prefixes:
        ttft(writer.port, p + [rng.randrange(300, 40000)])
    settle(writer.port)
    writer.stop()
    reader = server(binary, a, url, logdir, "reader")
    try:
        quiet, busy, stop = [], [], threading.Event()
        t = threading.Thread(target=stream_gaps, args=(reader.port, stop, quiet))
        t.start()
        time.sleep(1.0)
        quiet_n = len(quiet)
        loads = []
        if a.stopped:
            redis.send_signal(signal.SIGSTOP)
        for p in prefixes:
            loads.append(ttft(reader.port, p + [rng.randrange(300, 40000)]))
        if a.stopped:
            redis.send_signal(signal.SIGCONT)
        busy = quiet[quiet_n:]
        del quiet[quiet_n:]
        stop.set()
        t.join()
        return quiet, busy, loads
    finally:
        reader.stop()


def summary(gaps):
    gaps = sorted(gaps)
    q = lambda f: gaps[min(len(gaps) - 1, int(f * len(gaps)))] * 1e3  # noqa: E731
    return f"median {q(0.5):.1f} ms, p99 {q(0.99):.1f} ms, max {gaps[-1] * 1e3:.1f} ms ({len(gaps)} gaps)"


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--kvgpt", action="append", required=True)
    p.add_argument("--model", required=True)
    p.add_argument("-t", "--threads", type=int, default=2)
    p.add_argument("--prefix", type=int, default=500)
    p.add_argument("--loads", type=int, default=8)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--redis-server", default="redis-server")
    p.add_argument("--stopped", action="store_true",
                   help="stop Redis (SIGSTOP) while the loads are asked: each lookup waits for its timeout")
    a = p.parse_args()
    log(f"cpu: {cpu_model()}")
    logdir = tempfile.mkdtemp(prefix="kv_stall_")
    redis, url = redis_server(a.redis_server)
    rng = random.Random(7)
    got = {b: ([], [], []) for b in a.kvgpt}
    try:
        for r in range(a.rounds):
            order = a.kvgpt if r % 2 == 0 else a.kvgpt[::-1]
            for b in order:
                quiet, busy, loads = one_round(b, a, url, rng, logdir, redis)
                for acc, new in zip(got[b], (quiet, busy, loads)):
                    acc.extend(new)
        for b in a.kvgpt:
            quiet, busy, loads = got[b]
            what = "lookups in a stopped Redis" if a.stopped else "Redis loads"
            print(f"{b} ({git_rev(b) or '?'}): {a.loads} {what} of {a.prefix} tokens x {a.rounds} rounds; "
                  f"load TTFT median {statistics.median(loads) * 1e3:.1f} ms")
            print(f"  stream gaps, quiet: {summary(quiet)}")
            print(f"  stream gaps, while loading: {summary(busy)}")
    finally:
        redis.kill()
        shutil.rmtree(logdir, ignore_errors=True)


if __name__ == "__main__":
    main()
