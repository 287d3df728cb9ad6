#!/usr/bin/env python3
"""FP8 against bf16 convergence (issue 14): pairs of `kiln train` logs of the same preset, seed
and steps (bench/fp8_convergence_h200.sh runs them), one under --precision bf16 and one under
--precision fp8, one pair per seed. For the first pair it prints the loss curves every EVERY
steps (each point the mean of the EVERY steps up to it, so that one batch's noise does not
decide the comparison); for every pair the final training loss (mean of the last EVERY steps)
and, when the runs evaluated (--eval-every), the last held-out loss, with their relative
differences; with several pairs, the means over the seeds. Checks: every step ran (no step
missing, no NaN or inf loss) and the final losses agree within TOLERANCE: each pair's, or with
several pairs the seeds' means (one run's loss moves by more than 1% from seed to seed, so the
bar is the policies' difference, not one draw's).
Usage:
    python3 bench/fp8_convergence.py BF16_LOG FP8_LOG [BF16_LOG FP8_LOG ...] [--every 25] [--tolerance 0.01]
Exits 1 when a check fails, after printing everything.
"""
import math
import re
import sys

STEP_RE = re.compile(r"step (\d+)/(\d+)\s+loss (\S+)\s+tok/s (\d+(?:\.\d+)?)")
EVAL_RE = re.compile(r"eval step (\d+)\s+held-out loss (\S+)")


def read_log(path):
    """(step -> loss, the run's total step count, eval step -> held-out loss)."""
    out, total, evals = {}, None, {}
    with open(path, errors="replace") as f:
        for line in f:
            for part in line.split("\r"):
                m = STEP_RE.search(part)
                if m:
                    out[int(m.group(1))] = float(m.group(3))
                    total = int(m.group(2))
                m = EVAL_RE.search(part)
                if m:
                    evals[int(m.group(1))] = float(m.group(2))
    return out, total, evals


def losses(path):
    """step -> loss, and the run's total step count."""
    out, total, _ = read_log(path)
    return out, total


def rel(q, b):
    return q / b - 1 if b else float("nan")


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
    if len(args) < 2 or len(args) % 2:
        print(__doc__, file=sys.stderr)
        return 2
    failures = []

    def window_mean(l, end):
        vals = [l[s] for s in range(max(1, end - every + 1), end + 1) if s in l]
        return sum(vals) / len(vals) if vals else float("nan")

    finals = []  # per pair: (label, bf16 final, fp8 final, bf16 held-out, fp8 held-out)
    for p in range(0, len(args), 2):
        runs, evals = {}, {}
        label = args[p + 1]
        for name, path in (("bf16", args[p]), ("fp8", args[p + 1])):
            l, total, e = read_log(path)
            runs[name], evals[name] = l, e
            if not l:
                failures.append(f"{name}: no step lines in {path}")
                continue
            missing = [s for s in range(1, (total or 0) + 1) if s not in l]
            if missing:
                failures.append(f"{name} ({path}): {len(missing)} steps missing (first {missing[0]}): "
                                "the run stopped or skipped")
            bad = [s for s, v in l.items() if not math.isfinite(v)]
            if bad:
                failures.append(f"{name} ({path}): non-finite loss at steps {bad[:5]}")
        n = min(max(runs["bf16"], default=0), max(runs["fp8"], default=0))
        if p == 0:
            print(f"loss, mean over the {every} steps up to each step: bf16 | fp8 | fp8 / bf16 - 1")
            print()
            print("| step | bf16 | fp8 | rel |")
            print("|---|---|---|---|")
            for end in list(range(every, n + 1, every)) or [n]:
                b, q = window_mean(runs["bf16"], end), window_mean(runs["fp8"], end)
                print(f"| {end} | {b:.4f} | {q:.4f} | {rel(q, b):+.2%} |")
            shared = sorted(set(evals["bf16"]) & set(evals["fp8"]))
            if shared:
                print()
                print("held-out loss (--eval-every): bf16 | fp8 | fp8 / bf16 - 1")
                print()
                print("| step | bf16 | fp8 | rel |")
                print("|---|---|---|---|")
                for s in shared:
                    b, q = evals["bf16"][s], evals["fp8"][s]
                    print(f"| {s} | {b:.4f} | {q:.4f} | {rel(q, b):+.2%} |")
        if not n:
            continue
        b, q = window_mean(runs["bf16"], n), window_mean(runs["fp8"], n)
        shared = sorted(set(evals["bf16"]) & set(evals["fp8"]))
        hb, hq = (evals["bf16"][shared[-1]], evals["fp8"][shared[-1]]) if shared else (None, None)
        finals.append((label, b, q, hb, hq))

    print()
    print(f"final losses: training (mean of the last {every} steps) and the last held-out evaluation")
    print()
    print("| fp8 log | bf16 | fp8 | rel | held-out bf16 | held-out fp8 | rel |")
    print("|---|---|---|---|---|---|---|")
    for label, b, q, hb, hq in finals:
        held = f"{hb:.4f} | {hq:.4f} | {rel(hq, hb):+.2%}" if hb is not None else "- | - | -"
        print(f"| {label} | {b:.4f} | {q:.4f} | {rel(q, b):+.2%} | {held} |")

    def check(what, b, q):
        r = abs(q - b) / abs(b)
        print(f"{what}: bf16 {b:.4f}, fp8 {q:.4f}, relative difference {r:.2%} (tolerance {tolerance:.0%})")
        if not r <= tolerance:
            failures.append(f"{what}: final losses differ by {r:.2%} > {tolerance:.0%}")

    print()
    if len(finals) == 1:
        _, b, q, hb, hq = finals[0]
        check(f"final loss (mean of the last {every} steps)", b, q)
        if hb is not None:
            check("final held-out loss", hb, hq)
    elif finals:
        mean = lambda xs: sum(xs) / len(xs)  # noqa: E731
        check(f"final loss, mean over {len(finals)} seeds", mean([f[1] for f in finals]), mean([f[2] for f in finals]))
        held = [f for f in finals if f[3] is not None]
        if len(held) == len(finals):
            check(f"final held-out loss, mean over {len(finals)} seeds", mean([f[3] for f in held]),
                  mean([f[4] for f in held]))
    for f in failures:
        print(f"FAIL: {f}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
