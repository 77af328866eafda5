#!/usr/bin/env bash
# The MPI examples (examples/mpi/) on rxe, every rank a process of one
# mpirun inside the test VM. Runs INSIDE the VM:
#
#   scripts/softrdma-vm/vm-run.sh bash scripts/vm-mpi.sh [--bench] MPI_EXAMPLES_DIR
#
# MPI_EXAMPLES_DIR holds the five examples built on the host with mpicc
# against the verbs-enabled installed library (scripts/vm-test.sh does it
# with `scripts/mpi-examples.sh --build PREFIX DIR`). Each run is
# `mpirun -np 4` with scripts/mpi-lib.sh's short arguments and mpirun
# options, under `timeout`, and passes only with its example's verdict
# line (scripts/mpi-lib.sh) and exit status 0. --bench: the same checks
# with longer counts, for the figures of docs/benchmarks.md ("On rxe in
# the test VM"): alltoall_bw 20 rounds of 64 KiB, ring_lat 500 round
# trips, atomic_counter 1000 per rank, p2p_vs_mpi 500 pings and 50 x 1 MiB.
#
# Checks (PASS/FAIL each):
#   mpi-rxe0-EXAMPLE   4 ranks on rxe0 (--device rxe0 --gid-idx
#                      $RXE_GID_INDEX: every QP must connect with the IPv4
#                      RoCEv2 GID vm-run.sh found)
#   mpi-pair-EXAMPLE   4 ranks across the two rxe devices of the veth pair
#                      (scripts/softrdma-vm/netns-pair.sh `up rxe`, the
#                      routed layout: rxe cannot run in a namespace on these
#                      kernels), with GID_A/GID_B checked as above: ranks
#                      0,1 on DEV_A and 2,3 on DEV_B (--device-by-rank
#                      A,B), except p2p_vs_mpi, whose two measuring ranks
#                      0 and 1 must be on different devices (A,B,A,B).
#                      The RoCE traffic must have crossed the veth both
#                      ways: each end's rx_bytes grows by at least the
#                      example's floor below.
#   (peer_loss in both: rank 3 is killed mid-transfer; the survivors'
#   WRs to it must fail, the first with RETRY_EXC, within 5 s: rxe's
#   retransmission timeout, not the fabric's liveness check)
#   mpi-refuse-unknown-device  --device nosuch0 ends the job non-zero with
#                      "no RDMA device of that name"
#   mpi-refuse-wrong-gid       --gid-idx 0 on rxe0 (the fe80:: entry, not
#                      the IPv4 one the device connects with) ends the job
#                      non-zero with the GID mismatch
#
# RDMA_DIRECT_DATA_PATH=direct|fallback in the environment picks
# rdma-direct's rxe rings or libibverbs' provider (vm-suite.sh runs both).
# MPI_TIMEOUT: seconds per mpirun (default 300; TCG is slow).
#
# Exit status: 0 all passed; 1 a check failed; 2 usage / not in the VM.
set -uo pipefail

if [ "${IN_RDMA_VM:-0}" != 1 ]; then
  echo "vm-mpi.sh: run inside the test VM" >&2
  exit 2
fi
bench=0
if [ "${1:-}" = --bench ]; then bench=1; shift; fi
BIN=${1:-}
HERE=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=scripts/mpi-lib.sh
. "$HERE/mpi-lib.sh"
if [ "$bench" = 1 ]; then
  # Longer than the check's, never shorter: the floors below still hold.
  args_alltoall_bw=(--iters 20 --warmup 2 --size 65536)
  args_ring_lat=(--iters 500 --warmup 50)
  args_atomic_counter=(--count 1000)
  args_p2p_vs_mpi=(--lat-iters 500 --bw-iters 50)
fi
# rxe notices a dead peer only when the transport gives up: with the
# default timeout exponent 14, after the retransmissions 67 ms apart run
# out (the mesh asks for retry_cnt 7; rxe would retry forever at 7, so
# the library gives it 6: about half a second, slower under TCG), not
# within the fabric's 250 ms.
args_peer_loss=(--bound-ms 5000 --timeout 120)
for ex in "${mpi_examples[@]}"; do
  if [ ! -x "$BIN/$ex" ]; then
    echo "usage: vm-mpi.sh MPI_EXAMPLES_DIR (no $BIN/$ex: scripts/mpi-examples.sh --build)" >&2
    exit 2
  fi
done
command -v mpirun >/dev/null || { echo "vm-mpi.sh: no mpirun in the VM (openmpi-bin: build-vm.sh)" >&2; exit 2; }
PAIR=$HERE/softrdma-vm/netns-pair.sh
T=${MPI_TIMEOUT:-300}
NP=4
LOG=$(mktemp -d)
trap 'bash "$PAIR" down >/dev/null 2>&1; rm -rf "$LOG"' EXIT
failed=0
echo "vm-mpi: data path ${RDMA_DIRECT_DATA_PATH:-default}, $NP ranks, $(nproc) CPUs"

