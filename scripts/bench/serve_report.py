"""scripts/bench/bench_serve.py's report: the Markdown tables printed at the end, and the number
formats (also imported by scripts/fleet/)."""

from serve_servers import NAMES
from serve_workloads import expected_hit


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
    cells = {(c["server"], c["workload"], c["concurrency"]): c for c in results["cells"]}
    out = header_lines(a, header, keys)
    out += cell_table(a, cells, keys)
    out += figure_table(a, results, cells, keys)
    out += problem_lines(header, results)
    print("\n".join(out), flush=True)


def header_lines(a, header, keys):
    """The title and the run's description: the machine, the servers, the workloads."""
    both = len(keys) == 2
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
               + f": `serve {'' if a.parallel is None else f'--parallel {a.parallel} '}--cache-mb {a.cache_mb}"
               + (f" {' '.join(a.kvgpt_arg)}" if a.kvgpt_arg else "") + "`, K/V f32")
    if "kvgpt_b" in keys:
        out.append(f"- {NAMES['kvgpt_b']}: the same server with `{' '.join(a.versus_arg)}`")
    if "llama" in keys:
        ll = header["llama"]
        out.append(f"- llama.cpp: {ll['version']}: `llama-server -np {a.parallel or 16} -c {(a.parallel or 16) * a.ctx_per_slot}` "
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
    return out


def cell_table(a, cells, keys):
    """One row per workload and concurrency level: every server's numbers, and their ratio."""
    both = len(keys) == 2
    out = []
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
    return out


def figure_table(a, results, cells, keys):
    """Derived figures: TTFT miss ÷ hit, scaling, identity, the same text in both engines."""
    both = len(keys) == 2
    versus = " ÷ ".join(NAMES[k] for k in keys)
    out = []
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
    return out


def problem_lines(header, results):
    """The run's time, then what was skipped or went wrong."""
    out = []
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
    return out


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

