# shellcheck shell=bash
# What the H200 benchmark scripts share (bench/run_attention_h200.sh, bench/run_gemm_h200.sh):
# sourced by each after it sets `here`, its own folder, and before it reads its knobs.
# The benchmarks link libnvrtc and libcublasLt dynamically: h200_setup puts
# /usr/local/cuda/lib64 on LD_LIBRARY_PATH when it is there.

# h200_bench NAME: the benchmark binary NAME beside the script when there is one (a carried
# folder), else the build's, build/bench/NAME.
# shellcheck disable=SC2154  # here: the sourcing script's folder
h200_bench() {
  if [[ -x $here/$1 ]]; then echo "$here/$1"; else echo "$here/../build/bench/$1"; fi
}

# h200_setup: makes OUT_DIR, sets LD_LIBRARY_PATH (above) and status=0.
h200_setup() {
  mkdir -p "$OUT_DIR"
  [[ -d /usr/local/cuda/lib64 ]] && export LD_LIBRARY_PATH=/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  status=0
}

# h200_run NAME OUT LOG COMMAND...: runs COMMAND, stdout to OUT and stderr to LOG; when it
# fails, says so on stderr with LOG's last 5 lines and sets status=1.
h200_run() {
  local name=$1 out=$2 log=$3
  shift 3
  if ! "$@" >"$out" 2>"$log"; then
    echo "$name failed (log: $log):" >&2
    tail -5 "$log" >&2
    status=1
  fi
}

# h200_finish SCRIPT: the last line, "SCRIPT: OK" or "SCRIPT: FAILED", and the exit status.
h200_finish() {
  echo "$1: $([[ $status == 0 ]] && echo OK || echo FAILED)"
  exit "$status"
}
