#!/usr/bin/env python3
"""PyTorch's decode attention over the keys of bench/paged_attention_bench.cc, for comparison.

Times torch.nn.functional.scaled_dot_product_attention for B sequences of one query token
(16 heads, head dim 128) over --keys keys of 8 kv heads held densely ([B, 8, keys, 128], as
HF's static cache holds them: what the paged pool's block tables replace), bf16, GQA through
enable_gqa=True, with each SDPA backend that takes the shape (default dispatch, flash, cuDNN,
memory-efficient; k and v repeated to every query head before the timed region where a
backend refuses GQA). One JSON object a line on stdout, the format of paged_attention_bench's;
a readable line each on stderr.

    python3 bench/paged_attention_torch.py [--batches 1,32] [--keys 640] [--iters 50] [--warmup 5]
"""
import argparse
import json
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from attention_torch import timed  # noqa: E402  (beside this script)

HEADS, KV_HEADS, HEAD_DIM = 16, 8, 128
BACKENDS = {
    "default": None,
    "flash": SDPBackend.FLASH_ATTENTION,
    "cudnn": SDPBackend.CUDNN_ATTENTION,
    "efficient": SDPBackend.EFFICIENT_ATTENTION,
}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--batches", default="1,32")
    parser.add_argument("--keys", type=int, default=640)
    parser.add_argument("--iters", type=int, default=50)
    parser.add_argument("--warmup", type=int, default=5)
    args = parser.parse_args()
    torch.manual_seed(0)
    for batch in [int(b) for b in args.batches.split(",") if b]:
        q = (torch.rand(batch, HEADS, 1, HEAD_DIM, device="cuda") * 2 - 1).bfloat16()
        k = (torch.rand(batch, KV_HEADS, args.keys, HEAD_DIM, device="cuda") * 4 - 2).bfloat16()
        v = (torch.rand(batch, KV_HEADS, args.keys, HEAD_DIM, device="cuda") * 2 - 1).bfloat16()
        reference = F.scaled_dot_product_attention(q.float(), k.float().repeat_interleave(HEADS // KV_HEADS, 1),
                                                   v.float().repeat_interleave(HEADS // KV_HEADS, 1))
        moved = 2.0 * batch * KV_HEADS * args.keys * HEAD_DIM * 2  # K and V read once, bf16
        for name, backend in BACKENDS.items():
            impl = f"torch sdpa {name}"
            def call(kk=k, vv=v, gqa=True):
                return F.scaled_dot_product_attention(q, kk, vv, enable_gqa=gqa)
            fn = call
            try:
                with sdpa_kernel(backend) if backend is not None else torch.no_grad():
                    try:
                        out = call()
                    except RuntimeError:  # the backend refuses GQA: k and v repeated first
                        kr = k.repeat_interleave(HEADS // KV_HEADS, 1)
                        vr = v.repeat_interleave(HEADS // KV_HEADS, 1)
                        fn = lambda: call(kr, vr, False)
                        out = fn()
                        impl += " (k, v repeated)"
                    median, lo, hi = timed(fn, args.warmup, args.iters)
            except RuntimeError as e:
                print(f"batch {batch} {impl}: not run ({str(e).splitlines()[0][:100]})", file=sys.stderr)
                continue
            err = (out.float() - reference).abs().max().item()
            row = {"batch": batch, "keys": args.keys, "impl": impl, "launches": None, "median_us": median * 1e3,
                   "min_us": lo * 1e3, "max_us": hi * 1e3, "gbps": moved / (median * 1e-3) * 1e-9, "max_err": err}
            print(json.dumps(row))
            print(f"batch {batch:<3} {impl:<36} {median * 1e3:8.2f} us (min {lo * 1e3:.2f}, max {hi * 1e3:.2f}) "
                  f"{row['gbps']:6.0f} GB/s  err {err:.3g}", file=sys.stderr)


if __name__ == "__main__":
    main()
