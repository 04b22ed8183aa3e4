#!/usr/bin/env bash
# Three `kvgpt serve` replicas (-t 1 each) behind nginx (Debian's): consistent_hash on the session
# header (one shared-prefix group, one replica) against round_robin, one command (scripts/fleet/fleet.py
# has the details; extra arguments go to it, e.g. --rounds 2 --fault --drain --json out.json).
# Builds target/release/kvgpt and makes /tmp/distilgpt2-random (README's numpy venv) only when
# they are missing; fleet.py installs nginx with apt-get (as root) when it is not there.
set -euo pipefail
cd "$(dirname "$0")/../.."
source scripts/fleet/fleet_prepare.sh
exec python3 scripts/fleet/fleet.py --front nginx --kvgpt target/release/kvgpt --model /tmp/distilgpt2-random "$@"
