#!/usr/bin/env python3
"""The PyTorch baseline for kiln's GPT-2 benchmarks: nanoGPT's model, written to be kiln's
gpt2 presets exactly (frontends/gpt2.cc): learned position embeddings; pre-LN blocks
(LayerNorm with weight and bias, eps 1e-5), attention through one fused c_attn projection
and c_proj, MLP c_fc / GELU (tanh form) / c_proj, every projection with a bias; a final
ln_f; the LM head tied to the token embedding, whose table is padded from 50257 to 50304 rows
(a multiple of 128, as kiln and llm.c pad it) with the padding rows zero and the logits
sliced to the real vocabulary before the loss. Trained with kiln's recipe as
bench/torch_llama.py does (bf16 autocast, fp32 master weights, fused torch.optim.AdamW with
weight decay on tensors of rank >= 2 only, as kiln, global-norm clipping, SDPA causal
attention, kiln's learning rate per step).

With --inputs DIR (written by `kiln export-inputs gpt2-124M ...`), the model starts from
kiln's initial weights (DIR/model.safetensors: Hugging Face names, Conv1D weights [in, out],
wte's vocab_size rows), trains on kiln's batches with kiln's learning rates: the same
numbers `kiln train` sees, so the first losses must agree.

Prints one JSON object on stdout, the fields of bench/torch_llama.py's (bench/summarize.py
reads both):
    python3 bench/torch_gpt2.py --preset gpt2-124M --inputs DIR --warmup 5 --steps 30 [--compile]
"""
import argparse
import contextlib
import math
import os
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
# The readers of kiln's files and kiln's schedule are the Llama baseline's: one copy of each.
from torch_llama import InputError, read_safetensors, run_settings, train_and_report  # noqa: E402

# Mirrors frontends/model_config.cc's GPT-2 presets (d_ff = 4 d, head_dim = d / heads); the
# batch is the benchmark's (run_h200.sh passes --batch 16 to kiln for both).
PRESETS = {
    "gpt2-tiny": dict(vocab=256, d=128, layers=2, heads=2, positions=64, seq=64, batch=8),
    "gpt2-124M": dict(vocab=50257, d=768, layers=12, heads=12, positions=1024, seq=1024, batch=16),
    "gpt2-350M": dict(vocab=50257, d=1024, layers=24, heads=16, positions=1024, seq=1024, batch=16),
}
LN_EPS = 1e-5  # GPT-2's layer_norm_epsilon (kiln's rms_eps field)
VOCAB_MULTIPLE = 128  # ModelConfig::padded_vocab_size()

# The Hugging Face Conv1D weights, stored [in, out]; nn.Linear holds [out, in].
CONV1D_SUFFIXES = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")


def log(*args):
    print("torch_gpt2:", *args, file=sys.stderr, flush=True)


def padded_vocab(vocab):
    return (vocab + VOCAB_MULTIPLE - 1) // VOCAB_MULTIPLE * VOCAB_MULTIPLE


# ---- the model ----------------------------------------------------------------------------

class CausalSelfAttention(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.heads = c["heads"]
        self.c_attn = nn.Linear(c["d"], 3 * c["d"])
        self.c_proj = nn.Linear(c["d"], c["d"])

    def forward(self, x):
        B, T, D = x.shape
        q, k, v = self.c_attn(x).split(D, dim=2)
        q, k, v = (t.view(B, T, self.heads, D // self.heads).transpose(1, 2) for t in (q, k, v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(a.transpose(1, 2).reshape(B, T, D))


class Mlp(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c_fc = nn.Linear(c["d"], 4 * c["d"])
        self.c_proj = nn.Linear(4 * c["d"], c["d"])

    def forward(self, x):
        return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))


class Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.ln_1 = nn.LayerNorm(c["d"], eps=LN_EPS)
        self.attn = CausalSelfAttention(c)
        self.ln_2 = nn.LayerNorm(c["d"], eps=LN_EPS)
        self.mlp = Mlp(c)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class Gpt2(nn.Module):
    """Parameter names are Hugging Face's (transformer.h.3.attn.c_attn.weight, ...)."""

    def __init__(self, c):
        super().__init__()
        self.c = c
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(padded_vocab(c["vocab"]), c["d"]),
            wpe=nn.Embedding(c["positions"], c["d"]),
            h=nn.ModuleList(Block(c) for _ in range(c["layers"])),
            ln_f=nn.LayerNorm(c["d"], eps=LN_EPS),
        ))

    def forward(self, tokens, targets):
        t = self.transformer
        T = tokens.shape[1]
        x = t.wte(tokens) + t.wpe(torch.arange(T, device=tokens.device))
        for block in t.h:
            x = block(x)
        # The tied head over the padded table (whole GEMM tiles), then the real vocabulary.
        logits = F.linear(t.ln_f(x), t.wte.weight)[..., :self.c["vocab"]]
        return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1))


