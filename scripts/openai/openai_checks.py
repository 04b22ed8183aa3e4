"""What the `openai` client checks share: a run of named checks that reports each and never
raises, the assertions they make, and reading a field the OpenAI schema does not have."""

import traceback


class Checks:
    def __init__(self):
        self.results = []  # (name, ok, detail)

    def run(self, name, fn):
        try:
            detail = fn()
            self.results.append((name, True, detail or ""))
            print(f"PASS {name}" + (f" ({detail})" if detail else ""), flush=True)
        except Exception as e:  # noqa: BLE001 - any failure of a check is reported, not raised
            msg = f"{type(e).__name__}: {e}"
            if not isinstance(e, AssertionError):
                msg += "\n" + traceback.format_exc(limit=4)
            self.results.append((name, False, msg))
            print(f"FAIL {name}: {msg}", flush=True)


def expect(cond, msg):
    if not cond:
        raise AssertionError(msg)


def expect_eq(got, want, what):
    if got != want:
        raise AssertionError(f"{what}: got {got!r}, want {want!r}")


def extra(obj, name):
    """A field the OpenAI schema does not have (kept by the client's models as an extra)."""
    extras = getattr(obj, "model_extra", None) or {}
    if name in extras:
        return extras[name]
    return getattr(obj, name, None)
