#!/usr/bin/env bash
# The attention kernels of one bench/attention_bench shape under Nsight Compute on the GPU
# machine: per kernel its duration, SM and memory throughput, occupancy, registers and the
# warp-state summary (cycles per issued instruction and the stall reasons ncu names), so a
# change to kernels/flash_attention_wgmma.cuh starts from where its time goes. attention_bench
# runs its self-check first: the first launches are the wgmma forward, the mma.sync forward,
# then the backward's kernels.
#   ATTENTION_BENCH=.carry/attention_bench OUT_DIR=/tmp/prof bash bench/profile_attention_h200.sh
# Knobs: SHAPE=M (S, M or L of bench/attention_bench), COUNT=8 (launches profiled), NCU=ncu.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
BENCH=${ATTENTION_BENCH:-build/bench/attention_bench}
OUT_DIR=${OUT_DIR:-/tmp/kiln-attention-profile}
SHAPE=${SHAPE:-M}
COUNT=${COUNT:-8}
NCU=${NCU:-ncu}
mkdir -p "$OUT_DIR"
[[ -d /usr/local/cuda/lib64 ]] && export LD_LIBRARY_PATH=/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export KILN_CACHE_DIR=${KILN_CACHE_DIR:-$OUT_DIR/kernel-cache}
report="$OUT_DIR/ncu_$SHAPE.txt"
if ! "$NCU" --clock-control none --section SpeedOfLight --section WarpStateStats --section Occupancy \
    --section LaunchStats --launch-count "$COUNT" "$BENCH" --shapes "$SHAPE" --iters 1 --warmup 0 \
    > "$report" 2> "$OUT_DIR/ncu.log"; then
  echo "ncu failed (log: $OUT_DIR/ncu.log, report: $report):"; tail -5 "$OUT_DIR/ncu.log"; exit 1
fi
echo "commit: ${KILN_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}, attention shape $SHAPE"
# A kernel's header line ("  name(...) (grid)x(block), Context 1, Stream ..."), then the lines
# worth reading; ncu's rule text about stalls ("... stalled ...") kept to its first line.
grep -E "^  [A-Za-z_][A-Za-z0-9_]*.*\([0-9]+, [0-9]+, [0-9]+\)x\(|Duration|Compute \(SM\) Throughput|Memory Throughput|Achieved Occupancy|Registers Per Thread|Warp Cycles Per Issued Instruction|Dynamic Shared Memory Per Block|stalled" "$report" |
  cut -c1-200
