#!/usr/bin/env bash
# The decode step's paged attention on the H200, kiln against PyTorch in one run:
# bench/paged_attention_bench (kiln's split kernel in each of GEOMETRIES, built by CMake on a
# machine with Abseil and carried: the GPU machine has none) and bench/paged_attention_torch.py
# (torch SDPA over the same keys held densely), at llama-M's heads; then one table.
#   PAGED_ATTENTION_BENCH=.carry/paged_attention_bench bash bench/paged_attention_h200.sh
# Knobs: BATCHES=1,32 KEYS=640 CONTEXT=768 GEOMETRIES=(the bench's default) ITERS=50 WARMUP=5
# OUT_DIR=/tmp/kiln-paged-attention PYTHON=python3. Exit 1 (and a last line saying FAILED) when
# the bench's self-check fails (kiln's O against the reference) or either side cannot run.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
common=$here/h200_common.sh
[[ -f $common ]] || common=$here/../bench/h200_common.sh
# shellcheck source=bench/h200_common.sh
source "$common" || exit 1
BENCH=${PAGED_ATTENTION_BENCH:-$(h200_bench paged_attention_bench)}
BATCHES=${BATCHES:-1,32}
KEYS=${KEYS:-640}
CONTEXT=${CONTEXT:-768}
ITERS=${ITERS:-50}
WARMUP=${WARMUP:-5}
OUT_DIR=${OUT_DIR:-/tmp/kiln-paged-attention}
PYTHON=${PYTHON:-python3}
geometry_args=()
[[ -n ${GEOMETRIES:-} ]] && geometry_args=(--geometries "$GEOMETRIES")
h200_setup
h200_run paged_attention_bench "$OUT_DIR/kiln.jsonl" "$OUT_DIR/kiln.log" \
  "$BENCH" --batches "$BATCHES" --keys "$KEYS" --context "$CONTEXT" --iters "$ITERS" --warmup "$WARMUP" \
  "${geometry_args[@]}"
h200_run paged_attention_torch.py "$OUT_DIR/torch.jsonl" "$OUT_DIR/torch.log" \
  "$PYTHON" "$here/paged_attention_torch.py" --batches "$BATCHES" --keys "$KEYS" --iters "$ITERS" --warmup "$WARMUP"
head -1 "$OUT_DIR/kiln.log" 2>/dev/null
grep "not run" "$OUT_DIR/torch.log" 2>/dev/null
"$PYTHON" - "$OUT_DIR/kiln.jsonl" "$OUT_DIR/torch.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for f in sys.argv[1:] for l in open(f) if l.strip()]
print(f"{'batch':>5} {'implementation':<40} {'median us':>9} {'min':>8} {'max':>8} {'GB/s':>6} {'max err':>8}")
for r in sorted(rows, key=lambda r: (r["batch"], r["median_us"])):
    print(f"{r['batch']:>5} {r['impl']:<40} {r['median_us']:>9.2f} {r['min_us']:>8.2f} {r['max_us']:>8.2f} "
          f"{r['gbps']:>6.0f} {r['max_err']:>8.2g}")
PY
h200_finish paged_attention_h200.sh
