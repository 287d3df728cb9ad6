#!/usr/bin/env python3
"""Summarizes a bench run (bench/run_h200.sh) as Markdown tables: per preset, kiln's and
PyTorch's (eager, torch.compile) tok/s, the ratios, MFU, peak memory, time to first step,
and whether the first losses agree. Usage:
    python3 bench/summarize.py RUN_DIR [--skip N]

RUN_DIR holds, per preset P:
  kiln_P.log            the output of `kiln train P` (stdout and stderr)
  torch_eager_P.json    bench/torch_llama.py's (or torch_gpt2.py's, for gpt2-* presets) JSON (its
                        last line), and torch_compile_P.json
  inputs_P/inputs.json  `kiln export-inputs`'s sidecar (FLOPs per token for kiln's MFU)
  kilnfp8_P.log         optional: `kiln train P --precision fp8` (run_h200.sh's FP8=1), the
                        same steps and batches; adds a table of kiln fp8 against kiln bf16 and
                        torch.compile (bf16), with the first losses of fp8 and bf16
and meta.txt (commit, date, GPU, driver, torch), printed first.

From kiln's log it reads (anywhere on a line, so prefixes like "kiln train: " do not matter):
  step N/TOTAL  loss X  tok/s Y  ...   one line per step; the first --skip steps (default 5)
                                       are warm-up, left out of the statistics
  time to first step: S s              optional; "n/a" without it
  peak device memory: B bytes          optional; "n/a" without it

Exits 1 when a run failed or a first loss differs from kiln's by more than 1e-2 relative
(what the bf16 policy allows), after printing everything.
"""
import glob
import json
import os
import re
import statistics
import sys

PEAK_FLOPS = 989e12  # H200 dense bf16, DESIGN.md's MFU denominator
LOSS_TOLERANCE = 1e-2  # relative, first loss, kiln vs PyTorch (bf16 autocast on both)
MODES = ("eager", "torch.compile")
# The file name of each mode's log and JSON: torch_{file mode}_{preset}.log / .json.
FILE_MODES = {"eager": "eager", "torch.compile": "compile"}

STEP_RE = re.compile(r"step (\d+)/(\d+)\s+loss (\S+)\s+tok/s (\d+(?:\.\d+)?)")
FIRST_STEP_RE = re.compile(r"time to first step: ([0-9.eE+-]+) s\b")
PEAK_MEM_RE = re.compile(r"peak device memory: (\d+) bytes")


def stats(values):
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


def kiln_stats(path, skip):
    """kiln train's log -> tok/s statistics over the steps after `skip`, the losses, and the
    optional time to first step and peak memory; None when no step line is there."""
    tps, losses = [], []
    first_step_s = peak_bytes = None
    with open(path, errors="replace") as f:
        for line in f:
            for part in line.split("\r"):  # a progress bar, if the log came from a terminal
                m = STEP_RE.search(part)
                if m:
                    losses.append(float(m.group(3)))
                    if int(m.group(1)) > skip:
                        tps.append(float(m.group(4)))
                m = FIRST_STEP_RE.search(part)
                if m:
                    first_step_s = float(m.group(1))
                m = PEAK_MEM_RE.search(part)
                if m:
                    peak_bytes = int(m.group(1))
    if not losses:
        return None
    out = {"losses": losses, "time_to_first_step_s": first_step_s, "peak_mem_bytes": peak_bytes}
    if tps:
        out["tps"] = stats(tps)
    return out


def torch_run(path):
    """bench/torch_llama.py's or torch_gpt2.py's JSON (the last non-empty line), or None."""
    try:
        with open(path) as f:
            lines = [l for l in f.read().splitlines() if l.strip()]
        return json.loads(lines[-1]) if lines else None
    except (OSError, ValueError):
        return None


def fmt_tps(s):
    if not s:
        return "failed"
    return f"{s['median']:,.0f} ({s['min']:,.0f}-{s['max']:,.0f}, n={s['n']})"


def fmt_opt(v, fmt):
    return "n/a" if v is None else fmt(v)


def gb(b):
    return f"{b / 1e9:.1f} GB"


def rel_diff(a, b):
    return abs(a - b) / abs(b) if b else float("inf")


