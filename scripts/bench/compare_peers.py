#!/usr/bin/env python3
"""Benchmark kvgpt against peer engines on the same checkpoint and print one table of ratios.

Engines: kvgpt (`kvgpt bench`), Hugging Face transformers (PyTorch, sdpa attention), ONNX Runtime
(CPU) and llama.cpp (`llama-bench`, optional). Each one runs every test with the same thread count,
in float32, computing logits for the last position only, greedy decoding from random token ids.
Repetitions are interleaved (rep 1: kvgpt, HF, ORT, llama.cpp; rep 2: ...) so that drift in the
machine's speed hits every engine alike. Each cell is mean ± sd over the repetitions; the ratio
column is kvgpt / best peer, computed rep by rep.

    python3 scripts/fixtures/make_random_checkpoint.py /tmp/distilgpt2-random      # needs numpy
    python3 scripts/bench/compare_peers.py --model /tmp/distilgpt2-random -p 128,512 -n 128 -r 3 -t 2 \\
        [--llama-bench llama.cpp/build/bin/llama-bench --gguf distilgpt2-f32.gguf] [--json-out out.json]

The first run creates a venv (--venv, default .venv-peers) and pip-installs numpy, safetensors, onnx
and onnxruntime (55 MB of downloads), then torch + transformers for the HF column: PyPI's Linux torch
pulls its CUDA wheels, about 3 GB in all; --skip-torch leaves HF out. --setup-only just installs.

kvgpt runs as `kvgpt bench -p 4,P... -n N -r 1 -t T -o json --no-uncached --probe-mib 0` (its -p gives
the prefill rows and the decode contexts); llama.cpp as `llama-bench -o json`, prefill and decode
(at depths -d 0,P... where supported) in two calls.

The ORT model is transformers' GPT-2 exported with torch.onnx.export (past/present K/V as flat graph
inputs/outputs) and run through ONNX Runtime's transformer optimizer (model_type gpt2). Without torch
(--skip-torch, or when the export fails) it is built directly from model.safetensors with onnx.helper,
block by block, without ORT's fusions. The model is cached in VENV-onnx/; the table says which one ran.
Tests: prefill P for each -p; decode N after a 4-token prompt and after each -p. Engines or tests
that cannot run are listed under "not run" with the reason; the script never needs more than kvgpt.
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

from peers_onnx import onnx_path
from peers_tests import joined, label, log, plan_tests, run_json, tail
from peers_workers import worker_main

ENGINES = {"kvgpt": "kvgpt", "hf": "HF", "ort": "ORT", "llama": "llama.cpp"}
PEERS = ("hf", "ort", "llama")
BASE_PKGS = ["numpy", "safetensors", "onnx", "onnxruntime"]
TORCH_PKGS = ["torch", "transformers"]


# ---------------------------------------------------------------- kvgpt and llama.cpp

def run_kvgpt(a):
    """One `kvgpt bench` run; its -p gives both the prefill rows and the decode contexts."""
    # `--dtype gguf`: kvgpt reads llama.cpp's GGUF itself, each tensor held as the file stores it.
    model = ["--model", a.gguf] if a.dtype == "gguf" else ["--model", a.model, "--dtype", a.dtype]
    isa = ["--isa", a.kvgpt_isa] if a.kvgpt_isa else []
    cmd = [a.kvgpt, "bench", *model, *isa, "-p", joined(a.tests, "tg"), "-n", str(a.n), "-r", "1",
           "-t", str(a.threads), "-o", "json", "--no-uncached", "--probe-mib", "0"]
    res = {}
    for row in run_json(cmd, a.timeout):
        a.kvgpt_git, kind = row.get("git", "?"), row["test"][:2]
        key = (kind, row["prompt_tokens"], row["prompt_tokens"] if kind == "pp" else row["gen_tokens"])
        if row.get("mode") != "uncached" and key in a.tests:
            res[key] = float(row["tok_s_avg"])
    return res


def run_llama(a, state):
    """llama-bench: prefill rows, then decode rows after each context depth (-d, newer builds)."""
    base = [a.llama_bench, "-m", a.gguf, "-t", str(a.threads), "-r", "1", "-o", "json"]
    rows = run_json(base + ["-p", joined(a.tests, "pp"), "-n", "0"], a.timeout)
    decode = base + ["-p", "0", "-n", str(a.n)]
    if state.setdefault("depth", True):
        try:
            rows += run_json(decode + ["-d", joined(a.tests, "tg")], a.timeout)
        except RuntimeError:
            state["depth"] = False
    if not state["depth"]:
        rows += run_json(decode, a.timeout)
    res = {}
    for row in rows:
        state["version"] = f"{row.get('build_commit', '?')} (build {row.get('build_number', '?')}), weights {row.get('model_type', '?')}"
        p, n, depth = row["n_prompt"], row["n_gen"], row.get("n_depth", 0)
        key = ("pp", p, p) if p else ("tg", depth or 4, n)  # depth 0 (empty cache) goes on the "after 4" row
        if key in a.tests:
            res[key] = float(row["avg_ts"])
    return res


# ---------------------------------------------------------------- peer venv

def ensure_venv(a, not_run):
    """Create the venv and install what is missing; put failures into not_run."""
    py = a.venv / "bin" / "python"
    want = BASE_PKGS + ([] if a.skip_torch else TORCH_PKGS)
    if a.skip_torch:
        not_run.setdefault("hf", "--skip-torch given")
    if not py.exists():
        log(f"creating venv {a.venv}")
        proc = subprocess.run([sys.executable, "-m", "venv", str(a.venv)], capture_output=True, text=True)
        if proc.returncode != 0:
            for e in ("hf", "ort"):
                not_run.setdefault(e, f"cannot create venv {a.venv}: {tail(proc.stderr)}")
            return
    have = {m for m in want if subprocess.run([str(py), "-c", f"import {m}"], capture_output=True).returncode == 0}
    for group, engine in ((BASE_PKGS, "ort"), ([] if a.skip_torch else TORCH_PKGS, "hf")):
        missing = [m for m in group if m not in have]
        if not missing:
            continue
        if "torch" in missing:
            log("installing torch from PyPI: with its CUDA wheels about 3 GB (use --skip-torch to avoid)")
        log(f"pip install {' '.join(missing)} into {a.venv}")
        proc = subprocess.run([str(py), "-m", "pip", "install", "-q", *missing], capture_output=True, text=True)
        if proc.returncode != 0:
            not_run.setdefault(engine, f"pip install {' '.join(missing)} failed: {tail(proc.stderr)}")
            if engine == "ort":  # numpy/safetensors are needed by HF's worker too
                not_run.setdefault("hf", "base packages (numpy, safetensors) failed to install")


def run_worker(a, mode, extra=()):
    """This script in worker mode under the venv's Python; returns ({test key: tok/s}, versions)."""
    cmd = [str(a.venv / "bin" / "python"), str(Path(__file__).resolve()), "--worker", mode, "--model", a.model,
           "-p", ",".join(map(str, a.prompts)), "-n", str(a.n), "-t", str(a.threads), *extra]
    env = dict(os.environ, OMP_NUM_THREADS=str(a.threads), MKL_NUM_THREADS=str(a.threads))
    out = run_json(cmd, a.timeout, env=env)
    return {tuple(k): v for *k, v in out.get("results", [])}, out.get("versions", {})


