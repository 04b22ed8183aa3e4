"""scripts/openai/openai_client.py's checks of the errors: what the server refuses, and the exception


class the `openai` client raises for it."""

import openai

from openai_checks import expect, expect_eq
from openai_reference import CHAT_MESSAGES, PROMPT


def error_checks(checks, client, model):
    """7: bad values, a prompt past the context, an unknown model, a body over the limit."""
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


def auth_check(checks, base_url, api_key, model):
    """7: a wrong API key (only when the server was started with one)."""
    def wrong_key():
        bad = openai.OpenAI(base_url=base_url, api_key=api_key + "-wrong", max_retries=0, timeout=60)
        for call in (lambda: bad.models.list(),
                     lambda: bad.completions.create(model=model, prompt=PROMPT, max_tokens=1)):
            try:
                call()
            except openai.AuthenticationError as e:
                expect_eq(e.status_code, 401, "status")
            else:
                raise AssertionError("a wrong API key was accepted")

    checks.run("wrong API key raises openai.AuthenticationError", wrong_key)
