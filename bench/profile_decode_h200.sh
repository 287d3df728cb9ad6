#!/usr/bin/env bash
# One decode call of `kiln generate` under Nsight Compute on the GPU machine, summed up by
# kernel group (bench/ncu_summary.py): where the step's time and bytes go, kernel by kernel,
# which the CUDA-event `--report` (launches one by one) cannot say. llama-M, a 512-token
# prompt per sequence, 3 new tokens (the last of the decode calls is summed up).
#   KILN=.carry/bin/kiln OUT_DIR=/tmp/prof bash bench/profile_decode_h200.sh
# Knobs: PRESET=llama-M BATCH=1 PROMPT=512 NCU=ncu PYTHON=python3.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
KILN=${KILN:-build/kiln}
OUT_DIR=${OUT_DIR:-/tmp/kiln-profile}
PRESET=${PRESET:-llama-M}
BATCH=${BATCH:-1}
PROMPT=${PROMPT:-512}
NCU=${NCU:-ncu}
PYTHON=${PYTHON:-python3}
mkdir -p "$OUT_DIR"
[[ -d /usr/local/cuda/lib64 ]] && export LD_LIBRARY_PATH=/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export KILN_CACHE_DIR=${KILN_CACHE_DIR:-$OUT_DIR/kernel-cache}
prompts="$OUT_DIR/prompts_b$BATCH.txt"
"$PYTHON" bench/random_prompts.py "$BATCH" "$PROMPT" > "$prompts"
csv="$OUT_DIR/ncu_${PRESET}_b$BATCH.csv"
if ! "$NCU" --clock-control none --csv --print-units base \
    --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum \
    "$KILN" generate "$PRESET" --prompts "$prompts" --max-new-tokens 3 --temperature 0 --backend cuda \
    --max-running "$BATCH" --context $((PROMPT + 256)) > "$csv" 2> "$OUT_DIR/ncu.log"; then
  echo "ncu failed (log: $OUT_DIR/ncu.log):"; tail -5 "$OUT_DIR/ncu.log"; exit 1
fi
built=$("$KILN" version 2>/dev/null | awk 'NR == 1 { print $2 }')  # the binary's own commit
echo "commit: ${KILN_COMMIT:-${built:-unknown (a kiln without its version)}}, $PRESET batch $BATCH, prompt $PROMPT"
"$PYTHON" bench/ncu_summary.py "$csv"
