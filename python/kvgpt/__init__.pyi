"""Type stubs of the `kvgpt` package: `Model` has the native model's methods (`_kvgpt.pyi`) and
llama-cpp-python's OpenAI-shaped answers."""

from typing import Any, Dict, Iterator, List, Literal, Optional, Sequence, TypedDict, Union, overload

from typing_extensions import Unpack

from . import _kvgpt
from ._kvgpt import AttentionView as AttentionView
from ._kvgpt import KvCache as KvCache
from ._kvgpt import Stream as Stream
from ._kvgpt import chat_template as chat_template

def load(
    model: str,
    dtype: Optional[str] = None,
    threads: Optional[int] = None,
    offline: bool = False,
    kv_block_size: Optional[int] = None,
    kv_dtype: Optional[str] = None,
) -> Model: ...

class CompletionKw(TypedDict, total=False):
    max_tokens: int  # 16 (create_chat_completion: 64)
    temperature: Optional[float]
    top_p: Optional[float]
    top_k: Optional[int]
    seed: int
    stop: Optional[Union[str, List[str]]]
    repeat_penalty: float
    presence_penalty: float
    frequency_penalty: float
    ignore_eos: bool
    # The server's other fields, checked as `kvgpt serve` checks them.
    logprobs: Union[int, bool]  # completions: alternatives per token; chat: true, with top_logprobs
    top_logprobs: int
    echo: bool
    n: int
    stream_options: Dict[str, bool]

# At run time `Model` wraps the native model and hands it every method it does not define itself;
# for a type checker it has the native model's methods.
class Model(_kvgpt.Model):
    def __init__(self, native: _kvgpt.Model) -> None: ...
    @overload
    def create_completion(
        self, prompt: Union[str, Sequence[int]], *, stream: Literal[True], **kw: Unpack[CompletionKw]
    ) -> Iterator[Dict[str, Any]]: ...
    @overload
    def create_completion(
        self, prompt: Union[str, Sequence[int]], *, stream: Literal[False] = ..., **kw: Unpack[CompletionKw]
    ) -> Dict[str, Any]: ...
    @overload
    def create_chat_completion(
        self, messages: List[Dict[str, str]], *, stream: Literal[True], **kw: Unpack[CompletionKw]
    ) -> Iterator[Dict[str, Any]]: ...
    @overload
    def create_chat_completion(
        self, messages: List[Dict[str, str]], *, stream: Literal[False] = ..., **kw: Unpack[CompletionKw]
    ) -> Dict[str, Any]: ...

@overload
def create_completion(
    model: Model, prompt: Union[str, Sequence[int]], *, stream: Literal[True], **kw: Unpack[CompletionKw]
) -> Iterator[Dict[str, Any]]: ...
@overload
def create_completion(
    model: Model, prompt: Union[str, Sequence[int]], *, stream: Literal[False] = ..., **kw: Unpack[CompletionKw]
) -> Dict[str, Any]: ...
@overload
def create_chat_completion(
    model: Model, messages: List[Dict[str, str]], *, stream: Literal[True], **kw: Unpack[CompletionKw]
) -> Iterator[Dict[str, Any]]: ...
@overload
def create_chat_completion(
    model: Model, messages: List[Dict[str, str]], *, stream: Literal[False] = ..., **kw: Unpack[CompletionKw]
) -> Dict[str, Any]: ...
