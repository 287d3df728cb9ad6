#!/usr/bin/env bash
# The benchmark, run on the GPU machine in one go: kiln and PyTorch eager on llama-S and
# llama-M, same shapes, same GPU, same run. kiln comes prebuilt (the GPU machine has no
# Abseil): KILN=path/to/kiln. Results land in OUT_DIR; the summary table goes to stdout.
#   KILN=.carry/kiln OUT_DIR=/tmp/bench bash bench/run_h200.sh
set -euo pipefail
cd "$(dirname "$0")/.."
KILN=${KILN:-build/kiln}
OUT_DIR=${OUT_DIR:-/tmp/kiln-bench}
KILN_STEPS=${KILN_STEPS:-30}
mkdir -p "$OUT_DIR"
export KILN_CACHE_DIR=${KILN_CACHE_DIR:-$OUT_DIR/kernel-cache}
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader > "$OUT_DIR/gpu.txt"
for preset in llama-S llama-M; do
  "$KILN" train "$preset" --backend cuda --steps "$KILN_STEPS" > "$OUT_DIR/kiln_$preset.log" 2>&1 || true
  python3 bench/torch_llama.py --preset "$preset" --steps 20 --warmup 5 > "$OUT_DIR/torch_eager_$preset.json" || true
done
cat "$OUT_DIR/gpu.txt"
python3 bench/summarize.py "$OUT_DIR"
