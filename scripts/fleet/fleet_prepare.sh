# Sourced by scripts/fleet/fleet_vllm_router.sh and scripts/fleet/fleet_nginx.sh: from the repository's root,
# builds target/release/kvgpt and makes /tmp/distilgpt2-random (README's numpy venv) only when
# they are missing.
[[ -x target/release/kvgpt ]] || cargo build --release
if [[ ! -f /tmp/distilgpt2-random/model.safetensors ]]; then
    .venv/bin/python -c 'import numpy' 2>/dev/null || { python3 -m venv .venv && .venv/bin/pip install numpy; }
    .venv/bin/python scripts/fixtures/make_random_checkpoint.py /tmp/distilgpt2-random
fi
