#!/usr/bin/env bash
# Interoperability of the examples with rdma-core's tools on the kernel's
# software RDMA devices. Runs INSIDE the test VM (scripts/softrdma-vm), with
# the examples built on the host with the verbs backend:
#
#   export CARGO_TARGET_DIR=$PWD/target/h-ex
#   cargo build --release --features verbs --examples
#   scripts/softrdma-vm/vm-run.sh bash scripts/vm-interop.sh "$CARGO_TARGET_DIR/release/examples"
#
# The directory of the example binaries is the first argument, or
# $RDD_EXAMPLES_DIR, or target/release/examples of this repository.
#
# Checks, each printed as "PASS name (N s)" or "FAIL name (rc=N, N s)" with
# the output of both sides on failure, each side bounded by `timeout`
# ($INTEROP_TIMEOUT, default 60 s):
#   inproc-*            pingpong, write_bw, atomic_counter with --device, two
#                       QPs on one device (rxe0: connected directly; siw0:
#                       through rdma_cm); atomic_counter on siw0 must refuse
#                       (exit 2, "no RDMA atomic support": iWARP has none)
#   rc_pingpong-*       examples/pingpong in two-process mode against
#                       ibv_rc_pingpong on rxe0 (both roles, and against
#                       itself), GID index $RXE_GID_INDEX, -c / --chk
#   rping-*             examples/rping against rping -V (both roles) on rxe0
#                       and siw0, and against itself on siw0
# About 35-70 s inside the VM under TCG, depending on host load (plus the
# boot: 60-130 s of VM time in all). Set INTEROP_VERBOSE=1 to see the
# output of passing checks too. vm-run.sh passes RDD_EXAMPLES_DIR,
# INTEROP_TIMEOUT and INTEROP_VERBOSE only when named in VM_PASSENV.
#
# Exit status: 0 all checks passed; 1 at least one failed; 2 not inside the
# VM or no example binaries.
set -uo pipefail

if [ "${IN_RDMA_VM:-0}" != 1 ]; then
  echo "vm-interop.sh: run inside the test VM: scripts/softrdma-vm/vm-run.sh bash $0 BIN_DIR" >&2
  exit 2
fi
REPO=$(cd "$(dirname "$0")/.." && pwd)
BIN=${1:-${RDD_EXAMPLES_DIR:-$REPO/target/release/examples}}
for ex in pingpong write_bw atomic_counter rping; do
  if [ ! -x "$BIN/$ex" ]; then
    echo "vm-interop.sh: no $BIN/$ex (build with: cargo build --release --features verbs --examples)" >&2
    exit 2
  fi
done
T=${INTEROP_TIMEOUT:-60}
RXE=$RXE_DEV SIW=$SIW_DEV G=$RXE_GID_INDEX
LOG=$(mktemp -d)
trap 'rm -rf "$LOG"' EXIT
passed=0 failed=0
START=$SECONDS

# result NAME RC SECONDS OUTPUT-FILES...
result() {
  local name=$1 rc=$2 secs=$3 f; shift 3
  if [ "$rc" = 0 ]; then
    passed=$((passed + 1)); echo "PASS $name (${secs} s)"
    if [ "${INTEROP_VERBOSE:-0}" = 1 ]; then
      for f in "$@"; do sed 's/^/    /' "$f"; done
    fi
  else
    failed=$((failed + 1)); echo "FAIL $name (rc=$rc, ${secs} s)"
    for f in "$@"; do sed 's/^/    /' "$f" | tail -n 25; done
  fi
}

# check NAME CMD: one command, must exit 0.
check() {
  local name=$1 cmd=$2 rc=0 t0=$SECONDS
  echo "  \$ $cmd" > "$LOG/cmd"
  timeout "$T" bash -c "$cmd" > "$LOG/out" 2>&1 || rc=$?
  result "$name" "$rc" $((SECONDS - t0)) "$LOG/cmd" "$LOG/out"
}

