"""scripts/bench/compare_peers.py's workers, run inside the peers' venv (`compare_peers.py --worker MODE`):
the timing loop and the adaptors of Hugging Face transformers and ONNX Runtime, and the export of the
ONNX model."""

import json
import random
import time
from pathlib import Path

from peers_onnx import export_onnx
from peers_tests import plan_tests


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
