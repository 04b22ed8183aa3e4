#!/usr/bin/env python3
"""Drive a running `kvgpt serve` with the official `openai` Python package and check what it returns.

    python3 scripts/openai_client.py --base-url http://127.0.0.1:PORT/v1 --api-key KEY \\
        --kvgpt target/debug/kvgpt [--model tests/fixtures/tiny-gpt2]

scripts/openai_client.sh makes the venv, starts the server and runs this. Where there is an
independent party the server's answers are checked against it: `kvgpt generate --json` run as a
subprocess on the same model (same prompt, same sampling flags, same seed) gives the expected text,
token ids and log-probabilities; the chat prompt is rendered here by the rule the server documents
and fed to the same CLI. The rest (streaming against non-streaming, the prompt cache, the error
classes the client raises) is checked for consistency.

Prints one line per check, then `N passed, M failed`; exits 1 when anything failed.
"""

import argparse
import json
import os
import subprocess
import sys
import time

import openai

import openai_cache_checks
from openai_checks import Checks, expect, expect_eq, extra

MAX_CHUNKS = 2000  # bound on the chunks read from any one stream
LOGPROB_TOL = 1e-9
PROMPT = "The quick brown fox"
CHAT_MESSAGES = [
    {"role": "system", "content": "You are a terse assistant."},
    {"role": "user", "content": "Name three colours."},
    {"role": "assistant", "content": "Red, green, blue."},
    {"role": "user", "content": "And three animals?"},
]
CHAT_MESSAGES_2 = [
    {"role": "developer", "content": "Answer briefly."},
    {"role": "user", "content": "hi"},
]


class Cli:
    """`kvgpt generate ... --json`, the independent reference."""

    def __init__(self, binary, model):
        self.binary = binary
        self.model = model
        self.memo = {}

    def generate(self, prompt, n, *, temperature=None, top_p=None, top_k=None, seed=None,
                 logprobs=None, ignore_eos=True, presence_penalty=None, frequency_penalty=None,
                 repetition_penalty=None):
        args = [self.binary, "generate", prompt, "--model", self.model, "-n", str(n), "--json"]
        if ignore_eos:
            args.append("--ignore-eos")
        for flag, v in (("--temperature", temperature), ("--top-p", top_p), ("--top-k", top_k),
                        ("--seed", seed), ("--logprobs", logprobs), ("--presence-penalty", presence_penalty),
                        ("--frequency-penalty", frequency_penalty), ("--repetition-penalty", repetition_penalty)):
            if v is not None:
                args += [flag, str(v)]
        key = tuple(args)
        if key not in self.memo:
            p = subprocess.run(args, capture_output=True, text=True, timeout=120, check=False)
            if p.returncode != 0:
                raise AssertionError(f"`{' '.join(args)}` exited {p.returncode}: {p.stderr.strip()}")
            self.memo[key] = json.loads(p.stdout)
        return self.memo[key]


def collect_stream(stream):
    chunks = []
    for chunk in stream:
        chunks.append(chunk)
        if len(chunks) > MAX_CHUNKS:
            stream.close()
            raise AssertionError(f"stream did not end within {MAX_CHUNKS} chunks")
    return chunks


def compare_logprobs(got_tokens, got_lps, got_tops, cli_lps, what):
    """Server's per-token logprobs against the CLI's. Returns the largest difference."""
    expect_eq(len(got_lps), len(cli_lps), f"{what}: number of logprobs")
    worst = 0.0
    for i, (tok, lp, top, ref) in enumerate(zip(got_tokens, got_lps, got_tops, cli_lps)):
        expect_eq(tok, ref["token"], f"{what}: token {i}")
        d = abs(lp - ref["logprob"])
        worst = max(worst, d)
        expect(d <= LOGPROB_TOL, f"{what}: logprob {i}: got {lp!r}, CLI {ref['logprob']!r}")
        want_top = {}
        for t in ref["top"]:
            want_top.setdefault(t["token"], t["logprob"])
        expect_eq(sorted(top), sorted(want_top), f"{what}: top tokens at {i}")
        for t, v in top.items():
            d = abs(v - want_top[t])
            worst = max(worst, d)
            expect(d <= LOGPROB_TOL, f"{what}: top logprob of {t!r} at {i}: got {v!r}, CLI {want_top[t]!r}")
    return worst


