#!/usr/bin/env python3
"""K/V memory of many choices on one long system prompt, `kvgpt serve` builds side by side
(issue #34's memory and capacity figures):

    python3 scripts/bench/kv_memory.py --kvgpt BEFORE/kvgpt --kvgpt target/release/kvgpt \\
        --model /tmp/distilgpt2-random [-t 2] [--requests 16] [--n 4] [--system 500] [--question 8] \\
        [--output 64] [--arg=--kv-dtype --arg=q8_0] [--stop STR] [--parallel P] [--copies] [--temperature T]
        [--llama-server PATH --gguf FILE [--llama-arg=-ctk --llama-arg=q8_0 ...]]

Every server runs with `--parallel` = requests × n (every choice at once) and `--max-queue` as
large; the requests (one shared system prompt of --system token ids and a question of its own,
ids from a seeded RNG) are sent at once, greedy (or sampled at --temperature, each request with a
seed of its own), --output tokens each (with --stop, that stop
string too), and /metrics is polled every 5 ms for the K/V bytes held:

  a server without a block pool   kvgpt_kv_cache_bytes + kvgpt_prompt_cache_bytes (the running
                                  sequences' reservations and the prompt cache's copies)
  a server with one               kvgpt_kv_blocks_used × (kvgpt_kv_cache_limit_bytes /
                                  num_gpu_blocks): every block, however many hold it; with
                                  kvgpt_kv_blocks_peak (the pool's high-water mark, blocks held
                                  for part of a step included) in place of the used blocks

  llama-server                    its K/V cache as its log states it at start (it is allocated
                                  whole then: `-c` positions)

The peak of each, the refusals, preemptions, wall time and output tokens per second are printed
per server. Then every kvgpt request is sent again alone, to a fresh server of the same build and
flags, and each answer must equal the text it got among the others (exit 1 otherwise).

--parallel P runs P sequences at once (default: every one); --copies sends the n choices as n
requests of one choice each (llama-server answers one choice per request). With --llama-server,
llama-server runs the same requests beside the kvgpt builds: `-np P --kv-unified -c P × (prompt
+ output)`, plus --llama-arg flags (e.g. `-ctk q8_0 -ctv q8_0`). Standard library only.
"""

import argparse
import json
import random
import re
import tempfile
import threading
import time
import urllib.error
import urllib.request

from serve_servers import HOST, Server, cpu_model, free_port, git_rev, http_get, log


def metrics(port):
    status, text = http_get(port, "/metrics")
    out = {}
    for line in text.splitlines():
        m = re.match(r"^([a-zA-Z_:]+)(\{[^}]*\})? ([0-9.eE+-]+)$", line)
        if m:
            out[m.group(1) + (m.group(2) or "")] = float(m.group(3))
    return out


def kv_bytes(m):
    if "kvgpt_kv_blocks_used" in m:
        info = next(k for k in m if k.startswith("vllm:cache_config_info"))
        blocks = int(re.search(r'num_gpu_blocks="(\d+)"', info).group(1))
        # The pool's high-water mark where the build has one: it sees a block held for part of a step.
        used = max(m["kvgpt_kv_blocks_used"], m.get("kvgpt_kv_blocks_peak", 0))
        return used * m["kvgpt_kv_cache_limit_bytes"] / blocks
    return m.get("kvgpt_kv_cache_bytes", 0) + m.get("kvgpt_prompt_cache_bytes", 0)