# ---------------------------------------------------------------- report

def mean_sd(xs):
    return statistics.fmean(xs), (statistics.stdev(xs) if len(xs) > 1 else 0.0)


def fmt(xs, digits=1):
    m, s = mean_sd(xs)
    return f"{m:.{digits}f} ± {s:.{digits}f}"


def report(a, samples, not_run, notes, versions):
    keys = sorted({k for res in samples.values() for k in res}, key=lambda k: (k[0] == "tg", k[1], k[2]))
    lines = ["| test | " + " | ".join(f"{ENGINES[e]} tok/s" for e in ENGINES) + " | kvgpt / best peer |",
             "|---" * (len(ENGINES) + 2) + "|"]
    dump = {"model": a.model, "threads": a.threads, "reps": a.reps, "n": a.n, "prompts": a.prompts,
            "versions": versions, "not_run": not_run, "notes": notes, "tests": {}}
    for key in keys:
        row = {e: samples[e][key] for e in ENGINES if e in samples and key in samples[e]}
        peers = {e: xs for e, xs in row.items() if e in PEERS}
        ratio, entry = "—", {ENGINES[e]: dict(zip(("mean", "sd"), mean_sd(xs)), samples=xs) for e, xs in row.items()}
        if "kvgpt" in row and peers:
            best = max(peers, key=lambda e: statistics.fmean(peers[e]))
            rs = [k / b for k, b in zip(row["kvgpt"], peers[best])]
            ratio = f"{fmt(rs, 2)} (vs {ENGINES[best]})"
            entry["ratio"] = {"best_peer": ENGINES[best], "mean": mean_sd(rs)[0], "sd": mean_sd(rs)[1], "samples": rs}
        cells = [fmt(row[e]) if e in row else "—" for e in ENGINES]
        lines.append(f"| {label(key)} | " + " | ".join(cells) + f" | {ratio} |")
        dump["tests"][label(key)] = entry
    print(f"\nModel {a.model}, {a.threads} threads, kvgpt --dtype {a.dtype} (HF, ORT float32; llama.cpp the GGUF's "
          f"type), {a.reps} interleaved reps (mean ± sd)\n")
    print("\n".join(lines) if keys else "(no results)")
    for note in notes:
        print(f"- note: {note}")
    for name, version in versions.items():
        print(f"- {name}: {version}")
    if not_run:
        print("\nNot run:")
        for e, why in not_run.items():
            print(f"- {ENGINES[e]}: {why}")
    if a.json_out:
        Path(a.json_out).write_text(json.dumps(dump, indent=2) + "\n")


