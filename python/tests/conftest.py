"""What the package's tests share: the fixture model, Hugging Face's reference outputs for it
(read with json and numpy alone: no torch), and the `kvgpt` binary the Rust tests built."""

import json
import os
import struct
from pathlib import Path

import numpy as np
import pytest

import kvgpt

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = ROOT / "tests" / "fixtures" / "tiny-gpt2"


def read_safetensors(path):
    """A safetensors file as {name: numpy array}, from its format's definition (8-byte header
    length, JSON header, raw little-endian data)."""
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + n])
    base = 8 + n
    kinds = {"F32": np.float32, "I64": np.int64}
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        a, b = t["data_offsets"]
        out[name] = np.frombuffer(raw[base + a : base + b], dtype=kinds[t["dtype"]]).reshape(t["shape"])
    return out


@pytest.fixture(scope="session")
def model():
    return kvgpt.load(str(FIXTURE), threads=2)


@pytest.fixture(scope="session")
def checkpoint():
    """The fixture's weights, as Hugging Face names them without `transformer.`, in float64."""
    weights = read_safetensors(FIXTURE / "model.safetensors")
    return {k.removeprefix("transformer."): v.astype(np.float64) for k, v in weights.items()}


@pytest.fixture(scope="session")
def reference():
    doc = json.loads((FIXTURE / "reference.json").read_text())
    return doc, read_safetensors(FIXTURE / "reference.safetensors")


@pytest.fixture(scope="session")
def kvgpt_binary():
    """The CLI built by `cargo test` (or $KVGPT_BIN)."""
    path = Path(os.environ.get("KVGPT_BIN", ROOT / "target" / "debug" / "kvgpt"))
    if not path.is_file():
        pytest.fail(f"{path} is missing: build it with `cargo build` (or set KVGPT_BIN)")
    return path
