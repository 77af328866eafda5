#!/usr/bin/env bash
# Miri over the core's unit tests (undefined behaviour, data races and
# Stacked Borrows violations in the code the data path is built from).
#
#   scripts/miri.sh              wr::, error:: and ring:: unit tests
#   scripts/miri.sh FILTER...    only the tests whose names contain a FILTER
#
# Scope. The lib is built with `--no-default-features --features std`:
# no software HCA (its device thread and `Instant` polling make every
# test far too slow under Miri) and no C ABI. Of the unit tests that
# exist (`cargo test --lib -- --list`), the core modules are:
#
#   wr::              WR validation (SGE limits, inline, atomics)
#   error::           error codes
#   ring::            ring::mp (the lock-free multi-producer send ring)
#                     and ring::submit (the SPSC/MPSC submission rings;
#                     its `mpsc_two_threads` test runs real threads, which
#                     Miri schedules and checks for data races)
#
#   provider::mlx5::  the batch writer, the fast poll loop and in-order
#                     retirement on fake queue memory (the integration
#                     tests ring doorbells, and Miri cannot run `sfence`)
#   provider::rxe::,  the rxe and siw rings and codecs against an emulated
#   provider::siw::   kernel side (one thread per side in their
#                     concurrent tests)
#
# Then, with no FILTER given, a second pass with `--features std,soft`:
#
#   pool::            the buffer pool's lock-free free lists and slabs
#
# Miri's default flags are used: Stacked Borrows, strict data-race
# detection, isolation on. Nothing is disabled. If Miri reports UB, the
# script fails with Miri's own diagnostic: fix the code, do not add
# -Zmiri-* flags to hide it.
#
# The toolchain is the pinned nightly, RDD_NIGHTLY in scripts/toolchains.sh
# (installed, with miri and rust-src, if missing).
#
# MIRIFLAGS from the environment is passed through (for example
# `MIRIFLAGS=-Zmiri-many-seeds=0..8 scripts/miri.sh ring::` to explore more
# thread interleavings). CARGO_TARGET_DIR defaults to target/miri-ci so
# the nightly build does not evict the normal cache.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
# shellcheck source=scripts/toolchains.sh
. scripts/toolchains.sh

DEFAULT_FILTERS=("wr::" "error::" "ring::" "provider::mlx5::" "provider::rxe::" "provider::siw::")
if [ "$#" -gt 0 ]; then
    filters=("$@")
else
    filters=("${DEFAULT_FILTERS[@]}")
fi

die() {
    echo "miri.sh: FAILED: $*" >&2
    exit 1
}

rdd_ensure_nightly || die "Miri needs the $RDD_NIGHTLY toolchain with ${RDD_NIGHTLY_COMPONENTS[*]} (see above)"

export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-target/miri-ci}"
echo "miri.sh: $(rustup run "$RDD_NIGHTLY" rustc --version); $(cargo +"$RDD_NIGHTLY" miri --version 2>/dev/null || echo 'miri ?')" >&2
cargo +"$RDD_NIGHTLY" miri setup >/dev/null || die "cargo miri setup"

start=$(date +%s)
# List first, so a filter that matches nothing is an error rather than a
# silent pass (libtest filters are substrings; `--exact` is not used).
listing=$(cargo +"$RDD_NIGHTLY" miri test --lib --no-default-features --features std -- --list "${filters[@]}") ||
    die "the lib does not build under Miri (run: cargo +$RDD_NIGHTLY miri test --lib --no-default-features --features std)"
count=$(grep -c ': test$' <<<"$listing" || true)
[ "$count" -gt 0 ] || die "no unit tests match: ${filters[*]}"
echo "miri.sh: $count unit tests match: ${filters[*]}" >&2

if ! cargo +"$RDD_NIGHTLY" miri test --lib --no-default-features --features std -- "${filters[@]}"; then
    die "Miri reported an error (undefined behaviour, a data race, a leak or a failing test) above"
fi
echo "miri.sh: all $count tests passed under Miri in $(($(date +%s) - start)) s" >&2

if [ "$#" -eq 0 ]; then
    # The buffer pool needs the safe API (feature soft) to build; its unit
    # tests do not start the software device.
    start=$(date +%s)
    listing=$(cargo +"$RDD_NIGHTLY" miri test --lib --no-default-features --features std,soft -- --list pool::) ||
        die "the lib does not build under Miri with std,soft"
    count=$(grep -c ': test$' <<<"$listing" || true)
    [ "$count" -gt 0 ] || die "no unit tests match: pool::"
    if ! cargo +"$RDD_NIGHTLY" miri test --lib --no-default-features --features std,soft -- pool::; then
        die "Miri reported an error in pool:: (see above)"
    fi
    echo "miri.sh: all $count pool:: tests passed under Miri in $(($(date +%s) - start)) s" >&2
fi
