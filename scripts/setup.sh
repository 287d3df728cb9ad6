#!/usr/bin/env bash
# Installs what kiln needs to build and test on Debian 12. Safe to run twice: it installs
# only the packages that are missing, and runs apt-get update only then.
set -euo pipefail

packages=(
  build-essential cmake ninja-build git
  libabsl-dev                 # Status, StatusOr, containers, strings (linked statically)
  libprotobuf-dev protobuf-compiler   # the IR's protobuf form (linked statically)
  libgtest-dev libgmock-dev   # tests
  nlohmann-json3-dev          # Hugging Face config.json and safetensors headers
  graphviz                    # `dot`, to render `kiln dump --format dot`
  python3
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  sudo_cmd=()
  [[ $(id -u) -ne 0 ]] && sudo_cmd=(sudo)
  "${sudo_cmd[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
else
  echo "setup: all packages present"
fi

# The CUDA toolkit (nvcc, NVRTC, cuBLASLt, static cudart) is expected at /usr/local/cuda;
# kiln builds and tests without it, and without a GPU.
if [[ ! -x /usr/local/cuda/bin/nvcc ]]; then
  echo "setup: note: no CUDA toolkit at /usr/local/cuda; GPU code generation is disabled"
fi