# ---------------------------------------------------------------- main

def parse_args():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="HF GPT-2 folder (config.json, model.safetensors)")
    ap.add_argument("-p", dest="prompts", default="128,512", type=lambda s: [int(x) for x in s.split(",")],
                    help="prompt lengths, comma-separated (default 128,512)")
    ap.add_argument("-n", type=int, default=128, help="tokens to generate in decode tests (default 128)")
    ap.add_argument("-r", dest="reps", type=int, default=3, help="interleaved repetitions (default 3)")
    ap.add_argument("-t", dest="threads", type=int, default=2, help="threads for every engine (default 2)")
    ap.add_argument("--kvgpt", default="target/release/kvgpt", help="kvgpt binary")
    ap.add_argument("--dtype", default="f32",
                    choices=["f32", "f16", "bf16", "q8", "w8a8", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "q4_k", "gguf"],
                    help="kvgpt's --dtype (default f32), or gguf: kvgpt reads --gguf as llama.cpp does, each tensor "
                         "held as the file stores it; HF and ORT always run float32, llama.cpp the GGUF's type")
    ap.add_argument("--kvgpt-isa", help="kvgpt's --isa (default: the best this CPU has), e.g. avx2+fma")
    ap.add_argument("--engines", default="kvgpt,hf,ort,llama",
                    help="comma-separated subset of kvgpt,hf,ort,llama to run (default all)")
    ap.add_argument("--llama-bench", help="llama.cpp's llama-bench binary")
    ap.add_argument("--gguf", help="GGUF of the same model, for llama-bench")
    ap.add_argument("--venv", type=Path, default=Path(".venv-peers"), help="venv for the Python peers")
    ap.add_argument("--skip-torch", action="store_true", help="no torch/transformers: leave HF out")
    ap.add_argument("--setup-only", action="store_true", help="create the venv and the ONNX model, then exit")
    ap.add_argument("--timeout", type=float, default=3600, help="seconds allowed for one engine run")
    ap.add_argument("--json-out", help="also write the results as JSON to this file")
    ap.add_argument("--worker", choices=["hf", "ort", "export-onnx"], help=argparse.SUPPRESS)
    ap.add_argument("--onnx", help=argparse.SUPPRESS)
    return ap.parse_args()


