#!/usr/bin/env python3
"""The PyTorch baseline for kiln's benchmarks: the same Llama-style model as kiln's presets
(RMSNorm, RoPE in Hugging Face's rotate-half convention, grouped-query attention, SwiGLU,
untied LM head), trained with kiln's recipe the way a PyTorch user would write it: bf16
autocast, fp32 master weights, torch.optim.AdamW (fused on the GPU; weight decay on tensors
of rank >= 2 only, as kiln), global-norm clipping, SDPA causal attention, the learning rate
of each step set by hand (kiln's warmup + cosine).

With --inputs DIR (written by `kiln export-inputs`), the model starts from kiln's initial
weights (DIR/model.safetensors), trains on kiln's batches (DIR/batches.bin) with kiln's
learning rate per step (DIR/inputs.json): the same numbers `kiln train` sees, so the first
losses must agree. --weights FILE and --batches FILE name the files one by one.

Prints one JSON object on stdout (progress goes to stderr): tok/s (median, min, max over the
timed steps, each step timed by the wall clock with the GPU synchronized, as `kiln train`
times its steps; CUDA-event times too), MFU, peak memory (torch.cuda.max_memory_allocated),
time to first step (wall time from the start of the model build, weight loading and
torch.compile included, through the end of the first optimizer step) and the first losses.
    python3 bench/torch_llama.py --preset llama-S --inputs DIR --warmup 5 --steps 30 [--compile]
"""
import argparse
import contextlib
import json
import math
import os
import statistics
import struct
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

# Mirrors frontends/model_config.cc's presets.
from llama_presets import PRESETS, RMS_EPS, ROPE_THETA  # noqa: F401 (re-exported; torch-free for the shell scripts)
PEAK_FLOPS = 989e12  # H200 dense bf16, DESIGN.md's MFU denominator


def log(*args):
    print("torch_llama:", *args, file=sys.stderr, flush=True)


class InputError(Exception):
    """A file that does not match the model or the run: the message says what and where."""


# ---- kiln's files -------------------------------------------------------------------------

_ST_DTYPES = {"F32": (torch.float32, 4), "F16": (torch.float16, 2), "BF16": (torch.bfloat16, 2),
              "I32": (torch.int32, 4), "I64": (torch.int64, 8)}


def _read_exactly(path, offset, size):
    """size bytes of path from offset into one bytearray (reads in chunks: one read() call
    returns at most ~2 GB on Linux, and llama-M's weights are 3.5 GB)."""
    buf = bytearray(size)
    view = memoryview(buf)
    with open(path, "rb") as f:
        f.seek(offset)
        done = 0
        while done < size:
            n = f.readinto(view[done:done + (1 << 30)])
            if not n:
                raise InputError(f"{path}: file ends after {offset + done} bytes, expected {offset + size}")
            done += n
    return buf


def read_safetensors(path):
    """A safetensors file as {name: tensor} (CPU, little-endian host) and its metadata, with
    no dependency beyond torch: [u64 N][N bytes of JSON header][data]. Every offset and
    size is checked against the header's dtype and shape."""
    if sys.byteorder != "little":
        raise InputError("the safetensors reader assumes a little-endian host")
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) != 8:
            raise InputError(f"{path}: too short for a safetensors file ({size} bytes)")
        (n,) = struct.unpack("<Q", head)
        if n > size - 8:
            raise InputError(f"{path}: header length {n} runs past the end of the file ({size} bytes)")
        try:
            header = json.loads(f.read(n))
        except ValueError as e:
            raise InputError(f"{path}: the header is not JSON: {e}")
    if not isinstance(header, dict):
        raise InputError(f"{path}: the header is not a JSON object")
    metadata = header.pop("__metadata__", {}) or {}
    data_size = size - 8 - n
    data = _read_exactly(path, 8 + n, data_size)
    tensors = {}
    for name, info in header.items():
        dtype = info.get("dtype")
        if dtype not in _ST_DTYPES:
            raise InputError(f"{path}: tensor '{name}' has dtype {dtype}, not one of {sorted(_ST_DTYPES)}")
        torch_dtype, itemsize = _ST_DTYPES[dtype]
        shape = [int(d) for d in info["shape"]]
        begin, end = (int(x) for x in info["data_offsets"])
        numel = math.prod(shape)
        if not (0 <= begin <= end <= data_size) or end - begin != numel * itemsize:
            raise InputError(f"{path}: tensor '{name}' ({dtype}{shape}) has data_offsets [{begin}, {end}] "
                             f"that do not hold {numel * itemsize} bytes inside the {data_size}-byte data")
        if numel == 0:
            tensors[name] = torch.empty(shape, dtype=torch_dtype)
        else:
            tensors[name] = torch.frombuffer(data, dtype=torch_dtype, count=numel, offset=begin).reshape(shape)
    return tensors, metadata


