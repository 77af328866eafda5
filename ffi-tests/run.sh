#!/usr/bin/env bash
# CI entry point for the C ABI tests:
#  1. builds the release staticlib, then builds and runs every C/C++ test
#     and the C example, plain and under ASan+UBSan (make check);
#  2. installs the library with scripts/install.sh into a temporary PREFIX
#     and builds examples/c/pingpong.c the way a user would, with
#     `cc ... $(pkg-config --cflags --libs rdma-direct)`, then runs it.
# Honours CARGO_TARGET_DIR.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/.." && pwd)

make -C "$here" check

echo "== install into a temporary prefix and build with pkg-config"
prefix=$(mktemp -d "${TMPDIR:-/tmp}/rdd-prefix.XXXXXX")
trap 'rm -rf "$prefix"' EXIT
PREFIX="$prefix" bash "$root/scripts/install.sh"
export PKG_CONFIG_PATH="$prefix/lib/pkgconfig"
# The installed copy must be self-contained: build outside the source tree.
cp "$root/examples/c/pingpong.c" "$prefix/pingpong.c"
cd "$prefix"
echo "pkg-config --cflags --libs rdma-direct: $(pkg-config --cflags --libs rdma-direct)"
pkg-config --exists --print-errors "rdma-direct = $(pkg-config --modversion rdma-direct)"
cc -std=c11 -Wall -Wextra -Wpedantic -Werror -O2 pingpong.c \
    $(pkg-config --cflags --libs rdma-direct) -o pingpong
./pingpong 2000 64
./pingpong 200 256 --step
echo "ffi-tests: pkg-config build of examples/c/pingpong.c passed"
