#!/usr/bin/env python3
"""Drive a running `kvgpt serve` with the official `openai` Python package and check what it returns.

    python3 scripts/openai/openai_client.py --base-url http://127.0.0.1:PORT/v1 --api-key KEY \\
        --kvgpt target/debug/kvgpt [--model tests/fixtures/tiny-gpt2]

scripts/openai/openai_client.sh makes the venv, starts the server and runs this. Where there is an
independent party the server's answers are checked against it: `kvgpt generate --json` run as a
subprocess on the same model (same prompt, same sampling flags, same seed) gives the expected text,
token ids and log-probabilities; the chat prompt is rendered here by the rule the server documents
and fed to the same CLI. The rest (streaming against non-streaming, the prompt cache, the error
classes the client raises) is checked for consistency.

Prints one line per check, then `N passed, M failed`; exits 1 when anything failed.
"""

import argparse
import os
import sys

import openai

import openai_cache_checks
from openai_chat_checks import chat_checks
from openai_checks import Checks
from openai_completion_checks import (cache_check, greedy_checks, model_checks, prompt_checks, sampling_checks,
                                      stream_checks)
from openai_error_checks import auth_check, error_checks
from openai_reference import CHAT_MESSAGES, CHAT_MESSAGES_2, PROMPT, Cli


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
    model_checks(checks, client, model)
    # 2 ------------------------------------------------------------------ greedy completions
    greedy_checks(checks, client, cli, greedy, state)
    prompt_checks(checks, client, cli, model, greedy)
    # 3 ------------------------------------------------------------------ seeded sampling
    sampling_checks(checks, client, cli, model)
    # 4 ------------------------------------------------------------------ streaming completions
    stream_checks(checks, client, cli, model, greedy, state)
    # 5 ------------------------------------------------------------------ chat
    # The server strips the answer's leading whitespace from the content (the template ends with
    # "Assistant:", so the model's first token usually starts with a space); the logprobs keep the
    # raw tokens. The second conversation's greedy answer starts with such a token.
    for label, messages in (("system+user+assistant+user", CHAT_MESSAGES), ("developer+user", CHAT_MESSAGES_2)):
        chat_checks(checks, client, cli, model, label, messages, state)
    # 6 ------------------------------------------------------------------ prompt cache
    cache_check(checks, client, cli, model)
    openai_cache_checks.add_checks(checks, client, model=model, model_dir=a.model, base_url=a.base_url,
                                   api_key=a.api_key)
    # 7 ------------------------------------------------------------------ errors
    error_checks(checks, client, model)
    if not a.no_auth:
        auth_check(checks, a.base_url, a.api_key, model)

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
