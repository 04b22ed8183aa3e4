"""kvgpt in Python: the engine behind the `kvgpt` command line, with numpy views of every step.

    import kvgpt
    model = kvgpt.load("tests/fixtures/tiny-gpt2")          # a folder, a GGUF file or a Hub id
    model.generate("The cat sat on", max_tokens=8)           # the same bits as `kvgpt generate`
    logits, cache = model.run_with_cache("The cat sat on")   # TransformerLens's hook names
    kv = model.kv_cache("The cat sat on"); kv.step(" the")   # the KV cache, one step at a time

Everything runs with the GIL released, in the model's own threads.
"""

from __future__ import annotations

import json
from typing import Any, Dict, Iterator, List, Optional, Sequence, Union

from . import _kvgpt
from ._kvgpt import AttentionView, KvCache, Stream, chat_template

__all__ = ["load", "Model", "KvCache", "Stream", "AttentionView", "chat_template", "create_completion",
           "create_chat_completion"]


def load(
    model: str,
    dtype: Optional[str] = None,
    threads: Optional[int] = None,
    offline: bool = False,
    kv_block_size: Optional[int] = None,
    kv_dtype: Optional[str] = None,
) -> "Model":
    """Loads a model folder, a GGUF file or a Hugging Face Hub id, as `kvgpt --model` finds them.
    `dtype` converts the weight matrices (default: as the file stores them, f32 from
    safetensors); `threads` sizes the model's thread pool (default: one per core);
    `kv_block_size` is `--kv-block-size`: positions per K/V block (default 16; every size gives
    the same bits); `kv_dtype` is `--kv-dtype`: f32 (default), f16, bf16 or q8_0."""
    native = _kvgpt.load(
        model, dtype=dtype, threads=threads, offline=offline, kv_block_size=kv_block_size, kv_dtype=kv_dtype
    )
    return Model(native)


class Model:
    """A loaded model: the native `kvgpt._kvgpt.Model`'s methods (`tokenize`, `detokenize`,
    `generate`, `stream`, `run_with_cache`, `hook_names`, `kv_cache`, `score`,
    `attention_view`, `config`), plus llama-cpp-python's OpenAI-shaped `create_completion` and
    `create_chat_completion`."""

    def __init__(self, native: "_kvgpt.Model") -> None:
        self._native = native

    def __getattr__(self, name: str) -> Any:
        return getattr(self._native, name)

    def __repr__(self) -> str:
        return repr(self._native)

    def create_completion(self, prompt: Union[str, Sequence[int]], **kw: Any) -> Any:
        """See `kvgpt.create_completion`."""
        return create_completion(self, prompt, **kw)

    def create_chat_completion(self, messages: List[Dict[str, str]], **kw: Any) -> Any:
        """See `kvgpt.create_chat_completion`."""
        return create_chat_completion(self, messages, **kw)


def _body(kw: Dict[str, Any], stop: Optional[Union[str, List[str]]], stream: bool) -> Dict[str, Any]:
    """llama-cpp-python's keywords as an OpenAI request body, with the server's defaults (OpenAI's:
    temperature 1 unless given; `temperature=0` is greedy) and one of Python's own: seed 0, so a
    call answers the same every time (`repeat_penalty` is HF's repetition penalty). Any other
    field the server takes may be given too (`logprobs`, `echo`, `n`, `ignore_eos`,
    `stream_options`, ...)."""
    body = {k: v for k, v in kw.items() if v is not None}
    if "repeat_penalty" in body:
        body["repetition_penalty"] = body.pop("repeat_penalty")
    body.setdefault("seed", 0)
    if stop is not None:
        body["stop"] = stop
    body["stream"] = stream
    return body


def _prompt(prompt: Any) -> Any:
    """A prompt as a request body takes it: a text, texts, token ids (numpy's or torch's too) or
    lists of them."""
    if isinstance(prompt, (bytes, bytearray)):
        raise TypeError("expected a str or a list of token ids, got bytes: decode it to a str first")
    if isinstance(prompt, str):
        return prompt
    items = list(prompt)
    if items and isinstance(items[0], str):
        return items
    if items and hasattr(items[0], "__len__"):
        return [[int(i) for i in p] for p in items]
    return [int(i) for i in items]


def _answer(model: Model, body: Dict[str, Any], chat: bool) -> Union[Dict[str, Any], Iterator[Dict[str, Any]]]:
    out = model._native.complete(json.dumps(body), chat=chat)
    if isinstance(out, str):
        return json.loads(out)
    return (json.loads(chunk) for chunk in out)


def create_completion(model: Model, prompt: Union[str, Sequence[int]], stop: Optional[Union[str, List[str]]] = None,
                      stream: bool = False, **kw: Any) -> Union[Dict[str, Any], Iterator[Dict[str, Any]]]:
    """An OpenAI-shaped completion, as llama-cpp-python's `Llama.create_completion` returns it
    (`stream=True`: an iterator of chunks), made by the code `kvgpt serve` answers with: the same
    checks, fields and usage, its sequences batched in the model's engine with every other
    completion running meanwhile. Keywords: `max_tokens` (16), `temperature`, `top_p`, `top_k`,
    `seed`, `repeat_penalty`, `presence_penalty`, `frequency_penalty`, and the server's other
    fields (`logprobs`, `echo`, `n`, `ignore_eos`, `stream_options`, ...)."""
    return _answer(model, {"prompt": _prompt(prompt), **_body(kw, stop, stream)}, chat=False)


def create_chat_completion(model: Model, messages: List[Dict[str, str]], stop: Optional[Union[str, List[str]]] = None,
                           stream: bool = False, max_tokens: int = 64,
                           **kw: Any) -> Union[Dict[str, Any], Iterator[Dict[str, Any]]]:
    """An OpenAI-shaped chat completion over kvgpt's plain chat template (the server's: system
    messages as paragraphs, then `User: …` / `Assistant: …` lines); the answer ends at the next
    `User:` line, or a stop of yours. The keywords are `create_completion`'s (`logprobs: True`
    with `top_logprobs` for log-probabilities, as the chat endpoint takes them)."""
    body = {"messages": messages, **_body({"max_tokens": max_tokens, **kw}, stop, stream)}
    return _answer(model, body, chat=True)
