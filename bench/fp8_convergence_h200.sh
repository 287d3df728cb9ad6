#!/usr/bin/env bash
# FP8 against bf16 convergence on the GPU machine (issue 14): for each seed, `kiln train
# PRESET` twice from it (same initial weights, same batches, same schedule), --precision bf16
# and --precision fp8, holding out the corpus's last tenth and evaluating on it every EVAL
# steps; then bench/fp8_convergence.py prints the loss curves (the first seed's) every 25
# steps, every seed's final training and held-out losses, and checks they agree within 1%
# (with several seeds, their means) and that no step was lost or NaN.
#   KILN=.carry/bin/kiln OUT_DIR=/tmp/conv PRESET=llama-M STEPS=500 SEEDS="1337 11 12" bash bench/fp8_convergence_h200.sh
# Knobs: PRESET (llama-M), STEPS (500), SEEDS (1337), LR (1e-3: llama-M's loss spikes at kiln's
# default 3e-3), EVERY (25), EVAL (100; 0: no held-out split), KILN_FLAGS (extra flags for
# both runs), PARALLEL (1: the runs at once).
set -uo pipefail
cd "$(dirname "$0")/.."
KILN=${KILN:-build/kiln}
OUT_DIR=${OUT_DIR:-/tmp/kiln-fp8-convergence}
PRESET=${PRESET:-llama-M}
STEPS=${STEPS:-500}
SEEDS=${SEEDS:-${SEED:-1337}}
LR=${LR:-1e-3}
EVERY=${EVERY:-25}
EVAL=${EVAL:-100}
mkdir -p "$OUT_DIR"
# The runs go concurrently (one H200 holds four llama-M runs: 210 s for four 500-step runs
# against about 4 x 90 s one after another); each has its own kernel cache unless
# KILN_CACHE_DIR names one (the cache writes each entry atomically, so sharing one is safe,
# only less parallel). PARALLEL=0 runs them one after another.
PARALLEL=${PARALLEL:-1}
logs=()
pids=()
run_one() {  # seed precision log
  local t0
  t0=$(date +%s)
  # shellcheck disable=SC2086  # KILN_FLAGS is a list of flags
  KILN_CACHE_DIR=${KILN_CACHE_DIR:-$OUT_DIR/kernel-cache.$2.$1} \
    "$KILN" train "$PRESET" --backend cuda --steps "$STEPS" --seed "$1" --lr "$LR" --precision "$2" \
    --eval-every "$EVAL" ${KILN_FLAGS:-} > "$3" 2>&1 ||
    echo "fp8_convergence: kiln train $PRESET --precision $2 --seed $1 failed (see $3)"
  echo "fp8_convergence: $PRESET $2 seed $1: $(($(date +%s) - t0)) s"
}
for seed in $SEEDS; do
  for precision in bf16 fp8; do
    log="$OUT_DIR/$precision.seed$seed.log"
    logs+=("$log")
    if ((PARALLEL)); then
      run_one "$seed" "$precision" "$log" &
      pids+=($!)
    else
      run_one "$seed" "$precision" "$log"
    fi
  done
done
for pid in "${pids[@]}"; do wait "$pid"; done
python3 bench/fp8_convergence.py "${logs[@]}" --every "$EVERY" | tee "$OUT_DIR/summary.md"
exit "${PIPESTATUS[0]}"
