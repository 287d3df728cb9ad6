#!/usr/bin/env python3
"""Serving workloads for `kiln generate --prompts FILE.jsonl` (issue 15's measurements), and the
summary of the runs bench/serve_h200.sh makes of them.

    serve_workload.py mixed OUT --requests 256 --prompt 64:1024 --output 32:512 --vocab 32000 --seed 1
        one request a line, prompt lengths and output budgets uniform over the ranges (inclusive),
        tokens uniform over [0, vocab); the same arguments write the same file
    serve_workload.py shared OUT --requests 64 --prefix 512 --suffix 64 --output 64 --vocab 32000 --seed 1
        every request the same PREFIX tokens, then SUFFIX tokens of its own
    serve_workload.py single OUT --requests 4 --prompt 2048 --output 1 --vocab 32000 --seed 1
        requests of one prompt length (the prefill measurement: run one at a time, so that each
        prefill is one call of its own and the first call's warm-up is averaged over several)
    serve_workload.py summarize DIR
        the markdown tables of DIR's logs (prefill_P.log, mixed.log, shared.log,
        shared_nocache.log); exits 1 when a log lacks kiln generate's figures

The summary reads the two figure lines `kiln generate` writes on stderr: "prefill N tokens in
S s (R tok/s, C from the prefix cache), decode ..." and "K requests, P prompt tokens (C from
the prefix cache: H%), G new tokens in W s: T tok/s new".
"""
import json
import os
import random
import re
import sys

PREFILL_RE = re.compile(r"prefill (\d+) tokens in ([0-9.]+) s \((\d+|-) tok/s, (\d+) from the prefix cache\), "
                        r"decode (\d+) tokens in ([0-9.]+) s")
SUMMARY_RE = re.compile(r"(\d+) requests?, (\d+) prompt tokens \((\d+) from the prefix cache: ([0-9.]+)%\), (\d+) new "
                        r"tokens in ([0-9.]+) s: (\d+|-) tok/s new")


def parse_range(text):
    lo, _, hi = text.partition(":")
    lo, hi = int(lo), int(hi or lo)
    if lo < 1 or hi < lo:
        raise ValueError(f"range {text!r}: expected LO:HI with 1 <= LO <= HI")
    return lo, hi


def mixed(requests, prompt, output, vocab, seed):
    rng = random.Random(seed)
    return [{"tokens": [rng.randrange(vocab) for _ in range(rng.randint(*prompt))],
             "max_new_tokens": rng.randint(*output)} for _ in range(requests)]


def shared(requests, prefix, suffix, output, vocab, seed):
    rng = random.Random(seed)
    common = [rng.randrange(vocab) for _ in range(prefix)]
    return [{"tokens": common + [rng.randrange(vocab) for _ in range(suffix)], "max_new_tokens": output}
            for _ in range(requests)]


def write_jsonl(path, rows):
    with open(path, "w") as f:
        for r in rows:
            f.write(json.dumps(r, separators=(",", ":")) + "\n")


def read_figures(path):
    """The prefill/decode line's and the summary line's numbers, or None where absent."""
    prefill = summary = None
    try:
        with open(path, errors="replace") as f:
            text = f.read()
    except OSError:
        return None, None
    m = PREFILL_RE.search(text)
    if m:
        prefill = {"prefill_tokens": int(m.group(1)), "prefill_s": float(m.group(2)),
                   "cached_tokens": int(m.group(4)), "decode_tokens": int(m.group(5)), "decode_s": float(m.group(6))}
    m = SUMMARY_RE.search(text)
    if m:
        summary = {"requests": int(m.group(1)), "prompt_tokens": int(m.group(2)), "cached_tokens": int(m.group(3)),
                   "hit_rate": float(m.group(4)) / 100, "new_tokens": int(m.group(5)), "seconds": float(m.group(6))}
    return prefill, summary