def complete(port, body):
    req = urllib.request.Request(f"http://{HOST}:{port}/v1/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=600) as r:
            return 200, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


def start(a, binary, parallel):
    cmd = [binary, "serve", "--model", a.model, "--host", HOST, "--port", "0", "-t", str(a.threads),
           "--parallel", str(parallel), "--max-queue", str(max(parallel, 256)), *a.arg]
    s = Server("kvgpt", cmd, 0, tempfile.mkdtemp(prefix="kv_memory_"))
    s.start(timeout=120)
    return s


def start_llama(a, parallel):
    port = free_port()
    ctx = parallel * (a.system + a.question + a.output + 8)
    cmd = [a.llama_server, "-m", a.gguf, "--host", HOST, "--port", str(port), "-t", str(a.threads), "-tb",
           str(a.threads), "-np", str(parallel), "--kv-unified", "-c", str(ctx), "--cont-batching", "--no-webui", "-lv", "4",
           *a.llama_arg]
    s = Server("llama", cmd, port, tempfile.mkdtemp(prefix="kv_memory_llama_"))
    s.start(timeout=120)
    return s


def llama_kv_mib(s):
    """The K/V cache llama-server allocated, from its log (`... size = X MiB, ... K (f16): ..., V ...`)."""
    text = s.log_path.read_text(errors="replace")
    sizes = [float(m) for m in re.findall(r"llama_kv_cache: +size = +([0-9.]+) MiB", text)]
    return sum(sizes) if sizes else float("nan")


def run_all(a, binary, bodies):
    """All requests at once on one server: each answer's texts, the peak K/V bytes, and counters."""
    s = start_llama(a, a.parallel) if binary == "llama" else start(a, binary, a.parallel)
    peak, done = [0.0], threading.Event()

    def poll():
        while not done.is_set():
            if binary != "llama":
                peak[0] = max(peak[0], kv_bytes(metrics(s.port)))
            time.sleep(0.005)

    results = [None] * len(bodies)

    def send(i):
        results[i] = complete(s.port, bodies[i])

    poller = threading.Thread(target=poll)
    poller.start()
    t0 = time.monotonic()
    threads = [threading.Thread(target=send, args=(i,)) for i in range(len(bodies))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.monotonic() - t0
    done.set()
    poller.join()
    m = metrics(s.port) if binary != "llama" else {}
    if binary == "llama":
        peak[0] = llama_kv_mib(s) * 2**20
    s.stop()
    return results, peak[0], wall, m


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--kvgpt", action="append", required=True, help="a kvgpt binary (repeat to compare)")
    p.add_argument("--model", required=True)
    p.add_argument("-t", "--threads", type=int, default=2)
    p.add_argument("--requests", type=int, default=16)
    p.add_argument("--n", type=int, default=4)
    p.add_argument("--system", type=int, default=500)
    p.add_argument("--question", type=int, default=8)
    p.add_argument("--output", type=int, default=64)
    p.add_argument("--stop", default=None)
    p.add_argument("--arg", action="append", default=[], help="one more flag for every server")
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--temperature", type=float, default=0.0,
                   help="sample (each request with a seed of its own) instead of greedy choices, which say the same thing")
    p.add_argument("--parallel", type=int, default=0, help="sequences at once (default: all)")
    p.add_argument("--copies", action="store_true", help="n requests of one choice instead of n choices")
    p.add_argument("--llama-server", default=None)
    p.add_argument("--gguf", default=None)
    p.add_argument("--llama-arg", action="append", default=[])
    a = p.parse_args()
    a.parallel = a.parallel or a.requests * a.n
    rng = random.Random(a.seed)
    system = [rng.randrange(300, 40000) for _ in range(a.system)]
    bodies = []
    for _ in range(a.requests):
        body = {"prompt": system + [rng.randrange(300, 40000) for _ in range(a.question)], "n": a.n,
                "max_tokens": a.output, "temperature": 0, "ignore_eos": True}
        if a.stop:
            body["stop"] = [a.stop]
        if a.temperature > 0:
            body.update(temperature=a.temperature, seed=rng.randrange(1 << 31))
        bodies += [dict(body, n=1) for _ in range(a.n)] if a.copies else [body]
    log(f"cpu: {cpu_model()}")
    failed = False
    for binary in a.kvgpt + (["llama"] if a.llama_server else []):
        results, peak, wall, m = run_all(a, binary, bodies)
        refused = [r for r in results if r[0] != 200]
        texts = [[c["text"] for c in r[1]["choices"]] if r[0] == 200 else None for r in results]
        out_tokens = sum(r[1].get("usage", {}).get("completion_tokens", 0) for r in results if r[0] == 200)
        name = "llama-server " + " ".join(a.llama_arg) if binary == "llama" else f"{binary} ({git_rev(binary) or '?'}) {' '.join(a.arg)}"
        sampled = f", sampled at T={a.temperature}" if a.temperature > 0 else ""
        print(f"{name}: {a.requests} requests × n {a.n}{' (as copies)' if a.copies else ''}{sampled} on a {a.system}-token "
              f"system prompt, {a.parallel} at once: peak K/V {peak / 2**20:.1f} MiB, {len(refused)} refused, "
              f"{m.get('vllm:num_preemptions_total', 0):.0f} preemptions, {wall:.1f} s, {out_tokens / wall:.0f} tok/s")
        for code, body in refused[:3]:
            print(f"  refused {code}: {body.get('error', {}).get('message', body)}")
        if binary == "llama":
            continue
        s = start(a, binary, a.n)
        for i, body in enumerate(bodies):
            if texts[i] is None:
                continue
            code, alone = complete(s.port, body)
            if code != 200 or [c["text"] for c in alone["choices"]] != texts[i]:
                print(f"  request {i}: alone it answered differently ({code})")
                failed = True
        s.stop()
        print("  every answer equals the same request alone on a fresh server" if not failed else "  MISMATCH")
    raise SystemExit(1 if failed else 0)


if __name__ == "__main__":
    main()
