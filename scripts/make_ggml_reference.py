#!/usr/bin/env python3
"""Writes tests/fixtures/ggml_blocks.json: llama.cpp's block formats as gguf-py (llama.cpp's own
Python package, `pip install gguf numpy`) reads and writes them, for kvgpt's kernel tests.

For each type: random blocks (valid scales, random integers) and gguf-py's dequantized values;
for the types kvgpt quantizes (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1), random weights and gguf-py's
quantized blocks of them. Values travel as the hex of little-endian f32s, so nothing is rounded
on the way.

    python scripts/make_ggml_reference.py tests/fixtures/ggml_blocks.json
"""
import json
import sys
from importlib.metadata import version

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import quants

TYPES = ["Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K"]
QUANTIZED = ["Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1"]


def random_blocks(rng, name, n):
    """n blocks of type `name`: random bytes with every f16 scale set to a finite value."""
    size = quants.GGML_QUANT_SIZES[T[name]][1]
    b = rng.integers(0, 256, size=(n, size), dtype=np.uint8)
    f16 = lambda k: rng.uniform(-0.05, 0.05, size=(n, k)).astype(np.float16).view(np.uint8)
    if name in ("Q8_0", "Q4_0", "Q5_0"):
        b[:, 0:2] = f16(1)
    elif name in ("Q4_1", "Q5_1", "Q4_K", "Q5_K"):
        b[:, 0:4] = f16(2)
    elif name == "Q6_K":
        b[:, 208:210] = f16(1)
    if name == "Q8_0":
        b[:, 2:][b[:, 2:] == 0x80] = 0x81  # -128: no ggml quantizer writes it
    return b


def main(out):
    rng = np.random.default_rng(20261203)
    doc = {"source": "gguf-py " + version("gguf"), "blocks": {}, "quantized": {}}
    for name in TYPES:
        blocks = random_blocks(rng, name, 24)
        values = quants.dequantize(blocks.reshape(-1), T[name]).astype(np.float32)
        doc["blocks"][name] = {"bytes": blocks.tobytes().hex(), "values": values.tobytes().hex()}
    for name in QUANTIZED:
        x = rng.normal(0.0, 0.05, size=(16, 64)).astype(np.float32)
        x[3, :32] = 0.0  # a block of zeros
        x[5, 7] = 0.9  # an outlier
        q = quants.quantize(x, T[name])
        doc["quantized"][name] = {"rows": 16, "k": 64, "weights": x.tobytes().hex(), "bytes": q.tobytes().hex()}
    with open(out, "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main(sys.argv[1])
