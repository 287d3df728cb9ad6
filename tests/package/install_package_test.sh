#!/usr/bin/env bash
# ctest's install_package (tests/CMakeLists.txt): installs the build into a temporary prefix
# and uses it as another project would. It fails when
#   - the install fails, or the package names kiln's source or build tree (not relocatable);
#   - an installed header includes a kiln header that was not installed;
#   - the installed `kiln` does not run, or a binary links libcuda, or Abseil, protobuf or
#     libstdc++ as shared libraries (the link setup of cmake/StaticDeps.cmake, kept for
#     consumers);
#   - frontends/examples/print_llama or train_mlp, configured out of tree with
#     find_package(kiln) against the prefix, does not build, or prints anything other than
#     what the same example built inside kiln's tree prints, or the MLP's loss does not fall.
#
# usage: install_package_test.sh BUILD_DIR SOURCE_DIR IN_TREE_PRINT_LLAMA IN_TREE_TRAIN_MLP CXX GENERATOR WITH_CUDA
set -euo pipefail
build=$1 src=$2 in_tree_print_llama=$3 in_tree_train_mlp=$4 cxx=$5 generator=$6 with_cuda=$7

work=$(mktemp -d "${TMPDIR:-/tmp}/kiln-package-test.XXXXXX")
trap 'rm -rf "$work"' EXIT
prefix=$work/prefix
fail() {
  echo "install_package: FAIL: $*" >&2
  exit 1
}
step() { echo "install_package: $*"; }
# Runs a command quietly; on failure shows its output and fails with `what`.
quiet() {
  local what=$1
  shift
  "$@" >"$work/log" 2>&1 || { cat "$work/log" >&2; fail "$what"; }
}

step "cmake --install $build --prefix $prefix"
unset DESTDIR
quiet "cmake --install" cmake --install "$build" --prefix "$prefix"
config=$(find "$prefix" -name kilnConfig.cmake -print -quit)
[[ -n $config ]] || fail "no kilnConfig.cmake under $prefix"
package_dir=$(dirname "$config")
for f in bin/kiln include/frontends/llama.h include/frontends/training_session.h include/frontends/compile.h include/ir/builder.h \
  include/ir/text_format.h include/ir/ir.pb.h include/ir/ir.proto; do
  [[ -e $prefix/$f ]] || fail "$f is not installed"
done
for f in kilnConfigVersion.cmake kilnTargets.cmake; do
  [[ -e $package_dir/$f ]] || fail "$package_dir/$f is not installed"
done
for lib in ir runtime passes frontends $([[ $with_cuda == ON ]] && echo codegen cuda); do
  [[ -n $(find "$prefix" -name "libkiln_$lib.a") ]] || fail "libkiln_$lib.a is not installed"
done
if grep -rlF -e "$src/" -e "$build/" "$package_dir"; then
  fail "the CMake package above names kiln's source or build tree"
fi

step "every kiln header an installed header includes is installed"
# A quoted include whose first folder is one of kiln's (ir/, passes/, ...) is kiln's; others
# ("absl/...") are the system's. Without CUDA, codegen/ and runtime/cuda/ are not built and
# only included under #ifdef KILN_WITH_CUDA.
missing=0
while IFS= read -r header; do
  while IFS= read -r included; do
    top=${included%%/*}
    [[ $included == */* && -d $src/$top ]] || continue
    [[ $with_cuda != ON && ($top == codegen || $included == runtime/cuda/*) ]] && continue
    if [[ ! -f $prefix/include/$included ]]; then
      echo "  ${header#"$prefix"/include/} includes \"$included\", which is not installed" >&2
      missing=1
    fi
  done < <(sed -nE 's/^[[:space:]]*#[[:space:]]*include[[:space:]]+"([^"]+)".*/\1/p' "$header")
done < <(find "$prefix/include" -name '*.h')
((missing == 0)) || fail "headers missing from the package"

# No libcuda, and Abseil, protobuf and libstdc++ linked statically (cli_binary_deps_test.cc
# holds build/kiln to the same).
check_links() {
  local needed
  needed=$(readelf -d "$1" | grep '(NEEDED)') || fail "readelf -d $1"
  if grep -E 'libcuda\.so|libabsl|libprotobuf|libstdc\+\+|libgcc_s' <<<"$needed"; then
    fail "$1 links the shared libraries above"
  fi
}

step "the installed kiln runs"
quiet "$prefix/bin/kiln models" "$prefix/bin/kiln" models
grep -q llama-tiny "$work/log" || fail "kiln models does not list llama-tiny: $(cat "$work/log")"
check_links "$prefix/bin/kiln"

for example in print_llama train_mlp; do
  step "frontends/examples/$example: configure and build against the package"
  quiet "configure $example" cmake -S "$src/frontends/examples/$example" -B "$work/$example" -G "$generator" \
    -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_COMPILER="$cxx" -DCMAKE_PREFIX_PATH="$prefix"
  found=$(sed -n 's/^kiln_DIR:PATH=//p' "$work/$example/CMakeCache.txt")
  [[ $found == "$package_dir" ]] || fail "$example found kiln at '$found', not in $package_dir"
  quiet "build $example" cmake --build "$work/$example" -j 2
  check_links "$work/$example/$example"
done

step "print_llama prints llama-tiny's IR, as the in-tree build does"
"$work/print_llama/print_llama" >"$work/print_llama.out" || fail "print_llama exited $?"
"$in_tree_print_llama" >"$work/print_llama.expected" || fail "$in_tree_print_llama exited $?"
[[ $(head -n 1 "$work/print_llama.out") == "module @llama-tiny" ]] || fail "print_llama: $(head -n 3 "$work/print_llama.out")"
grep -q '^func @forward {$' "$work/print_llama.out" || fail "print_llama prints no @forward"
diff "$work/print_llama.expected" "$work/print_llama.out" >&2 || fail "print_llama's output differs from the in-tree build's"

step "train_mlp trains, and its loss falls"
"$work/train_mlp/train_mlp" >"$work/train_mlp.out" || fail "train_mlp exited $?"
cat "$work/train_mlp.out"
"$in_tree_train_mlp" >"$work/train_mlp.expected" || fail "$in_tree_train_mlp exited $?"
diff "$work/train_mlp.expected" "$work/train_mlp.out" >&2 || fail "train_mlp's output differs from the in-tree build's"
# The last printed training loss below a third of the first, and the held-out loss below a
# third of what it was before training.
awk '
  $1 == "step" && $3 == "loss" { n++; if (n == 1) first = $4; last = $4 }
  $1 == "held-out" { before = $3; after = $6 }
  END {
    if (n < 5) { print "train_mlp printed " n " losses" > "/dev/stderr"; exit 1 }
    if (!(last < first / 3)) { print "training loss " first " -> " last > "/dev/stderr"; exit 1 }
    if (!(after < before / 3)) { print "held-out loss " before " -> " after > "/dev/stderr"; exit 1 }
  }' "$work/train_mlp.out" || fail "train_mlp's loss did not fall"
step "ok"
