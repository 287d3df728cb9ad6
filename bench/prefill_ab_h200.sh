#!/usr/bin/env bash
# A/B of prefill configurations on the GPU machine: `kiln generate` of BATCH prompts of PROMPT
# random tokens (bench/random_prompts.py, the decode benchmark's) with one new token, under
# each configuration's extra flags, the configurations interleaved REPEATS times (A B A B ...,
# so that a drift of the machine falls on all of them alike); then per configuration and shape
# the median over the repeats of the prefill tok/s that `kiln generate` prints (its prefill
# calls' time, compiles excluded), their spread, and the calls made.
#   bash bench/prefill_ab_h200.sh "default=" "paged=--no-fresh-prefill" \
#     "one_a_call=--no-fresh-prefill --prefill-call-tokens 1"
# Knobs: SHAPES="512x32 2048x4 512x1" (PROMPTxBATCH), REPEATS=3, PRESET=llama-M, KILN=build/kiln,
# BACKEND=cuda, OUT_DIR=/tmp/kiln-prefill-ab, PYTHON=python3, VOCAB (of the random tokens;
# 32000, or 256 for the tiny presets). ctest runs it on the CPU with llama-tiny
# (bench_prefill_ab_cpu).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
KILN=${KILN:-build/kiln}
PRESET=${PRESET:-llama-M}
BACKEND=${BACKEND:-cuda}
SHAPES=${SHAPES:-512x32 2048x4 512x1}
REPEATS=${REPEATS:-3}
OUT_DIR=${OUT_DIR:-/tmp/kiln-prefill-ab}
PYTHON=${PYTHON:-python3}
VOCAB=${VOCAB:-32000}
if [[ $# -lt 1 ]]; then
  echo "usage: bench/prefill_ab_h200.sh NAME=FLAGS... [NAME=FLAGS...] (FLAGS: kiln generate flags, may be empty)" >&2
  exit 2
fi
for config in "$@"; do
  if [[ $config != *=* || ${config%%=*} == "" ]]; then
    echo "prefill_ab_h200.sh: '$config' is not NAME=FLAGS" >&2
    exit 2
  fi
done
for shape in $SHAPES; do
  if [[ ! $shape =~ ^[0-9]+x[0-9]+$ ]]; then
    echo "prefill_ab_h200.sh: shape '$shape' is not PROMPTxBATCH" >&2
    exit 2
  fi
done
mkdir -p "$OUT_DIR"
export KILN_CACHE_DIR=${KILN_CACHE_DIR:-$OUT_DIR/kernel-cache}
built=$("$KILN" version 2>/dev/null | awk 'NR == 1 { print $2 }')
echo "commit: ${KILN_COMMIT:-${built:-unknown}}"
[[ $BACKEND == cuda ]] && echo "gpu: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>&1 | head -1)"
results="$OUT_DIR/results.txt"
: > "$results"
status=0
for ((r = 1; r <= REPEATS; ++r)); do
  for shape in $SHAPES; do
    prompt=${shape%x*} batch=${shape#*x}
    # Token ids as .jsonl lines: a byte-level preset would read a plain line as text.
    prompts="$OUT_DIR/prompts_${shape}.jsonl"
    [[ -s $prompts ]] || "$PYTHON" bench/random_prompts.py "$batch" "$prompt" --vocab "$VOCAB" |
      sed 's/^/{"tokens": [/; s/$/]}/' > "$prompts"
    for config in "$@"; do
      name=${config%%=*}
      read -r -a flags <<< "${config#*=}"
      log="$OUT_DIR/${name}_${shape}_$r.log"
      if ! "$KILN" generate "$PRESET" --prompts "$prompts" --max-new-tokens 1 --temperature 0 --backend "$BACKEND" \
          --max-running "$batch" --context $((prompt + 1)) "${flags[@]}" > "$log.out" 2> "$log"; then
        echo "$name $shape (repeat $r) failed:"; tail -3 "$log"; status=1
        continue
      fi
      # "prefill 16384 tokens in 0.172 s (95312 tok/s, ..." and "prefill calls: 4 (4 of @fresh_prefill)".
      rate=$(sed -nE 's/.*kiln generate: prefill [0-9]+ tokens in [0-9.]+ s \(([0-9]+) tok\/s.*/\1/p' "$log" | head -1)
      calls=$(sed -nE 's/.*prefill calls: ([0-9]+) \(([0-9]+) of @fresh_prefill\).*/\1 \2/p' "$log" | head -1)
      if [[ -z $rate || -z $calls ]]; then
        echo "$name $shape (repeat $r): no prefill figures in $log"; status=1
        continue
      fi
      echo "$name $shape $rate $calls" >> "$results"
    done
  done
done
"$PYTHON" - "$results" "$SHAPES" "$@" <<'PY'
import statistics, sys
rows = [l.split() for l in open(sys.argv[1]) if l.strip()]
shapes = sys.argv[2].split()
names = [c.split("=", 1)[0] for c in sys.argv[3:]]
print(f"{'configuration':<16} " + " ".join(f"{s + ' (prompt x batch) tok/s':>40}" for s in shapes))
for name in names:
    cells = []
    for s in shapes:
        got = [r for r in rows if r[0] == name and r[1] == s]
        if not got:
            cells.append("failed")
            continue
        rates = [int(r[2]) for r in got]
        cells.append(f"{statistics.median(rates):,.0f} ({min(rates):,}-{max(rates):,}) x{len(rates)}, "
                     f"{got[0][3]} calls ({got[0][4]} fresh)")
    print(f"{name:<16} " + " ".join(f"{c:>40}" for c in cells))
PY
exit $status