def main():
    a = parse_args()
    if a.worker:
        return worker_main(a)
    a.model = str(Path(a.model).resolve())
    if not (Path(a.model) / "config.json").is_file():
        sys.exit(f"--model {a.model}: no config.json there")
    if a.dtype == "gguf" and not a.gguf:
        sys.exit("--dtype gguf: kvgpt reads the GGUF given with --gguf; give one")
    a.venv = a.venv.resolve()
    cfg = json.loads((Path(a.model) / "config.json").read_text())
    a.tests, notes = plan_tests(a.prompts, a.n, cfg["n_positions"])
    not_run = {}
    wanted = {e.strip() for e in a.engines.split(",") if e.strip()}
    if wanted - set(ENGINES):
        sys.exit(f"--engines: unknown {', '.join(sorted(wanted - set(ENGINES)))} (choose from {', '.join(ENGINES)})")
    for e in set(ENGINES) - wanted:
        not_run[e] = "left out by --engines"

    kvgpt = shutil.which(a.kvgpt) or (a.kvgpt if Path(a.kvgpt).is_file() else None)
    if "kvgpt" in not_run:
        pass
    elif not kvgpt:
        not_run["kvgpt"] = f"binary not found: {a.kvgpt} (cargo build --release)"
    else:
        a.kvgpt = str(Path(kvgpt).resolve())
        proc = subprocess.run([a.kvgpt, "bench", "--help"], capture_output=True, text=True)
        if proc.returncode != 0:
            not_run["kvgpt"] = f"{a.kvgpt} has no working `bench` subcommand: {tail(proc.stderr, 1, first=True)}"
    if "llama" in not_run:
        pass
    elif not (a.llama_bench and a.gguf):
        not_run["llama"] = "no llama-bench/gguf given"
    elif not (Path(a.llama_bench).is_file() and Path(a.gguf).is_file()):
        not_run["llama"] = f"missing file: {a.llama_bench if not Path(a.llama_bench).is_file() else a.gguf}"

    if {"hf", "ort"} & wanted:
        ensure_venv(a, not_run)
    if "ort" not in not_run:
        try:
            a.onnx_file = onnx_path(a)
            if not a.onnx_file.exists():
                log(f"building ONNX model {a.onnx_file}")
                run_worker(a, "export-onnx", ["--onnx", str(a.onnx_file), *(["--skip-torch"] if a.skip_torch else [])])
        except Exception as e:
            not_run["ort"] = f"ONNX export failed: {type(e).__name__}: {e}"
    if a.setup_only:
        for e, why in not_run.items():
            log(f"{ENGINES[e]} not available: {why}")
        return 0

    runners = {"kvgpt": lambda: (run_kvgpt(a), {"kvgpt": getattr(a, "kvgpt_git", "?")}),
               "hf": lambda: run_worker(a, "hf"),
               "ort": lambda: run_worker(a, "ort", ["--onnx", str(a.onnx_file)]),
               "llama": lambda: (run_llama(a, llama_state), {"llama.cpp": llama_state.get("version", "?")})}
    llama_state, samples, versions = {}, {}, {}
    for rep in range(a.reps):
        for e in ENGINES:
            if e in not_run:
                continue
            log(f"rep {rep + 1}/{a.reps}: {ENGINES[e]}")
            try:
                res, ver = runners[e]()
            except Exception as ex:  # an engine that fails is reported, never fatal
                not_run[e] = f"failed in rep {rep + 1}: {type(ex).__name__}: {ex}"
                samples.pop(e, None)
                continue
            versions.update(ver)
            for key, tok_s in res.items():
                samples.setdefault(e, {}).setdefault(key, []).append(tok_s)
    if llama_state.get("depth") is False:
        notes.append("this llama-bench has no -d: llama.cpp decodes from an empty cache, shown on the 'after 4' row")
    report(a, samples, not_run, notes, versions)
    return 0


if __name__ == "__main__":
    sys.exit(main())