def hf_to_module_name(hf_name):
    """kiln's (Hugging Face's) weight names -> this file's module names:
    model.layers.3.self_attn.q_proj.weight -> layers.3.q_proj.weight, lm_head.weight stays."""
    name = hf_name[len("model."):] if hf_name.startswith("model.") else hf_name
    return name.replace(".self_attn.", ".").replace(".mlp.", ".")


def load_kiln_weights(model, path):
    """Copies every tensor of path into model's parameters; fails loudly on a missing,
    unexpected, misshaped or non-float tensor, naming each."""
    tensors, _ = read_safetensors(path)
    params = dict(model.named_parameters())
    mapped = {}
    for hf_name, t in tensors.items():
        name = hf_to_module_name(hf_name)
        if name in mapped:
            raise InputError(f"{path}: '{hf_name}' and another tensor both map to parameter '{name}'")
        mapped[name] = (hf_name, t)
    missing = sorted(set(params) - set(mapped))
    unexpected = sorted(mapped[n][0] for n in set(mapped) - set(params))
    problems = []
    if missing:
        problems.append(f"no tensor for {len(missing)} parameter(s): {', '.join(missing[:8])}")
    if unexpected:
        problems.append(f"{len(unexpected)} tensor(s) this model does not have: {', '.join(unexpected[:8])}")
    for name in sorted(set(params) & set(mapped)):
        hf_name, t = mapped[name]
        if tuple(t.shape) != tuple(params[name].shape):
            problems.append(f"'{hf_name}' is {list(t.shape)}, parameter '{name}' is {list(params[name].shape)}")
        elif not t.is_floating_point():
            problems.append(f"'{hf_name}' is {t.dtype}, not a float tensor")
    if problems:
        raise InputError(f"{path} does not fit the model: " + "; ".join(problems))
    with torch.no_grad():
        for name, p in params.items():
            p.copy_(mapped[name][1].to(torch.float32))
    return len(params)


