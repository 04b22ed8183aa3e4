"""Bad input raises a clear exception and the interpreter goes on; the OpenAI-shaped answers; the
viewer; the example script."""

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import kvgpt

ROOT = Path(__file__).resolve().parents[2]


def test_bad_input_raises_clear_exceptions(model, tmp_path):
    with pytest.raises(FileNotFoundError, match="nope"):
        kvgpt.load(str(tmp_path / "nope"), offline=True)
    # A bare name that is no folder here is looked up on the Hub, and the error says why.
    with pytest.raises(FileNotFoundError, match="there is no folder `nope` here, so it was taken as a Hugging Face Hub id"):
        kvgpt.load("nope", offline=True)
    with pytest.raises(ValueError, match="dtype \"q3\" is not one kvgpt holds weights as; choose one of f32"):
        kvgpt.load(str(ROOT / "tests" / "fixtures" / "tiny-gpt2"), dtype="q3")
    with pytest.raises(ValueError, match="128"):
        model.generate("hello " * 200)
    with pytest.raises(ValueError, match="128"):
        model.run_with_cache(list(range(129)))
    with pytest.raises(TypeError, match="expected a str or a list of token ids, got int"):
        model.generate(42)
    with pytest.raises(ValueError, match="50257"):
        model.detokenize([50257])
    with pytest.raises(ValueError, match="temperature"):
        model.generate("x", temperature=-1.0)
    with pytest.raises(TypeError, match="unexpected keyword \"max_new_tokens\"; generate and stream take max_tokens"):
        model.generate("x", max_new_tokens=4)
    with pytest.raises(TypeError, match="max_tokens"):
        model.stream("x", max_tokens="four")
    with pytest.raises(ValueError, match="stop sequence is empty"):
        model.generate("x", stop=[""])
    with pytest.raises(ValueError, match="step takes one token"):
        model.kv_cache("The cat").step(" sat on")
    with pytest.raises(IndexError, match="layers 0 to 1"):
        model.kv_cache("The cat").k(2)
    with pytest.raises(ValueError, match="the text is empty"):
        model.kv_cache("")
    with pytest.raises(TypeError, match="got bytes: decode it to a str first"):
        model.generate(b"The cat")
    with pytest.raises(ValueError, match="token -1: ids go from 0 to 50256"):
        model.kv_cache("The cat").step(-1)
    full = model.kv_cache(list(range(128)))
    with pytest.raises(ValueError, match="the cache is full: it holds 128 of the model's 128 positions"):
        full.step(0)
    assert full.length == 128
    # Still alive, and right.
    assert model.tokenize("The cat sat on") == [464, 3797, 3332, 319]


def test_own_files_and_numbers_follow_the_clis_rules(model, tmp_path):
    """Issue #33: a page is never saved onto a file the model was read from (on e3c743f
    `save(model_dir + "/config.json")` overwrote it); threads are capped as the CLI caps them
    (`threads=5000` started threads until the system refused); an int out of range is a
    ValueError, as README says of a bad argument (it was a TypeError)."""
    import shutil
    copy = tmp_path / "model"
    shutil.copytree(ROOT / "tests" / "fixtures" / "tiny-gpt2", copy)
    view = kvgpt.load(str(copy), threads=1).attention_view("The cat")
    for name in ["config.json", "model.safetensors", "tokenizer.json"]:
        before = (copy / name).read_bytes()
        with pytest.raises(ValueError, match=f"is the model's .*, which this run reads; choose another output file"):
            view.save(str(copy / name))
        assert (copy / name).read_bytes() == before, name
    view.save(str(tmp_path / "page.html"))
    assert (tmp_path / "page.html").read_text() == view.html
    for threads in [0, 1025, 5000]:
        with pytest.raises(ValueError, match=f"{threads} threads: ask for 1 to 1024"):
            kvgpt.load(str(copy), threads=threads)
    for threads in [-1, 2**70]:
        with pytest.raises(ValueError, match="threads: .* is out of range"):
            kvgpt.load(str(copy), threads=threads)
    for key, value in [("max_tokens", 2**70), ("seed", -1), ("top_k", 2**64)]:
        with pytest.raises(ValueError, match=f"{key}: {value} is out of range"):
            model.generate("x", **{key: value})
    with pytest.raises(TypeError, match="max_tokens"):
        model.generate("x", max_tokens=1.5)
    with pytest.raises(ValueError, match="ids go from 0 to 50256"):
        model.generate([464, 2**40])
    with pytest.raises(ValueError, match="ids go from 0 to 50256"):
        model.detokenize([-1])


def test_openai_shaped_answers(model, reference):
    doc, _ = reference
    p = doc["prompts"][0]
    out = model.create_completion(p["text"], max_tokens=10, temperature=0)
    assert out["object"] == "text_completion" and out["choices"][0]["finish_reason"] == "length"
    assert out["choices"][0]["text"] == model.detokenize(p["greedy"]["ids"][:10])
    counts = {k: out["usage"][k] for k in ("prompt_tokens", "completion_tokens", "total_tokens")}
    assert counts == {"prompt_tokens": 4, "completion_tokens": 10, "total_tokens": 14}
    chunks = list(model.create_completion(p["text"], max_tokens=10, temperature=0, stream=True))
    assert "".join(c["choices"][0]["text"] for c in chunks) == out["choices"][0]["text"]
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    assert kvgpt.chat_template(msgs) == "Be brief.\n\nUser: Hi\nAssistant:"
    chat = model.create_chat_completion(msgs, max_tokens=6, temperature=0)
    r = model.generate("Be brief.\n\nUser: Hi\nAssistant:", max_tokens=6, stop=["\nUser:"])
    assert chat["choices"][0]["message"] == {"role": "assistant", "content": r["text"].lstrip()}
    with pytest.raises(ValueError, match="role \"tool\""):
        kvgpt.chat_template([{"role": "tool", "content": "x"}])


def test_attention_view_is_kvgpt_viewer_with_the_weights(model, reference):
    doc, t = reference
    view = model.attention_view("The cat sat on")
    assert view.html.startswith("<!DOCTYPE html>") and "attention of" in view.html
    # Jupyter's frame holds the page itself, as a browser reads the attribute back.
    import html
    import json
    import re
    frame = re.fullmatch(r'<iframe srcdoc="([^"]*)" style="[^"]*" sandbox="allow-scripts"></iframe>', view._repr_html_())
    assert frame is not None and html.unescape(frame[1]) == view.html
    # The page carries HF's weights (five decimals): layer 1, head 2, query 3 over its keys.
    data = json.loads(re.search(r'<script type="application/json" id="kvgpt-data">(.*?)</script>', view.html, re.S)[1])
    assert data["tokens"] == ["The", "·cat", "·sat", "·on"]
    assert np.max(np.abs(np.array(data["attn"][1][2][3]) - t["p0.attn.1"][2, 3])) < 1e-4


def test_the_example_runs(tmp_path):
    r = subprocess.run([sys.executable, str(ROOT / "examples" / "notebook.py")], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "loss" in r.stdout and "viewer:" in r.stdout
