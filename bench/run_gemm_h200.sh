#!/usr/bin/env bash
# GEMMs on the H200: bench/gemm_bench (cuBLASLt bf16 against FP8 e4m3 x e4m3 -> bf16 through
# kiln's GemmPlan, autotuned, on llama-S's and llama-M's forward projection GEMMs; built by
# CMake on a machine with Abseil and carried: the GPU machine has none), then one table.
#   GEMM_BENCH=.carry/gemm_bench bash bench/run_gemm_h200.sh
# The script finds gemm_bench beside itself when GEMM_BENCH is unset and there is one (a folder
# carried with the two files works), else build/bench/gemm_bench; bench/h200_common.sh (what
# the run_*_h200.sh scripts share) beside itself too, else in the repo's bench/ (for a carried
# folder at the repo's root).
# Knobs: PRESETS=llama-S,llama-M GEMMS=qkv,o,gate_up,down,lm_head ITERS=50 WARMUP=5
# MAX_ERROR=0.02 OUT_DIR=/tmp/kiln-gemm PYTHON=python3.
# Exit 1 (and a last line saying FAILED) when gemm_bench fails: no GPU or no FP8 tensor cores
# (it runs with --require-gpu here), a plan that fails, or an FP8 result further than
# MAX_ERROR (of max |D|) from the bf16 GEMM of the same values.
# gemm_bench links libnvrtc and libcublasLt dynamically: LD_LIBRARY_PATH gets
# /usr/local/cuda/lib64 when it is there.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
common=$here/h200_common.sh
[[ -f $common ]] || common=$here/../bench/h200_common.sh
# shellcheck source=bench/h200_common.sh
source "$common" || exit 1
BENCH=${GEMM_BENCH:-$(h200_bench gemm_bench)}
PRESETS=${PRESETS:-llama-S,llama-M}
GEMMS=${GEMMS:-qkv,o,gate_up,down,lm_head}
ITERS=${ITERS:-50}
WARMUP=${WARMUP:-5}
MAX_ERROR=${MAX_ERROR:-0.02}
OUT_DIR=${OUT_DIR:-/tmp/kiln-gemm}
PYTHON=${PYTHON:-python3}
h200_setup
h200_run gemm_bench "$OUT_DIR/gemm.jsonl" "$OUT_DIR/gemm.log" \
  "$BENCH" --presets "$PRESETS" --gemms "$GEMMS" --iters "$ITERS" --warmup "$WARMUP" --max-error "$MAX_ERROR" --require-gpu
head -1 "$OUT_DIR/gemm.log"
"$PYTHON" - "$OUT_DIR/gemm.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
print(f"{'preset':<8} {'gemm':<8} {'M':>6} {'N':>6} {'K':>6}  {'bf16 TFLOP/s med (min-max)':<28} "
      f"{'fp8 TFLOP/s med (min-max)':<28} {'fp8/bf16':>8}  {'rel err':>8}")
for r in rows:
    b, f = r["bf16_tflops"], r["fp8_tflops"]
    print(f"{r['preset']:<8} {r['gemm']:<8} {r['m']:>6} {r['n']:>6} {r['k']:>6}  "
          f"{b['median']:7.1f} ({b['min']:6.1f}-{b['max']:6.1f})       "
          f"{f['median']:7.1f} ({f['min']:6.1f}-{f['max']:6.1f})       {r['fp8_over_bf16']:7.2f}x  {r['max_rel_err']:8.2g}")
for preset in sorted({r["preset"] for r in rows}):
    sel = [r for r in rows if r["preset"] == preset]
    flops = sum(2.0 * r["m"] * r["n"] * r["k"] for r in sel)
    t16 = sum(r["bf16_us"] for r in sel)
    t8 = sum(r["fp8_us"] for r in sel)
    print(f"{preset}: these {len(sel)} GEMMs, one of each: bf16 {t16:.0f} us ({flops / t16 * 1e-6:.0f} TFLOP/s), "
          f"fp8 {t8:.0f} us ({flops / t8 * 1e-6:.0f} TFLOP/s), {t16 / t8:.2f}x")
PY
h200_finish run_gemm_h200
