#!/usr/bin/env bash
# Two "hosts" inside the test VM, each with its own RDMA device, joined by a
# veth pair (scripts/softrdma-vm/netns-pair.sh), and rdma-direct's own
# programs on both ends. Runs INSIDE the VM:
#
#   scripts/softrdma-vm/vm-run.sh bash scripts/vm-two-host.sh EXAMPLES_DIR
#
# Checks (PASS/FAIL each, every side under `timeout`):
#   two-host-rxe-pingpong  examples/pingpong server on rxe device A, client on
#                          rxe device B connecting to A's address (queue
#                          pairs exchanged out of band over TCP, every
#                          message checked with --chk), and the RoCEv2
#                          traffic really crossed the veth (A's rx byte
#                          counter). The VM's kernels cannot run rxe inside a
#                          network namespace (netns-pair.sh explains), so the
#                          rxe pair is the "routed" layout: both veth ends in
#                          the initial namespace, policy routing forcing the
#                          traffic through the veth.
#   two-host-siw-rping     examples/rping server in namespace A on siw device
#                          A, client in namespace B on siw device B (rdma_cm,
#                          SEND + RDMA READ/WRITE, payload validated with -V).
#
# Exit status: 0 all passed; 1 a check failed; 2 usage / not in the VM.
set -uo pipefail

if [ "${IN_RDMA_VM:-0}" != 1 ]; then
  echo "vm-two-host.sh: run inside the test VM" >&2
  exit 2
fi
BIN=${1:-}
if [ ! -x "$BIN/pingpong" ] || [ ! -x "$BIN/rping" ]; then
  echo "usage: vm-two-host.sh EXAMPLES_DIR (built with --features verbs)" >&2
  exit 2
fi
PAIR=$(cd "$(dirname "$0")" && pwd)/softrdma-vm/netns-pair.sh
T=${TWO_HOST_TIMEOUT:-90}
LOG=$(mktemp -d)
trap 'bash "$PAIR" down >/dev/null 2>&1; rm -rf "$LOG"' EXIT
failed=0

report() { # report NAME RC
  if [ "$2" = 0 ]; then
    echo "PASS $1"
  else
    failed=1
    echo "FAIL $1 (rc=$2)"
    for f in "$LOG"/*; do echo "  --- $f"; tail -n 20 "$f" | sed 's/^/    /'; done
  fi
  rm -f "$LOG"/*
}

# --- rxe: pingpong across the veth -------------------------------------
rc=0
if eval "$(bash "$PAIR" up rxe 2>"$LOG/up")"; then
  before=$(cat "/sys/class/net/$NETDEV_A/statistics/rx_bytes")
  iters=200 size=4096
  timeout "$T" $EXEC_A "$BIN/pingpong" --device "$DEV_A" --gid-idx "$GID_A" --server \
    --port 18600 --iters $iters --size $size --chk --timeout 60 >"$LOG/server" 2>&1 &
  spid=$!
  sleep 1
  timeout "$T" $EXEC_B "$BIN/pingpong" --device "$DEV_B" --gid-idx "$GID_B" \
    --connect "$IP_A" --port 18600 --iters $iters --size $size --chk --timeout 60 \
    >"$LOG/client" 2>&1 || rc=$?
  src=0
  wait "$spid" || src=$?
  [ "$rc" = 0 ] && rc=$src
  after=$(cat "/sys/class/net/$NETDEV_A/statistics/rx_bytes")
  if [ "$rc" = 0 ] && [ $((after - before)) -lt $((iters * size)) ]; then
    echo "only $((after - before)) bytes arrived on $NETDEV_A" >"$LOG/veth"
    rc=3
  fi
else
  rc=4
fi
bash "$PAIR" down >/dev/null 2>&1
report two-host-rxe-pingpong "$rc"

# --- siw: rping over rdma_cm between two namespaces ----------------------
rc=0
if eval "$(bash "$PAIR" up siw 2>"$LOG/up")"; then
  timeout "$T" $EXEC_A "$BIN/rping" -s -a "$IP_A" -p 7300 -C 20 -S 256 -V --device "$DEV_A" \
    --timeout 60 >"$LOG/server" 2>&1 &
  spid=$!
  sleep 1
  timeout "$T" $EXEC_B "$BIN/rping" -c -a "$IP_A" -p 7300 -C 20 -S 256 -V --device "$DEV_B" \
    --timeout 60 >"$LOG/client" 2>&1 || rc=$?
  src=0
  wait "$spid" || src=$?
  [ "$rc" = 0 ] && rc=$src
else
  rc=4
fi
bash "$PAIR" down >/dev/null 2>&1
report two-host-siw-rping "$rc"

exit $failed
