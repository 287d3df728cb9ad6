#!/usr/bin/env bash
# Sets up, builds, and runs kiln's main job: training llama-tiny on the built-in corpus, on
# the CPU. Extra arguments go to `kiln train` (e.g. --steps 20).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh >/dev/null
cmake --preset default >/dev/null
cmake --build build -j"$(nproc)"
exec build/kiln train llama-tiny --backend cpu "$@"
