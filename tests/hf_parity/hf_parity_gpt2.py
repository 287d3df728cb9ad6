#!/usr/bin/env python3
"""kiln eval against Hugging Face transformers on the same randomly initialised GPT-2.

As hf_parity.py does for Llama: builds a small GPT2LMHeadModel (byte vocabulary, tied head),
perturbs its LayerNorm weights and biases and its linear biases (HF initialises them to 1 and
0, which would leave them untested), saves it with save_pretrained (transformer.-prefixed
names, Conv1D weights [in, out]), scores a text file as stride-T windows of T+1 tokens with
transformers, then runs `kiln eval FOLDER --precision fp32` on the same folder and compares.
With --original-names the folder is rewritten with the original upload's names (no
"transformer." prefix, each block's attn.bias mask buffer), which kiln also loads.

Needs torch and transformers (the GPU machine has both; this machine and CI do not), so it
is not part of ctest. Usage:
    python3 tests/hf_parity/hf_parity_gpt2.py --kiln build/kiln --data runtime/data/default_corpus.txt
Exit status 0 when |kiln - hf| / hf <= --tolerance (default 1e-4).
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

import torch
import transformers
from transformers import GPT2Config, GPT2LMHeadModel

from hf_parity import hf_window_loss


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kiln", required=True)
    ap.add_argument("--data", required=True)
    ap.add_argument("--bytes", type=int, default=16384, help="score the first N bytes of --data")
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--tolerance", type=float, default=1e-4)
    ap.add_argument("--backend", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--original-names", action="store_true")
    ap.add_argument("--out", default=None, help="folder for the model and the report")
    args = ap.parse_args()

    torch.manual_seed(0)
    config = GPT2Config(vocab_size=256, n_embd=128, n_layer=2, n_head=2, n_positions=512,
                        activation_function="gelu_new", layer_norm_epsilon=1e-5, initializer_range=0.1,
                        attn_implementation="eager")
    model = GPT2LMHeadModel(config).float().eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(".bias") or ".ln_" in name:
                p.add_(0.1 * torch.randn_like(p))

    out = args.out or tempfile.mkdtemp(prefix="kiln_hf_parity_gpt2_")
    folder = os.path.join(out, "hf_gpt2")
    model.save_pretrained(folder, safe_serialization=True)
    if args.original_names:
        from safetensors.torch import load_file, save_file
        path = os.path.join(folder, "model.safetensors")
        tensors = {k.removeprefix("transformer."): v for k, v in load_file(path).items()}
        n = config.n_positions
        for i in range(config.n_layer):
            tensors[f"h.{i}.attn.bias"] = torch.tril(torch.ones(n, n)).view(1, 1, n, n)
        save_file(tensors, path, metadata={"format": "pt"})

    data_path = os.path.join(out, "data.txt")
    with open(args.data, "rb") as f:
        data = f.read()[:args.bytes]
    with open(data_path, "wb") as f:
        f.write(data)
    tokens = torch.tensor(list(data), dtype=torch.long)

    hf32, windows = hf_window_loss(model, tokens, args.seq, args.batch, torch.float32)
    hf64, _ = hf_window_loss(model, tokens, args.seq, args.batch, torch.float64)

    cmd = [args.kiln, "eval", folder, "--data", data_path, "--precision", "fp32", "--backend", args.backend,
           "--seq", str(args.seq), "--batch", str(args.batch)]
    run = subprocess.run(cmd, capture_output=True, text=True)
    match = re.search(r"^loss (\S+)$", run.stdout, re.M)
    if run.returncode != 0 or not match:
        print("kiln eval failed:", run.returncode, run.stdout, run.stderr, file=sys.stderr)
        return 1
    kiln = float(match.group(1))
    rel32 = abs(kiln - hf32) / abs(hf32)
    rel64 = abs(kiln - hf64) / abs(hf64)
    report = {
        "transformers": transformers.__version__, "torch": torch.__version__,
        "config": json.load(open(os.path.join(folder, "config.json"))), "original_names": args.original_names,
        "windows": windows, "seq": args.seq, "kiln_backend": args.backend,
        "hf_loss_fp32": hf32, "hf_loss_fp64": hf64, "kiln_loss_fp32": kiln,
        "rel_err_vs_hf_fp32": rel32, "rel_err_vs_hf_fp64": rel64, "tolerance": args.tolerance,
        "kiln_stderr": run.stderr.strip(),
    }
    print(json.dumps(report, indent=2))
    with open(os.path.join(out, "hf_parity_gpt2_report.json"), "w") as f:
        json.dump(report, f, indent=2)
    ok = rel32 <= args.tolerance
    print(f"hf_parity_gpt2: kiln {kiln:.6f} vs transformers {hf32:.6f} (fp32), {hf64:.6f} (fp64): "
          f"relative error {rel32:.2e} / {rel64:.2e} -> {'PASS' if ok else 'FAIL'} (tolerance {args.tolerance:g})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
