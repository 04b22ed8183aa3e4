"""`kvgpt convert` read by llama.cpp's own Python reader, gguf-py (`pip install gguf`), against the
files llama.cpp wrote from the same fixture (tests/fixtures/gguf: its converter's f32, f16 and q8_0,
`llama-quantize --pure`'s q4_0, q4_1, q5_0 and q5_1): every metadata field with its type and value,
every tensor's name, shape, type and bytes. bf16, of which llama.cpp wrote no fixture, against
gguf-py's own bf16 rounding of the f32 file's tensors."""

import subprocess
from pathlib import Path

import gguf
import numpy as np
import pytest

from conftest import FIXTURE, ROOT

GGUFS = ROOT / "tests" / "fixtures" / "gguf"


def convert(binary: Path, out: Path, ty: str) -> None:
    # The converter named the fixture "Model" (from the folder it was given).
    args = [str(binary), "convert", str(FIXTURE), str(out), "--type", ty, "--name", "Model"]
    subprocess.run(args, check=True, capture_output=True)


def fields(r: gguf.GGUFReader) -> dict:
    """Each metadata field's types and value bytes (the header's own counts left out)."""
    return {k: (f.types, [bytes(f.parts[i]) for i in f.data]) for k, f in r.fields.items() if not k.startswith("GGUF.")}


def tensors(r: gguf.GGUFReader) -> dict:
    return {t.name: (t.tensor_type, [int(d) for d in t.shape], bytes(t.data)) for t in r.tensors}


@pytest.mark.parametrize("ty", ["f32", "f16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1"])
def test_every_field_and_tensor_is_llama_cpps(kvgpt_binary, tmp_path, ty):
    out = tmp_path / f"{ty}.gguf"
    convert(kvgpt_binary, out, ty)
    mine, theirs = gguf.GGUFReader(str(out)), gguf.GGUFReader(str(GGUFS / f"tiny-gpt2-{ty}.gguf"))
    a, b = fields(mine), fields(theirs)
    assert sorted(a) == sorted(b)
    assert [k for k in a if a[k] != b[k]] == []
    ta, tb = tensors(mine), tensors(theirs)
    assert sorted(ta) == sorted(tb)
    assert [n for n in ta if ta[n] != tb[n]] == []
    assert len(ta) == 28 and ta["token_embd.weight"][0].name == ty.upper()


def test_bf16_is_gguf_pys_rounding_of_the_f32_file(kvgpt_binary, tmp_path):
    out = tmp_path / "bf16.gguf"
    convert(kvgpt_binary, out, "bf16")
    mine = gguf.GGUFReader(str(out))
    assert mine.fields["general.file_type"].contents() == gguf.LlamaFileType.MOSTLY_BF16
    ta = {t.name: t for t in mine.tensors}
    for t in gguf.GGUFReader(str(GGUFS / "tiny-gpt2-f32.gguf")).tensors:
        data = np.asarray(t.data)
        # The converter's rule: matrices but the position embedding in the type asked for.
        matrix = data.ndim == 2 and t.name != "position_embd.weight"
        want = gguf.quants.quantize(data, gguf.GGMLQuantizationType.BF16) if matrix else data
        got = ta[t.name]
        assert got.tensor_type == (gguf.GGMLQuantizationType.BF16 if matrix else gguf.GGMLQuantizationType.F32)
        assert bytes(got.data) == np.ascontiguousarray(want).tobytes(), t.name
