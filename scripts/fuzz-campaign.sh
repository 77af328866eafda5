#!/usr/bin/env bash
# Fuzz campaign (docs/fuzzing.md, fuzz/README.md): long runs that carry
# their progress in a merged corpus.
#
#   scripts/fuzz-campaign.sh [-t SECONDS] [-j JOBS] [-n RUNS] [-c] [TARGET...]
#
#   -t SECONDS  time per target (default 600); ignored with -n
#   -n RUNS     run each target for exactly RUNS executions instead
#   -j JOBS     parallel fuzzing processes per target (default 1; libFuzzer
#               -fork=JOBS when above 1)
#   -c          also measure source coverage with `cargo fuzz coverage`
#               (edges, and the lines of src/ the corpus never reaches)
#   TARGET...   default: every target (`cargo fuzz list`)
#
# For each target, in this order:
#  1. the campaign corpus fuzz/campaign/corpus/<target>/ is fuzzed (on the
#     first run it is made from the committed merged corpus
#     fuzz/merged/<target>/, the seeds and the regressions); new inputs go
#     to a scratch directory, and libFuzzer replays the corpus first;
#  2. corpus, new inputs, seeds and regressions are merged and minimised
#     (`-merge=1`: the smallest set with the same coverage) back into the
#     campaign corpus, and copied to fuzz/merged/<target>/, which is
#     committed: the next campaign, on any machine, starts where this one
#     stopped;
#  3. the run is reported and appended to the committed ledger
#     fuzz/ledger.tsv: date, the commit fuzzed (with "+" when the work tree
#     had changes), target, seconds, jobs, executions, exec/s (wall), exec
#     per CPU second, CPU seconds, edges covered by the merged corpus,
#     corpus files and bytes, findings; `cumulative` is the sum of
#     executions over every run of the target recorded there;
#  4. with -c, `cargo fuzz coverage` replays the merged corpus with source
#     coverage; the per-file summary of src/ and the never-reached lines
#     (file:line ranges) go to fuzz/campaign/coverage/<target>.txt;
#  5. a finding (crash, assertion, timeout, leak, OOM; a slow-unit report
#     only if the input is slow again on replay) is minimised
#     (`-minimize_crash=1`) and copied to fuzz/regressions/<target>/; the
#     script then fails and prints how to replay it. Replaying it is the
#     regression test: `scripts/fuzz.sh` (and CI) replays every file in
#     fuzz/regressions/<target>/ before it fuzzes, and the
#     `regressions_are_named_and_have_a_target` test of fuzz/ (`cargo test` in
#     fuzz/) checks that each file there is named and has a target; name it
#     after the bug and add the fix's own unit test in the crate.
#
# fuzz/campaign/ is scratch (ignored by git); fuzz/ledger.tsv and
# fuzz/merged/ are committed, and docs/fuzzing.md summarises them.
# Environment: FUZZ_INPUT_TIMEOUT (seconds per input, default
# 10), FUZZ_RSS_MB (default 2048), CAMPAIGN_DIR (default fuzz/campaign),
# CAMPAIGN_LEDGER (default fuzz/ledger.tsv), CARGO_TARGET_DIR (where the
# fuzz binaries are built and looked for; default fuzz/target).
# Two ASan features are off (ASAN_OPTIONS, unless set): stack-use-after-
# return detection (safe Rust cannot return a dangling stack pointer) and
# allocation stacks in reports (malloc_context_size=0; the failing access
# keeps its stack); together they cost about a quarter of the execution
# rate. Every other check stays on.
set -euo pipefail

seconds=600
runs=
jobs=1
coverage=0
while getopts "t:n:j:c" opt; do
    case "$opt" in
        t) seconds=$OPTARG ;;
        n) runs=$OPTARG ;;
        j) jobs=$OPTARG ;;
        c) coverage=1 ;;
        *) sed -n '2,16p' "$0" >&2; exit 2 ;;
    esac