# check_refused NAME STATUS TEXT CMD: CMD must exit with STATUS and say TEXT.
check_refused() {
  local name=$1 want=$2 text=$3 cmd=$4 rc=0 t0=$SECONDS
  echo "  \$ $cmd (expect exit $want and \"$text\")" > "$LOG/cmd"
  timeout "$T" bash -c "$cmd" > "$LOG/out" 2>&1 || rc=$?
  if [ "$rc" = "$want" ] && grep -q "$text" "$LOG/out"; then rc=0; else rc=${rc/#0/unexpected-0}; fi
  result "$name" "$rc" $((SECONDS - t0)) "$LOG/cmd" "$LOG/out"
}

# wait_listen PORT PID: until something listens on PORT (TCP or rdma_cm), or
# the server PID has exited.
wait_listen() {
  local port=$1 pid=$2
  for _ in $(seq 200); do
    ss -Hltn "sport = :$port" 2>/dev/null | grep -q . && return 0
    rdma res show cm_id 2>/dev/null | grep -q "state LISTEN .*:$port " && return 0
    kill -0 "$pid" 2>/dev/null || return 1
    sleep 0.1
  done
}

# check_pair NAME PORT SERVER CLIENT [BAD-TEXT]: both must exit 0; BAD-TEXT
# (a regex) must not appear in either output.
check_pair() {
  local name=$1 port=$2 srv=$3 cli=$4 bad=${5:-} src=0 crc=0 t0=$SECONDS
  timeout "$T" bash -c "$srv" > "$LOG/srv" 2>&1 & local spid=$!
  wait_listen "$port" "$spid"
  timeout "$T" bash -c "$cli" > "$LOG/cli" 2>&1 || crc=$?
  wait "$spid" || src=$?
  local rc=$crc
  [ "$src" = 0 ] || rc="server:$src"
  if [ "$rc" = 0 ] && [ -n "$bad" ] && grep -qE "$bad" "$LOG/srv" "$LOG/cli"; then
    rc="output matches /$bad/"
  fi
  echo "  server: $srv" > "$LOG/srv.cmd"; echo "  client: $cli" > "$LOG/cli.cmd"
  result "$name" "$rc" $((SECONDS - t0)) "$LOG/srv.cmd" "$LOG/srv" "$LOG/cli.cmd" "$LOG/cli"
}

echo "kernel $(uname -r); $(dpkg-query -W -f='${Package} ${Version}' rdma-core 2>/dev/null)"
echo "rxe: $RXE $RXE_IP gid $G; siw: $SIW $SIW_IP; examples: $BIN"

# In-process runs on each device.
for d in "$RXE" "$SIW"; do
  check "inproc-pingpong-$d" "$BIN/pingpong --device $d --iters 200 --warmup 20"
  check "inproc-write_bw-$d" "$BIN/write_bw --device $d --size 4096 --iters 1000 --warmup 100"
done
check "inproc-atomic_counter-$RXE" "$BIN/atomic_counter --device $RXE --threads 2 --ops 4000"
check_refused "inproc-atomic_counter-$SIW-refused" 2 "no RDMA atomic support" \
  "$BIN/atomic_counter --device $SIW"

# ibv_rc_pingpong compatibility (TCP port 18515, rxe0 only: iWARP has no
# out-of-band QP connection).
N=200
PP="$BIN/pingpong --device $RXE --gid-idx $G --iters $N --chk"
RC="ibv_rc_pingpong -d $RXE -g $G -n $N -c"
check_pair "rc_pingpong-ours-server-$RXE" 18515 "$PP --server" "$RC 127.0.0.1" "invalid data"
check_pair "rc_pingpong-ours-client-$RXE" 18515 "$RC" "$PP --connect 127.0.0.1" "invalid data"
check_pair "rc_pingpong-ours-both-$RXE" 18515 "$PP --server" "$PP --connect 127.0.0.1" "invalid data"
check_pair "rc_pingpong-ours-both-$RXE-mtu4096-small" 18515 \
  "$BIN/pingpong --device $RXE --gid-idx $G --server --mtu 4096 --size 64 --rx-depth 8 --iters 500" \
  "$BIN/pingpong --device $RXE --gid-idx $G --connect 127.0.0.1 --mtu 4096 --size 64 --rx-depth 8 --iters 500"

# rping compatibility (rdma_cm port 7174).
C=10
for d in "$RXE:$RXE_IP" "$SIW:$SIW_IP"; do
  dev=${d%%:*} ip=${d#*:}
  check_pair "rping-ours-client-$dev" 7174 "rping -s -a $ip -V -C $C" "$BIN/rping -c -a $ip -V -C $C"
  check_pair "rping-ours-server-$dev" 7174 "$BIN/rping -s -a $ip -V -C $C" "rping -c -a $ip -V -C $C"
done
check_pair "rping-ours-both-$SIW-S1000" 7174 \
  "$BIN/rping -s -a $SIW_IP -V -S 1000" "$BIN/rping -c -a $SIW_IP -V -C $C -S 1000"

echo "vm-interop took $((SECONDS - START)) s"
echo "vm-interop: $passed passed, $failed failed"
[ "$failed" = 0 ]
