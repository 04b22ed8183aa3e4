"""Type stubs of kvgpt's native module (python/src/*.rs)."""

from typing import Dict, Iterator, List, Optional, Sequence, Tuple, TypedDict, Union

import numpy as np
import numpy.typing as npt
from typing_extensions import Unpack

Input = Union[str, Sequence[int]]

class Generated(TypedDict):
    text: str
    ids: List[int]
    prompt_ids: List[int]
    finish_reason: str  # "eos" | "length" | "stop"

class GenerateKw(TypedDict, total=False):
    max_tokens: int  # 16
    temperature: Optional[float]  # greedy unless a temperature, top_k or top_p is given
    top_k: Optional[int]
    top_p: Optional[float]
    seed: int  # 0
    stop: Optional[List[str]]
    repetition_penalty: float  # 1.0
    presence_penalty: float  # 0.0
    frequency_penalty: float  # 0.0
    ignore_eos: bool  # False

class Token(TypedDict):
    id: Optional[int]  # None: text held back to the end, after the last token
    text: str

class Scored(TypedDict):
    loss: float
    perplexity: float
    ids: List[int]
    surprisal: List[float]

def load(
    model: str,
    dtype: Optional[str] = None,
    threads: Optional[int] = None,
    offline: bool = False,
    kv_block_size: Optional[int] = None,
    kv_dtype: Optional[str] = None,
) -> Model: ...
def chat_template(messages: List[Dict[str, str]]) -> str: ...
# Where a chat answer ends: the next turn's label, "\nUser:".
CHAT_STOP: str

class Model:
    @property
    def config(self) -> Dict[str, Union[int, str]]: ...
    def tokenize(self, text: str) -> List[int]: ...
    def detokenize(self, ids: List[int]) -> str: ...
    def generate(self, prompt: Input, **kw: Unpack[GenerateKw]) -> Generated: ...
    def stream(self, prompt: Input, **kw: Unpack[GenerateKw]) -> Stream: ...
    def hook_names(self) -> List[str]: ...
    def run_with_cache(
        self, input: Input, names: Optional[List[str]] = None
    ) -> Tuple[npt.NDArray[np.float32], Dict[str, npt.NDArray[np.float32]]]: ...
    def kv_cache(self, input: Input) -> KvCache: ...
    def score(self, text: Input) -> Scored: ...
    def attention_view(self, input: Input) -> AttentionView: ...
    # The JSON text of a `/v1/completions` (or with `chat`, `/v1/chat/completions`) body; the
    # response's JSON text, or with "stream": true an iterator of its chunks' JSON texts.
    def complete(self, body: str, chat: bool = False) -> Union[str, Chunks]: ...

class Stream(Iterator[Token]):
    def __next__(self) -> Token: ...
    @property
    def result(self) -> Optional[Generated]: ...

class Chunks(Iterator[str]):
    def __next__(self) -> str: ...

class KvCache:
    @property
    def length(self) -> int: ...
    def __len__(self) -> int: ...
    @property
    def ids(self) -> List[int]: ...
    @property
    def logits(self) -> npt.NDArray[np.float32]: ...
    def k(self, layer: int) -> npt.NDArray[np.float32]: ...
    def v(self, layer: int) -> npt.NDArray[np.float32]: ...
    def step(self, token: Union[int, str]) -> npt.NDArray[np.float32]: ...

class AttentionView:
    @property
    def html(self) -> str: ...
    def _repr_html_(self) -> str: ...
    def save(self, path: str) -> None: ...
