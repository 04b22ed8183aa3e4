#!/usr/bin/env python3
"""Benchmark kvgpt against peer engines on the same checkpoint and print one table of ratios.

Engines: kvgpt (`kvgpt bench`), Hugging Face transformers (PyTorch, sdpa attention), ONNX Runtime
(CPU) and llama.cpp (`llama-bench`, optional). Each one runs every test with the same thread count,
in float32, computing logits for the last position only, greedy decoding from random token ids.
Repetitions are interleaved (rep 1: kvgpt, HF, ORT, llama.cpp; rep 2: ...) so that drift in the
machine's speed hits every engine alike. Each cell is mean ± sd over the repetitions; the ratio
column is kvgpt / best peer, computed rep by rep.

    python3 scripts/make_random_checkpoint.py /tmp/distilgpt2-random      # needs numpy
    python3 scripts/compare_peers.py --model /tmp/distilgpt2-random -p 128,512 -n 128 -r 3 -t 2 \\
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
import hashlib
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ENGINES = {"kvgpt": "kvgpt", "hf": "HF", "ort": "ORT", "llama": "llama.cpp"}
PEERS = ("hf", "ort", "llama")
BASE_PKGS = ["numpy", "safetensors", "onnx", "onnxruntime"]
TORCH_PKGS = ["torch", "transformers"]
ONNX_GRAPH_VERSION = 2  # bump when build_onnx changes, to invalidate the cache


# ---------------------------------------------------------------- tests and results

def label(key):
    kind, ctx, n = key
    return f"prefill {n}" if kind == "pp" else f"decode {n} after {ctx}"


def plan_tests(prompts, n_gen, n_positions):
    """Test keys ("pp", p, p) and ("tg", context, n), and notes on those that don't fit."""
    tests, skipped = [], []
    for p in prompts:
        (tests if p <= n_positions else skipped).append(("pp", p, p))
    for ctx in sorted({4, *prompts}):
        (tests if ctx + n_gen <= n_positions else skipped).append(("tg", ctx, n_gen))
    notes = [f"{label(k)}: exceeds n_positions {n_positions}" for k in skipped]
    return tests, notes


def joined(tests, kind):
    """Comma-separated contexts of the planned tests of one kind ("pp" or "tg")."""
    return ",".join(str(ctx) for k, ctx, _ in tests if k == kind)


def tail(text, lines=3, first=False):
    """The last (or first) few non-blank lines of a command's output, joined on one line."""
    kept = [line.strip() for line in text.splitlines() if line.strip()]
    return " | ".join(kept[:lines] if first else kept[-lines:])


def run_json(cmd, timeout, env=None):
    """Run a command; return the JSON on its stdout (last parseable line or whole text)."""
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"exit {proc.returncode}: {tail(proc.stderr or proc.stdout)}")
    try:
        return json.loads(proc.stdout)
    except json.JSONDecodeError:
        for line in reversed(proc.stdout.strip().splitlines()):
            try:
                return json.loads(line)
            except json.JSONDecodeError:
                continue
    raise RuntimeError(f"no JSON on stdout: {tail(proc.stdout or proc.stderr)}")


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


def onnx_path(a):
    model = Path(a.model).resolve()
    st = (model / "model.safetensors").stat()
    ident = f"{model}|{st.st_size}|{st.st_mtime_ns}|{(model / 'config.json').read_text()}|{ONNX_GRAPH_VERSION}|torch={not a.skip_torch}"
    key = hashlib.sha1(ident.encode()).hexdigest()[:16]
    return Path(f"{a.venv}-onnx") / key / "model.onnx"


def run_worker(a, mode, extra=()):
    """This script in worker mode under the venv's Python; returns ({test key: tok/s}, versions)."""
    cmd = [str(a.venv / "bin" / "python"), str(Path(__file__).resolve()), "--worker", mode, "--model", a.model,
           "-p", ",".join(map(str, a.prompts)), "-n", str(a.n), "-t", str(a.threads), *extra]
    env = dict(os.environ, OMP_NUM_THREADS=str(a.threads), MKL_NUM_THREADS=str(a.threads))
    out = run_json(cmd, a.timeout, env=env)
    return {tuple(k): v for *k, v in out.get("results", [])}, out.get("versions", {})


# ---------------------------------------------------------------- workers (run inside the venv)

