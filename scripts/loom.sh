#!/usr/bin/env bash
# Loom model checks of the ring algorithms (docs/architecture.md §6).
#
# Runs every test in a module named `loom_tests` (today: src/ring/mp/,
# src/ring/submit/ and src/soft/fabric/ring/), compiled with `--cfg loom`
# so `crate::sync` hands out loom's atomics and cells, in the `loom`
# profile (test + opt-level 3).
#
# Preemption bound: LOOM_MAX_PREEMPTIONS defaults to 2, as tokio's and
# thingbuf's CI do. A bound of 2 still finds the broken-ordering execution
# in submit::loom_tests::relaxed_publish_is_caught (it needs none), and
# keeps the three-thread models at seconds each; raise it locally for a
# deeper (much slower) search.
#
# Measured (2-core container, loom profile, LOOM_MAX_PREEMPTIONS=2):
#   ring::submit::loom_tests  6 models, 6.4 s together: service 3.5 s,
#     mpsc_three_producers 2.5 s, mpsc_two_producers 0.3 s, the rest < 0.1 s
#     (with LOOM_MAX_PREEMPTIONS=3: service 33 s, mpsc_three 14 s)
#   ring::mp::loom_tests      5 models, 24 s together
#   soft::fabric::ring::loom_tests  3 models, 0.1 s together
#   whole script: 95 s from a cold target dir (~65 s of it building loom
#     and the crate), 45 s with a warm one.
#
# Usage: scripts/loom.sh [SCOPE]   e.g. `scripts/loom.sh ring::submit` runs one
# module's models (the filter is "SCOPE::loom_tests::"); default: all.
#
# The build uses its own target directory (default target/loom) because
# RUSTFLAGS="--cfg loom" would otherwise invalidate the normal build cache.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

export RUSTFLAGS="${RUSTFLAGS:-} --cfg loom"
export LOOM_MAX_PREEMPTIONS="${LOOM_MAX_PREEMPTIONS:-2}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-target/loom}"

filter="${1:-}::loom_tests::"
echo "loom: filter $filter LOOM_MAX_PREEMPTIONS=$LOOM_MAX_PREEMPTIONS CARGO_TARGET_DIR=$CARGO_TARGET_DIR"
start=$(date +%s)
if ! cargo test --profile loom --lib -- "$filter"; then
    echo "loom: FAILED (a model found a bug, or did not finish)" >&2
    exit 1
fi
echo "loom: all models passed in $(($(date +%s) - start)) s"