def summarize(run):
    lines, ok = [], True
    prefills = sorted((int(m.group(1)), os.path.join(run, name)) for name in os.listdir(run)
                      for m in [re.fullmatch(r"prefill_(\d+)\.log", name)] if m)
    if prefills:
        lines += ["| prompt length | requests | prefill s (all of them) | prefill tok/s |", "|---|---|---|---|"]
        for length, path in prefills:
            p, s = read_figures(path)
            if not p or not s:
                lines.append(f"| {length} | failed | | |")
                ok = False
                continue
            rate = f"{p['prefill_tokens'] / p['prefill_s']:,.0f}" if p["prefill_s"] > 0 else "-"
            lines.append(f"| {length} | {s['requests']} | {p['prefill_s']:.4f} | {rate} |")
        lines.append("")
    rows = [("mixed", "mixed workload"), ("shared", "shared prefix, prefix cache on"),
            ("shared_nocache", "shared prefix, --no-prefix-cache")]
    table = []
    figures = {}
    for key, label in rows:
        path = os.path.join(run, f"{key}.log")
        if not os.path.exists(path):
            continue
        p, s = read_figures(path)
        if not p or not s:
            table.append(f"| {label} | failed | | | | |")
            ok = False
            continue
        figures[key] = (p, s)
        rate = s["new_tokens"] / s["seconds"] if s["seconds"] > 0 else float("nan")
        table.append(f"| {label} | {s['requests']} | {s['prompt_tokens']:,} ({s['hit_rate']:.1%} cached) | "
                     f"{s['new_tokens']:,} | {s['seconds']:.3f} | {rate:,.0f} |")
    if table:
        lines += ["| workload | requests | prompt tokens | new tokens | wall s | new tok/s |", "|---|---|---|---|---|---|"]
        lines += table
        lines.append("")
    if "shared" in figures and "shared_nocache" in figures:
        (pc, sc), (pn, sn) = figures["shared"], figures["shared_nocache"]
        saved = sn["seconds"] - sc["seconds"]
        lines.append(f"prefix cache: {sc['hit_rate']:.1%} of the prompt tokens served from it; prefill "
                     f"{pn['prefill_s']:.3f} s -> {pc['prefill_s']:.3f} s, wall {sn['seconds']:.3f} s -> "
                     f"{sc['seconds']:.3f} s ({saved:+.3f} s saved, {saved / sn['seconds']:.1%})"
                     if sn["seconds"] > 0 else "prefix cache: no time measured")
        if sc["new_tokens"] != sn["new_tokens"]:
            lines.append(f"FAIL: the shared-prefix runs generated {sc['new_tokens']} and {sn['new_tokens']} tokens")
            ok = False
    if not lines:
        lines.append(f"FAIL: no kiln generate logs in {run}")
        ok = False
    return lines, ok


def main(argv):
    if len(argv) < 3 or argv[1] not in ("mixed", "shared", "single", "summarize"):
        print(__doc__, file=sys.stderr)
        return 2
    mode, target = argv[1], argv[2]
    if mode == "summarize":
        lines, ok = summarize(target)
        print("\n".join(lines))
        return 0 if ok else 1
    opts = {"--requests": "1", "--prompt": "512", "--output": "1", "--vocab": "32000", "--seed": "1",
            "--prefix": "512", "--suffix": "64"}
    rest = argv[3:]
    for i in range(0, len(rest), 2):
        if rest[i] not in opts or i + 1 >= len(rest):
            print(f"serve_workload.py: unknown or incomplete option {rest[i]!r}", file=sys.stderr)
            return 2
        opts[rest[i]] = rest[i + 1]
    vocab, seed, requests = int(opts["--vocab"]), int(opts["--seed"]), int(opts["--requests"])
    if mode == "mixed":
        rows = mixed(requests, parse_range(opts["--prompt"]), parse_range(opts["--output"]), vocab, seed)
    elif mode == "shared":
        rows = shared(requests, int(opts["--prefix"]), int(opts["--suffix"]), int(opts["--output"]), vocab, seed)
    else:
        rows = mixed(requests, parse_range(opts["--prompt"]), parse_range(opts["--output"]), vocab, seed)
    write_jsonl(target, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
