"""The package against Hugging Face's outputs on the fixture (tests/fixtures/tiny-gpt2/reference.*),
within the tolerances the Rust tests use, and `generate` against `kvgpt generate --json` bit for bit."""

import json
import subprocess

import numpy as np
import pytest

import kvgpt
from conftest import FIXTURE

TOL = 1e-4


def close(got, want, what, tol=TOL):
    got, want = np.asarray(got, dtype=np.float64), np.asarray(want, dtype=np.float64)
    assert got.shape == want.shape, f"{what}: shape {got.shape} vs {want.shape}"
    worst = float(np.max(np.abs(got - want))) if got.size else 0.0
    assert worst <= tol, f"{what}: max |Δ| {worst:.3g} > {tol}"


def test_ids_logits_hidden_states_attention_and_kv(model, reference):
    doc, t = reference
    for p in doc["prompts"]:
        key, ids = p["key"], p["input_ids"]
        assert model.tokenize(p["text"]) == ids, key
        logits, cache = model.run_with_cache(p["text"])
        T = len(ids)
        assert logits.shape == (1, T, 50257) and logits.dtype == np.float32
        if f"{key}.logits" in t:
            close(logits[0], t[f"{key}.logits"], f"{key} logits at every position")
        else:
            close(logits[0, -1], t[f"{key}.last_logits"], f"{key} last logits")
        # HF's hidden states: embeddings, block 0's output; then the last block before ln_f.
        close(cache["blocks.0.hook_resid_pre"][0], t[f"{key}.hidden.0"], f"{key} embeddings")
        close(cache["hook_embed"][0] + cache["hook_pos_embed"][0], t[f"{key}.hidden.0"], f"{key} wte + wpe")
        close(cache["blocks.0.hook_resid_post"][0], t[f"{key}.hidden.1"], f"{key} block 0")
        close(cache["blocks.1.hook_resid_post"][0], t[f"{key}.pre_lnf"], f"{key} block 1")
        close(cache["ln_final.hook_normalized"][0], t[f"{key}.hidden.2"], f"{key} ln_f")
        close(cache["blocks.0.ln1.hook_normalized"][0], t[f"{key}.ln1.0"], f"{key} ln_1")
        qkv = t[f"{key}.qkv.0"].reshape(T, 3, 4, 16)
        for j, part in enumerate("qkv"):
            close(cache[f"blocks.0.attn.hook_{part}"][0], qkv[:, j], f"{key} hook_{part}")
        for layer in range(2):
            close(cache[f"blocks.{layer}.attn.hook_pattern"][0], t[f"{key}.attn.{layer}"], f"{key} attention {layer}")
            # K and V as HF's cache holds them: [head, position, head_dim].
            close(cache[f"blocks.{layer}.attn.hook_k"][0].transpose(1, 0, 2), t[f"{key}.k.{layer}"], f"{key} K {layer}")
            close(cache[f"blocks.{layer}.attn.hook_v"][0].transpose(1, 0, 2), t[f"{key}.v.{layer}"], f"{key} V {layer}")
        # The scores' softmax is the pattern; masked scores are -inf.
        s = cache["blocks.1.attn.hook_attn_scores"][0].astype(np.float64)
        assert np.all(np.isneginf(s[:, np.triu_indices(T, 1)[0], np.triu_indices(T, 1)[1]]))
        e = np.exp(s - s.max(axis=-1, keepdims=True))
        close(e / e.sum(axis=-1, keepdims=True), t[f"{key}.attn.1"], f"{key} softmax of the scores")


def test_kv_cache_holds_hf_keys_and_steps_like_the_whole_sequence(model, reference):
    doc, t = reference
    p = doc["prompts"][1]
    key, ids, greedy = p["key"], p["input_ids"], p["greedy"]["ids"]
    kv = model.kv_cache(p["text"])
    assert len(kv) == kv.length == len(ids) and kv.ids == ids
    for layer in range(2):
        close(kv.k(layer), t[f"{key}.k.{layer}"], f"K {layer}")
        close(kv.v(layer), t[f"{key}.v.{layer}"], f"V {layer}")
    close(kv.logits, t[f"{key}.logits"][-1], "the prompt's last logits")
    # Decoding HF's greedy tokens one at a time: each step's argmax is HF's next token, and its
    # logits are the bits of the whole sequence run at once.
    for i, tok in enumerate(greedy[:8]):
        assert int(np.argmax(kv.logits)) == tok, f"step {i}"
        out = kv.step(tok)
        whole, _ = model.run_with_cache(ids + greedy[: i + 1], names=[])
        assert np.array_equal(out, whole[0, -1]), f"step {i}: cached and uncached differ"
    assert kv.length == len(ids) + 8 and kv.k(0).shape == (4, len(ids) + 8, 16)


