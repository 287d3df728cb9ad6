#!/usr/bin/env bash
# Issue 15's decode benchmark on the GPU machine, kiln and Hugging Face transformers in one run:
# llama-M (random weights, bf16) at batch 1 and 32, prompts of 512 distinct random tokens,
# 256 new tokens, greedy. kiln: `kiln generate --backend cuda --prompts FILE` (its stderr
# gives decode ms per step: decode wall time over @decode calls, sampling and the logits'
# download included; compiles excluded; and the calls' median, min and max). HF:
# bench/hf_generate.py (static cache). The floor:
# the bytes one decode step must read (the bf16 weights but the embedding table, plus K and V
# of the average context, 512 + 128 tokens) over the card's copy bandwidth, measured in the
# same run (bench/copy_bandwidth.py; 4.26 TB/s on the H200 of DESIGN.md; nan when it cannot
# run), or COPY_TBS.
#   KILN=.carry/bin/kiln OUT_DIR=/tmp/gen bash bench/generate_h200.sh
# Knobs: PRESET=llama-M, BATCHES="1 32", PROMPT=512, NEW=256, HF=1 (0 skips transformers),
# COPY_TBS (skips the measurement), KILN_FLAGS (more `kiln generate` flags, e.g.
# --no-decode-lookahead).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
KILN=${KILN:-build/kiln}
OUT_DIR=${OUT_DIR:-/tmp/kiln-generate}
PRESET=${PRESET:-llama-M}
BATCHES=${BATCHES:-1 32}
PROMPT=${PROMPT:-512}
NEW=${NEW:-256}
HF=${HF:-1}
PYTHON=${PYTHON:-python3}
mkdir -p "$OUT_DIR"
export KILN_CACHE_DIR=${KILN_CACHE_DIR:-$OUT_DIR/kernel-cache}
# The binary's own commit (`kiln version`): carried binaries run in a checkout of another commit.
built=$("$KILN" version 2>/dev/null | awk 'NR == 1 { print $2 }')
echo "commit: ${KILN_COMMIT:-${built:-unknown (a kiln without its version)}}"
echo "gpu: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>&1 | head -1)"
COPY_TBS=${COPY_TBS:-$("$PYTHON" bench/copy_bandwidth.py 2>/dev/null || echo nan)}
echo "copy bandwidth for the floor: $COPY_TBS TB/s"
status=0
for batch in $BATCHES; do
  prompts="$OUT_DIR/prompts_b$batch.txt"
  "$PYTHON" bench/random_prompts.py "$batch" "$PROMPT" > "$prompts"
  log="$OUT_DIR/kiln_${PRESET}_b$batch.log"
  "$KILN" generate "$PRESET" --prompts "$prompts" --max-new-tokens "$NEW" --temperature 0 --backend cuda \
    --max-running "$batch" --context $((PROMPT + NEW)) ${KILN_FLAGS:-} > "$log.out" 2> "$log" || { echo "kiln b$batch failed"; tail -5 "$log"; status=1; }
  kiln_ms=$(grep -o '[0-9.]* ms each' "$log" | head -1 | cut -d' ' -f1)
  # The decode calls' median, min and max ("decode calls: median X ms, min Y, max Z").
  kiln_calls=$(grep -o 'decode calls: median [0-9.]* ms, min [0-9.]*, max [0-9.]*' "$log" | head -1 | tr -d ',' |
    awk '{print $4, $7, $9}')
  prefill=$(grep -o 'prefill [0-9]* tokens in [0-9.]* s ([0-9]* tok/s' "$log" | grep -o '[0-9]* tok/s' | head -1)
  hf_json="{}"
  if [ "$HF" = 1 ]; then
    hf_json=$(cd bench && "$PYTHON" hf_generate.py --preset "$PRESET" --batch "$batch" --prompt "$PROMPT" --new "$NEW" 2> "$OUT_DIR/hf_b$batch.log" | tail -1)
  fi
  "$PYTHON" - "$PRESET" "$batch" "$PROMPT" "$NEW" "${kiln_ms:-nan}" "${prefill:-?}" "$hf_json" "${kiln_calls:-nan nan nan}" "$COPY_TBS" <<'PY'
import json, sys
sys.path.insert(0, "bench")
from llama_presets import PRESETS
preset, batch, prompt, new, kiln_ms, prefill, hf = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5]), sys.argv[6], json.loads(sys.argv[7] or "{}")
call_median, call_min, call_max = (float(x) for x in sys.argv[8].split())
copy_tbs = float(sys.argv[9])
p = PRESETS[preset]
q, kv = p["heads"] * p["hd"], p["kv"] * p["hd"]
params = p["layers"] * (p["d"] * (2 * q + 2 * kv) + 3 * p["d"] * p["ff"]) + p["vocab"] * p["d"]  # projections, MLP, head
weight_bytes = 2 * params
kv_bytes = batch * (prompt + new / 2) * p["layers"] * 2 * kv * 2
floor_ms = 1e3 * (weight_bytes + kv_bytes) / (copy_tbs * 1e12)
hf_ms = hf.get("decode_ms_per_step_median", float("nan"))
print(f"{preset} batch {batch}, prompt {prompt}, {new} new: kiln {kiln_ms:.3f} ms/step (calls: median {call_median:.3f}, "
      f"min {call_min:.3f}, max {call_max:.3f}), HF {hf_ms:.3f} ms/step "
      f"(min {hf.get('decode_ms_per_step_min', float('nan')):.3f}, max {hf.get('decode_ms_per_step_max', float('nan')):.3f}), "
      f"floor {floor_ms:.3f} ms ({weight_bytes / 1e9:.2f} GB weights + {kv_bytes / 1e9:.2f} GB KV); "
      f"kiln/floor {call_median / floor_ms:.2f}x, HF/kiln {hf_ms / call_median:.2f}x (the calls' median, as HF's "
      f"figure leaves out its first step; the mean holds the first call's graph capture and GEMM autotuning); "
      f"prefill kiln {prefill}, "
      f"HF {hf.get('prefill_tok_per_s', float('nan')):.0f} tok/s")
PY
done
exit $status
