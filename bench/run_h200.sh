#!/usr/bin/env bash
# The benchmark of DESIGN.md's bar, in one run on the GPU machine: for llama-S and llama-M,
# kiln and PyTorch (eager and torch.compile) train the same model from the same initial
# weights on the same batches with the same learning rates:
#   1. `kiln export-inputs` writes kiln's initial weights (safetensors), batches and schedule;
#   2. `kiln train --backend cuda` runs from the same seed (so the same weights and batches);
#   3. bench/torch_llama.py --inputs runs eager, then torch.compile, on the exported files;
#   4. bench/summarize.py prints the tables (tok/s, ratios, MFU, peak memory, time to first
#      step) and checks that the first losses agree (exit 1 when they do not, or a run failed).
# kiln comes prebuilt (the GPU machine has no Abseil): KILN=path/to/kiln. Logs, JSON and the
# summary land in OUT_DIR. About 5-6 minutes on the H200 (torch.compile of llama-M alone
# takes ~80 s to its first step).
#   KILN=.carry/bench/kiln OUT_DIR=/tmp/kiln-bench bash bench/run_h200.sh
# GPT-2 (issue 16): PRESETS="gpt2-124M gpt2-350M" runs the same comparison against
# bench/torch_gpt2.py (nanoGPT's model, kiln's gpt2 presets exactly) at batch 16 x T 1024
# (GPT2_BATCH=16: gpt2-350M's preset batch is 8, so kiln and export-inputs get --batch); a
# preset's family picks the PyTorch script, so llama and gpt2 presets can share one run.
# Knobs: PRESETS="llama-S llama-M", WARMUP=5, STEPS=30 (timed steps after the warm-up),
# SEED=1337, MODES="eager compile", KEEP_WEIGHTS=1 keeps the exported safetensors (3.5 GB
# for llama-M), KILN_COMMIT names the commit kiln was built from (default: this tree's),
# LR=X the peak learning rate of both sides' schedule (default kiln's, 3e-3: llama-M's loss
# spikes at it, which makes its curves a poor comparison; LR=1e-3 is calmer), KILN_FLAGS
# extra flags for `kiln train` alone (e.g. "--lm-head-chunk-rows 4096"), FP8=1 also trains kiln
# with --precision fp8 on the same steps and batches (kilnfp8_P.log: summarize.py's FP8 table).
set -uo pipefail
cd "$(dirname "$0")/.."
KILN=${KILN:-build/kiln}
OUT_DIR=${OUT_DIR:-/tmp/kiln-bench}
PRESETS=${PRESETS:-llama-S llama-M}
WARMUP=${WARMUP:-5}
STEPS=${STEPS:-30}
SEED=${SEED:-1337}
MODES=${MODES:-eager compile}
TOTAL=$((WARMUP + STEPS))
PYTHON=${PYTHON:-python3}
mkdir -p "$OUT_DIR"
rm -f "$OUT_DIR"/kiln_*.log "$OUT_DIR"/kilnfp8_*.log "$OUT_DIR"/torch_*.json "$OUT_DIR"/torch_*.log "$OUT_DIR"/export_*.log
export KILN_CACHE_DIR=${KILN_CACHE_DIR:-$OUT_DIR/kernel-cache}
export PYTHONUNBUFFERED=1

# The commit kiln was built from (`kiln version`; "-dirty" with uncommitted changes): a
# carried binary runs in a checkout of another commit. The checkout's for a kiln without it.
if [ -n "${KILN_COMMIT:-}" ]; then
  commit=$KILN_COMMIT
elif commit=$("$KILN" version 2>/dev/null | awk 'NR == 1 { print $2 }') && [ -n "$commit" ]; then
  :
else
  commit="$(git rev-parse --short HEAD 2>/dev/null || echo unknown) (the checkout's)"
  if [ -n "$(git status --porcelain --untracked-files=no 2>/dev/null)" ]; then commit="$commit (with uncommitted changes)"; fi
fi
{
  echo "commit: $commit"
  echo "date: $(date -u '+%Y-%m-%d %H:%M UTC')"
  echo "gpu: $(nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader 2>&1 | head -1)"
  echo "torch: $("$PYTHON" -c 'import torch; print(torch.__version__)' 2>&1)"
  echo "steps: $WARMUP warm-up + $STEPS timed, seed $SEED"
} > "$OUT_DIR/meta.txt"

for preset in $PRESETS; do
  inputs="$OUT_DIR/inputs_$preset"
  # The PyTorch model of the preset's family; the shape flags both kiln commands take.
  script=bench/torch_llama.py
  shape=()
  case "$preset" in
    gpt2-*)
      script=bench/torch_gpt2.py
      shape=(--batch "${GPT2_BATCH:-16}")
      ;;
  esac
  [ -n "${LR:-}" ] && shape+=(--lr "$LR")
  t0=$(date +%s)
  "$KILN" export-inputs "$preset" "${shape[@]}" --steps "$TOTAL" --seed "$SEED" --out "$inputs" \
    > "$OUT_DIR/export_$preset.log" 2>&1 ||
    echo "run_h200: kiln export-inputs $preset failed (see $OUT_DIR/export_$preset.log)"
  t1=$(date +%s)
  # shellcheck disable=SC2086  # KILN_FLAGS is a list of flags
  "$KILN" train "$preset" "${shape[@]}" --backend cuda --steps "$TOTAL" --seed "$SEED" ${KILN_FLAGS:-} \
    > "$OUT_DIR/kiln_$preset.log" 2>&1 ||
    echo "run_h200: kiln train $preset failed (see $OUT_DIR/kiln_$preset.log)"
  t2=$(date +%s)
  echo "run_h200: $preset: export $((t1 - t0)) s, kiln train $((t2 - t1)) s"
  if [ "${FP8:-0}" = 1 ]; then
    # shellcheck disable=SC2086
    "$KILN" train "$preset" "${shape[@]}" --backend cuda --steps "$TOTAL" --seed "$SEED" --precision fp8 \
      ${KILN_FLAGS:-} > "$OUT_DIR/kilnfp8_$preset.log" 2>&1 ||
      echo "run_h200: kiln train $preset --precision fp8 failed (see $OUT_DIR/kilnfp8_$preset.log)"
    echo "run_h200: $preset: kiln train --precision fp8 $(($(date +%s) - t2)) s"
  fi
  for mode in $MODES; do
    flag=""
    [ "$mode" = compile ] && flag="--compile"
    t0=$(date +%s)
    "$PYTHON" "$script" --preset "$preset" --inputs "$inputs" --warmup "$WARMUP" --steps "$STEPS" $flag \
      > "$OUT_DIR/torch_${mode}_$preset.json" 2> "$OUT_DIR/torch_${mode}_$preset.log" ||
      echo "run_h200: torch $mode $preset failed (see $OUT_DIR/torch_${mode}_$preset.log)"
    echo "run_h200: $preset: torch $mode $(($(date +%s) - t0)) s"
  done
  [ "${KEEP_WEIGHTS:-0}" = 1 ] || rm -f "$inputs/model.safetensors"
done

"$PYTHON" bench/summarize.py "$OUT_DIR" --skip "$WARMUP" | tee "$OUT_DIR/summary.md"
exit "${PIPESTATUS[0]}"