def load_kiln_weights(model, path):
    """Copies every tensor of path (kiln's export: HF names, Conv1D [in, out], wte with the
    real vocabulary's rows) into model's parameters: Conv1D weights transposed, wte's
    padding rows zero. Fails loudly on a missing, unexpected or misshaped tensor, naming each."""
    tensors, _ = read_safetensors(path)
    params = dict(model.named_parameters())
    vocab, d = model.c["vocab"], model.c["d"]
    missing = sorted(set(params) - set(tensors))
    unexpected = sorted(set(tensors) - set(params))
    problems = []
    if missing:
        problems.append(f"no tensor for {len(missing)} parameter(s): {', '.join(missing[:8])}")
    if unexpected:
        problems.append(f"{len(unexpected)} tensor(s) this model does not have: {', '.join(unexpected[:8])}")
    converted = {}
    for name in sorted(set(params) & set(tensors)):
        t = tensors[name]
        if not t.is_floating_point():
            problems.append(f"'{name}' is {t.dtype}, not a float tensor")
            continue
        if name.endswith(CONV1D_SUFFIXES):
            t = t.t()
        if name == "transformer.wte.weight":
            if list(t.shape) != [vocab, d]:
                problems.append(f"'{name}' is {list(t.shape)}, expected [{vocab}, {d}] (the real vocabulary's rows)")
                continue
            t = torch.cat([t, torch.zeros(padded_vocab(vocab) - vocab, d, dtype=t.dtype)])
        if tuple(t.shape) != tuple(params[name].shape):
            want = list(params[name].shape)
            if name.endswith(CONV1D_SUFFIXES):
                want = want[::-1]
                got = list(tensors[name].shape)
            else:
                got = list(t.shape)
            problems.append(f"'{name}' is {got}, expected {want}")
            continue
        converted[name] = t
    if problems:
        raise InputError(f"{path} does not fit the model: " + "; ".join(problems))
    with torch.no_grad():
        for name, p in params.items():
            p.copy_(converted[name].to(torch.float32))
    return len(params)


def init_like_kiln(model, layers, seed):
    """kiln's init (frontends/weight_init.cc) in distribution, not in value: N(0, 0.02), the
    residual projections (attn.c_proj, mlp.c_proj) N(0, 0.02 / sqrt(2L)), LayerNorm weights 1,
    biases 0, wte's padding rows 0. For runs without kiln's weights."""
    torch.manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".ln_" in name and name.endswith(".weight"):
                p.fill_(1.0)
            elif name.endswith(".bias"):
                p.zero_()
            else:
                residual = name.endswith("c_proj.weight")
                p.normal_(0, 0.02 / math.sqrt(2 * layers) if residual else 0.02)
        model.transformer.wte.weight[model.c["vocab"]:].zero_()


def non_embedding_params(model):
    """kiln's NonEmbeddingParameterCount (frontends/model_config.cc), MFU's count: the blocks,
    ln_f and the head as if untied (vocab x d, the real vocabulary's rows); not wte nor wpe.
    gpt2-124M: 85.8M + 38.6M."""
    blocks = sum(p.numel() for n, p in model.named_parameters() if not n.startswith(("transformer.wte.",
                                                                                    "transformer.wpe.")))
    return blocks + model.c["vocab"] * model.c["d"]


# ---- the run ------------------------------------------------------------------------------

def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", default="gpt2-124M", choices=sorted(PRESETS))
    ap.add_argument("--steps", type=int, default=30, help="timed steps, after the warm-up")
    ap.add_argument("--warmup", type=int, default=5, help="untimed steps first")
    ap.add_argument("--compile", action="store_true", help="torch.compile the model")
    ap.add_argument("--inputs", metavar="DIR", help="kiln export-inputs folder: --weights, --batches and the lr per step")
    ap.add_argument("--weights", metavar="FILE", help="initial weights, safetensors with kiln's (HF) names")
    ap.add_argument("--batches", metavar="FILE", help="int32 [N, batch, seq+1] token rows (cycled if N < steps)")
    ap.add_argument("--batch", type=int, help="sequences per step without inputs.json (default: the preset's)")
    ap.add_argument("--lr", type=float, default=3e-3, help="peak lr of kiln's default schedule, without inputs.json")
    ap.add_argument("--seed", type=int, default=1337, help="init and random batch without --weights / --batches")
    ap.add_argument("--device", default="cuda", help="cuda; cpu only to test this script")
    args = ap.parse_args()

    c = PRESETS[args.preset]
    batch, seq = args.batch or c["batch"], c["seq"]

    def check_config(k, what):
        want = dict(family=k.get("family"), vocab=k["vocab_size"], d=k["d_model"], layers=k["n_layers"],
                    heads=k["n_heads"], ff=k["d_ff"], hd=k["head_dim"])
        have = dict(family="gpt2", vocab=c["vocab"], d=c["d"], layers=c["layers"], heads=c["heads"], ff=4 * c["d"],
                    hd=c["d"] // c["heads"])
        if want != have or k["rms_eps"] != LN_EPS or not k["tie_embeddings"]:
            raise InputError(f"{what} {k}, not --preset {args.preset} {have}")

    batch, seq, lrs, adamw, clip, meta = run_settings(args, batch, seq, check_config)
    if seq > c["positions"]:
        raise InputError(f"seq {seq} is beyond {args.preset}'s {c['positions']} positions")
    dev = torch.device(args.device)

    build_start = time.perf_counter()  # time to first step counts from here (CUDA's start too)
    with dev if hasattr(dev, "__enter__") else contextlib.nullcontext():
        model = Gpt2(c)
    if args.weights:
        n = load_kiln_weights(model, args.weights)
        log(f"loaded {n} tensors from {args.weights}")
    else:
        init_like_kiln(model, c["layers"], args.seed)
    model = model.to(dev)
    train_and_report(args, model, c, batch, seq, lrs, adamw, clip, meta, dev, build_start, non_embedding_params)

if __name__ == "__main__":
    try:
        main()
    except InputError as e:
        print(f"torch_gpt2: error: {e}", file=sys.stderr)
        sys.exit(1)