def test_loss_and_perplexity(model, reference):
    doc, _ = reference
    for p in doc["prompts"]:
        if "loss" in p:
            s = model.score(p["text"])
            close(s["loss"], p["loss"], f"{p['key']} loss", tol=1e-5)
            assert abs(s["perplexity"] / np.exp(p["loss"]) - 1) < 1e-4
            assert len(s["surprisal"]) == len(p["input_ids"]) - 1


def test_greedy_ids_and_the_cli_bits(model, reference, kvgpt_binary):
    doc, _ = reference
    for p in doc["prompts"]:
        n = min(len(p["greedy"]["ids"]), 128 - len(p["input_ids"]))
        g = model.generate(p["text"], max_tokens=n, ignore_eos=True)
        assert g["ids"] == p["greedy"]["ids"][:n], p["key"]
        assert g["prompt_ids"] == p["input_ids"] and g["finish_reason"] == "length"
    # Sampled, with a stop sequence: the same tokens and text as `kvgpt generate --json`.
    args = dict(max_tokens=30, temperature=0.9, top_k=40, top_p=0.95, seed=7, stop=[" the"])
    g = model.generate("The cat sat on", **args)
    cli = subprocess.run(
        [str(kvgpt_binary), "generate", "--model", str(model.config["name"]), "-n", "30", "--temperature", "0.9",
         "--top-k", "40", "--top-p", "0.95", "--seed", "7", "--stop", " the", "--json", "The cat sat on"],
        capture_output=True, text=True, check=True)
    want = json.loads(cli.stdout)
    assert (g["ids"], g["text"], g["finish_reason"]) == (want["generated_ids"], want["text"], want["finish_reason"])
    # Streamed: the same tokens, and texts that add up to the same text.
    s = model.stream("The cat sat on", **args)
    toks = list(s)
    assert [t["id"] for t in toks][: len(g["ids"])] == g["ids"]
    assert "".join(t["text"] for t in toks) == g["text"] and s.result["ids"] == g["ids"]


def test_kv_block_size_keeps_hf_greedy_ids_and_the_same_hidden_bits(model, reference):
    """`load(kv_block_size=…)` is `--kv-block-size`: blocks of 1 position or the whole context
    give HF's greedy ids and the bits of the default 16; a size out of range is refused."""
    doc, _ = reference
    p = max(doc["prompts"], key=lambda p: len(p["input_ids"]))
    n = min(len(p["greedy"]["ids"]), 128 - len(p["input_ids"]))
    def bits(kv):
        layers = range(model.config["n_layer"])
        return [kv.logits.tobytes()] + [kv.k(i).tobytes() + kv.v(i).tobytes() for i in layers]

    assert model.config["kv_block_size"] == 16
    want = bits(model.kv_cache(p["text"]))
    for block in (1, 128):
        m = kvgpt.load(str(FIXTURE), threads=2, kv_block_size=block)
        assert m.config["kv_block_size"] == block
        assert m.generate(p["text"], max_tokens=n, ignore_eos=True)["ids"] == p["greedy"]["ids"][:n]
        assert bits(m.kv_cache(p["text"])) == want, block
    for bad in (0, 4097):
        with pytest.raises(ValueError, match="a block holds 1 to 4096 positions"):
            kvgpt.load(str(FIXTURE), kv_block_size=bad)


def test_kv_dtype_holds_hf_keys_rounded_and_keeps_hf_greedy_ids(reference):
    """`load(kv_dtype=…)` is `--kv-dtype`: layer 0's K and V (computed from the embeddings alone)
    are HF's rounded as the type rounds (f16, bf16: half an ulp; q8_0: half a step d = max|x| / 127
    of its block, plus the step's own rounding to f16, up to 127 · d · 2^-11), and with f16 or
    bf16 every greedy continuation is still HF's."""
    doc, t = reference
    p = doc["prompts"][1]
    for kv_dtype, rel in (("f16", 2.0**-11), ("bf16", 2.0**-8), ("q8_0", None)):
        m = kvgpt.load(str(FIXTURE), threads=2, kv_dtype=kv_dtype)
        assert m.config["kv_dtype"] == kv_dtype
        kv = m.kv_cache(p["text"])
        for got, want in ((kv.k(0), t[f"{p['key']}.k.0"]), (kv.v(0), t[f"{p['key']}.v.0"])):
            want = want.reshape(got.shape).astype(np.float64)
            if rel is None:  # q8_0: blocks of 32 values along a head's row (16 here: one block)
                bound = np.abs(want).max(axis=-1, keepdims=True) / 127 * (0.5 + 127 * 2.0**-11) * 1.01
            else:
                bound = np.abs(want) * rel * 1.01
            assert np.all(np.abs(got - want) <= bound + 1e-5), kv_dtype
        if rel is not None:
            for q in doc["prompts"]:
                n = min(len(q["greedy"]["ids"]), 128 - len(q["input_ids"]))
                assert m.generate(q["text"], max_tokens=n, ignore_eos=True)["ids"] == q["greedy"]["ids"][:n]
    with pytest.raises(ValueError, match="kv_dtype \"q4\" is not a K/V type; choose one of f32, f16, bf16, q8_0"):
        kvgpt.load(str(FIXTURE), kv_dtype="q4")


