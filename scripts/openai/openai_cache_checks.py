"""The prompt cache's miss diagnosis over HTTP, through the official `openai` client (`extra_body`),
checked against Hugging Face's `tokenizers` package reading the model's own tokenizer.json: the
position where reuse must stop is the first token id where the two prompts differ, computed here,
not by kvgpt. Imported by scripts/openai/openai_client.py.

The cases: the article's (a system prompt with a `Current time:` line, two requests a minute apart),
one changed word in the middle of a long shared prefix, the same diagnosis in a streamed usage, and
the /metrics histogram of reuse-stop positions moving by exactly what the responses said.
"""

import json
import os
import time
import urllib.request

import tokenizers

from openai_checks import expect, expect_eq, extra

# The article's system prompt; only the time differs between the two requests.
SYSTEM = ("You are the support assistant of a bicycle shop. Answer in one sentence.\n"
          "Current time: {time}\n"
          "Opening hours: 9 to 18, Monday to Saturday.")
QUESTION = "\nUser: Do you repair tyres?\nAssistant:"


def first_difference(a, b):
    """The first index where the id lists differ (the shorter length if one is a prefix)."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return min(len(a), len(b))


def metrics_text(base_url, api_key):
    url = base_url.rstrip("/").removesuffix("/v1") + "/metrics"
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {api_key}"})
    with urllib.request.urlopen(req, timeout=30) as r:
        return r.read().decode()


def sample(text, name):
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"{name} not in /metrics")


def add_checks(checks, client, *, model, model_dir, base_url, api_key):
    tok = tokenizers.Tokenizer.from_file(os.path.join(model_dir, "tokenizer.json"))
    ids = lambda text: tok.encode(text).ids  # noqa: E731 - the independent tokenizer's ids
    nonce = f"[{os.getpid()}-{time.time_ns() % 1000003}] "  # a prefix no earlier request has
    diag = {"ignore_eos": True, "kvgpt": {"cache_diagnosis": True}}
    seen = []  # every reused count the responses reported, for the histogram check

    def usage_cache(r):
        pc = extra(r.usage, "prompt_cache")
        expect(isinstance(pc, dict), f"usage.prompt_cache is not an object: {pc!r}")
        seen.append(pc["reused"])
        return pc

    def check_stop(pc, a, b, r):
        stop = first_difference(a, b)
        expect_eq(pc["reused"], stop, "usage.prompt_cache.reused (the first differing id, by `tokenizers`)")
        expect_eq(pc["reason"], "differs", "reason")
        expect_eq(pc["new_token"]["id"], b[stop], "new_token.id")
        expect_eq(pc["cached_token"]["id"], a[stop], "cached_token.id")
        expect_eq(pc["new_token"]["text"], tok.decode([b[stop]]), "new_token.text")
        expect_eq(pc["recomputed"], len(b) - stop, "recomputed")
        expect_eq(r.usage.prompt_tokens_details.cached_tokens, stop, "prompt_tokens_details.cached_tokens")
        return stop

    before = metrics_text(base_url, api_key)

    def current_time():
        a_text = nonce + SYSTEM.format(time="2026-12-03 09:14") + QUESTION
        b_text = nonce + SYSTEM.format(time="2026-12-03 09:15") + QUESTION
        a, b = ids(a_text), ids(b_text)
        r1 = client.completions.create(model=model, prompt=a_text, max_tokens=4, temperature=0,
                                       extra_body={"ignore_eos": True})
        pc1 = usage_cache(r1)
        # Nothing cached starts with this nonce: reuse stops at 0, where the cache holds other
        # prompts' first tokens ("differs") or nothing at all ("cache_ends").
        expect_eq(pc1["reused"], 0, "the first request reuses nothing")
        expect(pc1["reason"] in ("differs", "cache_ends"), f"reason {pc1['reason']}")
        expect(pc1["cached_token"] is None or pc1["cached_token"]["id"] != a[0], f"cached_token {pc1['cached_token']}")
        expect("context" not in pc1, "no context unless asked for")
        r2 = client.completions.create(model=model, prompt=b_text, max_tokens=4, temperature=0, extra_body=diag)
        pc2 = usage_cache(r2)
        stop = check_stop(pc2, a, b, r2)
        ctx = pc2["context"]
        expect_eq(ctx["new_after"], tok.decode(b[stop:stop + 9]), "context.new_after")
        expect_eq(ctx["cached_after"], tok.decode(a[stop:stop + 9]), "context.cached_after")
        expect_eq(ctx["before"], tok.decode(b[max(0, stop - 8):stop]), "context.before")
        line = tok.decode(b[:stop]).rsplit("\n", 1)[-1]
        expect(line.startswith("Current time: "), f"the stop is in the time line: {line!r}")
        return f"stopped at {stop} of {len(b)}: {ctx['explanation']}"

    checks.run("cache diagnosis: a `Current time:` line a minute apart", current_time)

    def one_token_in_the_middle():
        words = ("the harbour was quiet that morning and the old keeper walked along the pier counting boats "
                 "while gulls argued over the nets and the tide turned slowly under a grey sky that promised "
                 "rain before noon")
        a_text = nonce + "Story: " + words
        b_text = a_text.replace("counting boats", "counting ships")
        a, b = ids(a_text), ids(b_text)
        expect(len(a) == len(b) and sum(x != y for x, y in zip(a, b)) == 1, "exactly one token differs")
        usage_cache(client.completions.create(model=model, prompt=a_text, max_tokens=2, temperature=0,
                                              extra_body={"ignore_eos": True}))
        r = client.completions.create(model=model, prompt=b_text, max_tokens=2, temperature=0, extra_body=diag)
        pc = usage_cache(r)
        stop = check_stop(pc, a, b, r)
        expect(0 < stop < len(b) - 10, f"the change is in the middle: {stop} of {len(b)}")
        expect_eq(extra(r.usage, "timings")["prompt_n"], len(b) - stop, "timings.prompt_n: all after it computed")
        return f"one token at {stop} of {len(b)}: {len(b) - stop} positions computed, though only one differs"

    checks.run("cache diagnosis: one changed token in the middle of a long shared prefix", one_token_in_the_middle)

    def streamed():
        text = nonce + SYSTEM.format(time="2026-12-03 09:16") + QUESTION
        stream = client.completions.create(model=model, prompt=text, max_tokens=2, temperature=0, stream=True,
                                           stream_options={"include_usage": True}, extra_body=diag)
        usage = [c.usage for c in stream if c.usage is not None]
        expect_eq(len(usage), 1, "one usage chunk")
        pc = extra(usage[0], "prompt_cache")
        seen.append(pc["reused"])
        a = ids(nonce + SYSTEM.format(time="2026-12-03 09:15") + QUESTION)  # the latest cached variant
        stop = first_difference(a, ids(text))
        expect_eq(pc["reused"], stop, "streamed usage.prompt_cache.reused")
        return f"stopped at {stop}"

    checks.run("cache diagnosis in a streamed usage chunk", streamed)

    def histogram():
        after = metrics_text(base_url, api_key)
        name = "kvgpt_prompt_cache_reuse_stop_position"
        count = sample(after, name + "_count") - sample(before, name + "_count")
        total = sample(after, name + "_sum") - sample(before, name + "_sum")
        expect_eq(count, len(seen), "sequences recorded: one per request")
        expect_eq(total, sum(seen), f"the sum of the reuse stops the {len(seen)} responses reported")
        stops = json.dumps({k: sample(after, f'kvgpt_prompt_cache_stops_total{{reason="{k}"}}')
                            for k in ("differs", "cache_ends", "last_token")})
        return f"count +{count:.0f}, sum +{total:.0f}; {stops}"

    checks.run("/metrics: a histogram of reuse-stop positions", histogram)