def summarize(run, skip):
    """The report's lines and whether everything passed."""
    lines, ok = [], True
    meta = os.path.join(run, "meta.txt")
    if os.path.exists(meta):
        with open(meta) as f:
            lines += [l.rstrip("\n") for l in f] + [""]
    presets = sorted({os.path.basename(p)[len("kiln_"):-len(".log")] for p in glob.glob(os.path.join(run, "kiln_*.log"))} |
                     {os.path.basename(p)[len("kilnfp8_"):-len(".log")] for p in glob.glob(os.path.join(run, "kilnfp8_*.log"))} |
                     {os.path.basename(p).split("_", 2)[2][:-len(".json")] for p in glob.glob(os.path.join(run, "torch_*_*.json"))})
    rows = []
    for preset in presets:
        k = kiln_stats(os.path.join(run, f"kiln_{preset}.log"), skip) if os.path.exists(
            os.path.join(run, f"kiln_{preset}.log")) else None
        t = {}
        for mode, file_mode in FILE_MODES.items():
            d = torch_run(os.path.join(run, f"torch_{file_mode}_{preset}.json"))
            if d and d.get("mode") == mode:
                t[mode] = d
        flops = None
        sidecar = os.path.join(run, f"inputs_{preset}", "inputs.json")
        if os.path.exists(sidecar):
            with open(sidecar) as f:
                flops = json.load(f).get("flops_per_token")
        if flops is None:
            flops = next((d.get("flops_per_token") for d in t.values() if d.get("flops_per_token")), None)
        fp8_log = os.path.join(run, f"kilnfp8_{preset}.log")
        k8 = kiln_stats(fp8_log, skip) if os.path.exists(fp8_log) else None
        rows.append((preset, k, t, flops, k8, os.path.exists(fp8_log)))

    lines.append(f"tok/s: median (min-max, n) over the steps after {skip} warm-up steps; ratios are kiln / PyTorch.")
    lines.append("")
    lines.append("| preset | kiln tok/s | torch eager tok/s | torch.compile tok/s | kiln / eager | kiln / compile |")
    lines.append("|---|---|---|---|---|---|")
    for preset, k, t, _, _, _ in rows:
        kt = k.get("tps") if k else None
        cells = [fmt_tps(kt)]
        torch_tps = {}
        # A mode the run left out (bench/run_h200.sh MODES=compile) has neither log nor JSON:
        # "not run", which fails nothing; one that ran and left no tok/s failed.
        ran = [mode for mode in MODES if any(os.path.exists(os.path.join(run, f"torch_{FILE_MODES[mode]}_{preset}{ext}"))
                                             for ext in (".log", ".json"))]
        for mode in MODES:
            d = t.get(mode)
            if d and d.get("tok_per_s_median"):
                torch_tps[mode] = d["tok_per_s_median"]
                cells.append(fmt_tps({"median": d["tok_per_s_median"], "min": d["tok_per_s_min"],
                                      "max": d["tok_per_s_max"], "n": d["timed_steps"]}))
            else:
                cells.append("failed" if mode in ran else "not run")
        for mode in MODES:
            cells.append(f"{kt['median'] / torch_tps[mode]:.2f}" if kt and mode in torch_tps else "-")
        lines.append(f"| {preset} | " + " | ".join(cells) + " |")
        if not kt or any(mode not in torch_tps for mode in ran):
            ok = False
        if kt and kt["n"] < 20:
            lines.append(f"<!-- {preset}: only {kt['n']} timed kiln steps (want >= 20) -->")

    lines.append("")
    lines.append("MFU: tok/s x (6 x non-embedding params + 12 x layers x seq x d_model) / 989 TFLOP/s. "
                 "Peak memory: kiln's device allocations (its arena), torch.cuda.max_memory_allocated. "
                 "Time to first step: from the start (kiln: of `kiln train`; PyTorch: of the model build, "
                 "weights loading and compilation included) to the end of the first optimizer step. "
                 f"First loss: |kiln - torch| / torch, must be <= {LOSS_TOLERANCE:g}; the last step's loss "
                 "shows whether the runs stayed together.")
    lines.append("")
    lines.append("| preset | MFU kiln / eager / compile | peak memory kiln / eager / compile "
                 "| time to first step kiln / eager / compile | first loss kiln | vs eager | vs compile "
                 "| last loss kiln / eager / compile |")
    lines.append("|---|---|---|---|---|---|---|---|")
    failures = []
    for preset, k, t, flops, _, _ in rows:
        kt = k.get("tps") if k else None
        mfu = [fmt_opt(kt["median"] * flops / PEAK_FLOPS if (kt and flops) else None, lambda v: f"{100 * v:.1f}%")]
        mem = [fmt_opt(k and k["peak_mem_bytes"], gb)]
        first = [fmt_opt(k and k["time_to_first_step_s"], lambda v: f"{v:.1f} s")]
        agree = []
        kiln_loss = k["losses"][0] if k else None
        last = [fmt_opt(k and k["losses"][-1], lambda v: f"{v:.4f}")]
        for mode in MODES:
            last.append(fmt_opt(((t.get(mode) or {}).get("losses") or [None])[-1], lambda v: f"{v:.4f}"))
        for mode in MODES:
            d = t.get(mode) or {}
            mfu.append(fmt_opt(d.get("mfu"), lambda v: f"{100 * v:.1f}%"))
            mem.append(fmt_opt(d.get("peak_mem_bytes"), gb))
            first.append(fmt_opt(d.get("time_to_first_step_s"), lambda v: f"{v:.1f} s"))
            torch_loss = (d.get("first_losses") or [None])[0]
            if kiln_loss is None or torch_loss is None:
                agree.append("-")
                continue
            r = rel_diff(kiln_loss, torch_loss)
            if d.get("inputs") != "kiln":
                agree.append(f"{torch_loss:.4f} ({r:.1e}, not kiln's inputs)")
            elif r > LOSS_TOLERANCE:
                agree.append(f"{torch_loss:.4f} ({r:.1e}) FAIL")
                failures.append(f"{preset}: first loss kiln {kiln_loss:.4f} vs {mode} {torch_loss:.4f}: "
                                f"{r:.2e} relative > {LOSS_TOLERANCE:g}")
            else:
                agree.append(f"{torch_loss:.4f} ({r:.1e}) ok")
        lines.append(f"| {preset} | {' / '.join(mfu)} | {' / '.join(mem)} | {' / '.join(first)} | "
                     f"{fmt_opt(kiln_loss, lambda v: f'{v:.4f}')} | {agree[0]} | {agree[1]} | {' / '.join(last)} |")
    fp8_rows = [r for r in rows if r[5]]
    if fp8_rows:
        lines.append("")
        lines.append("FP8 (kiln --precision fp8: the linear layers' GEMMs in FP8 with delayed scaling, the LM head "
                     "bf16): kiln fp8 against kiln bf16 and torch.compile (bf16) in the same run. First loss: fp8 "
                     "against kiln bf16's, relative.")
        lines.append("")
        lines.append("| preset | kiln fp8 tok/s | fp8 / kiln bf16 | fp8 / torch.compile | peak memory fp8 / bf16 "
                     "| first loss fp8 (vs bf16) | last loss fp8 / bf16 |")
        lines.append("|---|---|---|---|---|---|---|")
        for preset, k, t, _, k8, _ in fp8_rows:
            t8 = k8.get("tps") if k8 else None
            kt = k.get("tps") if k else None
            compile_tps = (t.get("torch.compile") or {}).get("tok_per_s_median")
            vs_bf16 = f"{t8['median'] / kt['median']:.2f}" if t8 and kt else "-"
            vs_compile = f"{t8['median'] / compile_tps:.2f}" if t8 and compile_tps else "-"
            mem = f"{fmt_opt(k8 and k8['peak_mem_bytes'], gb)} / {fmt_opt(k and k['peak_mem_bytes'], gb)}"
            first8 = k8["losses"][0] if k8 else None
            first16 = k["losses"][0] if k else None
            first = fmt_opt(first8, lambda v: f"{v:.4f}")
            if first8 is not None and first16 is not None:
                first += f" ({rel_diff(first8, first16):.1e})"
            last = (f"{fmt_opt(k8 and k8['losses'][-1], lambda v: f'{v:.4f}')} / "
                    f"{fmt_opt(k and k['losses'][-1], lambda v: f'{v:.4f}')}")
            lines.append(f"| {preset} | {fmt_tps(t8)} | {vs_bf16} | {vs_compile} | {mem} | {first} | {last} |")
            if not t8:
                ok = False
    for f in failures:
        lines.append("")
        lines.append(f"FAIL: {f}")
    return lines, ok and not failures


def main(argv):
    if len(argv) < 2 or argv[1].startswith("-"):
        print(__doc__, file=sys.stderr)
        return 2
    skip = int(argv[argv.index("--skip") + 1]) if "--skip" in argv else 5
    lines, ok = summarize(argv[1], skip)
    print("\n".join(lines))
    if not ok:
        print("summarize: FAILED (a run failed or the first losses disagree; see above)", file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