# Bytes that must arrive on each veth end during a run across the pair:
# what the check arguments move each way at the least (payload or, for
# small messages, 64 bytes per RoCE frame).
declare -A floor=(
  [alltoall_bw]=$((5 * 65536))  # 5 rounds of 64 KiB WRITEs each way
  [ring_lat]=$((100 * 64))      # hops 1->2 (A to B) and 3->0 (B to A)
  [atomic_counter]=$((300 * 64)) # ranks 2,3's atomics to rank 0, their responses
  [p2p_vs_mpi]=$((100 * 64))    # rank 0 (A) and rank 1 (B) ping-pong
  [peer_loss]=$((64 * 64))      # 0,1 (A) to the victim 3 (B); ring 1->2, 2->0
)

report() { # report NAME RC
  if [ "$2" = 0 ]; then
    echo "PASS $1"
  else
    failed=1
    echo "FAIL $1 (rc=$2)"
    for f in "$LOG"/*; do echo "  --- $f"; tail -n 25 "$f" | sed 's/^/    /'; done
  fi
  rm -f "$LOG"/*
}

# run EXAMPLE ARGS...: one mpirun; 0 with the verdict line, else non-zero.
run() {
  local ex=$1 rc=0; shift
  declare -n ex_args="args_$ex"
  echo "vm-mpi: mpirun -np $NP $ex ${ex_args[*]} $*" >"$LOG/cmd"
  # shellcheck disable=SC2086 # an example's extra options are words
  timeout --kill-after=10 "$T" mpirun "${mpirun_opts[@]}" ${mpi_opts_of[$ex]:-} -np "$NP" "$BIN/$ex" \
    "${ex_args[@]}" "$@" >"$LOG/out" 2>"$LOG/err" || rc=$?
  cat "$LOG/out"
  [ "$rc" = 0 ] || return "$rc"
  grep -qxF " $(mpi_verdict_of "$ex")" "$LOG/out" || { echo "no verdict line" >"$LOG/verdict"; return 3; }
}

# refuse NAME PATTERN EXAMPLE ARGS...: the run must fail and say PATTERN.
refuse() {
  local name=$1 pattern=$2 rc=0; shift 2
  run "$@" || rc=$?
  if [ "$rc" = 0 ]; then
    report "$name" 5
  elif [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
    report "$name" "$rc"
  elif ! grep -q "$pattern" "$LOG/err"; then
    echo "exit $rc without '$pattern' on stderr" >"$LOG/why"
    report "$name" 6
  else
    grep -m1 "$pattern" "$LOG/err"
    report "$name" 0
  fi
}

# --- one device: rxe0 ----------------------------------------------------
for ex in "${mpi_examples[@]}"; do
  rc=0
  run "$ex" --device "$RXE_DEV" --gid-idx "$RXE_GID_INDEX" || rc=$?
  report "mpi-rxe0-$ex" "$rc"
done
refuse mpi-refuse-unknown-device "no RDMA device of that name" ring_lat --device nosuch0
refuse mpi-refuse-wrong-gid "gid-idx 0: .* connect with GID" ring_lat --device "$RXE_DEV" --gid-idx 0

# --- two devices: the rxe veth pair --------------------------------------
if eval "$(bash "$PAIR" up rxe 2>"$LOG/up")"; then
  rm -f "$LOG/up"
  for ex in "${mpi_examples[@]}"; do
    rc=0
    if [ "$ex" = p2p_vs_mpi ]; then
      devs=$DEV_A,$DEV_B,$DEV_A,$DEV_B gids=$GID_A,$GID_B,$GID_A,$GID_B
    else
      devs=$DEV_A,$DEV_B gids=$GID_A,$GID_B
    fi
    a0=$(cat "/sys/class/net/$NETDEV_A/statistics/rx_bytes")
    b0=$(cat "/sys/class/net/$NETDEV_B/statistics/rx_bytes")
    run "$ex" --device-by-rank "$devs" --gid-idx-by-rank "$gids" || rc=$?
    da=$(($(cat "/sys/class/net/$NETDEV_A/statistics/rx_bytes") - a0))
    db=$(($(cat "/sys/class/net/$NETDEV_B/statistics/rx_bytes") - b0))
    echo "vm-mpi: $ex across the pair: $da bytes arrived on $NETDEV_A, $db on $NETDEV_B (floor ${floor[$ex]} each)"
    if [ "$rc" = 0 ] && { [ "$da" -lt "${floor[$ex]}" ] || [ "$db" -lt "${floor[$ex]}" ]; }; then
      echo "only $da bytes on $NETDEV_A and $db on $NETDEV_B, floor ${floor[$ex]}" >"$LOG/veth"
      rc=7
    fi
    report "mpi-pair-$ex" "$rc"
  done
else
  for ex in "${mpi_examples[@]}"; do report "mpi-pair-$ex" 4; done
fi
bash "$PAIR" down >/dev/null 2>&1

exit $failed
