#!/usr/bin/env bash
# FP8 against bf16 convergence on the GPU machine (issue 14): `kiln train PRESET` twice from
# the same seed (same initial weights, same batches, same schedule), --precision bf16 and
# --precision fp8, then bench/fp8_convergence.py prints the loss curves every 25 steps and
# checks the final losses agree within 1% and that no step was lost or NaN.
#   KILN=.carry/bin/kiln OUT_DIR=/tmp/conv PRESET=llama-M STEPS=500 bash bench/fp8_convergence_h200.sh
# Knobs: PRESET (llama-M), STEPS (500), SEED (1337), LR (1e-3: llama-M's loss spikes at kiln's
# default 3e-3), EVERY (25), KILN_FLAGS (extra flags for both runs).
set -uo pipefail
cd "$(dirname "$0")/.."
KILN=${KILN:-build/kiln}
OUT_DIR=${OUT_DIR:-/tmp/kiln-fp8-convergence}
PRESET=${PRESET:-llama-M}
STEPS=${STEPS:-500}
SEED=${SEED:-1337}
LR=${LR:-1e-3}
EVERY=${EVERY:-25}
mkdir -p "$OUT_DIR"
export KILN_CACHE_DIR=${KILN_CACHE_DIR:-$OUT_DIR/kernel-cache}
for precision in bf16 fp8; do
  t0=$(date +%s)
  # shellcheck disable=SC2086  # KILN_FLAGS is a list of flags
  "$KILN" train "$PRESET" --backend cuda --steps "$STEPS" --seed "$SEED" --lr "$LR" --precision "$precision" \
    ${KILN_FLAGS:-} > "$OUT_DIR/$precision.log" 2>&1 ||
    echo "fp8_convergence: kiln train $PRESET --precision $precision failed (see $OUT_DIR/$precision.log)"
  echo "fp8_convergence: $PRESET $precision: $(($(date +%s) - t0)) s"
done
python3 bench/fp8_convergence.py "$OUT_DIR/bf16.log" "$OUT_DIR/fp8.log" --every "$EVERY" | tee "$OUT_DIR/summary.md"
exit "${PIPESTATUS[0]}"
