#!/usr/bin/env python3
"""kiln generate against Hugging Face transformers' greedy generate on one random Llama.

Builds a small GQA Llama with an untied head in transformers (vocab 512, so kiln reads and
prints token ids), perturbs its norm weights (HF initialises them to 1), saves it as an HF
folder, and for each precision runs transformers' `generate` (greedy, static cache, no EOS)
and `kiln generate FOLDER --prompt-tokens ... --temperature 0` on the same prompt:
  fp32: the 64 new tokens must be equal;
  bf16: the tokens must agree until the first near-tie, i.e. where they first differ the
        fp32 model's logits for the two tokens are within --tie of each other (a bf16
        rounding can then flip the argmax), or agree throughout.
Needs torch and transformers (the GPU machine has both), so it is not part of ctest:
    python3 tests/hf_parity/hf_generate_parity.py --kiln build/kiln --backend cuda
Exit status 0 when both hold.
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


def hf_generate(model, prompt, new_tokens, dtype, device):
    model = model.to(device=device, dtype=dtype)
    x = torch.tensor([prompt], device=device)
    with torch.no_grad():
        out = model.generate(x, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False,
                             cache_implementation="static", pad_token_id=0)
    return out[0, len(prompt):].tolist()


def kiln_generate(kiln, folder, prompt, new_tokens, precision, backend):
    cmd = [kiln, "generate", folder, "--prompt-tokens", ",".join(map(str, prompt)), "--max-new-tokens",
           str(new_tokens), "--temperature", "0", "--precision", precision, "--backend", backend]
    run = subprocess.run(cmd, capture_output=True, text=True)
    if run.returncode != 0:
        raise RuntimeError(f"kiln generate failed ({run.returncode}): {run.stderr}")
    ids = [int(t) for t in re.findall(r"-?\d+", run.stdout.strip().splitlines()[0])]
    if ids[:len(prompt)] != prompt:
        raise RuntimeError(f"kiln generate did not echo the prompt: {run.stdout[:200]}")
    return ids[len(prompt):], run.stderr.strip()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kiln", required=True)
    ap.add_argument("--backend", default="cuda", choices=["cpu", "cuda"])
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--prompt-length", type=int, default=24)
    ap.add_argument("--tie", type=float, default=0.05, help="fp32 logit gap that counts as a near-tie")
    ap.add_argument("--out", default=None, help="folder for the model and the report")
    args = ap.parse_args()

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=512, hidden_size=256, intermediate_size=704, num_hidden_layers=4,
                         num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=512,
                         rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=False,
                         initializer_range=0.05, attn_implementation="eager")
    model = LlamaForCausalLM(config).float().eval()
    model.generation_config.eos_token_id = None
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.add_(0.1 * torch.randn_like(p))
    out = args.out or tempfile.mkdtemp(prefix="kiln_hf_generate_")
    folder = os.path.join(out, "hf_llama")
    model.save_pretrained(folder, safe_serialization=True)
    prompt = torch.randint(0, config.vocab_size, (args.prompt_length,), generator=torch.Generator().manual_seed(1)).tolist()
    device = "cuda" if torch.cuda.is_available() else "cpu"

    report = {"transformers": transformers.__version__, "torch": torch.__version__, "prompt": prompt,
              "kiln_backend": args.backend, "new_tokens": args.new_tokens}
    ok = True
    for precision, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        hf = hf_generate(model, prompt, args.new_tokens, dtype, device)
        kiln, stderr = kiln_generate(args.kiln, folder, prompt, args.new_tokens, precision, args.backend)
        first_diff = next((i for i, (a, b) in enumerate(zip(hf, kiln)) if a != b), None)
        entry = {"hf": hf, "kiln": kiln, "first_difference": first_diff, "kiln_stderr": stderr}
        if first_diff is None:
            entry["verdict"] = "equal"
        elif precision == "fp32":
            entry["verdict"] = "differ"
            ok = False
        else:
            # The fp32 model's logits after the common context: how close the two choices were.
            context = torch.tensor([prompt + hf[:first_diff]], device=device)
            with torch.no_grad():
                logits = model.to(device=device, dtype=torch.float32)(context).logits[0, -1]
            gap = abs(float(logits[hf[first_diff]] - logits[kiln[first_diff]]))
            entry["fp32_logit_gap_at_difference"] = gap
            entry["verdict"] = "near-tie" if gap <= args.tie else "differ"
            ok &= gap <= args.tie
        report[precision] = entry
        print(f"hf_generate_parity {precision}: {entry['verdict']} (first difference at "
              f"{first_diff if first_diff is not None else '-'} of {args.new_tokens})")
    with open(os.path.join(out, "hf_generate_parity_report.json"), "w") as f:
        json.dump(report, f, indent=2)
    print(json.dumps(report))
    print("hf_generate_parity:", "PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
