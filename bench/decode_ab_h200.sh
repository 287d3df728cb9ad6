#!/usr/bin/env bash
# A/B of decode configurations on the GPU machine: each configuration is a name and the
# environment it runs under (kiln binaries and switches such as KILN_PDL=0), run in turn
# REPEATS times (A B A B ..., so that a drift of the machine falls on all of them alike)
# through bench/generate_h200.sh without transformers; then per configuration and batch the
# median over the repeats of the decode calls' median, and the spread of those medians.
# Batch 32 moved by 10% between runs of one binary in session 17 (bench/RESULTS.md): decide
# between variants from this table, not from one run each.
#   bash bench/decode_ab_h200.sh "base=KILN=.carry/bin/kiln" "nopdl=KILN=.carry/bin/kiln KILN_PDL=0"
# Knobs: REPEATS=3 BATCHES="1 32" OUT_DIR=/tmp/kiln-decode-ab PYTHON=python3 (the rest, e.g.
# PRESET or NEW, pass through to generate_h200.sh).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
REPEATS=${REPEATS:-3}
BATCHES=${BATCHES:-1 32}
OUT_DIR=${OUT_DIR:-/tmp/kiln-decode-ab}
PYTHON=${PYTHON:-python3}
if [[ $# -lt 1 ]]; then
  echo "usage: bench/decode_ab_h200.sh NAME=ENV... [NAME=ENV...] (ENV: space-separated VAR=VALUE)" >&2
  exit 2
fi
for config in "$@"; do
  if [[ $config != *=* || ${config%%=*} == "" ]]; then
    echo "decode_ab_h200.sh: '$config' is not NAME=ENV" >&2
    exit 2
  fi
done
mkdir -p "$OUT_DIR"
# The table is of call times: no floor, so no copy-bandwidth measurement in every run; one
# kernel cache for every run (each configuration compiles its kernels once, not each repeat).
export COPY_TBS=${COPY_TBS:-nan}
export KILN_CACHE_DIR=${KILN_CACHE_DIR:-$OUT_DIR/kernel-cache}
results="$OUT_DIR/results.txt"
: > "$results"
status=0
for ((r = 1; r <= REPEATS; ++r)); do
  for config in "$@"; do
    name=${config%%=*}
    read -r -a assignments <<< "${config#*=}"
    log="$OUT_DIR/${name}_$r.log"
    if ! env "${assignments[@]}" HF=0 BATCHES="$BATCHES" OUT_DIR="$OUT_DIR/${name}_$r" bash bench/generate_h200.sh > "$log" 2>&1; then
      echo "$name (repeat $r) failed:"; tail -3 "$log"; status=1
    fi
    # "llama-M batch 1, ...: kiln 0.886 ms/step (calls: median 0.880, ...": name, batch, median.
    sed -nE "s/^[^ ]+ batch ([0-9]+),.*calls: median ([0-9.]+|nan),.*/$name \1 \2/p" "$log" >> "$results"
  done
done
"$PYTHON" - "$results" "$@" <<'PY'
import statistics, sys
rows = [l.split() for l in open(sys.argv[1]) if l.strip()]
names = [c.split("=", 1)[0] for c in sys.argv[2:]]
batches = sorted({int(b) for _, b, _ in rows})
print(f"{'configuration':<20} " + " ".join(f"{'batch ' + str(b) + ' ms (min-max)':>26}" for b in batches))
for name in names:
    cells = []
    for b in batches:
        ms = [float(m) for n, bb, m in rows if n == name and int(bb) == b and m != "nan"]
        cells.append(f"{statistics.median(ms):.3f} ({min(ms):.3f}-{max(ms):.3f}) x{len(ms)}" if ms else "failed")
    print(f"{name:<20} " + " ".join(f"{c:>26}" for c in cells))
PY
exit $status
