"""kvgpt in a notebook, as a script (python/tests/test_api.py runs it): tokens, a forward pass
with its hooks, the KV cache one step at a time, the loss, and OpenAI-shaped completions.

    python examples/notebook.py [MODEL]      # default: the bundled tests/fixtures/tiny-gpt2
"""

import sys
from pathlib import Path

import numpy as np

import kvgpt

here = Path(__file__).resolve().parent
model = kvgpt.load(sys.argv[1] if len(sys.argv) > 1 else str(here.parent / "tests" / "fixtures" / "tiny-gpt2"))
print(model, model.config)

# 1. Text becomes ids.
text = "The cat sat on the mat because"
ids = model.tokenize(text)
print("ids:", ids, [model.detokenize([i]) for i in ids])

# 2. One forward pass, with what it computes on the way (TransformerLens's names).
logits, cache = model.run_with_cache(text, names=["hook_embed", "blocks.0.attn.hook_pattern", "ln_final.hook_normalized"])
print("logits", logits.shape, "next token:", repr(model.detokenize([int(logits[0, -1].argmax())])))
pattern = cache["blocks.0.attn.hook_pattern"][0]  # [head, query, key]
print("layer 0, head 0: what the last token attends to:", np.round(pattern[0, -1], 3))

# 3. The KV cache: prefill once, then each step computes one token's Q, K, V.
kv = model.kv_cache(text)
for _ in range(5):
    nxt = int(kv.logits.argmax())
    kv.step(nxt)
print("cache:", kv, "K of layer 0:", kv.k(0).shape, "->", repr(model.detokenize(kv.ids[len(ids):])))
# The same five tokens from generate (greedy), bit for bit.
assert model.generate(text, max_tokens=5, ignore_eos=True)["ids"] == kv.ids[len(ids):]

# 4. How surprised the model is by each token.
s = model.score(text)
print(f"loss {s['loss']:.3f} nats/token, perplexity {s['perplexity']:.1f}")

# 5. OpenAI-shaped answers, as llama-cpp-python gives them.
out = model.create_completion("The cat sat on", max_tokens=8, temperature=0.8, seed=1)
print(out["choices"][0]["text"], out["usage"])
chat = model.create_chat_completion([{"role": "user", "content": "Hello!"}], max_tokens=8)
print(chat["choices"][0]["message"])

# 6. The attention viewer (shown inline by Jupyter; `view.save(path)` writes the page to a file).
view = model.attention_view("The cat sat on the mat")
print("viewer:", len(view.html), "bytes of HTML")
