#!/usr/bin/env bash
# Builds the release static library and installs the C API:
#
#   $PREFIX/lib/librdma_direct.a
#   $PREFIX/include/rdma_direct.h
#   $PREFIX/lib/pkgconfig/rdma-direct.pc   (generated from rdma-direct.pc.in)
#
# so that `cc app.c $(pkg-config --cflags --libs rdma-direct)` works.
#
#   scripts/install.sh                          PREFIX=/usr/local
#   PREFIX=$HOME/.local scripts/install.sh
#   LIBDIR=/usr/lib64 PREFIX=/usr scripts/install.sh
#   DESTDIR=/tmp/stage PREFIX=/usr scripts/install.sh   staged (packaging):
#       files go under $DESTDIR, the .pc file names $PREFIX
#
# Only the static archive is installed (no shared library), so -lrdma_direct
# always links it. Honours CARGO_TARGET_DIR and CARGO.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
prefix=${PREFIX:-/usr/local}
libdir=${LIBDIR:-$prefix/lib}
includedir=${INCLUDEDIR:-$prefix/include}
destdir=${DESTDIR:-}
cargo=${CARGO:-cargo}
target_dir=${CARGO_TARGET_DIR:-$root/target}

case "$prefix$libdir$includedir" in
    *'|'*) echo "install.sh: paths must not contain '|'" >&2; exit 2 ;;
esac

cd "$root"
version=$(sed -n 's/^version *= *"\([^"]*\)".*/\1/p' Cargo.toml | head -n 1)
if [ -z "$version" ]; then
    echo "install.sh: no version in Cargo.toml" >&2
    exit 1
fi

# Build the staticlib and ask rustc which native libraries it needs (cargo
# replays the note when the build is already fresh).
echo "install.sh: building librdma_direct.a $version (release)" >&2
log=$(mktemp "${TMPDIR:-/tmp}/rdd-install.XXXXXX")
trap 'rm -f "$log"' EXIT
if ! "$cargo" rustc --release --lib --features ffi,soft --crate-type staticlib \
    -- --print native-static-libs >"$log" 2>&1; then
    cat "$log" >&2
    echo "install.sh: build failed" >&2
    exit 1
fi
native=$(sed -n 's/^note: native-static-libs: //p' "$log" | tail -n 1)
if [ -z "$native" ]; then
    cat "$log" >&2
    echo "install.sh: rustc did not report the native libraries" >&2
    exit 1
fi
# libc is always linked by the C compiler driver.
libs=()
for l in $native; do
    [ "$l" = "-lc" ] || libs+=("$l")
done

lib="$target_dir/release/librdma_direct.a"
if [ ! -f "$lib" ]; then
    echo "install.sh: $lib was not built" >&2
    exit 1
fi

install -d "$destdir$libdir" "$destdir$includedir" "$destdir$libdir/pkgconfig"
install -m 0644 "$lib" "$destdir$libdir/librdma_direct.a"
install -m 0644 include/rdma_direct.h "$destdir$includedir/rdma_direct.h"
sed -e "s|@PREFIX@|$prefix|g" \
    -e "s|@LIBDIR@|$libdir|g" \
    -e "s|@INCLUDEDIR@|$includedir|g" \
    -e "s|@VERSION@|$version|g" \
    -e "s|@NATIVE_LIBS@|${libs[*]}|g" \
    rdma-direct.pc.in >"$destdir$libdir/pkgconfig/rdma-direct.pc"
chmod 0644 "$destdir$libdir/pkgconfig/rdma-direct.pc"

echo "install.sh: installed into ${destdir}${prefix}:" >&2
echo "  $libdir/librdma_direct.a" >&2
echo "  $includedir/rdma_direct.h" >&2
echo "  $libdir/pkgconfig/rdma-direct.pc (Libs: -lrdma_direct ${libs[*]})" >&2
echo "build C programs with: cc app.c \$(pkg-config --cflags --libs rdma-direct)" >&2
if [ -z "$destdir" ]; then
    echo "  (set PKG_CONFIG_PATH=$libdir/pkgconfig if that is not a default pkg-config directory)" >&2
fi
