#!/usr/bin/env bash
# Fuzz smoke run (CONTRIBUTING.md, fuzz/README.md).
#
# Builds every cargo-fuzz target in fuzz/, checks the committed seeds are
# current, then runs each target for FUZZ_SECONDS (default 30; the lean
# targets wr_check, wqe_one and cqe_one FUZZ_LEAN_SECONDS, default 15)
# starting from a scratch copy of fuzz/seeds/<target>/ (plus the
# reproducers of past findings in fuzz/regressions/<target>/ and the
# committed minimised campaign corpus fuzz/merged/<target>/, if any) in
# fuzz/corpus/<target>/; libFuzzer replays that whole corpus before it
# mutates anything. Any
# crash, assertion failure, timeout, leak or OOM fails the script; the
# reproducer stays in fuzz/artifacts/<target>/ and the command to replay it
# is printed.
#
#   scripts/fuzz.sh                    every target (`cargo fuzz list`: wqe_encode,
#                                      cqe_decode, wr_parse, raw_ops, obj_ops,
#                                      submit_ops, ...)
#   scripts/fuzz.sh cqe_decode         only the named targets
#   FUZZ_SECONDS=600 scripts/fuzz.sh   a longer run
#
# Needs the pinned nightly, RDD_NIGHTLY in scripts/toolchains.sh (the
# sanitizer flags are nightly-only), and cargo-fuzz CARGO_FUZZ_VERSION; both
# are installed if missing. fuzz/ has its own Cargo.toml but no toolchain
# file, so rustup gives it the repository's rust-toolchain.toml (stable):
# every cargo call below names the nightly explicitly.
set -euo pipefail

seconds=${FUZZ_SECONDS:-30}
lean_seconds=${FUZZ_LEAN_SECONDS:-15}
# The lean targets run thousands of times faster than the deep ones: a
# short smoke run already executes hundreds of thousands of inputs.
lean_targets=" wr_check wqe_one cqe_one fabric_rx "
# Per-input time limit: anything slower than this is reported as a hang.
input_timeout=${FUZZ_INPUT_TIMEOUT:-10}

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# shellcheck source=scripts/toolchains.sh
. "$root/scripts/toolchains.sh"
cd "$root/fuzz"

if ! rdd_ensure_nightly; then
    echo "fuzz.sh: the $RDD_NIGHTLY toolchain is needed (see above)" >&2
    exit 1
fi
if ! rdd_ensure_cargo_tool cargo-fuzz "$CARGO_FUZZ_VERSION" cargo fuzz; then
    echo "fuzz.sh: cargo-fuzz $CARGO_FUZZ_VERSION is needed (see above)" >&2
    exit 1
fi
echo "fuzz.sh: $(rustup run "$RDD_NIGHTLY" rustc --version); $(cargo fuzz --version)"

if [ "$#" -gt 0 ]; then
    targets=("$@")
else
    mapfile -t targets < <(cargo +"$RDD_NIGHTLY" fuzz list)
fi
if [ "${#targets[@]}" -eq 0 ]; then
    echo "fuzz.sh: no fuzz targets found" >&2
    exit 1
fi

echo "== fuzz: seed corpora are current"
cargo +"$RDD_NIGHTLY" test --quiet

echo "== fuzz: build every target"
cargo +"$RDD_NIGHTLY" fuzz build

failed=()
for t in "${targets[@]}"; do
    seeds="seeds/$t"
    corpus="corpus/$t"
    if [ ! -d "$seeds" ]; then
        echo "fuzz.sh: no seed directory $seeds" >&2
        exit 1
    fi
    rm -rf "$corpus"
    mkdir -p "$corpus" "artifacts/$t"
    cp "$seeds"/* "$corpus"/
    if [ -d "regressions/$t" ]; then
        cp "regressions/$t"/* "$corpus"/
    fi
    if [ -d "merged/$t" ]; then
        cp "merged/$t"/* "$corpus"/
    fi
    secs=$seconds
    case "$lean_targets" in
        *" $t "*) secs=$lean_seconds ;;
    esac
    log=$(mktemp "${TMPDIR:-/tmp}/fuzz-$t.XXXXXX")
    # Artifacts newer than this marker were written by this run.
    marker=$(mktemp "${TMPDIR:-/tmp}/fuzz-$t-start.XXXXXX")
    echo "== fuzz: $t for ${secs}s from $(find "$corpus" -type f | wc -l) inputs (seeds, regressions, merged corpus)"
    set +e
    cargo +"$RDD_NIGHTLY" fuzz run "$t" "$corpus" -- \
        -max_total_time="$secs" \
        -timeout="$input_timeout" \
        -print_final_stats=1 >"$log" 2>&1
    rc=$?
    set -e
    # libFuzzer's last status line: executions, coverage, corpus size.
    grep -E '^#[0-9]+' "$log" | tail -n 1 || true
    grep -E '^stat::(number_of_executed_units|average_exec_per_sec|peak_rss_mb)' "$log" || true
    if [ "$rc" -ne 0 ]; then
        echo "!! fuzz: $t FAILED (exit $rc)" >&2
        # The panic message (or sanitizer report), then libFuzzer's summary.
        grep -E -A 6 "panicked at|^==[0-9]+==ERROR" "$log" | head -n 40 >&2 || true
        grep -E "^SUMMARY|Test unit written|^(Base64|Output of)" "$log" >&2 || true
        find "artifacts/$t" -type f -newer "$marker" | while read -r a; do
            echo "!! reproduce: (cd fuzz && cargo +$RDD_NIGHTLY fuzz run $t $a)" >&2
        done
        failed+=("$t")
    fi
    rm -f "$log" "$marker"
done

passed=$((${#targets[@]} - ${#failed[@]}))
if [ "${#failed[@]}" -ne 0 ]; then
    echo "!! fuzz: FAILED: ${failed[*]}" >&2
    echo "fuzz: $passed passed, ${#failed[@]} failed"
    exit 1
fi
echo "fuzz: $passed passed, 0 failed"