def measure(eng, tests, vocab):
    """Time each test once (after a warm-up) on an engine adaptor; return [[kind, ctx, n, tok/s]]."""
    rng = random.Random(0)
    ids = lambda k: eng.encode([rng.randrange(vocab) for _ in range(k)])
    state, tok = eng.start(ids(4))
    for _ in range(4):  # warm up the decode path
        state, tok = eng.step(state, tok)
    out = []
    for kind, ctx, n in tests:
        x = ids(ctx)
        if kind == "pp":
            eng.prefill(x)  # warm-up at this shape
            t0 = time.perf_counter()
            eng.prefill(x)
        else:
            state, tok = eng.start(x)
            t0 = time.perf_counter()
            for _ in range(n):
                state, tok = eng.step(state, tok)
        out.append([kind, ctx, n, n / (time.perf_counter() - t0)])
    return out


class HfEngine:
    def __init__(self, model_dir, threads):
        import inspect
        import torch
        import transformers
        from transformers import GPT2LMHeadModel
        torch.set_num_threads(threads)
        self.torch = torch
        major, minor = (int(x) for x in transformers.__version__.split(".")[:2])
        dtype_kw = "dtype" if (major, minor) >= (4, 56) else "torch_dtype"
        self.model = GPT2LMHeadModel.from_pretrained(
            model_dir, **{dtype_kw: torch.float32}, attn_implementation="sdpa").eval()
        params = inspect.signature(self.model.forward).parameters  # logits of the last position only
        self.last_only = next(({k: 1} for k in ("logits_to_keep", "num_logits_to_keep") if k in params), {})
        self.versions = {"torch": torch.__version__, "transformers": transformers.__version__}

    def encode(self, ids):
        return self.torch.tensor([ids], dtype=self.torch.long)

    def _run(self, ids, past=None, cache=True):
        with self.torch.no_grad():
            return self.model(input_ids=ids, past_key_values=past, use_cache=cache, **self.last_only)

    def prefill(self, ids):
        self._run(ids, cache=False)

    def start(self, ids):
        return self.step(None, ids)

    def step(self, past, tok):
        out = self._run(tok, past)
        return out.past_key_values, out.logits[:, -1].argmax(-1, keepdim=True)


