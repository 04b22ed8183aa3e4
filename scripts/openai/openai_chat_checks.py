"""scripts/openai/openai_client.py's checks of /v1/chat/completions: the content against
`kvgpt generate` on the prompt rendered by the server's documented template, streaming, the default
max tokens and the logprobs."""

from openai_checks import expect, expect_eq
from openai_reference import collect_stream, compare_logprobs, fmt_diff


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
