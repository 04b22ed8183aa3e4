"""scripts/bench/bench_serve.py's workloads, requests and statistics: the shared-prefix and unique
workloads, one streamed completion, a cell of requests from C threads, and a cell's summary. Also
imported by scripts/fleet/ (the workload, the request loop and the statistics)."""

import http.client
import json
import random
import statistics
import threading
import time

from serve_servers import HOST


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
    request headers (scripts/fleet/fleet.py sends a session id for nginx's consistent hash); `on_text()` is
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

