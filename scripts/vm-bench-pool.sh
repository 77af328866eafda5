#!/usr/bin/env bash
# Buffer pool vs registering a fresh MR per buffer (benches/pool.rs) on the
# software device, rxe and siw, one after the other in ONE session of the
# test VM, so the ratios compare within one run. Runs INSIDE the VM; from
# the host:
#
#   export CARGO_TARGET_DIR=$PWD/target/h-poolbench
#   cargo bench --features verbs --bench pool --no-run    # prints the binary's path
#   mkdir -p /tmp/poolbench && cp <pool binary> /tmp/poolbench/pool
#   VM_TIMEOUT=900 scripts/softrdma-vm/vm-run.sh bash scripts/vm-bench-pool.sh /tmp/poolbench/pool
#
# Every argument after the binary goes to each run (default: POOL_ARGS
# below). Environment:
#   POOL_DEVICES  "soft $RXE_DEV $SIW_DEV"
#   POOL_ARGS     "--iters 200000 --reg-iters 1000 --reps 5 --large-mib 128"
#                 (the host defaults, 2 000 000 / 20 000 / 1 GiB per run,
#                 take far too long under TCG; with 128 MiB per run the
#                 256 MiB regions still run twice per run, as on the host)
#   POOL_TIMEOUT  seconds per device (default 400)
#
# Exit status: 0 if every device's run succeeded, 1 otherwise, 2 if not
# inside the VM or no binary given.
set -uo pipefail

if [ "${IN_RDMA_VM:-0}" != 1 ]; then
  echo "vm-bench-pool.sh: run inside the test VM: scripts/softrdma-vm/vm-run.sh bash $0 BINARY" >&2
  exit 2
fi
BIN=${1:-}
if [ -z "$BIN" ] || [ ! -x "$BIN" ]; then
  echo "usage: vm-bench-pool.sh PATH-TO-pool-BINARY [ARGS...]" >&2
  exit 2
fi
shift
if [ $# -gt 0 ]; then
  ARGS=("$@")
else
  read -r -a ARGS <<< "${POOL_ARGS:---iters 200000 --reg-iters 1000 --reps 5 --large-mib 128}"
fi
DEVICES=${POOL_DEVICES:-"soft $RXE_DEV $SIW_DEV"}
T=${POOL_TIMEOUT:-400}
FAILED=0
START=$SECONDS

echo "vm-bench-pool: kernel $(uname -r); $(nproc) CPUs; $(awk '/MemTotal/ { printf "%d MiB", $2 / 1024 }' /proc/meminfo); load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "vm-bench-pool: $BIN ${ARGS[*]}"
for dev in $DEVICES; do
  echo
  t0=$SECONDS
  timeout "$T" "$BIN" --device "$dev" "${ARGS[@]}" || { echo "vm-bench-pool: $dev failed (status $?)" >&2; FAILED=1; }
  echo
  echo "vm-bench-pool: $dev took $((SECONDS - t0)) s; load $(cut -d' ' -f1-3 /proc/loadavg)"
done
echo
echo "vm-bench-pool: $((SECONDS - START)) s"
exit "$FAILED"
