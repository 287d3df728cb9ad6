#!/usr/bin/env python3
"""Summarizes a bench run: kiln's per-step log lines and the PyTorch JSON lines, per preset,
as a Markdown table with ratios. Usage: python3 bench/summarize.py RUN_DIR [--skip N]

RUN_DIR holds kiln_<preset>.log (the output of `kiln train`) and torch_<mode>_<preset>.json.
kiln's first --skip steps (default 5) are warm-up and are left out of the statistics."""
import glob
import json
import os
import re
import statistics
import sys


def kiln_stats(path, skip):
    tps, losses = [], []
    for line in open(path):
        m = re.match(r"step (\d+)/\d+\s+loss (\S+)\s+tok/s (\d+)", line)
        if m:
            losses.append(float(m.group(2)))
            if int(m.group(1)) > skip:
                tps.append(float(m.group(3)))
    if not tps:
        return None
    return {"median": statistics.median(tps), "min": min(tps), "max": max(tps), "n": len(tps),
            "first_loss": losses[0], "last_loss": losses[-1]}


def main():
    run = sys.argv[1]
    skip = int(sys.argv[sys.argv.index("--skip") + 1]) if "--skip" in sys.argv else 5
    rows = []
    for log in sorted(glob.glob(os.path.join(run, "kiln_*.log"))):
        preset = os.path.basename(log)[len("kiln_"):-len(".log")]
        k = kiln_stats(log, skip)
        torch_runs = {}
        for j in glob.glob(os.path.join(run, f"torch_*_{preset}.json")):
            d = json.loads(open(j).read().strip().splitlines()[-1])
            torch_runs[d["mode"]] = d
        rows.append((preset, k, torch_runs))
    print("| preset | kiln tok/s median (min-max, n) | kiln loss first -> last | torch eager tok/s median (min-max) | kiln / eager |")
    print("|---|---|---|---|---|")
    for preset, k, t in rows:
        e = t.get("eager")
        kt = f"{k['median']:.0f} ({k['min']:.0f}-{k['max']:.0f}, {k['n']})" if k else "failed"
        kl = f"{k['first_loss']:.4f} -> {k['last_loss']:.4f}" if k else "-"
        et = f"{e['tok_per_s_median']:.0f} ({e['tok_per_s_min']:.0f}-{e['tok_per_s_max']:.0f})" if e else "-"
        ratio = f"{k['median'] / e['tok_per_s_median']:.3f}" if (k and e) else "-"
        print(f"| {preset} | {kt} | {kl} | {et} | {ratio} |")


if __name__ == "__main__":
    main()
