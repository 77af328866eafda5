#!/usr/bin/env bash
# Smoke test of the RDMA test VM: proves the kernel's software RDMA devices
# work with rdma-core's own tools before any rdma-direct test relies on them.
# Runs INSIDE the VM; from the host:
#
#   scripts/softrdma-vm/build-vm.sh                       (once; cached)
#   scripts/softrdma-vm/vm-run.sh bash scripts/vm-smoke.sh
#
# Checks, each printed as "PASS name" or "FAIL name" (with the tool's output
# on failure) and each bounded by `timeout` (SMOKE_TIMEOUT, default 60 s):
#   devinfo-rxe0, devinfo-siw0   ibv_devinfo sees the device, port ACTIVE
#   rc_pingpong-rxe0             ibv_rc_pingpong over rxe loopback, GID
#                                index $RXE_GID_INDEX (QPs connected out of band)
#   rping-rxe0, rping-siw0       rping (rdma_cm, SEND + RDMA READ/WRITE), data verified
#   write_bw-siw0                ib_write_bw -R (rdma_cm) on siw loopback
#   pair-rxe-*, pair-siw-*       scripts/softrdma-vm/netns-pair.sh up/check/down:
#                                two devices on a veth pair, traffic across it
# About 40-70 s of VM time under TCG.
#
# Exit status: 0 all checks passed; 1 at least one failed; 2 not inside the VM.
set -uo pipefail

if [ "${IN_RDMA_VM:-0}" != 1 ]; then
  echo "vm-smoke.sh: run inside the test VM: scripts/softrdma-vm/vm-run.sh bash $0" >&2
  exit 2
fi
PAIR=$(cd "$(dirname "$0")" && pwd)/softrdma-vm/netns-pair.sh
T=${SMOKE_TIMEOUT:-60}
LOG=$(mktemp -d)
trap 'rm -rf "$LOG"' EXIT
passed=0 failed=0
START=$SECONDS

now_ms() { echo $(( ${EPOCHREALTIME/./} / 1000 )); }
T0=$(now_ms)
result() { # result NAME RC OUTPUT-FILES...: one PASS/FAIL line, with the time since T0
  local name=$1 rc=$2 f; shift 2
  local took="$(( $(now_ms) - T0 )) ms"
  T0=$(now_ms)
  if [ "$rc" = 0 ]; then
    passed=$((passed + 1)); echo "PASS $name ($took)"
  else
    failed=$((failed + 1)); echo "FAIL $name (rc=$rc, $took)"
    for f in "$@"; do sed 's/^/    /' "$f" | tail -n 20; done
  fi
}

# check_pair NAME PORT "server" "client": a server and a client on this host.
# The client starts once the server listens on PORT (rdma_cm or TCP).
check_pair() {
  local name=$1 port=$2 srv=$3 cli=$4 src=0 crc=0
  timeout "$T" bash -c "$srv" > "$LOG/srv" 2>&1 & local spid=$!
  for _ in $(seq 150); do
    rdma res show cm_id 2>/dev/null | grep -q "state LISTEN .*:$port " && break
    ss -Hltn "sport = :$port" 2>/dev/null | grep -q . && break
    sleep 0.1
  done
  timeout "$T" bash -c "$cli" > "$LOG/cli" 2>&1 || crc=$?
  wait "$spid" || src=$?
  [ "$src" = 0 ] || crc=$src
  echo "  server: $srv" > "$LOG/srv.cmd"; echo "  client: $cli" > "$LOG/cli.cmd"
  result "$name" "$crc" "$LOG/srv.cmd" "$LOG/srv" "$LOG/cli.cmd" "$LOG/cli"
}

# check_devinfo DEV: ibv_devinfo knows DEV and its port 1 is active.
check_devinfo() {
  local rc=0
  timeout "$T" ibv_devinfo -d "$1" > "$LOG/out" 2>&1 || rc=$?
  [ "$rc" != 0 ] || grep -q 'state:.*PORT_ACTIVE' "$LOG/out" || rc=1
  result "devinfo-$1" "$rc" "$LOG/out"
}

# pair TYPE: netns-pair.sh up TYPE, check, down.
pair() {
  local ty=$1 rc=0
  timeout "$T" "$PAIR" up "$ty" > "$LOG/pair-up" 2>&1 || rc=$?
  result "pair-$ty-up" "$rc" "$LOG/pair-up"
  if [ "$rc" = 0 ]; then
    # the check prints its own PASS/FAIL lines, one per connection
    CHECK_ITERS=${CHECK_ITERS:-100} CHECK_TIMEOUT=$T timeout $((3 * T)) "$PAIR" check > "$LOG/pair-check" 2>&1; rc=$?
    T0=$(now_ms)
    grep -v '^pair:' "$LOG/pair-check" | sed "s/^\(PASS\|FAIL\) pair-/\1 pair-$ty-/"
    passed=$((passed + $(grep -c '^PASS' "$LOG/pair-check")))
    failed=$((failed + $(grep -c '^FAIL' "$LOG/pair-check")))
    if [ "$rc" != 0 ] && ! grep -q '^FAIL' "$LOG/pair-check"; then
      result "pair-$ty-check" "$rc" "$LOG/pair-check"
    fi
  fi
  rc=0
  timeout "$T" "$PAIR" down > "$LOG/pair-down" 2>&1 || rc=$?
  result "pair-$ty-down" "$rc" "$LOG/pair-down"
}

echo "kernel $(uname -r); $(dpkg-query -W -f='${Package} ${Version}' rdma-core 2>/dev/null)"
echo "rxe: $RXE_DEV $RXE_IP gid $RXE_GID_INDEX; siw: $SIW_DEV $SIW_IP"

check_devinfo "$RXE_DEV"
check_devinfo "$SIW_DEV"
check_pair rc_pingpong-rxe0 18515 \
  "ibv_rc_pingpong -d $RXE_DEV -g $RXE_GID_INDEX -n 200" \
  "ibv_rc_pingpong -d $RXE_DEV -g $RXE_GID_INDEX -n 200 $RXE_IP"
check_pair rping-rxe0 7174 "rping -s -a $RXE_IP -C 10 -V" "rping -c -a $RXE_IP -C 10 -V"
check_pair rping-siw0 7174 "rping -s -a $SIW_IP -C 10 -V" "rping -c -a $SIW_IP -C 10 -V"
check_pair write_bw-siw0 18515 \
  "ib_write_bw -d $SIW_DEV -R -n 100 -F" "ib_write_bw -d $SIW_DEV -R -n 100 -F $SIW_IP"
pair rxe
pair siw

echo "vm-smoke took $((SECONDS - START)) s"
echo "vm-smoke: $passed passed, $failed failed"
[ "$failed" = 0 ]