def test_every_hook_is_there_with_its_shape_and_names_records_only_those(model):
    names = model.hook_names()
    T, C, NH, HS, F = 4, 64, 4, 16, 256
    want = {"hook_embed": (1, T, C), "hook_pos_embed": (1, T, C), "ln_final.hook_normalized": (1, T, C)}
    for layer in range(2):
        b = f"blocks.{layer}."
        for h in ["hook_resid_pre", "ln1.hook_normalized", "hook_attn_out", "hook_resid_mid", "ln2.hook_normalized",
                  "hook_mlp_out", "hook_resid_post"]:
            want[b + h] = (1, T, C)
        for h in ["attn.hook_q", "attn.hook_k", "attn.hook_v"]:
            want[b + h] = (1, T, NH, HS)
        want[b + "attn.hook_attn_scores"] = want[b + "attn.hook_pattern"] = (1, NH, T, T)
        want[b + "mlp.hook_post"] = (1, T, F)
    assert sorted(names) == sorted(want)
    _, cache = model.run_with_cache("The cat sat on")
    assert {k: v.shape for k, v in cache.items()} == want
    # The block's output (the forward pass's own) is the residual after attention plus the MLP's
    # output, as TransformerLens has it.
    for layer in range(2):
        b = f"blocks.{layer}."
        assert np.array_equal(cache[b + "hook_resid_post"], cache[b + "hook_resid_mid"] + cache[b + "hook_mlp_out"])
    some = ["blocks.1.attn.hook_pattern", "hook_embed"]
    _, only = model.run_with_cache("The cat sat on", names=some)
    assert sorted(only) == sorted(some)
    assert np.array_equal(only["blocks.1.attn.hook_pattern"], cache["blocks.1.attn.hook_pattern"])
    with pytest.raises(ValueError, match="not a hook of this model"):
        model.run_with_cache("x", names=["blocks.9.hook_resid_pre"])


def test_the_hooks_hf_does_not_record_follow_from_the_checkpoint(model, checkpoint):
    """The hooks without a Hugging Face reference (layer 1's ln_1 and q, attention's output, ln_2,
    the MLP), each computed here in numpy (float64) from the checkpoint's weights and the hooks
    before it that the references check."""
    w = checkpoint
    _, cache = model.run_with_cache("The cat sat on the mat because it was warm")
    c = {k: v[0].astype(np.float64) for k, v in cache.items()}
    T = c["hook_embed"].shape[0]

    def layernorm(x, name):
        mu, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
        return (x - mu) / np.sqrt(var + 1e-5) * w[f"{name}.weight"] + w[f"{name}.bias"]

    def linear(x, name):
        return x @ w[f"{name}.weight"] + w[f"{name}.bias"]

    for layer in range(2):
        b, h = f"blocks.{layer}.", f"h.{layer}."
        ln1 = layernorm(c[b + "hook_resid_pre"], h + "ln_1")
        close(c[b + "ln1.hook_normalized"], ln1, f"{b}ln1")
        q, k, v = np.split(linear(ln1, h + "attn.c_attn"), 3, axis=-1)
        for part, x in zip("qkv", (q, k, v)):
            close(c[b + f"attn.hook_{part}"], x.reshape(T, 4, 16), f"{b}hook_{part}")
        z = np.einsum("hqk,khd->qhd", c[b + "attn.hook_pattern"], c[b + "attn.hook_v"]).reshape(T, 64)
        attn_out = linear(z, h + "attn.c_proj")
        close(c[b + "hook_attn_out"], attn_out, f"{b}hook_attn_out")
        close(c[b + "hook_resid_mid"], c[b + "hook_resid_pre"] + attn_out, f"{b}hook_resid_mid")
        ln2 = layernorm(c[b + "hook_resid_mid"], h + "ln_2")
        close(c[b + "ln2.hook_normalized"], ln2, f"{b}ln2")
        x = linear(ln2, h + "mlp.c_fc")
        post = 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3)))  # GPT-2's gelu_new
        close(c[b + "mlp.hook_post"], post, f"{b}mlp.hook_post")
        close(c[b + "hook_mlp_out"], linear(c[b + "mlp.hook_post"], h + "mlp.c_proj"), f"{b}hook_mlp_out")