done
shift $((OPTIND - 1))

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# shellcheck source=scripts/toolchains.sh
. "$root/scripts/toolchains.sh"
cd "$root/fuzz"
# An empty CARGO_TARGET_DIR is an error to cargo; treat it as unset.
if [ -z "${CARGO_TARGET_DIR:-}" ]; then
    unset CARGO_TARGET_DIR
fi
camp=${CAMPAIGN_DIR:-$root/fuzz/campaign}
input_timeout=${FUZZ_INPUT_TIMEOUT:-10}
rss=${FUZZ_RSS_MB:-2048}
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_stack_use_after_return=0:malloc_context_size=0:detect_odr_violation=0}

if ! rdd_ensure_nightly; then
    echo "fuzz-campaign.sh: the $RDD_NIGHTLY toolchain is needed (see above)" >&2
    exit 1
fi
if ! rdd_ensure_cargo_tool cargo-fuzz "$CARGO_FUZZ_VERSION" cargo fuzz; then
    echo "fuzz-campaign.sh: cargo-fuzz $CARGO_FUZZ_VERSION is needed (see above)" >&2
    exit 1
fi
if [ "$#" -gt 0 ]; then
    targets=("$@")
else
    mapfile -t targets < <(cargo +"$RDD_NIGHTLY" fuzz list)
fi

echo "== campaign: build ${targets[*]}"
for t in "${targets[@]}"; do
    cargo +"$RDD_NIGHTLY" fuzz build "$t"
done
# Where cargo puts the fuzz binaries: $CARGO_TARGET_DIR when set (cargo
# reads a relative one from the fuzz/ directory, as this script does), else
# fuzz/target.
tdir=${CARGO_TARGET_DIR:-target}
bindir=$tdir/x86_64-unknown-linux-gnu/release
mkdir -p "$camp/corpus" "$camp/coverage" "$camp/logs"
stats=${CAMPAIGN_LEDGER:-$root/fuzz/ledger.tsv}
if [ ! -f "$stats" ]; then
    printf 'date\tcommit\ttarget\tseconds\tjobs\texecs\texec_per_s\texec_per_cpu_s\tcpu_s\tedges\tfiles\tbytes\tfindings\tcumulative\n' >"$stats"
fi
commit=$(git -C "$root" rev-parse --short=12 HEAD 2>/dev/null || echo unknown)
if [ -n "$(git -C "$root" status --porcelain -- src fuzz/fuzz_targets fuzz/src 2>/dev/null)" ]; then
    commit="$commit+"
fi

