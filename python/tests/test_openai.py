"""`create_completion` and `create_chat_completion` against `kvgpt serve`: the same requests sent
to the server over HTTP and made from Python give the same answers, field by field (the two share
the core's OpenAI code: a field that drifted on one side fails here), and the greedy text is
Hugging Face's."""

import json
import re
import subprocess
import threading
import time
import urllib.error
import urllib.request

import pytest

import kvgpt

from conftest import FIXTURE

# Differ by design: each side numbers its responses and stamps its own clock and times.
UNEQUAL = {"id", "created", "timings"}


@pytest.fixture
def server(kvgpt_binary):
    """A server of its own for each test, so its prompt cache starts empty, as a new model's does."""
    p = subprocess.Popen([str(kvgpt_binary), "serve", "--model", str(FIXTURE), "--port", "0", "-t", "2"],
                         stderr=subprocess.PIPE, text=True)
    port = None
    for line in p.stderr:
        m = re.search(r"listening on http://127\.0\.0\.1:(\d+)", line)
        port = port or (m and m[1])
        if "ready on" in line:
            break
    assert port, "the server did not say where it listens"
    threading.Thread(target=p.stderr.read, daemon=True).start()  # keep its pipe drained
    yield f"http://127.0.0.1:{port}"
    p.terminate()
    p.wait(timeout=30)


def post(url, path, body):
    req = urllib.request.Request(url + path, json.dumps(body).encode(), {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            raw = r.read().decode()
            return r.status, raw
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def events(raw):
    """A server-sent event stream's data lines, [DONE] left out."""
    data = [line[len("data: "):] for line in raw.splitlines() if line.startswith("data: ")]
    assert data[-1] == "[DONE]"
    return [json.loads(d) for d in data[:-1]]


def same(a, b, where="answer"):
    """Equal in every field but those that differ by design."""
    if isinstance(a, dict) and isinstance(b, dict):
        assert sorted(a) == sorted(b), f"{where}: fields {sorted(a)} against {sorted(b)}"
        for k in a:
            if k not in UNEQUAL:
                same(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, list) and isinstance(b, list):
        assert len(a) == len(b), f"{where}: {len(a)} items against {len(b)}"
        for i, (x, y) in enumerate(zip(a, b)):
            same(x, y, f"{where}[{i}]")
    else:
        assert a == b, f"{where}: {a!r} against {b!r}"


def test_completions_are_the_servers_field_by_field(server, reference):
    model = kvgpt.load(str(FIXTURE), threads=2)  # its own engine: the two prompt caches start alike
    doc, _ = reference
    text = doc["prompts"][0]["text"]
    asks = [
        {"prompt": text, "max_tokens": 10, "temperature": 0, "seed": 0, "logprobs": 2},
        {"prompt": [text, doc["prompts"][1]["text"]], "max_tokens": 6, "temperature": 0.8, "seed": 5, "n": 2,
         "stop": ["e"]},
        {"prompt": text, "max_tokens": 5, "temperature": 0, "seed": 0, "echo": True, "ignore_eos": True},
    ]
    # One default for both: without a temperature, the server's (OpenAI's 1), the same seed.
    asks.append({"prompt": text, "max_tokens": 8, "seed": 3})
    for body in asks:
        status, raw = post(server, "/v1/completions", body)
        assert status == 200, raw
        over_http = json.loads(raw)
        kw = {k: v for k, v in body.items() if k != "prompt"}
        same(over_http, model.create_completion(body["prompt"], **kw))
    # Greedy is Hugging Face's greedy continuation.
    first = model.create_completion(text, max_tokens=10, temperature=0)
    assert first["choices"][0]["text"] == model.detokenize(doc["prompts"][0]["greedy"]["ids"][:10])


def test_chat_and_streams_are_the_servers_field_by_field(server):
    model = kvgpt.load(str(FIXTURE), threads=2)
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    body = {"messages": msgs, "max_tokens": 6, "temperature": 0.7, "seed": 3, "logprobs": True, "top_logprobs": 2}
    status, raw = post(server, "/v1/chat/completions", body)
    assert status == 200, raw
    kw = {k: v for k, v in body.items() if k != "messages"}
    same(json.loads(raw), model.create_chat_completion(msgs, **kw))
    # Streams: the same chunks, in the same order, the usage last.
    body = {"prompt": "The cat sat on", "max_tokens": 8, "temperature": 0, "seed": 0, "logprobs": 1,
            "stream": True, "stream_options": {"include_usage": True}}
    status, raw = post(server, "/v1/completions", body)
    assert status == 200, raw
    chunks = list(model.create_completion(body["prompt"], **{k: v for k, v in body.items() if k != "prompt"}))
    same(events(raw), chunks, "chunks")
    assert chunks[-1]["usage"]["completion_tokens"] == 8
    chat = {"max_tokens": 8, "temperature": 0, "seed": 0, "stream": True, "stream_options": {"include_usage": True}}
    status, raw = post(server, "/v1/chat/completions", {"messages": msgs, **chat})
    assert status == 200, raw
    same(events(raw), list(model.create_chat_completion(msgs, **chat)), "chat chunks")


def test_bad_requests_get_the_servers_message(server, model):
    for body, kw in [
        ({"prompt": "x", "max_token": 4}, {"max_token": 4}),
        ({"prompt": "x", "temperature": -1}, {"temperature": -1}),
        ({"prompt": "x", "n": 99}, {"n": 99}),
        ({"prompt": "hello " * 200, "max_tokens": 4}, {"max_tokens": 4}),
    ]:
        status, raw = post(server, "/v1/completions", {"temperature": 0, "seed": 0, **body})
        assert status == 400, raw
        with pytest.raises(ValueError) as e:
            model.create_completion(body["prompt"], **kw)
        assert str(e.value) == json.loads(raw)["error"]["message"]


def test_completions_from_threads_are_batched_and_each_is_greedy(model, reference):
    doc, _ = reference
    p = doc["prompts"][0]
    answers = [None] * 6

    def ask(i):
        answers[i] = model.create_completion(p["text"], max_tokens=10, temperature=0)["choices"][0]["text"]

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(6)]
    start = time.time()
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert time.time() - start < 120
    assert answers == [model.detokenize(p["greedy"]["ids"][:10])] * 6
