#!/usr/bin/env python3
"""Reference losses for `kvgpt score` from Hugging Face transformers, on the test fixture.

For each case: the text's ids (from the fixture's reference prompts), a window and a stride, and
the loss HF's perplexity guide computes: windows of `window` tokens starting every `stride`, each
scoring (with `labels=`, earlier tokens masked to -100) only the tokens no earlier window scored;
the mean over all scored tokens of the per-window `loss` weighted by its scored-token count.

    python3 scripts/make_score_reference.py tests/fixtures/tiny-gpt2 > tests/fixtures/score_reference.json

Needs torch and transformers (e.g. the venv of scripts/compare_peers.py).
"""
import json
import sys

import torch
from transformers import GPT2LMHeadModel


def windowed_loss(model, ids, window, stride):
    nll, count, prev_end = 0.0, 0, 0
    for begin in range(0, len(ids), stride):
        end = min(begin + window, len(ids))
        trg = end - prev_end
        inp = torch.tensor([ids[begin:end]])
        labels = inp.clone()
        labels[:, :-trg] = -100
        with torch.no_grad():
            loss = model(inp, labels=labels).loss.item()
        n = int((labels[:, 1:] != -100).sum())
        nll += loss * n
        count += n
        prev_end = end
        if end == len(ids):
            break
    return nll / count, count


def main():
    folder = sys.argv[1]
    model = GPT2LMHeadModel.from_pretrained(folder, attn_implementation="eager").eval()
    ref = json.load(open(f"{folder}/reference.json"))
    prompts = {p["key"]: p["input_ids"] for p in ref["prompts"]}
    cases = []
    for key, window, stride in [("p2", 128, 64), ("p2", 32, 16), ("p2", 24, 24), ("p2", 40, 7), ("p1", 5, 2)]:
        loss, count = windowed_loss(model, prompts[key], window, stride)
        cases.append({"prompt": key, "ids": prompts[key], "window": window, "stride": stride,
                      "loss": loss, "tokens_scored": count})
    import transformers
    print(json.dumps({"generator": {"transformers": transformers.__version__, "torch": torch.__version__},
                      "cases": cases}, indent=1))


if __name__ == "__main__":
    main()
