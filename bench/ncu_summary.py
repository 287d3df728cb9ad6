#!/usr/bin/env python3
"""Where one call of a kiln executable spends its GPU time, from an Nsight Compute CSV:

    ncu --clock-control none --csv --print-units base \\
        --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum CMD > ncu.csv
    python3 bench/ncu_summary.py ncu.csv [--from-last gather]

kiln's kernels are named k_<node>_<op> (codegen/kernel_source.cc), so the kernels group by
op and grid (one GEMV shape per grid). The call is the kernels from the last launch of the
--from-last op on (a decode call opens with the embedding gather; prefill does too, so the last
gather starts the last decode call). Each row: launches, total and per-launch microseconds,
DRAM megabytes read and written per launch, and GB/s. Each kernel runs alone with cold
caches under ncu, so small kernels read longer than in the CUDA graph: compare rows, and
variants, not the total with the step time. bench/profile_decode_h200.sh runs it."""
import argparse
import collections
import csv
import re
import sys

TIME, READ, WRITE = "gpu__time_duration.sum", "dram__bytes_read.sum", "dram__bytes_write.sum"


def read_kernels(lines):
    """The profiled kernels in launch order: dicts of name, grid and the metrics (floats)."""
    kernels = collections.OrderedDict()
    for row in csv.DictReader(line for line in lines if line.startswith('"')):
        k = kernels.setdefault(row["ID"], {"name": row["Kernel Name"], "grid": row.get("Grid Size", "")})
        try:
            k[row["Metric Name"]] = float(row["Metric Value"].replace(",", ""))
        except ValueError:
            k[row["Metric Name"]] = float("nan")
    return list(kernels.values())


def op_of(name):
    """k_146_gemm -> gemm; k_162_kv_cache_write_copy -> kv_cache_write_copy; others as named."""
    m = re.match(r"k_[A-Za-z0-9]+?_([a-z][a-z0-9_]*)$", name.split("(")[0])
    return m.group(1) if m else name.split("(")[0][:40]


def last_call(kernels, first_op):
    starts = [i for i, k in enumerate(kernels) if op_of(k["name"]) == first_op]
    return kernels[starts[-1]:] if starts else kernels


def summarize(kernels):
    """Rows (op, grid, launches, total ns, read bytes, written bytes), largest total first."""
    groups = collections.OrderedDict()
    for k in kernels:
        g = groups.setdefault((op_of(k["name"]), k["grid"]), [0, 0.0, 0.0, 0.0])
        g[0] += 1
        g[1] += k.get(TIME, 0.0)
        g[2] += k.get(READ, 0.0)
        g[3] += k.get(WRITE, 0.0)
    rows = [(op, grid, *v) for (op, grid), v in groups.items()]
    return sorted(rows, key=lambda r: -r[3])


def format_table(rows):
    total = sum(r[3] for r in rows)
    out = [f"{sum(r[2] for r in rows)} kernels, {total / 1e3:.1f} us (each alone, cold caches)",
           f"{'op':<28} {'grid':<14} {'n':>4} {'us':>8} {'us each':>8} {'MB rd':>8} {'MB wr':>7} {'GB/s':>6}"]
    for op, grid, n, t, rd, wr in rows:
        gbps = (rd + wr) / t if t > 0 else 0.0
        out.append(f"{op:<28} {grid:<14} {n:>4} {t / 1e3:>8.1f} {t / n / 1e3:>8.2f} {rd / n / 1e6:>8.2f} "
                   f"{wr / n / 1e6:>7.2f} {gbps:>6.0f}")
    return "\n".join(out)


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("csv")
    parser.add_argument("--from-last", default="gather", help="the op whose last launch opens the call")
    args = parser.parse_args(argv)
    with open(args.csv) as f:
        kernels = read_kernels(f)
    if not kernels:
        print(f"ncu_summary: no kernels in {args.csv}", file=sys.stderr)
        return 1
    print(format_table(summarize(last_call(kernels, args.from_last))))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
