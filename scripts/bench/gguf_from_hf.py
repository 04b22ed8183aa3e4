#!/usr/bin/env python3
"""A GPT-2 model folder (config.json, model.safetensors, vocab.json, merges.txt) as an f32 GGUF for
llama.cpp, written with gguf-py (`pip install gguf numpy`) and no torch: the tensors and metadata
llama.cpp's own `convert_hf_to_gguf.py` writes for GPT-2 (`--check` compares them with a GGUF that
converter made, e.g. tests/fixtures/gguf/tiny-gpt2-f32.gguf from tests/fixtures/tiny-gpt2).

    python3 scripts/bench/gguf_from_hf.py /tmp/distilgpt2-random /tmp/distilgpt2-random-f32.gguf
    python3 scripts/bench/gguf_from_hf.py tests/fixtures/tiny-gpt2 /tmp/t.gguf --check tests/fixtures/gguf/tiny-gpt2-f32.gguf
"""

import argparse
import json
import struct
import sys
from pathlib import Path

import gguf
import numpy as np


def safetensors(path):
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + n])
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        assert t["dtype"] == "F32", f"{name}: {t['dtype']} (only f32 checkpoints)"
        a, b = t["data_offsets"]
        out[name.removeprefix("transformer.")] = np.frombuffer(raw[8 + n + a : 8 + n + b], np.float32).reshape(t["shape"])
    return out


def tensors(w, n_layer):
    """GGUF name → array, as llama.cpp's converter maps GPT-2 (Conv1D weights transposed)."""
    out = {"token_embd.weight": w["wte.weight"], "position_embd.weight": w["wpe.weight"],
           "output_norm.weight": w["ln_f.weight"], "output_norm.bias": w["ln_f.bias"]}
    parts = {"ln_1": "attn_norm", "attn.c_attn": "attn_qkv", "attn.c_proj": "attn_output", "ln_2": "ffn_norm",
             "mlp.c_fc": "ffn_up", "mlp.c_proj": "ffn_down"}
    for i in range(n_layer):
        for hf, name in parts.items():
            weight = w[f"h.{i}.{hf}.weight"]
            out[f"blk.{i}.{name}.weight"] = weight if hf.startswith("ln") else np.ascontiguousarray(weight.T)
            out[f"blk.{i}.{name}.bias"] = w[f"h.{i}.{hf}.bias"]
    return out


def write(src, dst):
    cfg = json.loads((src / "config.json").read_text())
    n_layer = cfg.get("n_layer", 12)
    w = safetensors(src / "model.safetensors")
    out = gguf.GGUFWriter(str(dst), "gpt2")
    out.add_name("Model")
    out.add_block_count(n_layer)
    out.add_context_length(cfg.get("n_positions", cfg.get("n_ctx", 1024)))
    out.add_embedding_length(cfg["n_embd"])
    out.add_feed_forward_length(cfg.get("n_inner") or 4 * cfg["n_embd"])
    out.add_head_count(cfg["n_head"])
    out.add_layer_norm_eps(cfg.get("layer_norm_epsilon", 1e-5))
    out.add_file_type(0)
    vocab = json.loads((src / "vocab.json").read_text())
    tokens = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
    merges = [m for m in (src / "merges.txt").read_text().splitlines() if m and not m.startswith("#version")]
    eos = cfg.get("eos_token_id", 50256)
    out.add_tokenizer_model("gpt2")
    out.add_tokenizer_pre("gpt-2")
    out.add_token_list(tokens)
    out.add_token_types([3 if i == eos else 1 for i in range(len(tokens))])
    out.add_token_merges(merges)
    out.add_bos_token_id(cfg.get("bos_token_id", eos))
    out.add_eos_token_id(eos)
    out.add_unk_token_id(eos)
    out.add_add_bos_token(False)
    out.add_add_eos_token(False)
    for name, a in tensors(w, n_layer).items():
        out.add_tensor(name, a)
    out.write_header_to_file()
    out.write_kv_data_to_file()
    out.write_tensors_to_file()
    out.close()


def check(mine, theirs):
    a, b = gguf.GGUFReader(str(mine)), gguf.GGUFReader(str(theirs))
    bad = []
    skip = {"general.size_label", "GGUF.kv_count", "general.type", "general.quantization_version"}
    for k, f in b.fields.items():
        if k in skip:
            continue
        g = a.fields.get(k)
        if g is None or [bytes(g.parts[i]) for i in g.data] != [bytes(f.parts[i]) for i in f.data]:
            bad.append(f"field {k}")
    ta = {t.name: t for t in a.tensors}
    for t in b.tensors:
        m = ta.get(t.name)
        if m is None or list(m.shape) != list(t.shape) or not np.array_equal(m.data, t.data):
            bad.append(f"tensor {t.name}")
    return bad


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("src", type=Path)
    p.add_argument("dst", type=Path)
    p.add_argument("--check", type=Path, help="a GGUF llama.cpp's converter wrote from the same folder")
    a = p.parse_args()
    write(a.src, a.dst)
    if a.check:
        bad = check(a.dst, a.check)
        print("the same tensors and metadata as " + str(a.check) if not bad else "differs: " + ", ".join(bad[:10]))
        sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
