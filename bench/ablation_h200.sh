#!/usr/bin/env bash
# Issue 13's ablation on the GPU machine: `kiln train PRESET --backend cuda` with every pass,
# then with each training pass disabled in turn (`--disable-pass`), printing one markdown
# row per run: tok/s (median, min-max over the steps after the warm-up; the last step is
# the --report step, launched kernel by kernel, and is left out), kernel launches per step,
# GEMMs, the arena (the step's peak device memory) and the last loss (the passes change no
# value beyond their precision policy, so the losses agree).
#   KILN=.carry/kiln PRESETS="llama-S gpt2-124M" bash bench/ablation_h200.sh
# Knobs: PRESETS, STEPS=15, WARMUP=4, PASSES (the passes to disable one at a time).
set -uo pipefail
cd "$(dirname "$0")/.."
KILN=${KILN:-build/kiln}
PRESETS=${PRESETS:-llama-S}
STEPS=${STEPS:-15}
WARMUP=${WARMUP:-4}
PASSES=${PASSES:-elide-grad-zeroing narrow-activations-bf16 fuse-residual-norm gemm-bias-epilogue merge-sibling-gemms expand-rope fuse-loops rematerialize group-optimizer-updates select-flash-attention}
LOG_DIR=${LOG_DIR:-/tmp/kiln-ablation}
mkdir -p "$LOG_DIR"
export KILN_CACHE_DIR=${KILN_CACHE_DIR:-$LOG_DIR/kernel-cache}
echo "| preset | passes | tok/s median (min-max) | launches | GEMMs | bytes moved | arena | last loss |"
echo "|---|---|---|---|---|---|---|---|"
for preset in $PRESETS; do
  for disabled in "" $PASSES; do
    log="$LOG_DIR/${preset}_${disabled:-all}.log"
    flags=()
    [ -n "$disabled" ] && flags=(--disable-pass "$disabled")
    "$KILN" train "$preset" --backend cuda --steps "$STEPS" --report "${flags[@]}" > "$log" 2>&1 ||
      echo "ablation: kiln train $preset ${flags[*]} failed (see $log)" >&2
    python3 - "$log" "$preset" "${disabled:-}" "$WARMUP" "$STEPS" <<'PY'
import re, statistics, sys
log, preset, disabled, warmup, steps = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
text = open(log).read()
rates = [float(m.group(2)) for m in re.finditer(r"^step (\d+)/\d+ +loss \S+ +tok/s (\d+)", text, re.M)
         if warmup < int(m.group(1)) < steps]
losses = re.findall(r"^step \d+/\d+ +loss (\S+)", text, re.M)
launches = re.search(r"(\d+) kernel launches .*?, (\d+) GEMMs, arena ([\d.]+ \w+), ([\d.]+ \w+) moved", text)
name = "all" if not disabled else f"without {disabled}"
if not rates or not launches:
    print(f"| {preset} | {name} | failed (see {log}) | | | | | |")
else:
    print(f"| {preset} | {name} | {statistics.median(rates):,.0f} ({min(rates):,.0f}-{max(rates):,.0f}) | "
          f"{launches.group(1)} | {launches.group(2)} | {launches.group(4)} | {launches.group(3)} | {losses[-1]} |")
PY
  done
done