failed=()
for t in "${targets[@]}"; do
    bin=$bindir/$t
    corpus=$camp/corpus/$t
    new=$camp/new/$t
    art=artifacts/$t
    mkdir -p "$corpus" "$art"
    rm -rf "$new"
    mkdir -p "$new"
    if [ -z "$(ls -A "$corpus")" ]; then
        cp seeds/"$t"/* "$corpus"/
        if [ -d merged/"$t" ]; then
            cp merged/"$t"/* "$corpus"/
        fi
    fi
    log=$camp/logs/$t-$(date -u +%Y%m%dT%H%M%S).log
    marker=$(mktemp "${TMPDIR:-/tmp}/campaign-$t.XXXXXX")
    limit=(-max_total_time="$seconds")
    what="${seconds}s"
    if [ -n "$runs" ]; then
        limit=(-runs="$runs")
        what="$runs runs"
    fi
    par=()
    if [ "$jobs" -gt 1 ]; then
        par=(-fork="$jobs" -ignore_crashes=0)
    fi
    echo "== campaign: $t for $what, $jobs job(s), from $(find "$corpus" -type f | wc -l) corpus files"
    start=$(date +%s)
    timing=$log.time
    set +e
    # New inputs are written to the first directory ($new); the corpus,
    # seeds and regressions are read.
    extra=(seeds/"$t")
    [ -d regressions/"$t" ] && extra+=(regressions/"$t")
    /usr/bin/time -f '%U %S' -o "$timing" \
        "$bin" "${limit[@]}" "${par[@]}" -timeout="$input_timeout" -rss_limit_mb="$rss" \
        -artifact_prefix="$art/" -print_final_stats=1 \
        "$new" "$corpus" "${extra[@]}" >"$log" 2>&1
    rc=$?
    set -e
    wall=$(( $(date +%s) - start ))
    # CPU seconds (user + system) of the fuzzing processes: on a shared
    # machine the wall-clock rate says little; executions per CPU second
    # are the rate of one core.
    cpu=$(awk 'NF == 2 { printf "%.2f", $1 + $2 }' "$timing" | tail -n 1)
    # Executions: the final stats (single process) or the last status line
    # (fork mode, "#N: cov: ...").
    execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n 1)
    if [ -z "$execs" ]; then
        execs=$(grep -Eo '^#[0-9]+' "$log" | tail -n 1 | tr -d '#')
    fi
    execs=${execs:-0}
    # Every new artifact is a finding, except a slow-unit report that
    # replays within the per-input timeout: libFuzzer writes one for any
    # input that took more than 10 s of wall time, which on a loaded
    # machine is the whole process being off the CPU, not the input (a
    # real hang is a timeout-* artifact). Such a report is counted and
    # removed; one that is slow again on replay stays a finding.
    findings=0
    slow=0
    while read -r a; do
        case $(basename "$a") in
        slow-unit-*)
            if "$bin" -timeout="$input_timeout" -rss_limit_mb="$rss" "$a" >/dev/null 2>&1; then
                slow=$((slow + 1))
                rm -f "$a"
                continue
            fi
            ;;
        esac
        findings=$((findings + 1))
    done < <(find "$art" -type f -newer "$marker")
    rm -f "$marker"
    if [ "$slow" -gt 0 ]; then
        echo "campaign: $t: $slow slow-unit report(s) that replay within ${input_timeout}s (the process was off the CPU): not findings"
    fi

    echo "== campaign: $t: merge and minimise"
    merged=$camp/merged/$t
    rm -rf "$merged"
    mkdir -p "$merged"
    "$bin" -merge=1 -timeout="$input_timeout" -rss_limit_mb="$rss" \
        "$merged" "$corpus" "$new" "${extra[@]}" >"$log.merge" 2>&1
    rm -rf "$corpus" "$new"
    mv "$merged" "$corpus"
    rm -rf merged/"$t"
    mkdir -p merged/"$t"
    cp "$corpus"/* merged/"$t"/
    # Edges the merged corpus reaches: libFuzzer's INITED line on a replay.
    edges=$("$bin" -runs=0 "$corpus" 2>&1 | sed -n 's/.*INITED cov: \([0-9]*\).*/\1/p' | tail -n 1)
    files=$(find "$corpus" -type f | wc -l)
    bytes=$(du -sb "$corpus" | cut -f1)
    rate=$(awk -v e="$execs" -v w="$wall" 'BEGIN { printf "%d", (w > 0 ? e / w : 0) }')
    cpurate=$(awk -v e="$execs" -v c="$cpu" 'BEGIN { printf "%d", (c > 0 ? e / c : 0) }')
    prev=$(awk -F'\t' -v t="$t" 'NR > 1 && $3 == t { s += $6 } END { print s + 0 }' "$stats")
    cum=$((prev + execs))
    printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' \
        "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "$commit" "$t" "$wall" "$jobs" "$execs" "$rate" "$cpurate" \
        "$cpu" "${edges:-?}" "$files" "$bytes" "$findings" "$cum" >>"$stats"
    echo "campaign: $t: $execs executions in ${wall}s (${rate}/s wall, ${cpurate} per CPU second," \
        "${cpu}s CPU), $cum cumulative; corpus $files files, $bytes bytes; ${edges:-?} edges;" \
        "$findings finding(s)"

    if [ "$coverage" -eq 1 ]; then
        echo "== campaign: $t: source coverage (cargo fuzz coverage)"
        out=$camp/coverage/$t.txt
        cargo +"$RDD_NIGHTLY" fuzz coverage "$t" "$corpus" >"$log.cov" 2>&1
        # cargo fuzz coverage builds into fuzz/target/<triple>/coverage
        # whatever CARGO_TARGET_DIR says (it passes its own --target-dir).
        cbin=target/x86_64-unknown-linux-gnu/coverage/x86_64-unknown-linux-gnu/release/$t
        prof=coverage/$t/coverage.profdata
        llvm=$(rustc +"$RDD_NIGHTLY" --print sysroot)/lib/rustlib/x86_64-unknown-linux-gnu/bin
        {
            echo "# $t: source coverage of the merged corpus ($files files), $(date -u +%Y-%m-%d)"
            echo "# per-file summary of src/ (llvm-cov report)"
            "$llvm/llvm-cov" report "$cbin" -instr-profile="$prof" \
                -ignore-filename-regex='(\.cargo|rustc|/fuzz/|/library/)' 2>/dev/null |
                sed "s#$root/##"
            echo
            echo "# lines of src/ never reached (file: line ranges)"
            "$llvm/llvm-cov" export "$cbin" -instr-profile="$prof" -format=lcov \
                -ignore-filename-regex='(\.cargo|rustc|/fuzz/|/library/)' 2>/dev/null |
                awk -v root="$root/" '
                    /^SF:/ { f = substr($0, 4); sub(root, "", f); n = 0; next }
                    /^DA:/ { split(substr($0, 4), d, ","); if (d[2] == 0) z[f] = z[f] " " d[1]; next }
                    END {
                        for (f in z) {
                            k = split(z[f], L, " "); out = ""; s = L[1]; p = L[1];
                            for (i = 2; i <= k + 1; i++) {
                                if (i <= k && L[i] == p + 1) { p = L[i]; continue }
                                out = out (out == "" ? "" : ",") (s == p ? s : s "-" p);
                                if (i <= k) { s = L[i]; p = L[i] }
                            }
                            print f ": " out
                        }
                    }' | sort
        } >"$out"
        total=$(grep -E '^TOTAL' "$out" | awk '{print $(NF-3)}' || true)
        echo "campaign: $t: line coverage of src/ ${total:-?}; never-reached lines in $out"
    fi

    if [ "$rc" -ne 0 ] || [ "$findings" -ne 0 ]; then
        echo "!! campaign: $t FAILED (exit $rc)" >&2
        grep -E -A 6 "panicked at|^==[0-9]+==ERROR" "$log" | head -n 40 >&2 || true
        mkdir -p regressions/"$t"
        find "$art" -type f -newer "$log.merge" -o -type f -name 'crash-*' -newer "$stats" 2>/dev/null |
            sort -u | while read -r a; do
            min=$a.min
            "$bin" -minimize_crash=1 -runs=20000 -exact_artifact_path="$min" "$a" >/dev/null 2>&1 || true
            [ -s "$min" ] || min=$a
            dest=regressions/$t/$(basename "$a" | sed 's/^\(crash\|timeout\|oom\|leak\|slow-unit\)-/\1-/')
            cp "$min" "$dest"
            echo "!! finding: $dest (minimised); replay: (cd fuzz && cargo +$RDD_NIGHTLY fuzz run $t $dest)" >&2
            echo "!!   rename it after the bug, fix, and add a unit test of the fix in the crate" >&2
        done
        failed+=("$t")
    fi
done

echo "== campaign: totals ($stats, cumulative executions per target)"
awk -F'\t' 'NR > 1 { c[$3] = $14; e[$3] = $10 } END { for (t in c) printf "  %-12s %12d executions  %s edges\n", t, c[t], e[t] }' "$stats" | sort
if [ "${#failed[@]}" -ne 0 ]; then
    echo "!! campaign: findings in: ${failed[*]}" >&2
    exit 1
fi
echo "campaign: ${#targets[@]} target(s), no findings"
