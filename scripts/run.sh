#!/usr/bin/env bash
# Sets up, builds, and runs kiln's main job on its built-in default. Extra arguments go
# to that command.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh >/dev/null
cmake --preset default >/dev/null
cmake --build build -j"$(nproc)"
exec build/kiln dump llama-tiny "$@"
