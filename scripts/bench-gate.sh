#!/usr/bin/env bash
# Instruction-count gate for the post and poll paths: compares the counts
# of scripts/bench.sh with the committed baseline and fails when one rose.
#
#   bash scripts/bench-gate.sh               run scripts/bench.sh, then compare
#   bash scripts/bench-gate.sh TABLE.md      compare a saved scripts/bench.sh output
#   bash scripts/bench-gate.sh --update      rewrite the baseline from a fresh run
#   --baseline FILE                          another baseline (default:
#                                            benches/baseline/post-poll.tsv)
#
# Gated: every figure of the main table of scripts/bench.sh that is a
# callgrind count, i.e. the "rdma-direct" column of every row (C-ABI and
# extra rows included) and the "C reference" column where it has one.
# Counts are exact for one toolchain and binary; the table prints them to
# 0.1.
#
# Fails (exit 1), naming each row with its old and new figure and the
# change in %, when
#   - a row rose by more than THRESHOLD_PCT (3) percent;
#   - a baseline row is missing from the table (a renamed row is renamed in
#     the baseline on purpose, with --update);
#   - a row's unit differs from the baseline's;
#   - the table was measured with another rustc, C compiler or flags, or
#     on another architecture than the baseline (its header says which):
#     the counts are comparable only for one toolchain.
# Reports rows that got cheaper (commit a new baseline to hold them), and
# rows the baseline does not have as "new, not gated".
#
# --update runs scripts/bench.sh, prints the comparison with the old
# baseline (never failing), and rewrites the baseline file; review it with
# `git diff` and commit it saying which rows changed and why.
#
# BENCH_ITERS defaults to 2048 here (scripts/bench.sh: 10000). The
# per-op counts do not depend on it (every count measured with 100, 500,
# 1000, 2000 and 10000 calls was the same per op); 2048 is a multiple of
# the 256 BBs of the send ring and the 256 entries of the CQ, so a path
# that runs once per ring wrap is averaged over whole wraps. Most of the
# run time is valgrind starting the program once per row.
# BENCH_OUT: where scripts/bench.sh keeps its artifacts; by default a
# temporary directory, removed when the gate passes and kept (and named)
# when it fails. Other variables as in scripts/bench.sh.
#
# Exit status: 0 passed (or baseline updated), 1 gate failed, 2 usage or
# a tool/build/run failure.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
THRESHOLD_PCT=3
BASELINE=$ROOT/benches/baseline/post-poll.tsv
MODE=check
TABLE=

usage() {
	sed -n '5,9p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2
	exit 2
}
die() {
	echo "bench-gate.sh: $*" >&2
	exit 2
}
while [ $# -gt 0 ]; do
	case "$1" in
	--update) MODE=update ;;
	--baseline)
		[ $# -ge 2 ] || usage
		BASELINE=$2
		shift
		;;
	-h | --help) usage ;;
	-*) usage ;;
	*)
		[ -z "$TABLE" ] || usage
		TABLE=$1
		;;
	esac
	shift
done
[ "$MODE" = update ] && [ -n "$TABLE" ] &&
	die "--update measures afresh; it takes no table file"
command -v python3 >/dev/null 2>&1 || die "required tool not found: python3"
[ "$MODE" = update ] || [ -r "$BASELINE" ] ||
	die "no baseline $BASELINE (create it with: bash scripts/bench-gate.sh --update)"

CLEANUP=
if [ -z "$TABLE" ]; then
	export BENCH_ITERS=${BENCH_ITERS:-2048}
	if [ -z "${BENCH_OUT:-}" ]; then
		BENCH_OUT=$(mktemp -d "${TMPDIR:-/tmp}/rdd-bench-gate.XXXXXX")
		CLEANUP=$BENCH_OUT
	fi
	export BENCH_OUT
	mkdir -p "$BENCH_OUT"
	TABLE=$BENCH_OUT/table.md
	echo "bench-gate.sh: running scripts/bench.sh (BENCH_ITERS=$BENCH_ITERS)" >&2
	bash "$ROOT/scripts/bench.sh" >"$TABLE" || die "scripts/bench.sh failed (artifacts in $BENCH_OUT)"
fi
[ -r "$TABLE" ] || die "cannot read $TABLE"

# What the baseline header records about the tree that produced it.
COMMIT=unknown
if git -C "$ROOT" rev-parse --git-dir >/dev/null 2>&1; then
	COMMIT=$(git -C "$ROOT" rev-parse --short=12 HEAD)
	if [ -n "$(git -C "$ROOT" status --porcelain --untracked-files=no)" ]; then
		COMMIT="$COMMIT plus uncommitted changes"
	fi
