#!/usr/bin/env python3
"""kiln eval against Hugging Face transformers on the same randomly initialised Llama.

Builds a small GQA Llama with an untied head in transformers, perturbs its norm weights (HF
initialises them to 1, which would leave the norms untested), saves it as an HF folder
(config.json + model.safetensors), scores a text file as stride-T windows of T+1 tokens with
transformers (the mean of the per-token cross-entropy, as `kiln eval` defines it), then runs
`kiln eval FOLDER --precision fp32` on the same folder and file and compares.

Needs torch and transformers (the GPU machine has both; this machine and CI do not), so it
is not part of ctest. Usage:
    python3 tests/hf_parity/hf_parity.py --kiln build/kiln --data runtime/data/default_corpus.txt
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
from transformers import LlamaConfig, LlamaForCausalLM


def hf_window_loss(model, tokens, seq, batch, dtype):
    """Mean loss over all full stride-seq windows of seq+1 tokens, in `dtype`."""
    model = model.to(dtype)
    windows = (len(tokens) - 1) // seq
    total = torch.zeros((), dtype=torch.float64)
    with torch.no_grad():
        for first in range(0, windows, batch):
            rows = min(batch, windows - first)
            x = torch.stack([tokens[(first + r) * seq:(first + r) * seq + seq + 1] for r in range(rows)])
            # labels=input_ids: transformers shifts them, scoring positions 0..seq-1 against
            # tokens 1..seq; the last input token only adds an unused position (causal).
            loss = model(input_ids=x, labels=x).loss
            total += loss.double() * rows
    return (total / windows).item(), windows


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kiln", required=True)
    ap.add_argument("--data", required=True)
    ap.add_argument("--bytes", type=int, default=16384, help="score the first N bytes of --data")
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--tolerance", type=float, default=1e-4)
    ap.add_argument("--backend", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--out", default=None, help="folder for the model and the report")
    args = ap.parse_args()

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=256, hidden_size=128, intermediate_size=384, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                         rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=False,
                         initializer_range=0.1, attn_implementation="eager")
    model = LlamaForCausalLM(config).float().eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.add_(0.1 * torch.randn_like(p))

    out = args.out or tempfile.mkdtemp(prefix="kiln_hf_parity_")
    folder = os.path.join(out, "hf_llama")
    model.save_pretrained(folder, safe_serialization=True)
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
        "config": json.load(open(os.path.join(folder, "config.json"))),
        "windows": windows, "seq": args.seq, "kiln_backend": args.backend,
        "hf_loss_fp32": hf32, "hf_loss_fp64": hf64, "kiln_loss_fp32": kiln,
        "rel_err_vs_hf_fp32": rel32, "rel_err_vs_hf_fp64": rel64, "tolerance": args.tolerance,
        "kiln_stderr": run.stderr.strip(),
    }
    print(json.dumps(report, indent=2))
    with open(os.path.join(out, "hf_parity_report.json"), "w") as f:
        json.dump(report, f, indent=2)
    ok = rel32 <= args.tolerance
    print(f"hf_parity: kiln {kiln:.6f} vs transformers {hf32:.6f} (fp32), {hf64:.6f} (fp64): "
          f"relative error {rel32:.2e} / {rel64:.2e} -> {'PASS' if ok else 'FAIL'} (tolerance {args.tolerance:g})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
