#!/usr/bin/env bash
# Attention on the H200, kiln against PyTorch in one run: bench/attention_bench (kiln's wgmma and
# mma.sync forwards and its forward+backward, built by CMake on a machine with Abseil and
# carried: the GPU machine has none) and bench/attention_torch.py (torch SDPA's flash and cuDNN
# backends), on the shapes S, M and L of DESIGN.md's attention bar; then one table.
#   ATTENTION_BENCH=.carry/attention_bench bash bench/run_attention_h200.sh
# The script finds attention_torch.py beside itself, and attention_bench there too when
# ATTENTION_BENCH is unset and there is one (a folder carried with the three files works);
# bench/h200_common.sh (what the run_*_h200.sh scripts share) beside itself too, else in the
# repo's bench/ (for a carried folder at the repo's root).
# Knobs: SHAPES=S,M,L ITERS=20 WARMUP=3 OUT_DIR=/tmp/kiln-attention PYTHON=python3.
# Exit 1 (and a last line saying FAILED) when attention_bench's self-check fails (kiln's O
# against the reference and the two forwards against each other) or either side cannot run.
# attention_bench links libnvrtc and libcublasLt dynamically: LD_LIBRARY_PATH gets
# /usr/local/cuda/lib64 when it is there.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
common=$here/h200_common.sh
[[ -f $common ]] || common=$here/../bench/h200_common.sh
# shellcheck source=bench/h200_common.sh
source "$common" || exit 1
BENCH=${ATTENTION_BENCH:-$(h200_bench attention_bench)}
SHAPES=${SHAPES:-S,M,L}
ITERS=${ITERS:-20}
WARMUP=${WARMUP:-3}
OUT_DIR=${OUT_DIR:-/tmp/kiln-attention}
PYTHON=${PYTHON:-python3}
h200_setup
h200_run attention_bench "$OUT_DIR/kiln.jsonl" "$OUT_DIR/kiln.log" \
  "$BENCH" --shapes "$SHAPES" --iters "$ITERS" --warmup "$WARMUP"
h200_run attention_torch.py "$OUT_DIR/torch.jsonl" "$OUT_DIR/torch.log" \
  "$PYTHON" "$here/attention_torch.py" --shapes "$SHAPES" --iters "$ITERS" --warmup "$WARMUP"
head -1 "$OUT_DIR/kiln.log" "$OUT_DIR/torch.log" 2>/dev/null | grep -v '^==>' | grep -v '^$'
"$PYTHON" - "$OUT_DIR/kiln.jsonl" "$OUT_DIR/torch.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for f in sys.argv[1:] for l in open(f) if l.strip()]
def err(r):
    ref = "" if r["max_err_ref"] is None else f"{r['max_err_ref']:.2g}"
    return ref, f"{r['max_err_vs']:.2g} ({r['vs']})"
print(f"{'shape':<24} {'implementation':<36} {'median ms':>9} {'min':>8} {'max':>8} {'TFLOP/s':>8}  "
      f"{'err vs ref':>10}  err vs")
for shape in ("S", "M", "L"):
    for r in (r for r in rows if r["shape"] == shape):
        label = f"{shape} B{r['b']} H{r['h']} KV{r['hkv']} T{r['t']} D{r['d']}"
        ref, vs = err(r)
        print(f"{label:<24} {r['impl']:<36} {r['median_ms']:9.3f} {r['min_ms']:8.3f} {r['max_ms']:8.3f} "
              f"{r['tflops']:8.1f}  {ref:>10}  {vs}")
PY
h200_finish run_attention_h200
