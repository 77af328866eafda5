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
#   FEATURES=verbs scripts/install.sh           with the verbs backend:
#       rdd_device_open_verbs opens kernel RDMA devices (rxe, siw, mlx5)
#
# FEATURES=verbs builds the archive with `--features verbs` (needs
# libibverbs-dev and librdmacm-dev). The archive then needs rdma-core's
# libibverbs, librdmacm and libmlx5: the .pc file names them in
# Requires.private (each one whose own .pc file pkg-config finds here; the
# others as -l flags in Libs.private), so C programs link with
#   cc app.c $(pkg-config --cflags --libs --static rdma-direct)
# Without FEATURES the .pc file is exactly as before: no private fields.
#
# Only the static archive is installed (no shared library), so -lrdma_direct
# always links it. Honours CARGO_TARGET_DIR, CARGO and PKG_CONFIG.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
prefix=${PREFIX:-/usr/local}
libdir=${LIBDIR:-$prefix/lib}
includedir=${INCLUDEDIR:-$prefix/include}
destdir=${DESTDIR:-}
cargo=${CARGO:-cargo}
pkg_config=${PKG_CONFIG:-pkg-config}
target_dir=${CARGO_TARGET_DIR:-$root/target}
features=${FEATURES:-}

case "$features" in
    "") cargo_features=ffi,soft ;;
    verbs) cargo_features=ffi,soft,verbs ;;
    *) echo "install.sh: FEATURES must be empty or 'verbs', not '$features'" >&2; exit 2 ;;
esac

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
echo "install.sh: building librdma_direct.a $version (release, features $cargo_features)" >&2
log=$(mktemp "${TMPDIR:-/tmp}/rdd-install.XXXXXX")
trap 'rm -f "$log"' EXIT
if ! "$cargo" rustc --release --lib --features "$cargo_features" --crate-type staticlib \
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
# libc is always linked by the C compiler driver. The rdma-core libraries
# of the verbs backend go to the private fields (below), under the name of
# their pkg-config module.
libs=()
verbs_libs=()
for l in $native; do
    case "$l" in
        -lc) ;;
        -libverbs | -lrdmacm | -lmlx5) verbs_libs+=("$l") ;;
        *) libs+=("$l") ;;
    esac
done
requires_private=()
libs_private=()
if [ "$features" = verbs ]; then
    if [ ${#verbs_libs[@]} -ne 3 ]; then
        cat "$log" >&2
        echo "install.sh: rustc reported '${verbs_libs[*]}', expected -libverbs, -lrdmacm and -lmlx5" >&2
        exit 1
    fi
    for l in "${verbs_libs[@]}"; do
        module=lib${l#-l}            # -libverbs -> libibverbs, -lmlx5 -> libmlx5
        if "$pkg_config" --exists --static "$module" 2>/dev/null; then
            requires_private+=("$module")
        else
            libs_private+=("$l")
        fi
    done
elif [ ${#verbs_libs[@]} -ne 0 ]; then
    echo "install.sh: a build without verbs reported '${verbs_libs[*]}'" >&2
    exit 1
fi
# Comma-separated, as pkg-config lists modules.
requires_joined=$(IFS=,; echo "${requires_private[*]}")
requires_joined=${requires_joined//,/, }

lib="$target_dir/release/librdma_direct.a"
if [ ! -f "$lib" ]; then
    echo "install.sh: $lib was not built" >&2
    exit 1
fi

install -d "$destdir$libdir" "$destdir$includedir" "$destdir$libdir/pkgconfig"
install -m 0644 "$lib" "$destdir$libdir/librdma_direct.a"
install -m 0644 include/rdma_direct.h "$destdir$includedir/rdma_direct.h"
# '##' lines are notes of the template only; an empty private field is
# left out altogether.
drop_empty=()
[ -n "$requires_joined" ] || drop_empty+=(-e '/^Requires.private: @REQUIRES_PRIVATE@$/d')
[ ${#libs_private[@]} -ne 0 ] || drop_empty+=(-e '/^Libs.private: @LIBS_PRIVATE@$/d')
sed -e '/^##/d' \
    "${drop_empty[@]}" \
    -e "s|@PREFIX@|$prefix|g" \
    -e "s|@LIBDIR@|$libdir|g" \
    -e "s|@INCLUDEDIR@|$includedir|g" \
    -e "s|@VERSION@|$version|g" \
    -e "s|@NATIVE_LIBS@|${libs[*]}|g" \
    -e "s|@REQUIRES_PRIVATE@|$requires_joined|g" \
    -e "s|@LIBS_PRIVATE@|${libs_private[*]}|g" \
    rdma-direct.pc.in >"$destdir$libdir/pkgconfig/rdma-direct.pc"
chmod 0644 "$destdir$libdir/pkgconfig/rdma-direct.pc"

echo "install.sh: installed into ${destdir}${prefix}:" >&2
echo "  $libdir/librdma_direct.a" >&2
echo "  $includedir/rdma_direct.h" >&2
echo "  $libdir/pkgconfig/rdma-direct.pc (Libs: -lrdma_direct ${libs[*]})" >&2
if [ "$features" = verbs ]; then
    [ -z "$requires_joined" ] || echo "    Requires.private: $requires_joined" >&2
    [ ${#libs_private[@]} -eq 0 ] || echo "    Libs.private: ${libs_private[*]}" >&2
    echo "build C programs with: cc app.c \$(pkg-config --cflags --libs --static rdma-direct)" >&2
    echo "  (--static: the archive needs libibverbs, librdmacm and libmlx5, which only --static lists)" >&2
else
    echo "build C programs with: cc app.c \$(pkg-config --cflags --libs rdma-direct)" >&2
fi
if [ -z "$destdir" ]; then
    echo "  (set PKG_CONFIG_PATH=$libdir/pkgconfig if that is not a default pkg-config directory)" >&2
fi
