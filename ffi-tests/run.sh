#!/usr/bin/env bash
# CI entry point for the C ABI tests:
#  1. builds the release staticlib, then builds and runs every C/C++ test
#     and the C examples, plain and under ASan+UBSan (make check);
#     then builds examples/c/fuzz_wr_builder.c with clang's libFuzzer and
#     runs it briefly (make check-fuzz-example);
#  2. builds a ThreadSanitizer-instrumented staticlib with the pinned
#     nightly and runs the threaded submission-service test and example
#     under TSan (make check-tsan; the first build takes about 4 minutes);
#  3. installs the library with scripts/install.sh into a temporary PREFIX
#     and builds the C examples (examples/c/pingpong.c, write_bw.c) the way
#     a user would, with `cc ... $(pkg-config --cflags --libs rdma-direct)`,
#     then runs them on the software device, and checks that `--device`
#     on this library (built without the verbs backend) is refused with
#     the example's explanation. (The verbs-enabled install, FEATURES=verbs,
#     is built and run on rxe by scripts/vm-test.sh.)
# Honours CARGO_TARGET_DIR.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/.." && pwd)

make -C "$here" check
# The C libFuzzer example (examples/c/fuzz_wr_builder.c): clang's
# -fsanitize=fuzzer; scripts/install-deps.sh installs clang.
make -C "$here" check-fuzz-example

# shellcheck source=scripts/toolchains.sh
. "$root/scripts/toolchains.sh"
rdd_ensure_nightly
make -C "$here" check-tsan NIGHTLY="$RDD_NIGHTLY"

echo "== install into a temporary prefix and build with pkg-config"
prefix=$(mktemp -d "${TMPDIR:-/tmp}/rdd-prefix.XXXXXX")
trap 'rm -rf "$prefix"' EXIT
PREFIX="$prefix" bash "$root/scripts/install.sh"
export PKG_CONFIG_PATH="$prefix/lib/pkgconfig"
# The installed copy must be self-contained: build outside the source tree.
cp "$root/examples/c/pingpong.c" "$root/examples/c/write_bw.c" "$root/examples/c/common.h" \
    "$prefix/"
cd "$prefix"
echo "pkg-config --cflags --libs rdma-direct: $(pkg-config --cflags --libs rdma-direct)"
pkg-config --exists --print-errors "rdma-direct = $(pkg-config --modversion rdma-direct)"
# Without FEATURES=verbs the .pc file has no private fields.
if grep -q '^Requires.private:\|^Libs.private:' lib/pkgconfig/rdma-direct.pc; then
    echo "ffi-tests: a build without verbs installed private fields:" >&2
    cat lib/pkgconfig/rdma-direct.pc >&2
    exit 1
fi
for ex in pingpong write_bw; do
    # shellcheck disable=SC2046  # pkg-config prints several words
    cc -std=c11 -Wall -Wextra -Wpedantic -Werror -O2 "$ex.c" \
        $(pkg-config --cflags --libs rdma-direct) -o "$ex"
done
./pingpong 2000 64
./pingpong 200 256 --step
./write_bw --iters 5000 --warmup 500
# --device needs a verbs-enabled library: refused, exit 2, saying why.
for ex in pingpong write_bw; do
    rc=0
    "./$ex" --device rxe0 >out.txt 2>&1 || rc=$?
    if [ "$rc" != 2 ] || ! grep -q "built without the verbs backend" out.txt; then
        echo "ffi-tests: $ex --device on a library without verbs: exit $rc, expected 2 and an explanation:" >&2
        cat out.txt >&2
        exit 1
    fi
    echo "$ex --device rxe0 (no verbs backend): refused as expected: $(head -n 1 out.txt)"
done
echo "ffi-tests: pkg-config builds of examples/c/pingpong.c and write_bw.c passed"
