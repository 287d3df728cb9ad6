#!/usr/bin/env bash
# Issue 15's serving measurements on the GPU machine, all from `kiln generate --prompts
# FILE.jsonl` (random weights, greedy, workloads of random token ids written by
# bench/serve_workload.py, the same files for the same SEED):
#   1. prefill tok/s at each prompt length of PREFILLS: PREFILL_REQUESTS prompts of that length,
#      one at a time, one new token each;
#   2. a mixed workload with continuous batching: REQUESTS requests, prompt lengths uniform
#      over PROMPT (LO:HI) and output budgets over OUTPUT, MAX_RUNNING decoded at once;
#   3. a shared-prefix workload, SHARED requests of one PREFIX-token prefix and SUFFIX tokens of
#      their own, SHARED_OUTPUT new tokens each, once with the prefix cache and once with
#      --no-prefix-cache: the cache's hit rate and the time it saves.
# Then serve_workload.py summarize prints the tables (summary.md in OUT_DIR).
#   KILN=.carry/bin/kiln OUT_DIR=/tmp/serve bash bench/serve_h200.sh
# Knobs: PRESET=llama-M, BACKEND=cuda, PREFILLS="512 2048", PREFILL_REQUESTS=4, REQUESTS=256, PROMPT=64:1024,
# OUTPUT=32:512, MAX_RUNNING=64, SHARED=64, PREFIX=512, SUFFIX=64, SHARED_OUTPUT=64, SEED=1,
# BLOCK=16. tests/CMakeLists.txt runs it on the CPU with llama-tiny and small knobs.
set -uo pipefail
cd "$(dirname "$0")/.."
KILN=${KILN:-build/kiln}
OUT_DIR=${OUT_DIR:-/tmp/kiln-serve}
PRESET=${PRESET:-llama-M}
BACKEND=${BACKEND:-cuda}
PREFILLS=${PREFILLS:-512 2048}
PREFILL_REQUESTS=${PREFILL_REQUESTS:-4}
REQUESTS=${REQUESTS:-256}
PROMPT=${PROMPT:-64:1024}
OUTPUT=${OUTPUT:-32:512}
MAX_RUNNING=${MAX_RUNNING:-64}
SHARED=${SHARED:-64}
PREFIX=${PREFIX:-512}
SUFFIX=${SUFFIX:-64}
SHARED_OUTPUT=${SHARED_OUTPUT:-64}
SEED=${SEED:-1}
BLOCK=${BLOCK:-16}
PYTHON=${PYTHON:-python3}
mkdir -p "$OUT_DIR"
export KILN_CACHE_DIR=${KILN_CACHE_DIR:-$OUT_DIR/kernel-cache}
[[ -d /usr/local/cuda/lib64 ]] && export LD_LIBRARY_PATH=/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
vocab=$("$KILN" models | awk -v p="$PRESET" '$1 == p { print $2 }')
if [[ -z $vocab ]]; then
  echo "serve_h200: $PRESET is not a preset of $KILN ('kiln models' lists them)" >&2
  exit 2
fi
status=0
# run NAME FILE CONTEXT [FLAGS...]: kiln generate over FILE, stdout to NAME.out, stderr to NAME.log.
run() {
  local name=$1 file=$2 context=$3
  shift 3
  if ! "$KILN" generate "$PRESET" --prompts "$file" --temperature 0 --backend "$BACKEND" --block-size "$BLOCK" \
      --context "$context" "$@" > "$OUT_DIR/$name.out" 2> "$OUT_DIR/$name.log"; then
    echo "serve_h200: $name failed (see $OUT_DIR/$name.log):" >&2
    tail -3 "$OUT_DIR/$name.log" >&2
    status=1
  fi
}
workload() { "$PYTHON" bench/serve_workload.py "$@" --vocab "$vocab" --seed "$SEED" || status=1; }

for length in $PREFILLS; do
  workload single "$OUT_DIR/prefill_$length.jsonl" --requests "$PREFILL_REQUESTS" --prompt "$length" --output 1
  run "prefill_$length" "$OUT_DIR/prefill_$length.jsonl" $((length + BLOCK)) --max-running 1
done
workload mixed "$OUT_DIR/mixed.jsonl" --requests "$REQUESTS" --prompt "$PROMPT" --output "$OUTPUT"
run mixed "$OUT_DIR/mixed.jsonl" $((${PROMPT#*:} + ${OUTPUT#*:})) --max-running "$MAX_RUNNING"
workload shared "$OUT_DIR/shared.jsonl" --requests "$SHARED" --prefix "$PREFIX" --suffix "$SUFFIX" \
  --output "$SHARED_OUTPUT"
run shared "$OUT_DIR/shared.jsonl" $((PREFIX + SUFFIX + SHARED_OUTPUT)) --max-running "$MAX_RUNNING"
run shared_nocache "$OUT_DIR/shared.jsonl" $((PREFIX + SUFFIX + SHARED_OUTPUT)) --max-running "$MAX_RUNNING" \
  --no-prefix-cache
{
  # The binary's own commit (`kiln version`): carried binaries run in a checkout of another commit.
  built=$("$KILN" version 2>/dev/null | awk 'NR == 1 { print $2 }')
  echo "commit: ${KILN_COMMIT:-${built:-unknown (a kiln without its version)}}"
  echo "gpu: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1 || echo none)"
  echo "$PRESET, backend $BACKEND, seed $SEED, block $BLOCK; prefill: $PREFILL_REQUESTS requests a length; mixed: $REQUESTS requests, prompts $PROMPT, outputs" \
    "$OUTPUT, max running $MAX_RUNNING; shared: $SHARED requests, prefix $PREFIX + $SUFFIX own, $SHARED_OUTPUT new"
  echo
} > "$OUT_DIR/summary.md"
"$PYTHON" bench/serve_workload.py summarize "$OUT_DIR" >> "$OUT_DIR/summary.md" || status=1
cat "$OUT_DIR/summary.md"
exit $status
