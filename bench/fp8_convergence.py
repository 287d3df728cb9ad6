#!/usr/bin/env python3
"""FP8 against bf16 convergence (issue 14): two `kiln train` logs of the same preset, seed and
steps (bench/fp8_convergence_h200.sh runs them), one under --precision bf16 and one under
--precision fp8. Prints the loss curves every EVERY steps (each point the mean of the EVERY
steps up to it, so that one batch's noise does not decide the comparison), the final losses
(mean of the last EVERY steps) and their relative difference, and checks: every step ran
(no step missing, no NaN or inf loss) and the final losses agree within TOLERANCE.
Usage:
    python3 bench/fp8_convergence.py BF16_LOG FP8_LOG [--every 25] [--tolerance 0.01]
Exits 1 when a check fails, after printing everything.
"""
import math
import re
import sys

STEP_RE = re.compile(r"step (\d+)/(\d+)\s+loss (\S+)\s+tok/s (\d+(?:\.\d+)?)")


def losses(path):
    """step -> loss, and the run's total step count."""
    out, total = {}, None
    with open(path, errors="replace") as f:
        for line in f:
            for part in line.split("\r"):
                m = STEP_RE.search(part)
                if m:
                    out[int(m.group(1))] = float(m.group(3))
                    total = int(m.group(2))
    return out, total


def main(argv):
    args = [a for a in argv[1:]]
    every, tolerance = 25, 0.01
    if "--every" in args:
        i = args.index("--every")
        every = int(args[i + 1])
        del args[i:i + 2]
    if "--tolerance" in args:
        i = args.index("--tolerance")
        tolerance = float(args[i + 1])
        del args[i:i + 2]
    if len(args) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    runs = {}
    failures = []
    for name, path in (("bf16", args[0]), ("fp8", args[1])):
        l, total = losses(path)
        runs[name] = l
        if not l:
            failures.append(f"{name}: no step lines in {path}")
            continue
        missing = [s for s in range(1, (total or 0) + 1) if s not in l]
        if missing:
            failures.append(f"{name}: {len(missing)} steps missing (first {missing[0]}): the run stopped or skipped")
        bad = [s for s, v in l.items() if not math.isfinite(v)]
        if bad:
            failures.append(f"{name}: non-finite loss at steps {bad[:5]}")
    n = min(max(runs["bf16"], default=0), max(runs["fp8"], default=0))

    def window_mean(l, end):
        vals = [l[s] for s in range(max(1, end - every + 1), end + 1) if s in l]
        return sum(vals) / len(vals) if vals else float("nan")

    print(f"loss, mean over the {every} steps up to each step: bf16 | fp8 | fp8 / bf16 - 1")
    print()
    print("| step | bf16 | fp8 | rel |")
    print("|---|---|---|---|")
    for end in list(range(every, n + 1, every)) or [n]:
        b, q = window_mean(runs["bf16"], end), window_mean(runs["fp8"], end)
        print(f"| {end} | {b:.4f} | {q:.4f} | {q / b - 1:+.2%} |")
    if n:
        b, q = window_mean(runs["bf16"], n), window_mean(runs["fp8"], n)
        rel = abs(q - b) / abs(b)
        print()
        print(f"final loss (mean of the last {every} steps): bf16 {b:.4f}, fp8 {q:.4f}, "
              f"relative difference {rel:.2%} (tolerance {tolerance:.0%})")
        if not rel <= tolerance:
            failures.append(f"final losses differ by {rel:.2%} > {tolerance:.0%}")
    for f in failures:
        print(f"FAIL: {f}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
