#!/usr/bin/env bash
# Software-HCA loopback message rate: 8-byte RDMA WRITE and SEND, 1 and 16
# WRs per doorbell, step mode and thread mode (benches/soft_rate.rs).
#
#   bash scripts/soft_bench.sh > /tmp/soft.md
#
# 1. Runs the bench natively: every case SOFT_BENCH_REPS times (default 5),
#    interleaved, SOFT_BENCH_MSGS messages each (default 500000); the
#    median msgs/s is reported with the spread.
# 2. Runs each step-mode case once more under
#    `valgrind --tool=callgrind --toggle-collect=soft_rate_loop` with
#    SOFT_BENCH_CG_MSGS messages (default 100000) and divides the Ir of
#    the measured loop by the messages that went through it. The device's
#    share is the inclusive Ir of `SoftDevice::step`; the rest is the
#    application side (post, poll, re-posting receives).
#
# Prints one Markdown table on stdout; progress goes to stderr. Artifacts
# (callgrind files, annotations, raw output) stay in $SOFT_BENCH_OUT
# (default: a fresh temporary directory, printed on stderr).
#
# Environment: SOFT_BENCH_MSGS, SOFT_BENCH_REPS, SOFT_BENCH_CG_MSGS,
# SOFT_BENCH_OUT, CARGO, and CARGO_TARGET_DIR as usual for cargo.
#
# Exit status: non-zero if a tool is missing, a build or run fails, or the
# bench saw an allocation inside a measured loop.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
MSGS=${SOFT_BENCH_MSGS:-500000}
REPS=${SOFT_BENCH_REPS:-5}
CG_MSGS=${SOFT_BENCH_CG_MSGS:-100000}
CARGO=${CARGO:-cargo}

die() {
	echo "soft_bench.sh: $*" >&2
	exit 1
}
for t in "$CARGO" rustc valgrind callgrind_annotate python3; do
	command -v "$t" >/dev/null 2>&1 || die "required tool not found: $t"
done
for v in "$MSGS" "$REPS" "$CG_MSGS"; do
	[[ $v =~ ^[1-9][0-9]*$ ]] || die "SOFT_BENCH_* values must be positive integers"
done

OUT=${SOFT_BENCH_OUT:-$(mktemp -d "${TMPDIR:-/tmp}/rdd-soft-bench.XXXXXX")}
mkdir -p "$OUT"
echo "soft_bench.sh: artifacts in $OUT" >&2

echo "soft_bench.sh: building benches/soft_rate.rs" >&2
(cd "$ROOT" && "$CARGO" bench --no-run --bench soft_rate \
	--message-format=json-render-diagnostics) >"$OUT/cargo.json" ||
	die "cargo bench --no-run failed"
BIN=$(python3 - "$OUT/cargo.json" <<'PY'
import json, sys
exe = None
for line in open(sys.argv[1]):
    try:
        m = json.loads(line)
    except ValueError:
        continue
    if m.get("reason") == "compiler-artifact" and m.get("target", {}).get("name") == "soft_rate" \
            and m.get("executable"):
        exe = m["executable"]
if not exe:
    sys.exit("no soft_rate executable in cargo output")
print(exe)
PY
) || die "could not find the soft_rate bench binary"

echo "soft_bench.sh: wall clock, $REPS x $MSGS messages per case" >&2
"$BIN" --machine --msgs "$MSGS" --reps "$REPS" >"$OUT/wall.txt" ||
	die "soft_rate failed (see $OUT/wall.txt)"

STEP_CASES=(step-write-1 step-write-16 step-send-1 step-send-16)
for c in "${STEP_CASES[@]}"; do
	echo "soft_bench.sh: callgrind $c ($CG_MSGS messages)" >&2
	valgrind --tool=callgrind --collect-atstart=no --toggle-collect=soft_rate_loop \
		--callgrind-out-file="$OUT/$c.cg" \
		"$BIN" --only "$c" --msgs "$CG_MSGS" >"$OUT/$c.stdout" 2>"$OUT/$c.stderr" ||
		die "$c failed under valgrind (see $OUT/$c.stderr)"
	callgrind_annotate --inclusive=yes "$OUT/$c.cg" >"$OUT/$c.inclusive.txt" 2>/dev/null ||
		die "callgrind_annotate failed on $OUT/$c.cg"
	callgrind_annotate "$OUT/$c.cg" >"$OUT/$c.self.txt" 2>/dev/null ||
		die "callgrind_annotate failed on $OUT/$c.cg"
done

