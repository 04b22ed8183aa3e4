#!/usr/bin/env bash
# Check `kvgpt serve` with the official `openai` Python package.
#
#   scripts/openai/openai_client.sh [KVGPT_BINARY]        (default: target/debug/kvgpt)
#
# Makes a venv (OPENAI_VENV, default .venv-openai; reused when it already has the pinned openai and
# tokenizers),
# starts `KVGPT_BINARY serve` on the tiny fixture on a free loopback port with an API key, waits for
# /health, runs scripts/openai/openai_client.py against it, then stops the server with SIGTERM and checks
# that it drained and exited 0. Exits with the script's status (1 as well if the server misbehaved
# on shutdown). The server is killed whatever way this script ends.
set -euo pipefail

OPENAI_VERSION=3.51.0
# Hugging Face's tokenizer, the independent party for where the prompt cache's reuse must stop.
TOKENIZERS_VERSION=0.23.3
API_KEY=test-key
MODEL=tests/fixtures/tiny-gpt2
READY_TIMEOUT_S=60
STOP_TIMEOUT_S=30

bin=${1:-target/debug/kvgpt}
case $bin in
    /*) ;;
    */*) bin="$(cd "$(dirname "$bin")" && pwd)/$(basename "$bin")" ;;
    *) bin=$(command -v "$bin") ;;
esac
cd "$(dirname "$0")/../.."
[[ -x $bin ]] || { echo "openai_client.sh: $bin is not an executable" >&2; exit 1; }

venv=${OPENAI_VENV:-.venv-openai}
py=$venv/bin/python
if ! [[ -x $py ]] || ! "$py" -c "import openai, tokenizers, sys; sys.exit(openai.__version__ != '$OPENAI_VERSION' or tokenizers.__version__ != '$TOKENIZERS_VERSION')" 2>/dev/null; then
    echo "openai_client.sh: installing openai==$OPENAI_VERSION tokenizers==$TOKENIZERS_VERSION into $venv" >&2
    python3 -m venv "$venv"
    "$venv/bin/pip" install --disable-pip-version-check -q "openai==$OPENAI_VERSION" "tokenizers==$TOKENIZERS_VERSION"
fi
"$py" -c "import openai; print('openai', openai.__version__)"

log=$(mktemp)
server=
cleanup() {
    if [[ -n $server ]] && kill -0 "$server" 2>/dev/null; then
        kill -KILL "$server" 2>/dev/null || true
        wait "$server" 2>/dev/null || true
    fi
    rm -f "$log"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

show_log() { echo "--- server stderr:" >&2; cat "$log" >&2; echo "---" >&2; }

"$bin" serve --model "$MODEL" --host 127.0.0.1 --port 0 --api-key "$API_KEY" 2>"$log" &
server=$!

# The port, from the first line on stderr.
port=
for _ in $(seq $((READY_TIMEOUT_S * 10))); do
    port=$(sed -n 's|.*listening on http://127\.0\.0\.1:\([0-9][0-9]*\).*|\1|p' "$log" | head -n 1)
    [[ -n $port ]] && break
    kill -0 "$server" 2>/dev/null || break
    sleep 0.1
done
if [[ -z $port ]]; then
    echo "openai_client.sh: the server printed no 'listening on' line" >&2
    show_log
    exit 1
fi
echo "server pid $server on port $port"

# /health: 503 while loading, 200 when ready. Bounded by READY_TIMEOUT_S.
if ! "$py" - "$port" "$READY_TIMEOUT_S" "$server" <<'EOF'
import json, os, sys, time, urllib.error, urllib.request
port, limit, pid = int(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3])
deadline = time.monotonic() + limit
last = None
while time.monotonic() < deadline:
    try:
        os.kill(pid, 0)
    except OSError:
        sys.exit(f"the server exited before it was ready (last /health: {last})")
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as r:
            body = json.loads(r.read())
            if r.status == 200 and body == {"status": "ok"}:
                sys.exit(0)
            last = (r.status, body)
    except urllib.error.HTTPError as e:
        last = e.code
    except (urllib.error.URLError, OSError) as e:
        last = repr(e)
    time.sleep(0.1)
sys.exit(f"/health not 200 after {limit} s (last: {last})")
EOF
then
    show_log
    exit 1
fi
grep -q 'ready on http://' "$log" || { echo "openai_client.sh: /health is 200 but no 'ready on' line" >&2; show_log; exit 1; }

status=0
"$py" scripts/openai/openai_client.py --base-url "http://127.0.0.1:$port/v1" --api-key "$API_KEY" \
    --kvgpt "$bin" --model "$MODEL" || status=$?

# SIGTERM drains and exits 0.
kill -TERM "$server"
for _ in $(seq $((STOP_TIMEOUT_S * 10))); do
    kill -0 "$server" 2>/dev/null || break
    sleep 0.1
done
if kill -0 "$server" 2>/dev/null; then
    echo "openai_client.sh: the server was still running ${STOP_TIMEOUT_S} s after SIGTERM" >&2
    show_log
    exit 1
fi
rc=0
wait "$server" || rc=$?
server=
if [[ $rc -ne 0 ]]; then
    echo "openai_client.sh: the server exited $rc after SIGTERM (want 0)" >&2
    show_log
    exit 1
fi
echo "server exited 0 after SIGTERM"
[[ $status -eq 0 ]] || show_log
exit "$status"
