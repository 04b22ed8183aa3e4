#!/usr/bin/env python3
"""Write a DistilGPT-2-shaped Hugging Face model folder with random weights.

For benchmarks anyone can run without the Hub: 6 layers, 12 heads, n_embd 768, 1024 positions,
the real GPT-2 vocabulary (50257) and tokenizer files (copied from a tokenizer folder).

    python3 -m venv .venv && .venv/bin/pip install numpy
    .venv/bin/python scripts/make_random_checkpoint.py /tmp/distilgpt2-random

Weights follow GPT-2's init (N(0, 0.02), residual projections scaled by 1/sqrt(2 L), LayerNorm 1/0),
stored with the `transformer.` prefix as HF's GPT2LMHeadModel saves them. `--dtype` stores them
as float16 or bfloat16 instead.
"""

import argparse
import json
import shutil
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
DEFAULT_TOKENIZER = HERE.parent / "tests" / "fixtures" / "tiny-gpt2"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", type=Path, help="folder to write (created)")
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--embd", type=int, default=768)
    ap.add_argument("--positions", type=int, default=1024)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--dtype", choices=["float32", "float16", "bfloat16"], default="float32")
    ap.add_argument("--tokenizer-dir", type=Path, default=DEFAULT_TOKENIZER,
                    help="folder with tokenizer.json, vocab.json, merges.txt")
    a = ap.parse_args()

    if a.embd % a.heads:
        print(f"--embd {a.embd} must be a multiple of --heads {a.heads}", file=sys.stderr)
        return 2
    vocab, c, f, L = 50257, a.embd, 4 * a.embd, a.layers
    rng = np.random.default_rng(a.seed)

    def normal(*shape, std=0.02):
        return (rng.standard_normal(shape, dtype=np.float32) * std).astype(np.float32)

    t = {
        "transformer.wte.weight": normal(vocab, c),
        "transformer.wpe.weight": normal(a.positions, c, std=0.01),
        "transformer.ln_f.weight": np.ones(c, np.float32),
        "transformer.ln_f.bias": np.zeros(c, np.float32),
    }
    proj_std = 0.02 / np.sqrt(2 * L)
    for i in range(L):
        p = f"transformer.h.{i}."
        t[p + "ln_1.weight"] = np.ones(c, np.float32)
        t[p + "ln_1.bias"] = np.zeros(c, np.float32)
        t[p + "attn.c_attn.weight"] = normal(c, 3 * c)
        t[p + "attn.c_attn.bias"] = np.zeros(3 * c, np.float32)
        t[p + "attn.c_proj.weight"] = normal(c, c, std=proj_std)
        t[p + "attn.c_proj.bias"] = np.zeros(c, np.float32)
        t[p + "ln_2.weight"] = np.ones(c, np.float32)
        t[p + "ln_2.bias"] = np.zeros(c, np.float32)
        t[p + "mlp.c_fc.weight"] = normal(c, f)
        t[p + "mlp.c_fc.bias"] = np.zeros(f, np.float32)
        t[p + "mlp.c_proj.weight"] = normal(f, c, std=proj_std)
        t[p + "mlp.c_proj.bias"] = np.zeros(c, np.float32)

    dtype = {"float32": "F32", "float16": "F16", "bfloat16": "BF16"}[a.dtype]
    a.out.mkdir(parents=True, exist_ok=True)
    save_safetensors({k: convert(v, dtype) for k, v in t.items()}, dtype, a.out / "model.safetensors")

    config = {
        "activation_function": "gelu_new", "architectures": ["GPT2LMHeadModel"], "attn_pdrop": 0.1,
        "bos_token_id": 50256, "eos_token_id": 50256, "embd_pdrop": 0.1, "initializer_range": 0.02,
        "layer_norm_epsilon": 1e-05, "model_type": "gpt2", "n_ctx": a.positions, "n_embd": c,
        "n_head": a.heads, "n_inner": None, "n_layer": L, "n_positions": a.positions,
        "resid_pdrop": 0.1, "scale_attn_weights": True, "tie_word_embeddings": True,
        "torch_dtype": a.dtype, "vocab_size": vocab,
    }
    (a.out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    for name in ["tokenizer.json", "vocab.json", "merges.txt"]:
        src = a.tokenizer_dir / name
        if src.exists():
            shutil.copyfile(src, a.out / name)
    n_params = sum(v.size for v in t.values())
    print(f"wrote {a.out}: {L} layers, {a.heads} heads, n_embd {c}, {a.positions} positions, "
          f"{n_params / 1e6:.1f}M parameters, {a.dtype}")
    return 0


def convert(x: np.ndarray, dtype: str) -> np.ndarray:
    """float32 -> the stored dtype; bfloat16 (which numpy lacks) as uint16 bits, rounded to nearest even."""
    if dtype == "F16":
        return x.astype(np.float16)
    if dtype == "BF16":
        bits = x.view(np.uint32).astype(np.uint64)
        return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
    return x


def save_safetensors(tensors: dict, dtype: str, path: Path) -> None:
    """The safetensors format: 8-byte little-endian header length, JSON header, raw data."""
    header, offset = {"__metadata__": {"format": "pt"}}, 0
    for name, x in tensors.items():
        header[name] = {"dtype": dtype, "shape": list(x.shape), "data_offsets": [offset, offset + x.nbytes]}
        offset += x.nbytes
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(len(h).to_bytes(8, "little"))
        f.write(h)
        for x in tensors.values():
            f.write(np.ascontiguousarray(x).astype(x.dtype.newbyteorder("<")).tobytes())


if __name__ == "__main__":
    sys.exit(main())
