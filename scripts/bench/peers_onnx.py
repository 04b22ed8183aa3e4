"""scripts/bench/compare_peers.py's ONNX model for ONNX Runtime: transformers' GPT-2 through
torch.onnx.export and ORT's transformer optimizer, or, without torch, a graph built with onnx.helper
straight from model.safetensors; cached in VENV-onnx/ under a key of the model and the builder."""

import hashlib
import json
import shutil
from pathlib import Path

from peers_tests import log

ONNX_GRAPH_VERSION = 2  # bump when build_onnx changes, to invalidate the cache


def onnx_path(a):
    model = Path(a.model).resolve()
    st = (model / "model.safetensors").stat()
    ident = f"{model}|{st.st_size}|{st.st_mtime_ns}|{(model / 'config.json').read_text()}|{ONNX_GRAPH_VERSION}|torch={not a.skip_torch}"
    key = hashlib.sha1(ident.encode()).hexdigest()[:16]
    return Path(f"{a.venv}-onnx") / key / "model.onnx"


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