def read_batches(path, batch, seq):
    """batches.bin: int32 little-endian [N, batch, seq+1] -> (inputs, targets), each an
    int64 tensor [N, batch, seq] (inputs = [:seq], targets = [1:])."""
    if sys.byteorder != "little":
        raise InputError("the batches reader assumes a little-endian host")
    size = os.path.getsize(path)
    per_step = batch * (seq + 1) * 4
    if size == 0 or size % per_step:
        raise InputError(f"{path}: {size} bytes is not a whole number of [{batch}, {seq + 1}] int32 batches "
                         f"({per_step} bytes each)")
    rows = torch.frombuffer(_read_exactly(path, 0, size), dtype=torch.int32).view(size // per_step, batch, seq + 1)
    return rows[..., :-1].long(), rows[..., 1:].long()


def kiln_default_lrs(peak, steps):
    """kiln train's schedule for --lr peak and --steps steps (runtime/training/lr_schedule.cc
    with train_command.cc's defaults), for runs without inputs.json."""
    min_lr, warmup, total = peak / 10, min(10, steps // 10 + 1), steps
    out = []
    for step in range(steps):
        if step < warmup:
            out.append(peak * (step + 1) / warmup)
            continue
        progress = min(max((step - warmup) / max(1, total - warmup - 1), 0.0), 1.0)
        out.append(min_lr + 0.5 * (peak - min_lr) * (1.0 + math.cos(math.pi * progress)))
    return out


# ---- the model ----------------------------------------------------------------------------

class RMSNorm(nn.Module):
    def __init__(self, d, eps=RMS_EPS):
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
    def __init__(self, c, seq):
        super().__init__()
        self.c = c
        self.embed_tokens = nn.Embedding(c["vocab"], c["d"])
        self.layers = nn.ModuleList(Block(c) for _ in range(c["layers"]))
        self.norm = RMSNorm(c["d"])
        self.lm_head = nn.Linear(c["d"], c["vocab"], bias=False)
        inv = ROPE_THETA ** (-torch.arange(0, c["hd"], 2, dtype=torch.float32) / c["hd"])
        angles = torch.outer(torch.arange(seq, dtype=torch.float32), inv)
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


def init_like_kiln(model, layers, seed):
    """kiln's init (frontends/weight_init.h) in distribution, not in value: N(0, 0.02),
    residual outputs N(0, 0.02 / sqrt(2L)), norms 1. For runs without kiln's weights."""
    torch.manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                continue
            std = 0.02 / math.sqrt(2 * layers) if name.endswith(("o_proj.weight", "down_proj.weight")) else 0.02
            p.normal_(0, std)


def non_embedding_params(model):
    """Parameters without the input embedding, LM head included: DESIGN.md's count, the one
    MFU uses (llama-S 125.3M, llama-M 820.6M)."""
    return sum(p.numel() for n, p in model.named_parameters() if n != "embed_tokens.weight")


# ---- the run ------------------------------------------------------------------------------

def run_settings(args, batch, seq, check_config):
    """The run's settings, shared by both baselines: kiln's AdamW recipe and default lr
    schedule, or, when the batches come with kiln's inputs.json (kiln export-inputs), that
    run's batch, seq, lrs and AdamW options. `check_config(k)` raises InputError when the
    exported model config k is not this script's preset. Fills args.weights and args.batches
    from --inputs. Returns (batch, seq, lrs, adamw, clip, meta)."""
    adamw = dict(betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)  # kiln's AdamWConfig
    clip = 1.0
    lrs = None
    meta = None
    if args.inputs:
        args.weights = args.weights or os.path.join(args.inputs, "model.safetensors")
        args.batches = args.batches or os.path.join(args.inputs, "batches.bin")
    meta_path = os.path.join(os.path.dirname(args.batches), "inputs.json") if args.batches else None
    if meta_path and os.path.exists(meta_path):
        with open(meta_path) as f:
            meta = json.load(f)
        check_config(meta["config"], f"{meta_path} describes {meta['model']}")
        batch, seq = meta["batch"], meta["seq"]
        lrs = meta["lr"]
        a = meta["adamw"]
        adamw = dict(betas=(a["beta1"], a["beta2"]), eps=a["eps"], weight_decay=a["weight_decay"])
        clip = a["clip_norm"]
    if lrs is None:
        lrs = kiln_default_lrs(args.lr, args.warmup + args.steps)
    return batch, seq, lrs, adamw, clip, meta


def train_and_report(args, model, c, batch, seq, lrs, adamw, clip, meta, dev, build_start, count_params):
    """The timed training run both baselines share (torch_gpt2.py imports it): the batches
    (kiln's, or random ones), AdamW with kiln's decay rule (rank >= 2 tensors decay, norms and
    biases do not), eager or torch.compile, bf16 autocast, global-norm clipping; prints one
    JSON line of tok/s, MFU, memory and losses. `count_params(model)` gives the non-embedding
    parameter count the FLOP estimate uses (each model counts its own)."""
    total = args.warmup + args.steps
    if args.batches:
        inputs, targets = read_batches(args.batches, batch, seq)
        if meta and list(inputs.shape[:2]) != [meta["batches"]["shape"][0], batch]:
            raise InputError(f"{args.batches} holds {list(inputs.shape)} batches, inputs.json says "
                             f"{meta['batches']['shape']}")
        if len(inputs) < total:
            log(f"warning: {args.batches} holds {len(inputs)} batches for {total} steps; cycling them")
    else:
        g = torch.Generator().manual_seed(args.seed)
        tokens = torch.randint(0, c["vocab"], (1, batch, seq + 1), generator=g)
        inputs, targets = tokens[..., :-1], tokens[..., 1:]
    if int(inputs.max()) >= c["vocab"] or int(inputs.min()) < 0:
        raise InputError(f"token ids outside [0, {c['vocab']})")
    # One tensor per step, each its own storage (torch.compile sees the same kind of input).
    inputs = [x.to(dev, copy=True) for x in inputs]
    targets = [x.to(dev, copy=True) for x in targets]

    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": adamw["weight_decay"]},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=lrs[0], betas=adamw["betas"], eps=adamw["eps"],
                            **({"fused": True} if dev.type == "cuda" else {}))
    step_fn = torch.compile(model) if args.compile else model

    def sync():
        if dev.type == "cuda":
            torch.cuda.synchronize()

    times, event_times, losses = [], [], []
    first_step_s = None
    for i in range(total):
        lr = lrs[i] if i < len(lrs) else lrs[-1]
        for group in opt.param_groups:
            group["lr"] = lr
        inp, tgt = inputs[i % len(inputs)], targets[i % len(targets)]
        if dev.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
        t0 = time.perf_counter()
        with torch.autocast(dev.type, dtype=torch.bfloat16):
            loss = step_fn(inp, tgt)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if dev.type == "cuda":
            end.record()
        sync()
        loss_value = loss.item()
        t1 = time.perf_counter()
        if first_step_s is None:
            first_step_s = t1 - build_start
            log(f"first step done {first_step_s:.1f} s after the model build started, loss {loss_value:.4f}")
        if not math.isfinite(loss_value):
            raise RuntimeError(f"loss is {loss_value} at step {i + 1}")
        losses.append(loss_value)
        if i >= args.warmup:
            times.append(t1 - t0)
            if dev.type == "cuda":
                event_times.append(start.elapsed_time(end) / 1e3)

    tok = batch * seq
    tps = sorted(tok / t for t in times)
    params = count_params(model)
    flops_per_token = 6 * params + 12 * c["layers"] * seq * c["d"]
    if meta and (params != meta["non_embedding_params"] or flops_per_token != meta["flops_per_token"]):
        raise InputError(f"this model has {params} non-embedding parameters, kiln's {meta['non_embedding_params']}")
    median = statistics.median(tps) if tps else None
    print(json.dumps({
        "preset": args.preset, "mode": "torch.compile" if args.compile else "eager",
        "torch": torch.__version__,
        "gpu": torch.cuda.get_device_name() if dev.type == "cuda" else str(dev),
        "inputs": "kiln" if args.weights and args.batches else "own",
        "batch": batch, "seq": seq, "tokens_per_step": tok,
        "warmup_steps": args.warmup, "timed_steps": len(times),
        "tok_per_s_median": median, "tok_per_s_min": tps[0] if tps else None, "tok_per_s_max": tps[-1] if tps else None,
        "step_ms_median": 1e3 * statistics.median(times) if times else None,
        "event_step_ms_median": 1e3 * statistics.median(event_times) if event_times else None,
        "non_embedding_params": params, "flops_per_token": flops_per_token,
        "mfu": median * flops_per_token / PEAK_FLOPS if median else None,
        "time_to_first_step_s": first_step_s,
        "peak_mem_bytes": torch.cuda.max_memory_allocated() if dev.type == "cuda" else None,
        "first_losses": losses[:3],
        "losses": losses,
        "lr": lrs[:total],
    }))



def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", default="llama-S", choices=sorted(PRESETS))
    ap.add_argument("--steps", type=int, default=30, help="timed steps, after the warm-up")
    ap.add_argument("--warmup", type=int, default=5, help="untimed steps first")
    ap.add_argument("--compile", action="store_true", help="torch.compile the model")
    ap.add_argument("--inputs", metavar="DIR", help="kiln export-inputs folder: --weights, --batches and the lr per step")
    ap.add_argument("--weights", metavar="FILE", help="initial weights, safetensors with kiln's (HF) names")
    ap.add_argument("--batches", metavar="FILE", help="int32 [N, batch, seq+1] token rows (cycled if N < steps)")
    ap.add_argument("--lr", type=float, default=3e-3, help="peak lr of kiln's default schedule, without inputs.json")
    ap.add_argument("--seed", type=int, default=1337, help="init and random batch without --weights / --batches")
    ap.add_argument("--device", default="cuda", help="cuda; cpu only to test this script")
    args = ap.parse_args()

    c = PRESETS[args.preset]
    batch, seq = c["batch"], c["seq"]

    def check_config(k, what):
        want = dict(vocab=k["vocab_size"], d=k["d_model"], layers=k["n_layers"], heads=k["n_heads"],
                    kv=k["n_kv_heads"], hd=k["head_dim"], ff=k["d_ff"])
        have = {key: c[key] for key in want}
        if want != have or k["rms_eps"] != RMS_EPS or k["rope_theta"] != ROPE_THETA or k["tie_embeddings"]:
            raise InputError(f"{what} {k}, not --preset {args.preset} {have}")

    batch, seq, lrs, adamw, clip, meta = run_settings(args, batch, seq, check_config)
    dev = torch.device(args.device)

    build_start = time.perf_counter()  # time to first step counts from here (CUDA's start too)
    # Built on the device (its throwaway default init runs there, fast), then overwritten.
    with dev if hasattr(dev, "__enter__") else contextlib.nullcontext():
        model = Llama(c, seq)
    if args.weights:
        n = load_kiln_weights(model, args.weights)
        log(f"loaded {n} tensors from {args.weights}")
    else:
        init_like_kiln(model, c["layers"], args.seed)
    model = model.to(dev)  # a no-op but for torch < 2.0 (no device context)
    train_and_report(args, model, c, batch, seq, lrs, adamw, clip, meta, dev, build_start, non_embedding_params)

if __name__ == "__main__":
    try:
        main()
    except InputError as e:
        print(f"torch_llama: error: {e}", file=sys.stderr)
        sys.exit(1)
