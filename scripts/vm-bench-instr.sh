#!/usr/bin/env bash
# User-space instructions per RDMA WRITE on rxe and siw, counted by
# callgrind: rdma-direct's own rings (one doorbell per chain of up to 32),
# the verbs fallback (libibverbs, chains of up to 32 per ibv_post_send), the
# verbs fallback with one WR per ibv_post_send, and perftest's ib_write_bw
# client. Runs INSIDE the test VM; from the host:
#
#   export CARGO_TARGET_DIR=$PWD/target/h-bench
#   cargo bench --features verbs --bench verbs_write --no-run   # prints the binary's path
#   VM_TIMEOUT=1800 scripts/softrdma-vm/vm-run.sh bash scripts/vm-bench-instr.sh <verbs_write binary>
#
# Method: each case runs twice under `valgrind --tool=callgrind`, with N1
# and N2 WRs (8 bytes, tx depth 128, one WR in 100 signaled, as
# ib_write_bw). Instructions per WR = (Ir(N2) - Ir(N1)) / (N2 - N1): the
# difference cancels start-up, connection setup and teardown, leaving the
# per-WR posting and polling loop. Only user space is counted (callgrind
# does not see the kernel, which does the rxe/siw protocol work). For
# perftest only the client (the side that posts) runs under callgrind; its
# bandwidth figures are meaningless under valgrind and are not used.
#
# Environment: BENCH_DEVICES ("rxe0 siw0"), INSTR_N1 (2000), INSTR_N2 (6000).
# Exit status: 0 if every case produced a count, 1 otherwise, 2 if not in
# the VM, no binary given, or valgrind missing (rebuild the image:
# scripts/softrdma-vm/build-vm.sh installs it).
set -uo pipefail

if [ "${IN_RDMA_VM:-0}" != 1 ]; then
  echo "vm-bench-instr.sh: run inside the test VM: scripts/softrdma-vm/vm-run.sh bash $0 BINARY" >&2
  exit 2
fi
BIN=${1:-}
if [ -z "$BIN" ] || [ ! -x "$BIN" ]; then
  echo "usage: vm-bench-instr.sh PATH-TO-verbs_write-BINARY" >&2
  exit 2
fi
command -v valgrind >/dev/null || { echo "vm-bench-instr.sh: no valgrind in the VM image" >&2; exit 2; }
DEVICES=${BENCH_DEVICES:-"$RXE_DEV $SIW_DEV"}
N1=${INSTR_N1:-2000}
N2=${INSTR_N2:-6000}
LOG=$(mktemp -d)
trap 'rm -rf "$LOG"' EXIT
PORT=19515
FAILED=0
declare -A IR

# The total Ir of a callgrind output file.
ir_of() { awk '/^summary:/ { print $2; exit }' "$1"; }

# Flags per device, as scripts/vm-bench.sh uses them.
dev_setup() {
  case "$1" in
    "$RXE_DEV") PT_FLAGS="-d $1 -x $RXE_GID_INDEX"; OUR_FLAGS="--device $1 --gid-index $RXE_GID_INDEX"; ADDR=$RXE_IP ;;
    "$SIW_DEV") PT_FLAGS="-d $1 -R"; OUR_FLAGS="--device $1 --ip $SIW_IP"; ADDR=$SIW_IP ;;
    *) echo "vm-bench-instr.sh: unknown device $1" >&2; exit 2 ;;
  esac
}

# ours CASE N ARGS...: our binary under callgrind; records IR[dev,CASE,N].
ours() {
  local case=$1 n=$2 out
  shift 2
  # shellcheck disable=SC2086
  if timeout 600 valgrind --tool=callgrind --callgrind-out-file="$LOG/cg" \
      "$BIN" $OUR_FLAGS --mode bw --size 8 --iters "$n" --tx-depth 128 --cq-mod 100 "$@" \
      > "$LOG/out" 2> "$LOG/err"; then
    IR[$dev,$case,$n]=$(ir_of "$LOG/cg")
    echo "$dev $case n=$n: Ir ${IR[$dev,$case,$n]}; $(cat "$LOG/out")"
  else
    echo "$dev $case n=$n: FAILED" >&2; tail -n 20 "$LOG/err" >&2
    FAILED=1
  fi
}

# perftest_client N: ib_write_bw server as usual, the client under callgrind.
perftest_client() {
  local n=$1 spid crc=0
  PORT=$((PORT + 1))
  # shellcheck disable=SC2086
  timeout 600 ib_write_bw $PT_FLAGS -F -p "$PORT" -s 8 -n "$n" > "$LOG/srv" 2>&1 &
  spid=$!
  for _ in $(seq 300); do
    rdma res show cm_id 2>/dev/null | grep -q "state LISTEN .*:$PORT " && break
    ss -Hltn "sport = :$PORT" 2>/dev/null | grep -q . && break
    sleep 0.1
  done
  # shellcheck disable=SC2086
  timeout 600 valgrind --tool=callgrind --callgrind-out-file="$LOG/cg" \
    ib_write_bw $PT_FLAGS -F -p "$PORT" -s 8 -n "$n" "$ADDR" > "$LOG/cli" 2>&1 || crc=$?
  [ "$crc" = 0 ] || kill "$spid" 2>/dev/null
  wait "$spid" || true
  if [ "$crc" = 0 ]; then
    IR[$dev,perftest,$n]=$(ir_of "$LOG/cg")
    echo "$dev perftest n=$n: Ir ${IR[$dev,perftest,$n]}"
  else
    echo "$dev perftest n=$n: FAILED ($crc)" >&2; tail -n 20 "$LOG/cli" >&2
    FAILED=1
  fi
}

echo "vm-bench-instr: kernel $(uname -r); $(valgrind --version); perftest $(dpkg-query -W -f='${Version}' perftest 2>/dev/null); N1=$N1 N2=$N2"
for dev in $DEVICES; do
  dev_setup "$dev"
  for n in "$N1" "$N2"; do
    ours direct "$n" --data-path direct --batch 32
    ours fallback "$n" --data-path fallback --batch 32
    ours fallback1 "$n" --data-path fallback --batch 1
    perftest_client "$n"
  done
done

per_wr() {
  awk -v a="${IR[$1,$2,$N2]:-}" -v b="${IR[$1,$2,$N1]:-}" -v d=$((N2 - N1)) \
    'BEGIN { if (a == "" || b == "") printf "fail"; else printf "%.0f", (a - b) / d }'
}
echo
echo "### User-space instructions per 8-byte RDMA WRITE (callgrind, (Ir($N2) - Ir($N1)) / $((N2 - N1)))"
echo
echo "| device | ours, direct rings, ≤ 32 per doorbell | ours, verbs fallback (libibverbs), ≤ 32 per call | ours, verbs fallback, 1 per call | perftest ib_write_bw client |"
echo "|---|---:|---:|---:|---:|"
for dev in $DEVICES; do
  echo "| $dev | $(per_wr "$dev" direct) | $(per_wr "$dev" fallback) | $(per_wr "$dev" fallback1) | $(per_wr "$dev" perftest) |"
done
exit "$FAILED"
