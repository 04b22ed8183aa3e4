"""kvgpt in Python: the engine behind the `kvgpt` command line, with numpy views of every step.

    import kvgpt
    model = kvgpt.load("tests/fixtures/tiny-gpt2")          # a folder, a GGUF file or a Hub id
    model.generate("The cat sat on", max_tokens=8)           # the same bits as `kvgpt generate`
    logits, cache = model.run_with_cache("The cat sat on")   # TransformerLens's hook names
    kv = model.kv_cache("The cat sat on"); kv.step(" the")   # the KV cache, one step at a time

Everything runs with the GIL released, in the model's own threads.
"""

from __future__ import annotations

import time
import uuid
from typing import Any, Dict, Iterator, List, Optional, Sequence, Union

from . import _kvgpt
from ._kvgpt import AttentionView, KvCache, Stream, chat_template

__all__ = ["load", "Model", "KvCache", "Stream", "AttentionView", "chat_template", "create_completion",
           "create_chat_completion"]


def load(model: str, dtype: Optional[str] = None, threads: Optional[int] = None, offline: bool = False) -> "Model":
    """Loads a model folder, a GGUF file or a Hugging Face Hub id, as `kvgpt --model` finds them.
    `dtype` converts the weight matrices (default: as the file stores them, f32 from
    safetensors); `threads` sizes the model's thread pool (default: one per core)."""
    return Model(_kvgpt.load(model, dtype=dtype, threads=threads, offline=offline))


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


def _usage(prompt: int, completion: int) -> Dict[str, int]:
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def _finish(reason: str) -> str:
    # OpenAI's words: "stop" for an end of text or a stop sequence, "length" for max_tokens.
    return "length" if reason == "length" else "stop"


def _generate_kw(stop: Optional[Union[str, List[str]]], repeat_penalty: float = 1.0, **kw: Any) -> Dict[str, Any]:
    """llama-cpp-python's keywords as `Model.generate`'s (`repeat_penalty` is HF's repetition penalty)."""
    return {**kw, "stop": [stop] if isinstance(stop, str) else stop, "repetition_penalty": repeat_penalty}


def create_completion(model: Model, prompt: Union[str, Sequence[int]], stop: Optional[Union[str, List[str]]] = None,
                      stream: bool = False, **kw: Any) -> Union[Dict[str, Any], Iterator[Dict[str, Any]]]:
    """An OpenAI-shaped completion, as llama-cpp-python's `Llama.create_completion` returns it
    (`stream=True`: an iterator of chunks). Keywords: `max_tokens` (16), `temperature`, `top_p`,
    `top_k`, `seed`, `repeat_penalty`, `presence_penalty`, `frequency_penalty`."""
    args = _generate_kw(stop, **kw)
    head = {"id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion", "created": int(time.time()),
            "model": model.config["name"]}
    if stream:
        return _completion_chunks(model.stream(prompt, **args), head)
    r = model.generate(prompt, **args)
    choice = {"text": r["text"], "index": 0, "logprobs": None, "finish_reason": _finish(r["finish_reason"])}
    return {**head, "choices": [choice], "usage": _usage(len(r["prompt_ids"]), len(r["ids"]))}


def _completion_chunks(s: Stream, head: Dict[str, Any]) -> Iterator[Dict[str, Any]]:
    for tok in s:
        if tok["text"]:
            yield {**head, "choices": [{"text": tok["text"], "index": 0, "logprobs": None, "finish_reason": None}]}
    r = s.result
    yield {**head, "choices": [{"text": "", "index": 0, "logprobs": None, "finish_reason": _finish(r["finish_reason"])}]}


def create_chat_completion(model: Model, messages: List[Dict[str, str]], stop: Optional[Union[str, List[str]]] = None,
                           stream: bool = False, max_tokens: int = 64,
                           **kw: Any) -> Union[Dict[str, Any], Iterator[Dict[str, Any]]]:
    """An OpenAI-shaped chat completion over kvgpt's plain chat template (the server's: system
    messages as paragraphs, then `User: …` / `Assistant: …` lines); the answer ends at the next
    `User:` line, or a stop of yours. The keywords are `create_completion`'s."""
    stops = [_kvgpt.CHAT_STOP] + ([stop] if isinstance(stop, str) else list(stop or []))
    args = _generate_kw(stops, max_tokens=max_tokens, **kw)
    prompt = chat_template(messages)
    head = {"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion", "created": int(time.time()),
            "model": model.config["name"]}
    if stream:
        return _chat_chunks(model.stream(prompt, **args), head)
    r = model.generate(prompt, **args)
    message = {"role": "assistant", "content": r["text"].lstrip()}
    choice = {"index": 0, "message": message, "logprobs": None, "finish_reason": _finish(r["finish_reason"])}
    return {**head, "choices": [choice], "usage": _usage(len(r["prompt_ids"]), len(r["ids"]))}


def _chat_chunks(s: Stream, head: Dict[str, Any]) -> Iterator[Dict[str, Any]]:
    head = {**head, "object": "chat.completion.chunk"}
    yield {**head, "choices": [{"index": 0, "delta": {"role": "assistant"}, "finish_reason": None}]}
    first = True
    for tok in s:
        text = tok["text"].lstrip() if first else tok["text"]
        if text:
            first = False
            yield {**head, "choices": [{"index": 0, "delta": {"content": text}, "finish_reason": None}]}
    r = s.result
    yield {**head, "choices": [{"index": 0, "delta": {}, "finish_reason": _finish(r["finish_reason"])}]}
