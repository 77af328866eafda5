#!/usr/bin/env bash
# Fuzz smoke run (style guide 2.10 "Fuzz", CI check 2.11.10).
#
# Builds every cargo-fuzz target in fuzz/, checks the committed seeds are
# current, then runs each target for FUZZ_SECONDS (default 30) starting from
# a scratch copy of fuzz/seeds/<target>/ (plus the reproducers of past
# findings in fuzz/regressions/<target>/, if any) in fuzz/corpus/<target>/;
# libFuzzer replays that whole corpus before it mutates anything. Any
# crash, assertion failure, timeout, leak or OOM fails the script; the
# reproducer stays in fuzz/artifacts/<target>/ and the command to replay it
# is printed.
#
#   scripts/fuzz.sh                    every target
#   scripts/fuzz.sh cqe_decode         only the named targets
#   FUZZ_SECONDS=600 scripts/fuzz.sh   a longer run
#
# Needs the nightly toolchain (sanitizer flags); cargo-fuzz is installed
# from crates.io if missing.
set -euo pipefail

seconds=${FUZZ_SECONDS:-30}
toolchain=${FUZZ_TOOLCHAIN:-nightly}
# Per-input time limit: anything slower than this is reported as a hang.
input_timeout=${FUZZ_INPUT_TIMEOUT:-10}

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root/fuzz"

if ! cargo +"$toolchain" --version >/dev/null 2>&1; then
    echo "fuzz.sh: the '$toolchain' toolchain is not installed (rustup toolchain install $toolchain)" >&2
    exit 1
fi
if ! cargo fuzz --version >/dev/null 2>&1; then
    echo "fuzz.sh: installing cargo-fuzz" >&2
    cargo install cargo-fuzz --locked
fi

if [ "$#" -gt 0 ]; then
    targets=("$@")
else
    mapfile -t targets < <(cargo +"$toolchain" fuzz list)
fi
if [ "${#targets[@]}" -eq 0 ]; then
    echo "fuzz.sh: no fuzz targets found" >&2
    exit 1
fi

echo "== fuzz: seed corpora are current"
cargo +"$toolchain" test --quiet

echo "== fuzz: build every target"
cargo +"$toolchain" fuzz build

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
    log=$(mktemp "${TMPDIR:-/tmp}/fuzz-$t.XXXXXX")
    # Artifacts newer than this marker were written by this run.
    marker=$(mktemp "${TMPDIR:-/tmp}/fuzz-$t-start.XXXXXX")
    echo "== fuzz: $t for ${seconds}s from $(ls "$corpus" | wc -l) inputs (seeds, regressions)"
    set +e
    cargo +"$toolchain" fuzz run "$t" "$corpus" -- \
        -max_total_time="$seconds" \
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
            echo "!! reproduce: (cd fuzz && cargo +$toolchain fuzz run $t $a)" >&2
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
