#!/usr/bin/env bash
# A/B of attention kernel builds on the GPU machine: each configuration is a name and an
# attention_bench binary (built from the commit under test and carried), run in turn REPEATS
# times (A B A B ..., so that a drift of the machine falls on all of them alike), then per
# shape and kiln implementation the median over the repeats of each run's median ms, the
# spread of those medians, and the largest error against the reference any run reported.
# TORCH=1 adds a run of bench/attention_torch.py (SDPA's flash and cuDNN) to every repeat,
# after the builds' runs, tabled the same way (torch's figures move 5-20% between calls, so
# only the same call's are a fair comparison).
#   bash bench/attention_ab_h200.sh main=.carry/attention_bench_main new=.carry/attention_bench
# Knobs: REPEATS=3 SHAPES=S,M,L ITERS=20 WARMUP=3 TORCH=0 OUT_DIR=/tmp/kiln-attention-ab
# PYTHON=python3 RUN_TIMEOUT=300 (seconds a run may take: a kernel that deadlocks costs that
# run, not the whole device call). Exit 1 when a run fails (its self-check included) or times
# out, 2 on bad arguments.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
REPEATS=${REPEATS:-3}
SHAPES=${SHAPES:-S,M,L}
ITERS=${ITERS:-20}
WARMUP=${WARMUP:-3}
TORCH=${TORCH:-0}
OUT_DIR=${OUT_DIR:-/tmp/kiln-attention-ab}
PYTHON=${PYTHON:-python3}
RUN_TIMEOUT=${RUN_TIMEOUT:-300}
if [[ $# -lt 1 ]]; then
  echo "usage: bench/attention_ab_h200.sh NAME=ATTENTION_BENCH... [NAME=ATTENTION_BENCH...]" >&2
  exit 2
fi
for config in "$@"; do
  if [[ $config != *=* || ${config%%=*} == "" || ${config#*=} == "" ]]; then
    echo "attention_ab_h200.sh: '$config' is not NAME=ATTENTION_BENCH" >&2
    exit 2
  fi
done
[[ -d /usr/local/cuda/lib64 ]] && export LD_LIBRARY_PATH=/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
mkdir -p "$OUT_DIR"
export KILN_CACHE_DIR=${KILN_CACHE_DIR:-$OUT_DIR/kernel-cache}
status=0
runs=()
for ((r = 1; r <= REPEATS; ++r)); do
  for config in "$@"; do
    name=${config%%=*}
    out="$OUT_DIR/${name}_$r.jsonl"
    timeout "$RUN_TIMEOUT" "${config#*=}" --shapes "$SHAPES" --iters "$ITERS" --warmup "$WARMUP" > "$out" \
      2> "$OUT_DIR/${name}_$r.log"
    rc=$?
    if [[ $rc == 124 ]]; then
      echo "$name (repeat $r) ran past $RUN_TIMEOUT s (a hang?)"; status=1
    elif [[ $rc != 0 ]]; then
      echo "$name (repeat $r) failed:"; tail -3 "$OUT_DIR/${name}_$r.log"; status=1
    fi
    runs+=("$name=$out")
  done
  # torch in every repeat too, so that its figure is a median over the same drift.
  if [[ $TORCH == 1 ]]; then
    if ! "$PYTHON" bench/attention_torch.py --shapes "$SHAPES" --iters "$ITERS" --warmup "$WARMUP" \
        > "$OUT_DIR/torch_$r.jsonl" 2> "$OUT_DIR/torch_$r.log"; then
      echo "attention_torch.py failed:"; tail -3 "$OUT_DIR/torch_$r.log"; status=1
    fi
    runs+=("torch=$OUT_DIR/torch_$r.jsonl")
  fi
done
"$PYTHON" - "${runs[@]}" <<'PY' || status=1
import collections, json, statistics, sys
ms = collections.defaultdict(list)   # (shape, impl, config) -> each run's median ms
err = collections.defaultdict(float)
order = []
for arg in sys.argv[1:]:
    name, path = arg.split("=", 1)
    if name not in order:
        order.append(name)
    try:
        lines = [l for l in open(path) if l.startswith("{")]
    except OSError:
        continue
    for line in lines:
        r = json.loads(line)
        key = (r["shape"], r["impl"], name)
        ms[key].append(r["median_ms"])
        if r.get("max_err_ref") is not None:
            err[key] = max(err[key], r["max_err_ref"])
print(f"{'shape':<6} {'implementation':<32} {'configuration':<16} {'median ms':>9} {'min-max of runs':>17} {'runs':>4} {'err vs ref':>10}")
for shape in ("S", "M", "L"):
    for impl in dict.fromkeys(k[1] for k in ms if k[0] == shape):
        for name in order:
            v = ms.get((shape, impl, name))
            if not v:
                continue
            e = f"{err[(shape, impl, name)]:.2g}" if (shape, impl, name) in err else ""
            print(f"{shape:<6} {impl:<32} {name:<16} {statistics.median(v):9.3f} "
                  f"{min(v):8.3f}-{max(v):<8.3f} {len(v):>4} {e:>10}")
PY
echo "attention_ab_h200: $([[ $status == 0 ]] && echo OK || echo FAILED)"
exit "$status"
