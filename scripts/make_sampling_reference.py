#!/usr/bin/env python3
"""Greedy continuations under HF's repetition penalty, from Hugging Face transformers, on the
test fixture: `generate(do_sample=False, repetition_penalty=θ)` for a few prompts and θ; and a
two-turn chat in `kvgpt chat`'s template (each turn's text tokenized on its own and appended).

    python3 scripts/make_sampling_reference.py tests/fixtures/tiny-gpt2 > tests/fixtures/sampling_reference.json

Needs torch and transformers (e.g. the venv of scripts/compare_peers.py).
"""
import json
import sys

import torch
import transformers
from transformers import GPT2LMHeadModel


def main():
    folder = sys.argv[1]
    model = GPT2LMHeadModel.from_pretrained(folder, attn_implementation="eager").eval()
    ref = json.load(open(f"{folder}/reference.json"))
    prompts = {p["key"]: p["input_ids"] for p in ref["prompts"]}
    cases = []
    for key in ["p0", "p1", "p3"]:
        for theta in [1.3, 0.7, 2.0]:
            ids = torch.tensor([prompts[key]])
            with torch.no_grad():
                out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=24,
                                     repetition_penalty=theta, pad_token_id=50256, eos_token_id=None)
            cases.append({"prompt": key, "ids": prompts[key], "repetition_penalty": theta,
                          "generated_ids": out[0, len(prompts[key]):].tolist()})
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(folder)
    chat, ids = [], []
    for k, line in enumerate(["Hello there", "How are you?"]):
        text = ("\n" if k else "") + f"User: {line}\nAssistant:"
        ids = ids + tok(text)["input_ids"]
        t = torch.tensor([ids])
        with torch.no_grad():
            out = model.generate(t, attention_mask=torch.ones_like(t), do_sample=False, max_new_tokens=8,
                                 pad_token_id=50256, eos_token_id=None)
        answer = out[0, len(ids):].tolist()
        chat.append({"line": line, "turn_ids": tok(text)["input_ids"], "answer_ids": answer,
                     "answer_text": tok.decode(answer), "ids_before_answer": len(ids)})
        ids = ids + answer
    print(json.dumps({"generator": {"transformers": transformers.__version__, "torch": torch.__version__},
                      "cases": cases, "chat": chat}, indent=1))


if __name__ == "__main__":
    main()
