#!/usr/bin/env bash
# The C examples on the kernel's software RDMA devices, built the way a C
# user builds them: scripts/vm-test.sh installs the verbs-enabled library
# on the host (FEATURES=verbs scripts/install.sh into a prefix), compiles
# examples/c/pingpong.c and write_bw.c outside the source tree with
# nothing but `cc ... $(pkg-config --cflags --libs --static rdma-direct)`
# (plain, and under ASan+UBSan with static sanitizer runtimes), and shares
# that directory into the test VM. Runs INSIDE the VM:
#
#   scripts/softrdma-vm/vm-run.sh bash scripts/vm-c-examples.sh C_EXAMPLES_DIR
#
# C_EXAMPLES_DIR holds pingpong, write_bw, pingpong_asan and write_bw_asan.
# Checks, each printed as "PASS name (N s)" or "FAIL name (rc=N, N s)"
# followed by the program's output, each bounded by `timeout` (60 s):
#   c-pingpong-rxe0*     two QPs on rxe0, connected with rdd_qp_connect,
#                        SEND/RECV round trips, every payload byte checked
#   c-write_bw-rxe0*     RDMA WRITE batches (rdd_qp_write calls with
#                        RDD_SEND_DEFER_DOORBELL: one doorbell per batch
#                        on rxe's direct ring, one per WR on the
#                        fallback; the last WR signaled), the
#                        target checked byte for byte after each size
#   c-*-siw0-refused     siw0 (iWARP) connects only through rdma_cm, which
#                        the C API does not offer: both examples must exit
#                        2 and say so, not fail obscurely
# The data path is the caller's RDMA_DIRECT_DATA_PATH (vm-suite.sh runs
# this once with `direct` and once with `fallback`); the first pingpong and
# write_bw runs must report that path (rdd_device_data_path).
#
# Exit status: 0 all checks passed; 1 at least one failed; 2 not inside the
# VM or no binaries.
set -uo pipefail

if [ "${IN_RDMA_VM:-0}" != 1 ]; then
  echo "vm-c-examples.sh: run inside the test VM: scripts/softrdma-vm/vm-run.sh bash $0 C_EXAMPLES_DIR" >&2
  exit 2
fi
BIN=${1:-}
for ex in pingpong write_bw pingpong_asan write_bw_asan; do
  if [ ! -x "$BIN/$ex" ]; then
    echo "vm-c-examples.sh: no $BIN/$ex (scripts/vm-test.sh builds them)" >&2
    exit 2
  fi
done
RXE=$RXE_DEV SIW=$SIW_DEV T=60
export ASAN_OPTIONS=halt_on_error=1:detect_leaks=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
OUT=$(mktemp)
trap 'rm -f "$OUT"' EXIT
passed=0 failed=0

# check NAME WANT-STATUS WANT-TEXT CMD...: CMD must exit with WANT-STATUS
# and, if WANT-TEXT is not empty, print it.
check() {
  local name=$1 want=$2 text=$3 rc=0 t0=$SECONDS
  shift 3
  timeout "$T" "$@" > "$OUT" 2>&1 || rc=$?
  if [ "$rc" = "$want" ] && { [ -z "$text" ] || grep -q "$text" "$OUT"; }; then
    passed=$((passed + 1)); echo "PASS $name ($((SECONDS - t0)) s)"
  else
    failed=$((failed + 1)); echo "FAIL $name (rc=$rc, want $want${text:+ and \"$text\"}, $((SECONDS - t0)) s)"
  fi
  echo "    \$ ${*#"$BIN/"}"
  sed 's/^/    /' "$OUT"
}

echo "kernel $(uname -r); RDMA_DIRECT_DATA_PATH=${RDMA_DIRECT_DATA_PATH:-(unset)}; binaries: $BIN"
echo "built on the host with: $(cat "$BIN/BUILD" 2>/dev/null || echo '(no BUILD file)')"

# The data path each example reports (rdd_device_data_path) must be the
# one RDMA_DIRECT_DATA_PATH asked for: rxe's direct rings by default.
dp=direct
case "${RDMA_DIRECT_DATA_PATH:-}" in fallback | portable) dp=fallback ;; esac
check "c-pingpong-$RXE" 0 "data path: $dp (" "$BIN/pingpong" 1000 64 --device "$RXE"
check "c-pingpong-$RXE-4096" 0 "" "$BIN/pingpong" 200 4096 --device "$RXE"
check "c-pingpong-$RXE-asan" 0 "" "$BIN/pingpong_asan" 200 64 --device "$RXE"
check "c-write_bw-$RXE" 0 "Data path        : $dp (" "$BIN/write_bw" --device "$RXE" --iters 200 --warmup 20
check "c-write_bw-$RXE-4096" 0 "" "$BIN/write_bw" --device "$RXE" --size 4096 --iters 2000 --warmup 200
check "c-write_bw-$RXE-asan-unbatched" 0 "" \
  "$BIN/write_bw_asan" --device "$RXE" --size 65536 --iters 200 --warmup 20 --batch 1
check "c-pingpong-$SIW-refused" 2 "connect only through rdma_cm" "$BIN/pingpong" 10 64 --device "$SIW"
check "c-write_bw-$SIW-refused" 2 "connect only through rdma_cm" "$BIN/write_bw" --device "$SIW"

echo "vm-c-examples: $passed passed, $failed failed"
[ "$failed" = 0 ]
