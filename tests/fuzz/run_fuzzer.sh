#!/bin/sh
# Builds one fuzz target with clang (libFuzzer + ASan + UBSan) from the sources it needs and
# fuzzes it, starting from a copy of its seeds and regressions (ctest runs the same inputs
# once, without libFuzzer, on every build: tests/fuzz/CMakeLists.txt).
#   tests/fuzz/run_fuzzer.sh TARGET [seconds, default 60]
# TARGET: ir_text, ir_proto, ir_json or safetensors. ir_proto and ir_json need build/ (the
# generated ir.pb.cc): run `cmake --build build` first.
set -eu
target=$1
root=$(cd "$(dirname "$0")/../.." && pwd)
out=${KILN_FUZZ_DIR:-$root/build-fuzz}
libdir=/usr/lib/x86_64-linux-gnu
# The IR without the parts no reader needs (the builder, Graphviz, format detection).
ir_sources=$(ls "$root"/ir/*.cc | grep -v -e builder.cc -e dot_graph.cc -e module_io.cc)
case "$target" in
  ir_text) sources="$ir_sources"; libs="" ;;
  ir_proto|ir_json) sources="$ir_sources $root/build/ir/ir.pb.cc"; libs="$libdir/libprotobuf.a" ;;
  safetensors)
    sources="$root/runtime/safetensors.cc $root/runtime/tensor_bytes.cc $root/ir/host_tensor.cc
             $root/ir/numerics.cc $root/runtime/memory_estimate.cc $root/runtime/mapped_file.cc
             $root/ir/thread_pool.cc $root/ir/types.cc $root/ir/file_util.cc $root/ir/graph.cc
             $root/ir/attributes.cc $root/ir/op_table.cc"
    libs="" ;;
  *) echo "run_fuzzer.sh: unknown target '$target' (ir_text, ir_proto, ir_json, safetensors)" >&2; exit 2 ;;
esac
mkdir -p "$out/corpus-$target"
cp -n "$root"/tests/fuzz/corpus/"$target"/* "$out/corpus-$target/" 2>/dev/null || true
cp -n "$root"/tests/fuzz/regressions/"$target"/* "$out/corpus-$target/" 2>/dev/null || true
# shellcheck disable=SC2086 # the source lists are meant to split
clang++ -std=c++20 -O1 -g -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
  -I"$root" -I"$root/build" "$root/tests/fuzz/${target}_fuzzer.cc" $sources \
  -Wl,--start-group $libs "$libdir"/libabsl_*.a -Wl,--end-group -lpthread -lz \
  -o "$out/${target}_fuzzer"
exec "$out/${target}_fuzzer" -max_total_time="${2:-60}" -max_len=65536 -timeout=10 "$out/corpus-$target"