CPU=$(grep -m1 '^model name' /proc/cpuinfo 2>/dev/null | cut -d: -f2- | sed 's/^ *//' || true)
export SB_CPU=${CPU:-unknown} SB_NPROC=$(nproc 2>/dev/null || echo '?')
export SB_RUSTC=$(rustc --version) SB_VALGRIND=$(valgrind --version)
export SB_DATE=$(date -u '+%Y-%m-%d %H:%M UTC') SB_LOAD=$(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null || echo '?')
export SB_MSGS=$MSGS SB_REPS=$REPS SB_CG_MSGS=$CG_MSGS

python3 - "$OUT" <<'PY'
import os, re, sys

out = sys.argv[1]
env = os.environ

def fields(line):
    return dict(kv.split("=", 1) for kv in line.split() if "=" in kv)

wall = {}
for line in open(f"{out}/wall.txt"):
    f = fields(line)
    if "case" in f:
        wall[f["case"]] = f

def ir_total(path):
    for line in open(path):
        if line.startswith("totals:") or line.startswith("summary:"):
            return int(line.split()[1])
    sys.exit(f"soft_bench.sh: no totals in {path}")

def ir_inclusive(path, symbol):
    pat = re.compile(r"^\s*([\d,]+)\s.*:" + re.escape(symbol) + r"(\s|$)")
    for line in open(path):
        m = pat.match(line)
        if m:
            return int(m.group(1).replace(",", ""))
    sys.exit(f"soft_bench.sh: {symbol} not found in {path}")

cg = {}
for c in ("step-write-1", "step-write-16", "step-send-1", "step-send-16"):
    f = {}
    for line in open(f"{out}/{c}.stdout"):
        f.update(fields(line))
    n = int(f["loop_msgs"])
    total = ir_total(f"{out}/{c}.cg")
    dev = ir_inclusive(f"{out}/{c}.inclusive.txt", "rdma_direct::soft::SoftDevice::step")
    cg[c] = {"total": total / n, "dev": dev / n, "app": (total - dev) / n,
             "allocs": int(f["allocs"])}

def m(x):
    return f"{x / 1e6:.2f} M"

print("## Software HCA loopback message rate (`scripts/soft_bench.sh`)\n")
print(f"- machine: {env['SB_CPU']}, nproc {env['SB_NPROC']}, load average at the end "
      f"{env['SB_LOAD']}; run {env['SB_DATE']}")
print(f"- {env['SB_RUSTC']}; {env['SB_VALGRIND']}")
print(f"- msgs/s: wall clock, median of {env['SB_REPS']} interleaved runs of "
      f"{env['SB_MSGS']} messages (min–max in brackets); Ir/msg: callgrind, "
      f"{env['SB_CG_MSGS']} messages plus warm-up, step mode only")
print("- 8-byte messages, one SGE, 1 WR in 16 signaled; SEND receivers re-post "
      "64 receives per doorbell-record update\n")
print("| mode | op | msgs/s, 1 WR/doorbell | msgs/s, 16 WRs/doorbell | 16/1 "
      "| Ir/msg, 1 WR/db (device + app) | Ir/msg, 16 WRs/db (device + app) | Ir 1/16 "
      "| allocations in loop |")
print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
bad_allocs = 0
for mode in ("step", "thread"):
    for op, label in (("write", "RDMA WRITE"), ("send", "SEND")):
        w1, w16 = wall[f"{mode}-{op}-1"], wall[f"{mode}-{op}-16"]
        r1, r16 = float(w1["rate"]), float(w16["rate"])
        allocs = int(w1["allocs"]) + int(w16["allocs"])
        cells = []
        for w in (w1, w16):
            cells.append(f"{m(float(w['rate']))} ({float(w['min'])/1e6:.2f}–{float(w['max'])/1e6:.2f})")
        if mode == "step":
            c1, c16 = cg[f"step-{op}-1"], cg[f"step-{op}-16"]
            ir1 = f"{c1['total']:.0f} ({c1['dev']:.0f} + {c1['app']:.0f})"
            ir16 = f"{c16['total']:.0f} ({c16['dev']:.0f} + {c16['app']:.0f})"
            irr = f"{c1['total'] / c16['total']:.2f}×"
            allocs += c1["allocs"] + c16["allocs"]
        else:
            ir1 = ir16 = irr = "—"
        bad_allocs += allocs
        print(f"| {mode} | {label} | {cells[0]} | {cells[1]} | {r16 / r1:.2f}× "
              f"| {ir1} | {ir16} | {irr} | {allocs} |")
if bad_allocs:
    print(f"\n**{bad_allocs} allocations inside measured loops.**")
    sys.exit(1)
PY
