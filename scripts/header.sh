#!/usr/bin/env bash
# Header drift check for include/rdma_direct.h (docs/architecture.md §9, CONTRIBUTING.md).
#
#   scripts/header.sh           regenerate into a temp file, fail on any diff
#   scripts/header.sh --write   regenerate include/rdma_direct.h in place
#
# cbindgen is pinned (CBINDGEN_VERSION in scripts/toolchains.sh): a
# different version may format the header differently, so exactly that
# version is installed if missing or different.
# cbindgen runs on src/ffi/mod.rs (single-source mode, following the `mod`
# declarations under it), so only the C API is scanned; see cbindgen.toml.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
# shellcheck source=scripts/toolchains.sh
. scripts/toolchains.sh
header=include/rdma_direct.h

mode=check
case "${1:-}" in
    "") ;;
    --write) mode='write' ;;
    *) echo "usage: $0 [--write]" >&2; exit 2 ;;
esac

# CBINDGEN=/path/to/cbindgen uses that binary (it must be the pinned version).
if [ -n "${CBINDGEN:-}" ]; then
    cbindgen_bin=$CBINDGEN
    have=$("$cbindgen_bin" --version 2>/dev/null | awk '{print $2}' || true)
    if [ "$have" != "$CBINDGEN_VERSION" ]; then
        echo "header.sh: CBINDGEN=$CBINDGEN is version ${have:-?}, expected $CBINDGEN_VERSION" >&2
        exit 1
    fi
else
    cbindgen_bin=cbindgen
    rdd_ensure_cargo_tool cbindgen "$CBINDGEN_VERSION" cbindgen || {
        echo "header.sh: cbindgen $CBINDGEN_VERSION is needed (see above)" >&2
        exit 1
    }
fi

tmp=$(mktemp "${TMPDIR:-/tmp}/rdma_direct.h.XXXXXX")
trap 'rm -f "$tmp"' EXIT
"$cbindgen_bin" --quiet --config cbindgen.toml --output "$tmp" src/ffi/mod.rs

if [ "$mode" = write ]; then
    cp "$tmp" "$header"
    echo "header.sh: wrote $header (cbindgen $CBINDGEN_VERSION)"
    exit 0
fi

if [ ! -f "$header" ]; then
    echo "header.sh: $header is missing; run scripts/header.sh --write" >&2
    exit 1
fi
if ! diff -u "$header" "$tmp"; then
    echo "header.sh: $header is out of date with src/ffi; run scripts/header.sh --write and commit it" >&2
    exit 1
fi
echo "header.sh: $header is up to date (cbindgen $CBINDGEN_VERSION)"
