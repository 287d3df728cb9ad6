#!/usr/bin/env python3
"""The PyTorch baseline for kiln's benchmarks: the same Llama-style model as kiln's presets
(RMSNorm, RoPE in Hugging Face's rotate-half convention, grouped-query attention, SwiGLU,
untied LM head), trained the way a PyTorch user would: bf16 autocast, fp32 master weights,
torch.optim.AdamW (fused), global-norm clipping, SDPA causal attention.

Prints one JSON object: tokens/s (median, min, max over the timed steps), step times, peak
memory and the first losses. Usage:
    python3 bench/torch_llama.py --preset llama-S --steps 30 --warmup 5 [--compile]
"""
import argparse
import json
import math
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

# Mirrors frontends/model_config.cc's presets.
PRESETS = {
    "llama-tiny": dict(vocab=256, d=128, layers=2, heads=4, kv=2, hd=32, ff=384, seq=64, batch=8),
    "llama-S": dict(vocab=32000, d=768, layers=16, heads=12, kv=4, hd=64, ff=2048, seq=1024, batch=16),
    "llama-M": dict(vocab=32000, d=2048, layers=16, heads=16, kv=8, hd=128, ff=5632, seq=2048, batch=4),
}


class RMSNorm(nn.Module):
    def __init__(self, d, eps=1e-5):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))
        self.eps = eps

    def forward(self, x):
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight).to(x.dtype)


def rope(x, cos, sin):  # x [B, H, T, D]
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


class Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c = c
        d, hd = c["d"], c["hd"]
        self.input_layernorm = RMSNorm(d)
        self.q_proj = nn.Linear(d, c["heads"] * hd, bias=False)
        self.k_proj = nn.Linear(d, c["kv"] * hd, bias=False)
        self.v_proj = nn.Linear(d, c["kv"] * hd, bias=False)
        self.o_proj = nn.Linear(c["heads"] * hd, d, bias=False)
        self.post_attention_layernorm = RMSNorm(d)
        self.gate_proj = nn.Linear(d, c["ff"], bias=False)
        self.up_proj = nn.Linear(d, c["ff"], bias=False)
        self.down_proj = nn.Linear(c["ff"], d, bias=False)

    def forward(self, x, cos, sin):
        c = self.c
        B, T, _ = x.shape
        h = self.input_layernorm(x)
        q = self.q_proj(h).view(B, T, c["heads"], c["hd"]).transpose(1, 2)
        k = self.k_proj(h).view(B, T, c["kv"], c["hd"]).transpose(1, 2)
        v = self.v_proj(h).view(B, T, c["kv"], c["hd"]).transpose(1, 2)
        q, k = rope(q, cos, sin), rope(k, cos, sin)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        x = x + self.o_proj(a.transpose(1, 2).reshape(B, T, -1))
        h = self.post_attention_layernorm(x)
        return x + self.down_proj(F.silu(self.gate_proj(h)) * self.up_proj(h))


class Llama(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c = c
        self.embed_tokens = nn.Embedding(c["vocab"], c["d"])
        self.layers = nn.ModuleList(Block(c) for _ in range(c["layers"]))
        self.norm = RMSNorm(c["d"])
        self.lm_head = nn.Linear(c["d"], c["vocab"], bias=False)
        inv = 10000.0 ** (-torch.arange(0, c["hd"], 2, dtype=torch.float32) / c["hd"])
        angles = torch.outer(torch.arange(c["seq"], dtype=torch.float32), inv)
        angles = torch.cat((angles, angles), dim=-1)
        self.register_buffer("cos", angles.cos(), persistent=False)
        self.register_buffer("sin", angles.sin(), persistent=False)

    def forward(self, tokens, targets):
        T = tokens.shape[1]
        x = self.embed_tokens(tokens)
        cos, sin = self.cos[:T], self.sin[:T]
        for layer in self.layers:
            x = layer(x, cos, sin)
        logits = self.lm_head(self.norm(x))
        return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.view(-1))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="llama-S", choices=sorted(PRESETS))
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--lr", type=float, default=3e-4)
    args = ap.parse_args()
    c = PRESETS[args.preset]
    torch.manual_seed(1337)
    dev = "cuda"
    model = Llama(c).to(dev)
    with torch.no_grad():  # kiln's init: N(0, 0.02), residual outputs / sqrt(2L), norms 1
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                continue
            std = 0.02 / math.sqrt(2 * c["layers"]) if name.endswith(("o_proj.weight", "down_proj.weight")) else 0.02
            p.normal_(0, std)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1, fused=True)
    step_fn = model
    t0 = time.perf_counter()
    if args.compile:
        step_fn = torch.compile(model)
    g = torch.Generator(device="cpu").manual_seed(0)
    tokens = torch.randint(0, c["vocab"], (c["batch"], c["seq"] + 1), generator=g).to(dev)
    inp, tgt = tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()

    times, losses = [], []
    first_step_s = None
    for i in range(args.warmup + args.steps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = step_fn(inp, tgt)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        end.record()
        torch.cuda.synchronize()
        if first_step_s is None:
            first_step_s = time.perf_counter() - t0
        losses.append(loss.item())
        if i >= args.warmup:
            times.append(start.elapsed_time(end) / 1e3)
    tok = c["batch"] * c["seq"]
    tps = sorted(tok / t for t in times)
    print(json.dumps({
        "preset": args.preset, "mode": "torch.compile" if args.compile else "eager",
        "torch": torch.__version__, "gpu": torch.cuda.get_device_name(),
        "tokens_per_step": tok, "timed_steps": len(times),
        "tok_per_s_median": statistics.median(tps), "tok_per_s_min": tps[0], "tok_per_s_max": tps[-1],
        "step_ms_median": 1e3 * statistics.median(times),
        "time_to_first_step_s": first_step_s,
        "peak_mem_gb": torch.cuda.max_memory_allocated() / 1e9,
        "first_losses": losses[:3],
    }))


if __name__ == "__main__":
    main()
