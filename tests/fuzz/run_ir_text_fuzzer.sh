#!/bin/sh
# Builds the IR text fuzzer with clang (libFuzzer + ASan + UBSan) from the few ir/ sources
# the text form needs, and runs it on a copy of the seed corpus.
#   tests/fuzz/run_ir_text_fuzzer.sh [seconds, default 60]
set -eu
root=$(cd "$(dirname "$0")/../.." && pwd)
out=${KILN_FUZZ_DIR:-$root/build-fuzz}
mkdir -p "$out/corpus"
cp -n "$root"/tests/fuzz/corpus/ir_text/* "$out/corpus/" 2>/dev/null || true
libdir=/usr/lib/x86_64-linux-gnu
clang++ -std=c++20 -O1 -g -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
  -I"$root" \
  "$root"/tests/fuzz/ir_text_fuzzer.cc \
  "$root"/ir/text_parser.cc "$root"/ir/text_lexer.cc "$root"/ir/text_printer.cc \
  "$root"/ir/attributes.cc "$root"/ir/types.cc "$root"/ir/graph.cc "$root"/ir/op_table.cc \
  "$root"/ir/shape_inference.cc "$root"/ir/verifier.cc "$root"/ir/op_attributes.cc \
  -Wl,--start-group "$libdir"/libabsl_*.a -Wl,--end-group -lpthread \
  -o "$out/ir_text_fuzzer"
exec "$out/ir_text_fuzzer" -max_total_time="${1:-60}" -max_len=65536 -timeout=10 "$out/corpus"
