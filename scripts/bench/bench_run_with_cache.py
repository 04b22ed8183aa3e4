#!/usr/bin/env python3
"""kvgpt's `run_with_cache` against Hugging Face transformers' forward with
`output_attentions=True, output_hidden_states=True` on the same checkpoint and prompt, interleaved
repetitions, the same thread count. Needs the kvgpt package, torch and transformers in one venv
(a throwaway one: the measurement's only use of torch):

    python3 -m venv /tmp/hf && /tmp/hf/bin/pip install ./python torch transformers
    /tmp/hf/bin/python scripts/bench/bench_run_with_cache.py /tmp/distilgpt2-random -T 128 -t 2 -r 7

Prints the median milliseconds of each and their ratio; kvgpt records every hook (all of
TransformerLens's names) and, separately, the attention patterns alone. Run it with
OMP_WAIT_POLICY=PASSIVE, or torch's threads spin after each of its runs, on the cores kvgpt's
run comes to next.
"""
import argparse
import gc
import statistics
import time

import kvgpt


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", help="a GPT-2 folder (config.json, model.safetensors)")
    ap.add_argument("-T", type=int, default=128, help="prompt tokens (default 128)")
    ap.add_argument("-t", type=int, default=2, help="threads for both (default 2)")
    ap.add_argument("-r", type=int, default=7, help="interleaved repetitions (default 7)")
    a = ap.parse_args()

    import torch
    from transformers import GPT2LMHeadModel

    torch.set_num_threads(a.t)
    hf = GPT2LMHeadModel.from_pretrained(a.model, attn_implementation="eager").eval()
    kv = kvgpt.load(a.model, threads=a.t)
    ids = [(i * 7919 + 13) % 50257 for i in range(a.T)]
    patterns = [f"blocks.{l}.attn.hook_pattern" for l in range(kv.config["n_layer"])]
    x = torch.tensor([ids])

    def hf_run():
        with torch.no_grad():
            return hf(x, output_attentions=True, output_hidden_states=True)

    runs = {"kvgpt, attention patterns": lambda: kv.run_with_cache(ids, names=patterns),
            "kvgpt, every hook": lambda: kv.run_with_cache(ids),
            "HF output_attentions + output_hidden_states": hf_run}
    # torch and transformers leave millions of objects behind them; without this, Python's cyclic
    # garbage collector walks them whenever a run makes new objects (kvgpt's dict of arrays, HF's
    # tuples of tensors), and that walk, not either engine, is what gets timed.
    gc.collect()
    gc.freeze()
    times = {k: [] for k in runs}
    for f in runs.values():
        f()  # warm-up
    for _ in range(a.r):
        for k, f in runs.items():
            t0 = time.perf_counter()
            f()
            times[k].append((time.perf_counter() - t0) * 1e3)
    hf_ms = statistics.median(times["HF output_attentions + output_hidden_states"])
    print(f"{a.model}, {a.T} tokens, {a.t} threads, median of {a.r} interleaved runs "
          f"(torch {torch.__version__}, kvgpt {kv.config['isa']}):")
    for k, v in times.items():
        m = statistics.median(v)
        print(f"  {k:45s} {m:8.2f} ms   HF / this {hf_ms / m:5.2f}")


if __name__ == "__main__":
    main()
