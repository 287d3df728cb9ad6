#!/usr/bin/env python3
"""PyTorch's causal GQA attention on the shapes of bench/attention_bench.cc, for comparison.

Times torch.nn.functional.scaled_dot_product_attention with the flash (FlashAttention-2) and
cuDNN backends forced through torch.nn.attention.sdpa_kernel, forward and forward+backward,
bf16 inputs drawn as kiln's bench draws them (q, k uniform in [-2, 2), v and dO in [-1, 1)).
GQA: enable_gqa=True where the backend takes it; otherwise k and v are repeated to every
query head before the timed region (the FLOPs are the same; the row says "(k, v repeated)").
One JSON object a line on stdout, the attention_bench format (max_err_vs compares the backend's
O with the flash backend's); a readable line each on stderr.

    python3 bench/attention_torch.py [--shapes S,M,L] [--iters 20] [--warmup 3]
"""
import argparse
import json
import math
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

SHAPES = {"S": (16, 12, 4, 1024, 64), "M": (4, 16, 8, 2048, 128), "L": (2, 16, 8, 4096, 128)}
BACKENDS = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION}


def timed(fn, warmup, iters):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    ms = []
    for _ in range(iters):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        ms.append(start.elapsed_time(stop))
    ms.sort()
    return ms[len(ms) // 2], ms[0], ms[-1]


def run(name, warmup, iters):
    b, h, hkv, t, d = SHAPES[name]
    gen = torch.Generator(device="cuda").manual_seed(0)

    def uniform(shape, lo, hi):
        return (lo + (hi - lo) * torch.rand(shape, generator=gen, device="cuda")).to(torch.bfloat16)

    q = uniform((b, h, t, d), -2, 2)
    k = uniform((b, hkv, t, d), -2, 2)
    v = uniform((b, hkv, t, d), -1, 1)
    dout = uniform((b, h, t, d), -1, 1)
    flops = 4.0 * b * h * t * t * d / 2
    rows, reference = [], None
    for backend, sdp in BACKENDS.items():
        with sdpa_kernel([sdp]):
            kk, vv, note = k, v, ""
            try:
                out = F.scaled_dot_product_attention(q, kk, vv, is_causal=True, enable_gqa=True)
                gqa = True
            except RuntimeError:
                kk = k.repeat_interleave(h // hkv, dim=1)
                vv = v.repeat_interleave(h // hkv, dim=1)
                gqa, note = False, " (k, v repeated)"
                try:
                    out = F.scaled_dot_product_attention(q, kk, vv, is_causal=True)
                except RuntimeError as e:
                    print(f"{name} torch sdpa {backend}: not available: {e}", file=sys.stderr)
                    continue
            if reference is None:
                reference = out.float()
            err_vs = (out.float() - reference).abs().max().item()
            fwd = timed(lambda: F.scaled_dot_product_attention(q, kk, vv, is_causal=True, enable_gqa=gqa), warmup,
                        iters)
            qg, kg, vg = (x.detach().clone().requires_grad_(True) for x in (q, kk, vv))

            def fwd_bwd():
                o = F.scaled_dot_product_attention(qg, kg, vg, is_causal=True, enable_gqa=gqa)
                o.backward(dout)

            fb = timed(fwd_bwd, warmup, iters)
        for impl, (med, lo, hi), f in ((f"torch sdpa {backend} fwd{note}", fwd, flops),
                                       (f"torch sdpa {backend} fwd+bwd{note}", fb, 3.5 * flops)):
            row = {"shape": name, "b": b, "h": h, "hkv": hkv, "t": t, "d": d, "impl": impl, "median_ms": med,
                   "min_ms": lo, "max_ms": hi, "tflops": f / (med * 1e-3) * 1e-12, "max_err_ref": None,
                   "max_err_vs": err_vs, "vs": "torch sdpa flash"}
            rows.append(row)
            print(f"{name:2} {impl:34} {med:8.3f} ms (min {lo:.3f}, max {hi:.3f}) {row['tflops']:6.1f} TFLOP/s",
                  file=sys.stderr)
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="S,M,L")
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    args = parser.parse_args()
    print(f"torch {torch.__version__} on {torch.cuda.get_device_name()}", file=sys.stderr)
    for name in args.shapes.split(","):
        for row in run(name, args.warmup, args.iters):
            print(json.dumps(row))
    return 0


if __name__ == "__main__":
    sys.exit(main())
