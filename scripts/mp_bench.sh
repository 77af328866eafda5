#!/usr/bin/env bash
# Multi-producer posting into one QP: lock-free SharedQp vs a spinlock per
# post, 1/2/4 producer threads, software HCA in step, thread and fill
# modes (benches/mp_post/; results in docs/benchmarks.md, "Multi-producer
# posting: lock-free vs spinlock").
#
#   bash scripts/mp_bench.sh [mp_post options] > /tmp/mp.md
#
# Builds the bench in the bench profile (release + debug info), runs it
# once with the given options (default: mp_post's defaults, about 50 s),
# and prints on stdout a Markdown block: machine, date, load average
# before and after, toolchain, the exact command, then the bench's table.
# Per-run progress goes to stderr. mp_post options: --seconds S,
# --warmup S, --reps N, --depth WRS, --fill-depth WRS,
# --modes step,thread,fill, --producers 1,2,4, --list N (WRs per post
# call; the spinlock takes its lock once per list).
#
# Wall-clock numbers: on a loaded or small machine they move a lot
# between runs; compare the two variants within one run (they are
# interleaved), and read the "producers posting at once" column before
# reading anything into a ratio.
#
# Environment: CARGO (default cargo), CARGO_TARGET_DIR as usual.
# Exit status: non-zero if the build or the bench fails (the bench fails
# if a completion is lost, duplicated, out of order or in error, or if
# the target memory is wrong); never because the 1.5x goal is missed.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
CARGO=${CARGO:-cargo}

die() {
	echo "mp_bench.sh: $*" >&2
	exit 1
}
command -v "$CARGO" >/dev/null 2>&1 || die "required tool not found: $CARGO"

echo "mp_bench.sh: building benches/mp_post/" >&2
json=$(cd "$ROOT" && "$CARGO" bench --no-run --bench mp_post --message-format=json-render-diagnostics) ||
	die "cargo bench --no-run --bench mp_post failed"
BIN=$(grep '"reason":"compiler-artifact"' <<<"$json" | grep '"name":"mp_post"' |
	grep -o '"executable":"[^"]*"' | tail -n1 | cut -d'"' -f4)
[ -n "$BIN" ] && [ -x "$BIN" ] || die "could not find the mp_post bench binary in cargo's output"

CPU=$(grep -m1 '^model name' /proc/cpuinfo 2>/dev/null | cut -d: -f2- | sed 's/^ *//' || true)
NPROC=$(nproc 2>/dev/null || echo '?')
LOAD_BEFORE=$(uptime)
DATE=$(date -u '+%Y-%m-%d %H:%M UTC')

echo "mp_bench.sh: running $BIN $*" >&2
out=$("$BIN" "$@") || die "mp_post failed (see stderr above)"
LOAD_AFTER=$(uptime)

echo "### Multi-producer posting: lock-free vs spinlock (\`scripts/mp_bench.sh\`)"
echo
echo "- machine: ${CPU:-unknown CPU}, nproc $NPROC, $(uname -m); run $DATE"
echo "- \`uptime\` before: \`$(sed 's/^ *//' <<<"$LOAD_BEFORE")\`"
echo "- \`uptime\` after: \`$(sed 's/^ *//' <<<"$LOAD_AFTER")\`"
echo "- $(rustc --version); bench profile (release, debug=1)"
echo "- command: \`bash scripts/mp_bench.sh${*:+ $*}\` (runs \`mp_post${*:+ $*}\`)"
echo
echo "$out"