fi

set +e
python3 - "$MODE" "$TABLE" "$BASELINE" "$THRESHOLD_PCT" "$COMMIT" "${BENCH_ITERS:-}" <<'PY'
import os, re, sys

mode, table_path, baseline_path, threshold, commit, iters = sys.argv[1:7]
threshold = float(threshold)
GATED = ("rdma-direct", "C reference")   # columns holding callgrind counts
KEYS = ("rustc", "cc", "arch")            # must match between table and baseline


def fail_parse(msg):
    print(f"bench-gate.sh: {table_path}: {msg}", file=sys.stderr)
    sys.exit(2)


def parse_table(path):
    """({(operation, implementation): (unit, value)}, {key: value}) from a
    scripts/bench.sh report."""
    lines = open(path, encoding="utf-8").read().splitlines()
    meta = {}
    for line in lines:
        m = re.match(r"^- (rustc \S+ [^;]*); C: (.+), `([^`]*)`; (valgrind\S*)$", line)
        if m:
            meta["rustc"] = m.group(1)
            meta["cc"] = f"{m.group(2)}, {m.group(3)}"
            meta["valgrind"] = m.group(4)
        m = re.match(r"^- machine: .*, (\S+); run .*$", line)
        if m:
            meta["arch"] = m.group(1)
        m = re.match(r"^- (\d+) calls per measured function", line)
        if m:
            meta["iters"] = m.group(1)
    for k in KEYS:
        if k not in meta:
            fail_parse(f"no {k} in the header lines (not a scripts/bench.sh report?)")
    cells = lambda l: [c.strip() for c in l.strip().strip("|").split("|")]
    head = next((i for i, l in enumerate(lines)
                 if l.startswith("| operation | unit |")), None)
    if head is None:
        fail_parse("no table starting with '| operation | unit |'")
    cols = cells(lines[head])
    for c in ("operation", "unit") + GATED:
        if c not in cols:
            fail_parse(f"the table has no '{c}' column")
    rows = {}
    for line in lines[head + 2:]:
        if not line.startswith("|"):
            break
        c = cells(line)
        if len(c) != len(cols):
            fail_parse(f"row with {len(c)} cells, header has {len(cols)}: {line}")
        op, unit = c[cols.index("operation")], c[cols.index("unit")]
        for impl in GATED:
            v = c[cols.index(impl)]
            if v == "—":
                continue
            try:
                val = float(v)
            except ValueError:
                fail_parse(f"{op} [{impl}]: not a number: {v!r}")
            if (op, impl) in rows:
                fail_parse(f"row {op!r} appears twice")
            rows[(op, impl)] = (unit, val)
    if not rows:
        fail_parse("the table has no rows")
    return rows, meta


def parse_baseline(path):
    rows, meta = {}, {}
    for n, line in enumerate(open(path, encoding="utf-8"), 1):
        line = line.rstrip("\n")
        if line.startswith("#"):
            m = re.match(r"^# (\w+): (.*)$", line)
            if m:
                meta[m.group(1)] = m.group(2)
            continue
        if not line.strip():
            continue
        f = line.split("\t")
        if len(f) != 4:
            print(f"bench-gate.sh: {path}:{n}: expected 4 tab-separated fields", file=sys.stderr)
            sys.exit(2)
        rows[(f[0], f[1])] = (f[2], float(f[3]))
    return rows, meta


def num(x):
    return f"{x:.1f}" if abs(x - round(x)) > 1e-9 else f"{int(round(x))}"


def name(key):
    return f"{key[0]} [{key[1]}]"


def compare(base, new):
    """Prints the comparison; returns the list of failure lines."""
    failures, better, added = [], [], []
    width = max(len(name(k)) for k in list(base) + list(new))
    print(f"{'row':<{width}}  {'unit':<10} {'baseline':>9} {'now':>9} {'change':>8}")
    for key in list(base) + [k for k in new if k not in base]:
        if key not in base:
            unit, v = new[key]
            added.append(f"new, not gated: {name(key)}: {num(v)} {unit}")
            print(f"{name(key):<{width}}  {unit:<10} {'—':>9} {num(v):>9} {'new':>8}")
            continue
        bunit, old = base[key]
        if key not in new:
            failures.append(f"MISSING: {name(key)}: in the baseline ({num(old)} {bunit}), "
                            f"not in the table (renamed? then rename it in the baseline on "
                            f"purpose: --update)")
            print(f"{name(key):<{width}}  {bunit:<10} {num(old):>9} {'—':>9} {'missing':>8}")
            continue
        unit, v = new[key]
        pct = (v - old) / old * 100 if old else (0.0 if v == old else float("inf"))
        print(f"{name(key):<{width}}  {unit:<10} {num(old):>9} {num(v):>9} {pct:>+7.1f}%")
        if unit != bunit:
            failures.append(f"UNIT CHANGED: {name(key)}: baseline {bunit}, table {unit}")
        elif v > old * (1 + threshold / 100):
            failures.append(f"REGRESSION: {name(key)}: {num(old)} -> {num(v)} {unit} "
                            f"({pct:+.1f} %, limit +{num(threshold)} %)")
        elif v < old:
            better.append(f"improved: {name(key)}: {num(old)} -> {num(v)} {unit} ({pct:+.1f} %)")
    if better or added:
        print()
    for line in better + added:
        print(line)
    return failures, better, added


