#!/usr/bin/env bash
# The GGUF test fixtures (tests/fixtures/gguf/tiny-gpt2-{f32,f16,q8_0}.gguf), written by llama.cpp's
# own converter from tests/fixtures/tiny-gpt2. The converter wants `n_ctx` in config.json, so it
# runs on a copy that has it. Then tiny-gpt2-{q4_0,q4_1,q5_0,q5_1}.gguf by llama.cpp's quantizer
# from the F32 one, every matrix of the one type (`--pure`), when its binary is given.
#
#   scripts/make_fixture_gguf.sh LLAMA_CPP_DIR PYTHON [LLAMA_QUANTIZE]
#
# LLAMA_CPP_DIR: llama.cpp's source (e.g. vendor/llama.cpp of the llama-cpp-python 0.3.36 sdist,
# fetched with `pip download --no-deps --no-build-isolation --no-binary :all: llama-cpp-python==0.3.36`);
# PYTHON: one with torch and transformers (the converter imports both).
set -euo pipefail
L=$1 PY=$2 QUANTIZE=${3:-}
here=$(cd "$(dirname "$0")/.." && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cp -r "$here/tests/fixtures/tiny-gpt2" "$tmp/model"
"$PY" -c "import json,sys; p=sys.argv[1]; c=json.load(open(p)); c['n_ctx']=c['n_positions']; json.dump(c, open(p,'w'), indent=2)" "$tmp/model/config.json"
mkdir -p "$here/tests/fixtures/gguf"
for t in f32 f16 q8_0; do
    PYTHONPATH="$L/gguf-py" "$PY" "$L/convert_hf_to_gguf.py" "$tmp/model" --outtype "$t" \
        --outfile "$here/tests/fixtures/gguf/tiny-gpt2-$t.gguf"
done
if [ -n "$QUANTIZE" ]; then
    for t in q4_0 q4_1 q5_0 q5_1; do
        "$QUANTIZE" --pure "$here/tests/fixtures/gguf/tiny-gpt2-f32.gguf" "$here/tests/fixtures/gguf/tiny-gpt2-$t.gguf" "$t" 2
    done
fi
