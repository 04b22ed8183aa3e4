#!/usr/bin/env python3
"""Time to the first token of a prompt-cache hit against a miss, `kvgpt serve` builds side by side
(issue #34: a hit maps the cached blocks instead of copying the K/V):

    python3 scripts/bench/kv_ttft.py --kvgpt BEFORE/kvgpt --kvgpt target/release/kvgpt \\
        --model /tmp/distilgpt2-random [-t 2] [--prefix 500] [--question 8] [--reps 15]

Every server stays up for the whole run and they take turns, rep by rep (which goes first
alternates), so drift in the machine's speed hits all alike. A rep sends a fresh --prefix-token
prefix with a question (a miss: the whole prompt is computed), then the same prefix with another
question (a hit: only the question is computed), one request at a time, streamed, 1 token out;
TTFT is the time to the first SSE chunk. Printed: each server's median miss and hit TTFT, and the
hit's ratio to the first server's. Standard library only.
"""

import argparse
import http.client
import json
import random
import statistics
import tempfile
import time

from serve_servers import HOST, Server, cpu_model, git_rev, log


def ttft(port, ids):
    body = {"prompt": ids, "max_tokens": 1, "temperature": 0, "stream": True}
    conn = http.client.HTTPConnection(HOST, port, timeout=120)
    t0 = time.monotonic()
    conn.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
    resp = conn.getresponse()
    if resp.status != 200:
        raise RuntimeError(f"HTTP {resp.status}: {resp.read()[:300]!r}")
    while True:
        line = resp.readline()
        if not line or line.startswith(b"data:"):
            break
    took = time.monotonic() - t0
    resp.read()
    conn.close()
    return took


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--kvgpt", action="append", required=True)
    p.add_argument("--model", required=True)
    p.add_argument("-t", "--threads", type=int, default=2)
    p.add_argument("--prefix", type=int, default=500)
    p.add_argument("--question", type=int, default=8)
    p.add_argument("--reps", type=int, default=15)
    p.add_argument("--arg", action="append", default=[], help="one more flag for every server")
    a = p.parse_args()
    rng = random.Random(11)
    log(f"cpu: {cpu_model()}")
    servers = []
    for i, binary in enumerate(a.kvgpt):
        cmd = [binary, "serve", "--model", a.model, "--host", HOST, "--port", "0", "-t", str(a.threads), *a.arg]
        s = Server("kvgpt", cmd, 0, tempfile.mkdtemp(prefix=f"kv_ttft_{i}_"))
        s.start(timeout=120)
        servers.append(s)
    times = {i: {"miss": [], "hit": []} for i in range(len(servers))}
    try:
        for rep in range(a.reps):
            order = list(range(len(servers)))
            if rep % 2:
                order.reverse()
            for i in order:
                prefix = [rng.randrange(300, 40000) for _ in range(a.prefix)]
                ask = lambda: prefix + [rng.randrange(300, 40000) for _ in range(a.question)]  # noqa: E731
                times[i]["miss"].append(ttft(servers[i].port, ask()))
                times[i]["hit"].append(ttft(servers[i].port, ask()))
    finally:
        for s in servers:
            s.stop()
    base = statistics.median(times[0]["hit"])
    for i, binary in enumerate(a.kvgpt):
        miss, hit = statistics.median(times[i]["miss"]), statistics.median(times[i]["hit"])
        print(f"{binary} ({git_rev(binary) or '?'}) {' '.join(a.arg)}: {a.prefix}+{a.question} tokens, "
              f"median TTFT miss {miss * 1e3:.1f} ms, hit {hit * 1e3:.1f} ms ({miss / hit:.1f}x faster), "
              f"hit / first server's hit {hit / base:.3f}")


if __name__ == "__main__":
    main()
