"""scripts/openai/openai_client.py's checks of /v1/models and /v1/completions: greedy text and
log-probabilities against `kvgpt generate`, the prompt's forms, seeded sampling and penalties,
streaming, and the prompt cache answering the same request twice."""

import os
import time

from openai_checks import expect, expect_eq, extra
from openai_reference import PROMPT, SAMPLING, collect_stream, compare_logprobs, fmt_diff


def model_checks(checks, client, model):
    """1: the model is listed."""
    def models_list():
        ids = [m.id for m in client.models.list().data]
        expect(model in ids, f"model {model!r} not in {ids}")
        return f"ids {ids}"

    checks.run("models.list shows the model", models_list)


def greedy_checks(checks, client, cli, greedy, state):
    """2: greedy completions: text, logprobs and the model alias."""
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


def prompt_checks(checks, client, cli, model, greedy):
    """2: the prompt as ids and lists, echo and stop, the default max_tokens."""
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


def sampling_checks(checks, client, cli, model):
    """3: seeded sampling and the penalties, against `kvgpt generate` with the same flags."""
    def seeded():
        r = client.completions.create(model=model, prompt=PROMPT, max_tokens=12, **SAMPLING,
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
        r = client.completions.create(model=model, prompt=PROMPT, max_tokens=12, n=2, **SAMPLING,
                                      extra_body={"ignore_eos": True, "top_k": 40})
        want = [cli.generate(PROMPT, 12, temperature=0.8, top_p=0.95, top_k=40, seed=s)["text"] for s in (7, 8)]
        expect_eq([c.index for c in r.choices], [0, 1], "choice indices")
        expect_eq([c.text for c in r.choices], want, "choice j == CLI with seed 7+j")
        expect_eq(r.usage.completion_tokens, 24, "usage.completion_tokens")

    checks.run("completions n=2: choice j == kvgpt generate --seed 7+j", seeded_n2)


def stream_checks(checks, client, cli, model, greedy, state):
    """4: streamed completions against the non-streamed text and the CLI."""
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
                                                          **SAMPLING, stream=True,
                                                          extra_body={"ignore_eos": True, "top_k": 40}))
        texts = {0: "", 1: ""}
        for c in chunks:
            for ch in c.choices:
                texts[ch.index] += ch.text
        want = [cli.generate(PROMPT, 12, temperature=0.8, top_p=0.95, top_k=40, seed=s)["text"] for s in (7, 8)]
        expect_eq([texts[0], texts[1]], want, "streamed choices vs CLI seeds 7 and 8")

    checks.run("completions stream n=2 seeded == kvgpt generate", stream_n2)


def cache_check(checks, client, cli, model):
    """6: the same request twice; the second reuses every prompt token but the last."""
    def cache():
        nonce = f"{os.getpid()}{time.time_ns() % 1000003}"
        prompt = (f"{nonce} Once the prompt cache holds this sentence, the second request reuses all of its "
                  "tokens but the last one, which the server always runs again to get the logits.")
        args = dict(model=model, prompt=prompt, max_tokens=12, **SAMPLING, extra_body={"ignore_eos": True, "top_k": 40})
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
