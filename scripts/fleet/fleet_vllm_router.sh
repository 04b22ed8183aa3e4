#!/usr/bin/env bash
# Three `kvgpt serve` replicas (-t 1 each) behind vllm-router 0.1.17: round_robin, cache_aware and
# kv_aware on a shared-prefix workload, one command (scripts/fleet/fleet.py has the details; extra
# arguments go to it, e.g. --rounds 2 --fault --drain --json out.json). Builds target/release/kvgpt
# and makes /tmp/distilgpt2-random (README's numpy venv) only when they are missing; fleet.py
# pip-installs the router into .venv-router when it is not there.
set -euo pipefail
cd "$(dirname "$0")/../.."
source scripts/fleet/fleet_prepare.sh
exec python3 scripts/fleet/fleet.py --front vllm-router --kvgpt target/release/kvgpt --model /tmp/distilgpt2-random "$@"
