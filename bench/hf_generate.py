#!/usr/bin/env python3
"""Hugging Face transformers' greedy generate on a kiln preset's shape: the decode baseline of
issue 15 (bench/generate_h200.sh runs it beside `kiln generate`).

A random-weight LlamaForCausalLM in bf16 with kiln's preset dims (bench/torch_llama.py's
PRESETS), the static KV cache, batch B of distinct random prompts of P tokens, N new tokens
(EOS off). The decode time per step is (time of N new tokens - time of 1 new token) / (N - 1),
both after a warm-up run, with the GPU synchronized; prefill tok/s is B * P over the
1-token run. Prints one JSON line.
    python3 bench/hf_generate.py --preset llama-M --batch 32 --prompt 512 --new 256
"""
import argparse
import json
import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from torch_llama import PRESETS, RMS_EPS, ROPE_THETA


def timed_generate(model, x, new_tokens):
    torch.cuda.synchronize()
    start = time.perf_counter()
    with torch.no_grad():
        out = model.generate(x, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False,
                             cache_implementation="static", pad_token_id=0)
    torch.cuda.synchronize()
    return time.perf_counter() - start, out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="llama-M", choices=sorted(PRESETS))
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--new", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    p = PRESETS[args.preset]
    config = LlamaConfig(vocab_size=p["vocab"], hidden_size=p["d"], intermediate_size=p["ff"],
                         num_hidden_layers=p["layers"], num_attention_heads=p["heads"],
                         num_key_value_heads=p["kv"], head_dim=p["hd"], max_position_embeddings=4096,
                         rms_norm_eps=RMS_EPS, rope_theta=ROPE_THETA, tie_word_embeddings=False)
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = LlamaForCausalLM(config).to(torch.bfloat16).eval()
    model.generation_config.eos_token_id = None
    x = torch.randint(0, p["vocab"], (args.batch, args.prompt), device="cuda")
    timed_generate(model, x, args.new)  # warm-up: the static cache, kernels, allocator
    one, full = [], []
    for _ in range(args.repeats):
        one.append(timed_generate(model, x, 1)[0])
        full.append(timed_generate(model, x, args.new)[0])
    per_step = sorted((f - o) / (args.new - 1) for f, o in zip(full, one))
    print(json.dumps({
        "preset": args.preset, "batch": args.batch, "prompt": args.prompt, "new_tokens": args.new,
        "decode_ms_per_step_median": 1e3 * per_step[len(per_step) // 2],
        "decode_ms_per_step_min": 1e3 * per_step[0], "decode_ms_per_step_max": 1e3 * per_step[-1],
        "prefill_tok_per_s": args.batch * args.prompt / sorted(one)[len(one) // 2],
        "peak_memory_gb": torch.cuda.max_memory_allocated() / 1e9,
    }))


if __name__ == "__main__":
    main()