def fmt_diff(worst):
    return "exact" if worst == 0.0 else f"max |diff| {worst:.3g}"


def render_chat(messages):
    """The server's documented chat template."""
    out = ""
    for m in messages:
        if m["role"] in ("system", "developer"):
            out += m["content"] + "\n\n"
        elif m["role"] == "user":
            out += "User: " + m["content"] + "\n"
        elif m["role"] == "assistant":
            out += "Assistant: " + m["content"] + "\n"
    return out + "Assistant:"


def chat_checks(checks, client, cli, model, label, messages, state):
    chat_prompt = render_chat(messages)
    args = dict(model=model, messages=messages, max_completion_tokens=12, temperature=0,
                extra_body={"ignore_eos": True})
    key = f"chat_text:{label}"

    def expected(ref):
        text = ref["text"]
        cut = text.find("\nUser:")
        return (text if cut < 0 else text[:cut]).lstrip(), cut >= 0

    def plain():
        r = client.chat.completions.create(**args)
        ref = cli.generate(chat_prompt, 12)
        want, stopped = expected(ref)
        expect_eq(r.object, "chat.completion", "object")
        expect_eq(len(r.choices), 1, "number of choices")
        m = r.choices[0].message
        expect_eq(m.role, "assistant", "message.role")
        expect_eq(m.content, want, "content vs `kvgpt generate` on the rendered prompt")
        expect_eq(r.choices[0].finish_reason, "stop" if stopped else "length", "finish_reason")
        expect(r.usage is not None, "no usage")
        expect_eq(r.usage.prompt_tokens, len(ref["prompt_ids"]), "usage.prompt_tokens vs the rendered prompt")
        if not stopped:
            expect_eq(r.usage.completion_tokens, 12, "usage.completion_tokens")
        expect_eq(r.usage.total_tokens, r.usage.prompt_tokens + r.usage.completion_tokens, "usage.total_tokens")
        state[key] = m.content
        return f"{m.content!r} from raw {ref['text'][:12]!r}..."

    checks.run(f"chat [{label}] non-streaming == kvgpt generate on the rendered prompt", plain)

    def stream():
        chunks = collect_stream(client.chat.completions.create(**args, stream=True,
                                                               stream_options={"include_usage": True}))
        expect(chunks and chunks[0].choices, "no chunks")
        expect_eq(chunks[0].choices[0].delta.role, "assistant", "role of the first delta")
        expect(all(c.choices[0].delta.role is None for c in chunks[1:] if c.choices), "role on a later delta")
        content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
        expect(all(c.object == "chat.completion.chunk" for c in chunks), "chunk object")
        want = state.get(key)
        expect(want is not None, "the non-streaming chat check failed; nothing to compare with")
        expect_eq(content, want, "streamed content vs non-streaming content")
        expect(len(finish) == 1 and finish[0] in ("stop", "length"), f"finish_reason over the chunks: {finish}")
        last = chunks[-1]
        expect(last.usage is not None and last.choices == [], f"last chunk is not the usage chunk: {last}")
        if finish == ["length"]:
            expect_eq(last.usage.completion_tokens, 12, "usage.completion_tokens")
        return f"{len(chunks)} chunks, finish {finish[0]}"

    checks.run(f"chat [{label}] streaming == chat non-streaming", stream)

    def default_max():
        # No max tokens and no ignore_eos: the server runs to "\nUser:", EOS or the end of the context.
        r = client.chat.completions.create(model=model, messages=messages, temperature=0)
        n_prompt = len(cli.generate(chat_prompt, 1)["prompt_ids"])
        ref = cli.generate(chat_prompt, 128 - n_prompt, ignore_eos=False)
        want, stopped = expected(ref)
        expect_eq(r.choices[0].message.content, want, "content vs CLI up to \\nUser:")
        want_finish = "stop" if stopped or ref["finish_reason"] == "stop" else "length"
        expect_eq(r.choices[0].finish_reason, want_finish, "finish_reason")
        if want_finish == "length":
            expect_eq(r.usage.completion_tokens, 128 - n_prompt, "completion_tokens (the rest of the context)")
        return f"{r.usage.completion_tokens} tokens, finish {r.choices[0].finish_reason}"

    checks.run(f"chat [{label}] default max tokens (rest of context), \\nUser: stop", default_max)

    def logprobs():
        r = client.chat.completions.create(**args, logprobs=True, top_logprobs=3)
        ref = cli.generate(chat_prompt, 12, logprobs=3)
        content = r.choices[0].logprobs.content
        expect(content, "no logprobs.content")
        toks = [t.token for t in content]
        expect_eq("".join(toks).lstrip(), r.choices[0].message.content, "joined logprob tokens vs content")
        for t in content:
            expect_eq(bytes(t.bytes).decode("utf-8", "replace"), t.token, "bytes vs token")
            expect_eq(len(t.top_logprobs), 3, "number of top_logprobs")
        tops = [{x.token: x.logprob for x in t.top_logprobs} for t in content]
        worst = compare_logprobs(toks, [t.logprob for t in content], tops, ref["logprobs"][: len(content)],
                                 "chat logprobs")
        return fmt_diff(worst)

    checks.run(f"chat [{label}] logprobs top_logprobs=3 == kvgpt generate --logprobs 3", logprobs)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base-url", required=True, help="the server's /v1, e.g. http://127.0.0.1:PORT/v1")
    ap.add_argument("--api-key", default="unused",
                    help="the key the server was started with (--api-key); also turns on the 401 check")
    ap.add_argument("--no-auth", action="store_true", help="the server was started without --api-key")
    ap.add_argument("--kvgpt", required=True, help="the kvgpt binary, for `kvgpt generate` as reference")
    ap.add_argument("--model", default="tests/fixtures/tiny-gpt2", help="the folder given to `serve --model`")
    a = ap.parse_args()

    client = openai.OpenAI(base_url=a.base_url, api_key=a.api_key, max_retries=0, timeout=120)
    cli = Cli(a.kvgpt, a.model)
    # The served name: the folder's name (the --model path is the server's business).
    model = os.path.basename(os.path.normpath(a.model))
    checks = Checks()
    greedy = dict(model=model, prompt=PROMPT, max_tokens=12, temperature=0, extra_body={"ignore_eos": True})
    state = {}

    # 1 ------------------------------------------------------------------ models
    def models_list():
        ids = [m.id for m in client.models.list().data]
        expect(model in ids, f"model {model!r} not in {ids}")
        return f"ids {ids}"

    checks.run("models.list shows the model", models_list)

    # 2 ------------------------------------------------------------------ greedy completions
    def greedy_text():
        r = client.completions.create(**greedy)
        ref = cli.generate(PROMPT, 12)
        expect_eq(r.object, "text_completion", "object")
        expect_eq(len(r.choices), 1, "number of choices")
        c = r.choices[0]
        expect_eq(c.text, ref["text"], "text vs `kvgpt generate`")
        expect_eq(c.finish_reason, "length", "finish_reason")
        expect_eq(r.usage.completion_tokens, 12, "usage.completion_tokens")
        expect_eq(r.usage.prompt_tokens, len(ref["prompt_ids"]), "usage.prompt_tokens")
        expect_eq(r.usage.total_tokens, r.usage.prompt_tokens + 12, "usage.total_tokens")
        expect(isinstance(extra(r.usage, "timings"), dict), f"usage.timings missing: {r.usage}")
        state["greedy_text"] = c.text
        return repr(c.text)

    checks.run("completions greedy text == kvgpt generate", greedy_text)

    def greedy_logprobs():
        r = client.completions.create(**greedy, logprobs=3)
        ref = cli.generate(PROMPT, 12, logprobs=3)
        c = r.choices[0]
        expect_eq(c.text, ref["text"], "text")
        lp = c.logprobs
        expect(lp is not None, "no logprobs in the choice")
        expect_eq(extra(lp, "token_ids"), ref["generated_ids"], "logprobs.token_ids vs CLI generated_ids")
        expect_eq("".join(lp.tokens), c.text, "joined logprobs.tokens vs text")
        offsets, pos = [], 0
        for t in lp.tokens:
            offsets.append(pos)
            pos += len(t)
        expect_eq(lp.text_offset, offsets, "text_offset")
        expect(all(len(t) == 3 for t in lp.top_logprobs), "top_logprobs should have 3 entries each")
        worst = compare_logprobs(lp.tokens, lp.token_logprobs, lp.top_logprobs, ref["logprobs"], "logprobs=3")
        return fmt_diff(worst)

    checks.run("completions logprobs=3 == kvgpt generate --logprobs 3", greedy_logprobs)

    def model_alias():
        r = client.completions.create(**{**greedy, "model": "kvgpt"})
        expect_eq(r.choices[0].text, cli.generate(PROMPT, 12)["text"], "text with model id `kvgpt`")
        return f"answered as {r.model!r}"

    checks.run("completions with model id `kvgpt`", model_alias)

    def token_id_prompts():
        ref = cli.generate(PROMPT, 12)
        r = client.completions.create(**{**greedy, "prompt": ref["prompt_ids"]})
        expect_eq(r.choices[0].text, ref["text"], "text for a token-id prompt")
        ref2 = cli.generate("Once upon a time", 12)
        r = client.completions.create(**{**greedy, "prompt": [PROMPT, "Once upon a time"]})
        expect_eq([c.index for c in r.choices], [0, 1], "choice indices for two prompts")
        expect_eq([c.text for c in r.choices], [ref["text"], ref2["text"]], "texts for two prompts")
        r = client.completions.create(**{**greedy, "prompt": [ref2["prompt_ids"], ref["prompt_ids"]]})
        expect_eq([c.text for c in r.choices], [ref2["text"], ref["text"]], "texts for two id prompts")
        expect_eq(r.usage.completion_tokens, 24, "usage.completion_tokens for two prompts")

    checks.run("completions prompt as ids / list of strings / list of id lists", token_id_prompts)

    def echo_and_stop():
        ref = cli.generate(PROMPT, 12)
        r = client.completions.create(**greedy, echo=True)
        expect_eq(r.choices[0].text, PROMPT + ref["text"], "echo=True text")
        # A stop sequence taken from the middle of the reference text: the text ends before it.
        text = ref["text"]
        stop = text[len(text) // 2: len(text) // 2 + 4]
        expect(stop.strip() != "", f"no usable stop sequence in {text!r}")
        r = client.completions.create(**greedy, stop=[stop])
        want = text[: text.index(stop)]
        expect_eq(r.choices[0].text, want, f"text with stop={stop!r}")
        expect_eq(r.choices[0].finish_reason, "stop", "finish_reason with a stop sequence")
        return f"stop {stop!r}"

    checks.run("completions echo and stop", echo_and_stop)

    def default_max_tokens():
        r = client.completions.create(model=model, prompt=PROMPT, temperature=0, extra_body={"ignore_eos": True})
        expect_eq(r.usage.completion_tokens, 16, "completion_tokens with max_tokens left out")
        expect_eq(r.choices[0].text, cli.generate(PROMPT, 16)["text"], "text")

    checks.run("completions max_tokens defaults to 16", default_max_tokens)

    # 3 ------------------------------------------------------------------ seeded sampling
    sampling = dict(temperature=0.8, top_p=0.95, seed=7)

    def seeded():
        r = client.completions.create(model=model, prompt=PROMPT, max_tokens=12, **sampling,
                                      extra_body={"ignore_eos": True, "top_k": 40})
        ref = cli.generate(PROMPT, 12, temperature=0.8, top_p=0.95, top_k=40, seed=7)
        expect_eq(r.choices[0].text, ref["text"], "sampled text vs `kvgpt generate` with the same flags")
        greedy_ref = cli.generate(PROMPT, 12)
        expect(ref["text"] != greedy_ref["text"], "sampling gave the greedy text: the check would prove nothing")
        return repr(r.choices[0].text)

    checks.run("completions seeded sampling == kvgpt generate (T 0.8, top_p 0.95, top_k 40, seed 7)", seeded)

    def penalties():
        r = client.completions.create(model=model, prompt=PROMPT, max_tokens=12, temperature=0,
                                      presence_penalty=0.5, frequency_penalty=1.5,
                                      extra_body={"ignore_eos": True, "repetition_penalty": 1.2})
        ref = cli.generate(PROMPT, 12, presence_penalty=0.5, frequency_penalty=1.5, repetition_penalty=1.2)
        expect_eq(r.choices[0].text, ref["text"], "penalized greedy text vs `kvgpt generate` with the same flags")
        expect(ref["text"] != cli.generate(PROMPT, 12)["text"], "the penalties changed nothing: the check would prove nothing")
        return repr(r.choices[0].text)

    checks.run("completions presence/frequency/repetition penalties == kvgpt generate", penalties)

    def seeded_n2():
        r = client.completions.create(model=model, prompt=PROMPT, max_tokens=12, n=2, **sampling,
                                      extra_body={"ignore_eos": True, "top_k": 40})
        want = [cli.generate(PROMPT, 12, temperature=0.8, top_p=0.95, top_k=40, seed=s)["text"] for s in (7, 8)]
        expect_eq([c.index for c in r.choices], [0, 1], "choice indices")
        expect_eq([c.text for c in r.choices], want, "choice j == CLI with seed 7+j")
        expect_eq(r.usage.completion_tokens, 24, "usage.completion_tokens")

    checks.run("completions n=2: choice j == kvgpt generate --seed 7+j", seeded_n2)

    # 4 ------------------------------------------------------------------ streaming completions
    def stream_text():
        chunks = collect_stream(client.completions.create(**greedy, stream=True))
        texts = [c.choices[0].text for c in chunks if c.choices]
        finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
        want = state.get("greedy_text") or cli.generate(PROMPT, 12)["text"]
        expect_eq("".join(texts), want, "joined chunk texts vs non-streaming text")
        expect_eq(finish, ["length"], "finish_reason over the chunks")
        expect(all(c.object == "text_completion" for c in chunks), "chunk object")
        return f"{len(chunks)} chunks"

    checks.run("completions stream: joined chunks == non-streaming text", stream_text)

    def stream_usage():
        chunks = collect_stream(client.completions.create(**greedy, stream=True,
                                                          stream_options={"include_usage": True}))
        last = chunks[-1]
        expect(last.usage is not None, f"last chunk has no usage: {last}")
        expect_eq(last.choices, [], "choices of the usage chunk")
        expect_eq(last.usage.completion_tokens, 12, "usage.completion_tokens")
        expect_eq(last.usage.total_tokens, last.usage.prompt_tokens + 12, "usage.total_tokens")
        expect(all(c.usage is None for c in chunks[:-1]), "usage on a chunk before the last")
        want = state.get("greedy_text") or cli.generate(PROMPT, 12)["text"]
        expect_eq("".join(c.choices[0].text for c in chunks if c.choices), want, "joined chunk texts")

    checks.run("completions stream include_usage: last chunk usage.completion_tokens == 12", stream_usage)

    def stream_n2():
        chunks = collect_stream(client.completions.create(model=model, prompt=PROMPT, max_tokens=12, n=2,
                                                          **sampling, stream=True,
                                                          extra_body={"ignore_eos": True, "top_k": 40}))
        texts = {0: "", 1: ""}
        for c in chunks:
            for ch in c.choices:
                texts[ch.index] += ch.text
        want = [cli.generate(PROMPT, 12, temperature=0.8, top_p=0.95, top_k=40, seed=s)["text"] for s in (7, 8)]
        expect_eq([texts[0], texts[1]], want, "streamed choices vs CLI seeds 7 and 8")

    checks.run("completions stream n=2 seeded == kvgpt generate", stream_n2)

    # 5 ------------------------------------------------------------------ chat
    # The server strips the answer's leading whitespace from the content (the template ends with
    # "Assistant:", so the model's first token usually starts with a space); the logprobs keep the
    # raw tokens. The second conversation's greedy answer starts with such a token.
    for label, messages in (("system+user+assistant+user", CHAT_MESSAGES), ("developer+user", CHAT_MESSAGES_2)):
        chat_checks(checks, client, cli, model, label, messages, state)

    # 6 ------------------------------------------------------------------ prompt cache
    def cache():
        nonce = f"{os.getpid()}{time.time_ns() % 1000003}"
        prompt = (f"{nonce} Once the prompt cache holds this sentence, the second request reuses all of its "
                  "tokens but the last one, which the server always runs again to get the logits.")
        args = dict(model=model, prompt=prompt, max_tokens=12, **sampling, extra_body={"ignore_eos": True, "top_k": 40})
        r1 = client.completions.create(**args)
        r2 = client.completions.create(**args)
        ref = cli.generate(prompt, 12, temperature=0.8, top_p=0.95, top_k=40, seed=7)
        pt = r1.usage.prompt_tokens
        expect_eq(pt, len(ref["prompt_ids"]), "prompt_tokens")
        c1 = r1.usage.prompt_tokens_details.cached_tokens
        c2 = r2.usage.prompt_tokens_details.cached_tokens
        expect_eq(c1, 0, "cached_tokens of the first request")
        expect_eq(c2, pt - 1, "cached_tokens of the second request (prompt_tokens - 1)")
        expect_eq(r2.choices[0].text, r1.choices[0].text, "second text vs first")
        expect_eq(r1.choices[0].text, ref["text"], "text vs `kvgpt generate`")
        t2 = extra(r2.usage, "timings") or {}
        expect_eq(t2.get("cache_n"), c2, "usage.timings.cache_n of the second request")
        return f"prompt_tokens {pt}, cached {c1} then {c2}"

    checks.run("prompt cache: same request twice, cached_tokens == prompt_tokens - 1", cache)
    openai_cache_checks.add_checks(checks, client, model=model, model_dir=a.model, base_url=a.base_url,
                                   api_key=a.api_key)

    # 7 ------------------------------------------------------------------ errors
    def bad_temperature():
        try:
            client.completions.create(model=model, prompt=PROMPT, temperature=5)
        except openai.BadRequestError as e:
            expect_eq(e.status_code, 400, "status")
            expect_eq(e.param, "temperature", "error.param")
            expect_eq(e.type, "invalid_request_error", "error.type")
            expect(isinstance(e.body, dict) and e.body.get("message"), f"error.message missing: {e.body}")
            return repr(e.body["message"])
        raise AssertionError("temperature=5 was accepted")

    checks.run("temperature=5 raises openai.BadRequestError", bad_temperature)

    def bad_chat_value():
        try:
            client.chat.completions.create(model=model, messages=CHAT_MESSAGES, top_p=1.5)
        except openai.BadRequestError as e:
            expect_eq(e.param, "top_p", "error.param")
            return repr(e.body["message"])
        raise AssertionError("top_p=1.5 was accepted")

    checks.run("chat top_p=1.5 raises openai.BadRequestError", bad_chat_value)

    def too_long():
        try:
            client.completions.create(model=model, prompt=PROMPT, max_tokens=1000)
        except openai.BadRequestError as e:
            expect_eq(e.code, "context_length_exceeded", "error.code")
            return repr(e.body["message"])
        raise AssertionError("max_tokens=1000 on a 128-position model was accepted")

    checks.run("max_tokens past the context raises openai.BadRequestError", too_long)

    def unknown_model():
        try:
            client.completions.create(model="no-such-model", prompt=PROMPT, max_tokens=1)
        except openai.NotFoundError as e:
            expect_eq(e.status_code, 404, "status")
            expect_eq(e.code, "model_not_found", "error.code")
            return repr(e.body["message"])
        raise AssertionError("an unknown model was accepted")

    checks.run("unknown model raises openai.NotFoundError (model_not_found)", unknown_model)

    def unknown_model_chat():
        try:
            client.chat.completions.create(model="no-such-model", messages=CHAT_MESSAGES, max_tokens=1)
        except openai.NotFoundError as e:
            expect_eq(e.code, "model_not_found", "error.code")
            return None
        raise AssertionError("an unknown model was accepted")

    checks.run("chat unknown model raises openai.NotFoundError", unknown_model_chat)

    def huge_body():
        try:
            client.completions.create(model=model, prompt="a" * (2 << 20), max_tokens=1)
        except openai.APIStatusError as e:
            expect_eq(e.status_code, 413, "status")
            expect(isinstance(e.body, dict) and e.body.get("message"), f"not an OpenAI error body: {e.body!r}")
            return repr(e.body["message"])
        raise AssertionError("a 2 MiB body was accepted")

    checks.run("2 MiB body raises openai.APIStatusError 413", huge_body)

    if not a.no_auth:
        def wrong_key():
            bad = openai.OpenAI(base_url=a.base_url, api_key=a.api_key + "-wrong", max_retries=0, timeout=60)
            for call in (lambda: bad.models.list(),
                         lambda: bad.completions.create(model=model, prompt=PROMPT, max_tokens=1)):
                try:
                    call()
                except openai.AuthenticationError as e:
                    expect_eq(e.status_code, 401, "status")
                else:
                    raise AssertionError("a wrong API key was accepted")

        checks.run("wrong API key raises openai.AuthenticationError", wrong_key)

    # ------------------------------------------------------------------ summary
    failed = [r for r in checks.results if not r[1]]
    passed = len(checks.results) - len(failed)
    if failed:
        print("\nfailed:")
        for name, _, msg in failed:
            print(f"  {name}: {msg.splitlines()[0]}")
    print(f"{passed} passed, {len(failed)} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