class OrtEngine:
    def __init__(self, path, threads, cfg):
        import numpy as np
        import onnxruntime as ort
        so = ort.SessionOptions()
        so.intra_op_num_threads, so.inter_op_num_threads = threads, 1
        so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        self.sess = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
        self.np, L, H = np, cfg["n_layer"], cfg["n_head"]
        self.empty = [np.zeros((1, H, 0, cfg["n_embd"] // H), np.float32)] * (2 * L)
        self.past_names = [f"past_{kv}_{i}" for i in range(L) for kv in "kv"]
        self.outputs = ["logits"] + [f"present_{kv}_{i}" for i in range(L) for kv in "kv"]
        self.takes_bias = any(i.name == "attn_bias" for i in self.sess.get_inputs())
        graph = (Path(path).parent / "source.txt").read_text().strip()
        self.versions = {"onnxruntime": ort.__version__, "onnx graph": graph}

    def encode(self, ids):
        return self.np.array([ids], dtype=self.np.int64)

    def _run(self, ids, past):
        np, p, t = self.np, past[0].shape[2], ids.shape[1]
        feed = {"input_ids": ids, "position_ids": np.arange(p, p + t, dtype=np.int64)[None]}
        if self.takes_bias:  # the onnx.helper graph takes its causal mask as an input
            feed["attn_bias"] = np.triu(np.full((t, p + t), -np.inf, np.float32), k=p + 1)
        feed.update(zip(self.past_names, past))
        logits, *present = self.sess.run(self.outputs, feed)
        return present, logits.reshape(1, -1).argmax(-1).reshape(1, 1)

    def prefill(self, ids):
        self._run(ids, self.empty)

    def start(self, ids):
        return self._run(ids, self.empty)

    def step(self, past, tok):
        return self._run(tok, past)


def build_onnx(model_dir, out):
    """GPT-2 as an ONNX graph (opset 17) straight from model.safetensors; K/V cache as inputs/outputs."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper as oh, numpy_helper
    from safetensors.numpy import load_file
    cfg = json.loads((Path(model_dir) / "config.json").read_text())
    C, H, L, eps = cfg["n_embd"], cfg["n_head"], cfg["n_layer"], cfg.get("layer_norm_epsilon", 1e-5)
    act = cfg.get("activation_function", "gelu_new")
    if act not in ("gelu_new", "gelu_pytorch_tanh", "gelu", "gelu_fast"):
        raise SystemExit(f"activation {act} not supported by the ONNX builder")
    w = {k.removeprefix("transformer."): v for k, v in load_file(str(Path(model_dir) / "model.safetensors")).items()}
    nodes, inits, count = [], {}, iter(range(10 ** 9))

    def W(name, arr=None):  # a weight (as float32) or a constant, registered once
        if name not in inits:
            arr = w[name].astype(np.float32) if arr is None else arr
            inits[name] = numpy_helper.from_array(np.asarray(arr, order="C"), name)
        return name

    def op(kind, *inputs, out=None, n_out=1, **attrs):
        outs = [out] if out else [f"{kind}_{next(count)}" for _ in range(n_out)]
        nodes.append(oh.make_node(kind, list(inputs), outs, **attrs))
        return outs[0] if n_out == 1 else outs

    const = lambda name, *v, dt=np.float32: W(name, np.array(v if len(v) > 1 else v[0], dt))
    ln = lambda x, p: op("LayerNormalization", x, W(p + ".weight"), W(p + ".bias"), axis=-1, epsilon=eps)
    linear = lambda x, p: op("Add", op("MatMul", x, W(p + ".weight")), W(p + ".bias"))
    heads = lambda x: op("Transpose", op("Reshape", x, const("shape_bthd", 0, -1, H, C // H, dt=np.int64)),
                         perm=[0, 2, 1, 3])

    def gelu(x):
        if act == "gelu":  # exact: 0.5 x (1 + erf(x / sqrt 2))
            inner = op("Erf", op("Mul", x, const("inv_sqrt2", 2 ** -0.5)))
        else:  # tanh approximation (gelu_new)
            x3 = op("Mul", op("Mul", x, x), x)
            inner = op("Tanh", op("Mul", op("Add", x, op("Mul", x3, const("c044", 0.044715))),
                                  const("sqrt2pi", (2 / np.pi) ** 0.5)))
        return op("Mul", op("Mul", x, const("half", 0.5)), op("Add", inner, const("one", 1.0)))

    x = op("Add", op("Gather", W("wte.weight"), "input_ids", axis=0), op("Gather", W("wpe.weight"), "position_ids", axis=0))
    for i in range(L):
        p = f"h.{i}."
        q, k, v = op("Split", linear(ln(x, p + "ln_1"), p + "attn.c_attn"), const("split3", C, C, C, dt=np.int64),
                     axis=2, n_out=3)
        k_all = op("Concat", f"past_k_{i}", heads(k), axis=2, out=f"present_k_{i}")
        v_all = op("Concat", f"past_v_{i}", heads(v), axis=2, out=f"present_v_{i}")
        scores = op("MatMul", op("Mul", heads(q), const("scale", (C // H) ** -0.5)), op("Transpose", k_all, perm=[0, 1, 3, 2]))
        probs = op("Softmax", op("Add", scores, "attn_bias"), axis=-1)
        attn = op("Reshape", op("Transpose", op("MatMul", probs, v_all), perm=[0, 2, 1, 3]),
                  const("shape_btc", 0, -1, C, dt=np.int64))
        x = op("Add", x, linear(attn, p + "attn.c_proj"))
        x = op("Add", x, linear(gelu(linear(ln(x, p + "ln_2"), p + "mlp.c_fc")), p + "mlp.c_proj"))
    last = op("Gather", ln(x, "ln_f"), const("last", -1, dt=np.int64), axis=1)  # [1, C]
    op("Gemm", last, W("wte.weight"), transB=1, out="logits")

    f32, i64, hd = TensorProto.FLOAT, TensorProto.INT64, C // H
    kv = lambda name, s: oh.make_tensor_value_info(name, f32, [1, H, s, hd])
    inputs = [oh.make_tensor_value_info("input_ids", i64, [1, "T"]),
              oh.make_tensor_value_info("position_ids", i64, [1, "T"]),
              oh.make_tensor_value_info("attn_bias", f32, ["T", "PT"])]
    inputs += [kv(f"past_{c}_{i}", "P") for i in range(L) for c in "kv"]
    outputs = [oh.make_tensor_value_info("logits", f32, [1, cfg["vocab_size"]])]
    outputs += [kv(f"present_{c}_{i}", "PT") for i in range(L) for c in "kv"]
    graph = oh.make_graph(nodes, "gpt2", inputs, outputs, list(inits.values()))
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)], producer_name="kvgpt compare_peers")
    model.ir_version = 8
    onnx.save_model(model, str(out), save_as_external_data=True, location=out.name + ".data")


def export_torch_onnx(model_dir, out):
    """transformers' GPT2LMHeadModel through torch.onnx.export (TorchScript exporter), K/V cache as
    flat inputs/outputs, then ONNX Runtime's transformer optimizer (model_type gpt2) for its fusions."""
    import torch
    from onnxruntime.transformers import optimizer
    from transformers import DynamicCache, GPT2LMHeadModel
    model = GPT2LMHeadModel.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="eager").eval()
    L, H = model.config.n_layer, model.config.n_head
    hd = model.config.n_embd // H

    class WithFlatCache(torch.nn.Module):
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, input_ids, position_ids, *past):
            cache = DynamicCache()
            for i in range(L):
                cache.update(past[2 * i], past[2 * i + 1], i)
            o = self.m(input_ids=input_ids, position_ids=position_ids, past_key_values=cache, use_cache=True,
                       logits_to_keep=1)
            kv = o.past_key_values
            return (o.logits, *[t for i in range(L) for t in (kv.layers[i].keys, kv.layers[i].values)])

    past_names = [f"past_{c}_{i}" for i in range(L) for c in "kv"]
    present_names = [f"present_{c}_{i}" for i in range(L) for c in "kv"]
    dynamic = {"input_ids": {1: "T"}, "position_ids": {1: "T"}}
    dynamic.update({n: {2: "P"} for n in past_names})
    dynamic.update({n: {2: "PT"} for n in present_names})
    example = (torch.tensor([[1, 2, 3]]), torch.tensor([[2, 3, 4]]), *[torch.zeros(1, H, 2, hd)] * (2 * L))
    raw = out.with_name("raw.onnx")
    torch.onnx.export(WithFlatCache(model), example, str(raw), input_names=["input_ids", "position_ids", *past_names],
                      output_names=["logits", *present_names], dynamic_axes=dynamic, opset_version=17, dynamo=False)
    opt = optimizer.optimize_model(str(raw), model_type="gpt2", num_heads=H, hidden_size=model.config.n_embd,
                                   opt_level=0)
    opt.save_model_to_file(str(out), use_external_data_format=True)
    raw.unlink()
    fused = {k: v for k, v in opt.get_fused_operator_statistics().items() if v}
    return f"torch {torch.__version__} torch.onnx.export + ORT transformer optimizer (fused: {fused})"


def export_onnx(model_dir, out, use_torch):
    """The ORT model: a torch.onnx export when torch is installed, else the onnx.helper graph.
    Written to a temporary folder, then moved into place; source.txt says which it is."""
    tmp = out.parent.with_suffix(".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    source = None
    if use_torch:
        try:
            source = export_torch_onnx(model_dir, tmp / out.name)
        except Exception as e:  # fall back to the hand-built graph, and say so
            log(f"torch.onnx export failed ({type(e).__name__}: {e}); using the onnx.helper graph")
            for f in tmp.iterdir():
                f.unlink()
    if source is None:
        build_onnx(model_dir, tmp / out.name)
        source = "onnx.helper graph built from model.safetensors (no torch: ORT's transformer fusions not applied)"
    (tmp / "source.txt").write_text(source + "\n")
    shutil.rmtree(out.parent, ignore_errors=True)
    tmp.rename(out.parent)


def worker_main(a):
    cfg = json.loads((Path(a.model) / "config.json").read_text())
    if a.worker == "export-onnx":
        export_onnx(a.model, Path(a.onnx), use_torch=not a.skip_torch)
        print(json.dumps({"ok": True}))
        return 0
    eng = HfEngine(a.model, a.threads) if a.worker == "hf" else OrtEngine(a.onnx, a.threads, cfg)
    tests, _ = plan_tests(a.prompts, a.n, cfg["n_positions"])
    print(json.dumps({"results": measure(eng, tests, cfg["vocab_size"]), "versions": eng.versions}))
    return 0


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


def log(msg):
    print(f"[compare_peers] {msg}", file=sys.stderr, flush=True)


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
