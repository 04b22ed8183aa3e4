#!/usr/bin/env python3
"""Time to the first token of a prefix served from each tier under the pool (issue #35):

    python3 scripts/bench/kv_tiers_ttft.py --kvgpt target/release/kvgpt --model /tmp/distilgpt2-random \\
        [-t 2] [--prefix 500] [--question 20] [--reps 5] [--redis-server redis-server]

Starts a redis-server on a free loopback port (no persistence) and, for each --kv-verify share
(--verify, default 0 then 1),
three servers: A (`--kv-disk DIR --kv-redis URL`), B (`--kv-redis URL` only) and C (`--kv-disk DIR`,
restarted every rep). A rep takes a fresh random --prefix-token prefix and asks, one request at a
time, streamed, 1 token out, each time with a question of its own (--question tokens):
  miss        A, nothing cached
  RAM hit     A again
  disk hit    A after POST /flush_cache (its RAM prompt cache emptied; the writes waited for)
  Redis hit   B, which never saw the prefix
  restart     C, started on A's directory after A wrote it: its first request
TTFT is the time to the first SSE chunk; printed: the median of each and its ratio to the miss.
Standard library only.
"""

import argparse
import json
import random
import shutil
import statistics
import subprocess
import tempfile
import time

from kv_ttft import ttft
from serve_servers import HOST, Server, cpu_model, free_port, git_rev, log
from kv_memory import metrics

CASES = ["miss", "RAM hit", "disk hit", "Redis hit", "restart"]


def written(port):
    m = metrics(port)
    return sum(v for k, v in m.items() if k.startswith("kvgpt_kv_store_written_blocks_total"))


def settle(port):
    """Waits until the server's writer has written everything it was handed (no change for 200 ms)."""
    last, since = -1, time.monotonic()
    while time.monotonic() - since < 0.2:
        now = written(port)
        if now != last:
            last, since = now, time.monotonic()
        time.sleep(0.02)


def server(a, name, flags, logdir):
    cmd = [a.kvgpt, "serve", "--model", a.model, "--host", HOST, "--port", "0", "-t", str(a.threads), *flags]
    s = Server("kvgpt", cmd, 0, tempfile.mkdtemp(prefix=f"kv_tiers_{name}_", dir=logdir))
    s.start(timeout=120)
    return s


def run(a, verify, url, rng, logdir):
    disk = tempfile.mkdtemp(prefix="kv_tiers_disk_", dir=logdir)
    v = ["--kv-verify", str(verify)]
    A = server(a, "A", ["--kv-disk", disk, "--kv-redis", url, *v], logdir)
    B = server(a, "B", ["--kv-redis", url, *v], logdir)
    times = {c: [] for c in CASES}
    try:
        for _ in range(a.reps):
            prefix = [rng.randrange(300, 40000) for _ in range(a.prefix)]
            ask = lambda: prefix + [rng.randrange(300, 40000) for _ in range(a.question)]  # noqa: E731
            times["miss"].append(ttft(A.port, ask()))
            times["RAM hit"].append(ttft(A.port, ask()))
            settle(A.port)
            flush(A.port)
            times["disk hit"].append(ttft(A.port, ask()))
            times["Redis hit"].append(ttft(B.port, ask()))
            settle(A.port)
            C = server(a, "C", ["--kv-disk", disk, *v], logdir)
            times["restart"].append(ttft(C.port, ask()))
            C.stop()
    finally:
        A.stop()
        B.stop()
    return {c: statistics.median(t) for c, t in times.items()}


def redis_server(binary):
    """A redis-server on a free loopback port, no persistence: the process and its URL."""
    port = free_port()
    redis = subprocess.Popen([binary, "--port", str(port), "--bind", HOST, "--save", "", "--appendonly", "no"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(0.3)
    return redis, f"redis://{HOST}:{port}"


def flush(port):
    import http.client
    conn = http.client.HTTPConnection(HOST, port, timeout=30)
    conn.request("POST", "/flush_cache", "{}", {"Content-Type": "application/json"})
    conn.getresponse().read()
    conn.close()


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--kvgpt", required=True)
    p.add_argument("--model", required=True)
    p.add_argument("-t", "--threads", type=int, default=2)
    p.add_argument("--prefix", type=int, default=500)
    p.add_argument("--question", type=int, default=20)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--redis-server", default="redis-server")
    p.add_argument("--verify", default="0,1", help="--kv-verify shares to run, comma-separated")
    a = p.parse_args()
    log(f"cpu: {cpu_model()}")
    logdir = tempfile.mkdtemp(prefix="kv_tiers_")
    redis, url = redis_server(a.redis_server)
    rng = random.Random(5)
    try:
        for verify in [float(v) for v in a.verify.split(",")]:
            med = run(a, verify, url, rng, logdir)
            print(f"{a.kvgpt} ({git_rev(a.kvgpt) or '?'}) --kv-verify {verify}: {a.prefix}+{a.question} tokens, "
                  f"{a.reps} reps, median TTFT: " +
                  ", ".join(f"{c} {med[c] * 1e3:.1f} ms ({med[c] / med['miss']:.2f}x)" for c in CASES))
    finally:
        redis.kill()
        shutil.rmtree(logdir, ignore_errors=True)


if __name__ == "__main__":
    main()
