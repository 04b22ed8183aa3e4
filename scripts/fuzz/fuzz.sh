#!/usr/bin/env bash
# Runs every cargo-fuzz target (fuzz/fuzz_targets), or those FUZZ_TARGETS names, for SECONDS each (default 60), from seeds made
# here out of the fixture, and prints executions and crashes per target. Needs the nightly
# toolchain (rustup toolchain install nightly) and cargo-fuzz (cargo install cargo-fuzz).
# Exit status 1 if any target found a crash (its input is kept in fuzz/artifacts/TARGET/).
set -euo pipefail
cd "$(dirname "$0")/../.."
secs="${1:-60}"
# FUZZ_TARGETS="gguf npy" runs only those.
read -r -a targets <<< "${FUZZ_TARGETS:-safetensors config tokenizer npy prompt_cache request gguf zmtp}"
fix=tests/fixtures/tiny-gpt2
corpus=fuzz/corpus
mkdir -p "$corpus"

# Seeds: small valid inputs of each kind (the fuzzer mutates from them).
python3 - "$corpus" "$fix" <<'PY'
import json, os, struct, sys
corpus, fix = sys.argv[1], sys.argv[2]
def seed(target, name, data):
    os.makedirs(os.path.join(corpus, target), exist_ok=True)
    with open(os.path.join(corpus, target, name), "wb") as f:
        f.write(data)
# A small safetensors file: two f32 tensors and one f16, back to back.
tensors = {"a": ("F32", [2, 3], struct.pack("<6f", *range(6))),
           "transformer.ln_f.bias": ("F32", [4], struct.pack("<4f", 1, 2, 3, 4)),
           "h": ("F16", [2], b"\x00\x3c\x00\x40")}
header, off, body = {}, 0, b""
for k, (dt, shape, data) in tensors.items():
    header[k] = {"dtype": dt, "shape": shape, "data_offsets": [off, off + len(data)]}
    off += len(data); body += data
header["__metadata__"] = {"format": "pt"}
h = json.dumps(header).encode()
seed("safetensors", "small", struct.pack("<Q", len(h)) + h + body)
seed("config", "fixture", open(os.path.join(fix, "config.json"), "rb").read())
seed("tokenizer", "tiny", json.dumps({"version": "1.0", "truncation": None, "padding": None, "added_tokens": [],
     "normalizer": None, "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
     "use_regex": True}, "post_processor": None, "decoder": {"type": "ByteLevel", "add_prefix_space": True,
     "trim_offsets": True, "use_regex": True}, "model": {"type": "BPE", "dropout": None, "unk_token": None,
     "continuing_subword_prefix": "", "end_of_word_suffix": "", "fuse_unk": False, "byte_fallback": False,
     "vocab": {"a": 0, "b": 1, "ab": 2}, "merges": ["a b"]}}).encode())
d = "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }".ljust(117) + "\n"
seed("npy", "small", b"\x93NUMPY\x01\x00" + struct.pack("<H", len(d)) + d.encode() + struct.pack("<6f", *range(6)))
seed("prompt_cache", "magic", b"\x01KVGPTPC1" + b"\x00" * 12)
for i, body in enumerate([
    {"prompt": "The cat", "max_tokens": 4, "temperature": 0, "stop": ["\n"], "logprobs": 2},
    {"messages": [{"role": "user", "content": "hi"}], "stream": True, "stream_options": {"include_usage": True}},
    {"prompt": [464, 3797], "n": 2, "seed": 1, "top_p": 0.9, "top_k": 5, "echo": True},
    {"text": "hello"}, {"tokens": [1, 2, 3]}]):
    seed("request", f"body{i}", json.dumps(body).encode())
# A tiny GPT-2 GGUF (v3): the metadata the reader needs and one layer of 4×4 tensors, in F32.
def gstr(x): b = x.encode(); return struct.pack("<Q", len(b)) + b
def kv(k, t, v): return gstr(k) + struct.pack("<I", t) + v
u32 = lambda x: struct.pack("<I", x)
toks = ["a", "b", "ab", "<|endoftext|>"]
meta = [kv("general.architecture", 8, gstr("gpt2")), kv("gpt2.block_count", 4, u32(1)),
        kv("gpt2.context_length", 4, u32(4)), kv("gpt2.embedding_length", 4, u32(4)),
        kv("gpt2.feed_forward_length", 4, u32(16)), kv("gpt2.attention.head_count", 4, u32(1)),
        kv("gpt2.attention.layer_norm_epsilon", 6, struct.pack("<f", 1e-5)),
        kv("tokenizer.ggml.model", 8, gstr("gpt2")),
        kv("tokenizer.ggml.tokens", 9, u32(8) + struct.pack("<Q", len(toks)) + b"".join(gstr(t) for t in toks)),
        kv("tokenizer.ggml.merges", 9, u32(8) + struct.pack("<Q", 1) + gstr("a b")),
        kv("tokenizer.ggml.eos_token_id", 4, u32(3))]
shapes = {"token_embd.weight": [4, 4], "position_embd.weight": [4, 4], "output_norm.weight": [4], "output_norm.bias": [4]}
for n, s in [("attn_norm", [4]), ("attn_qkv", [4, 12]), ("attn_output", [4, 4]), ("ffn_norm", [4]),
             ("ffn_up", [4, 16]), ("ffn_down", [16, 4])]:
    shapes[f"blk.0.{n}.weight"] = s
    shapes[f"blk.0.{n}.bias"] = [s[-1]]
infos, off, data = b"", 0, b""
for n, s in shapes.items():
    count = 1
    for d in s: count *= d
    infos += gstr(n) + u32(len(s)) + b"".join(struct.pack("<Q", d) for d in s) + u32(0) + struct.pack("<Q", off)
    blob = struct.pack(f"<{count}f", *[0.01 * i for i in range(count)])
    blob += b"\0" * (-len(blob) % 32)
    data += blob; off += len(blob)
head = b"GGUF" + u32(3) + struct.pack("<QQ", len(shapes), len(meta)) + b"".join(meta) + infos
seed("gguf", "tiny", head + b"\0" * (-len(head) % 32) + data)
# A ZMTP peer: its greeting, READY (Socket-Type DEALER), and a replay request ["", start];
# the first byte is the size of the pieces the target feeds the decoder.
greet = b"\xff" + b"\0" * 8 + b"\x7f\x03\x00NULL" + b"\0" * 48
ready = b"\x05READY\x0bSocket-Type" + struct.pack(">I", 6) + b"DEALER"
seed("zmtp", "replay", b"\x07" + greet + b"\x04" + bytes([len(ready)]) + ready + b"\x01\x00\x00\x08" + struct.pack(">q", 0))
PY

rows=()
fail=0
for t in "${targets[@]}"; do
    log="fuzz/$t.log"
    # -rss_limit_mb: the model and header buffers are small; a larger RSS is itself a finding.
    if cargo +nightly fuzz run "$t" "$corpus/$t" -- -max_total_time="$secs" -rss_limit_mb=2048 \
        -max_len=65536 -print_final_stats=1 >"$log" 2>&1; then status=ok; else status=CRASH; fail=1; fi
    runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' | tail -1)
    crashes=$(find "fuzz/artifacts/$t" -type f 2>/dev/null | wc -l)
    rows+=("| $t | ${runs:-?} | $crashes | $status |")
done
echo "| target | executions | crash inputs kept | result |"
echo "|---|---|---|---|"
printf '%s\n' "${rows[@]}"
exit $fail