new, tmeta = parse_table(table_path)

if mode == "update":
    if os.path.exists(baseline_path):
        base, _ = parse_baseline(baseline_path)
        print(f"bench-gate.sh: {baseline_path} before this update against the fresh run:\n")
        accepted, _, _ = compare(base, new)
        if accepted:
            print("\nWhat the gate would have refused, accepted by this update:")
            for line in accepted:
                print(f"  {line}")
    os.makedirs(os.path.dirname(os.path.abspath(baseline_path)), exist_ok=True)
    with open(baseline_path, "w", encoding="utf-8") as f:
        f.write(
            "# Instruction counts of the post and poll paths: the baseline that\n"
            "# scripts/bench-gate.sh compares scripts/bench.sh's table with (a row\n"
            f"# fails when it rises by more than {num(threshold)} %). Written by\n"
            "# `bash scripts/bench-gate.sh --update`, which reruns scripts/bench.sh;\n"
            "# update it only on purpose, and say in the commit which rows changed\n"
            "# and why (CONTRIBUTING.md, \"Updating benchmark figures\").\n"
            "# Counts are exact for the toolchain below; the gate refuses a table\n"
            "# measured with another rustc, C compiler or flags, or architecture.\n"
            "#\n"
            f"# commit: {commit}\n"
            f"# rustc: {tmeta['rustc']}\n"
            f"# cc: {tmeta['cc']}\n"
            f"# valgrind: {tmeta.get('valgrind', 'unknown')}\n"
            f"# arch: {tmeta['arch']}\n"
            f"# iters: {tmeta.get('iters', iters or 'unknown')} calls per measured function\n"
            "#\n"
            "# operation<TAB>implementation<TAB>unit<TAB>instructions per unit\n")
        for (op, impl), (unit, v) in new.items():
            f.write(f"{op}\t{impl}\t{unit}\t{num(v)}\n")
    print(f"\nbench-gate.sh: wrote {len(new)} rows to {baseline_path}; review it with "
          "`git diff` and commit it with the reason")
    sys.exit(0)

base, bmeta = parse_baseline(baseline_path)
print(f"bench-gate.sh: {table_path} against {baseline_path} "
      f"(measured at {bmeta.get('commit', 'unknown')}), limit +{num(threshold)} % per row\n")
failures = []
for k in KEYS:
    if bmeta.get(k) != tmeta.get(k):
        failures.append(f"TOOLCHAIN: {k}: baseline '{bmeta.get(k)}', table '{tmeta.get(k)}': "
                        "counts are comparable only for one toolchain; if it changed on "
                        "purpose, rewrite the baseline: --update")
if bmeta.get("valgrind") != tmeta.get("valgrind"):
    print(f"note: valgrind differs (baseline '{bmeta.get('valgrind')}', table "
          f"'{tmeta.get('valgrind')}'); not gated\n")
f2, better, added = compare(base, new)
failures += f2
if failures:
    print(f"\nbench-gate.sh: FAILED ({len(failures)}):")
    for line in failures:
        print(f"  {line}")
    print("A change on purpose (a rise, a renamed row, another toolchain): rerun with "
          "--update and commit the baseline with the reason (CONTRIBUTING.md, "
          "\"Updating benchmark figures\").")
    sys.exit(1)
gated = sum(1 for k in base if k in new)
print(f"\nbench-gate.sh: passed: {gated} rows within +{num(threshold)} % "
      f"({len(better)} improved; {len(added)} new, not gated)")
if better:
    print("Rows got cheaper: commit a new baseline (--update) so the gate holds them there.")
PY
rc=$?
set -e
if [ $rc = 0 ] && [ -n "$CLEANUP" ]; then
	rm -rf "$CLEANUP"
elif [ -n "${BENCH_OUT:-}" ] && [ -d "${BENCH_OUT:-}" ]; then
	echo "bench-gate.sh: table and callgrind artifacts kept in $BENCH_OUT" >&2
fi
exit $rc
