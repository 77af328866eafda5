#!/usr/bin/env bash
# Builds and runs the MPI examples (examples/mpi/) on the cross-process
# software fabric, the way a user would:
#
#   1. installs the library (default features) with scripts/install.sh
#      into a temporary prefix;
#   2. builds every example with
#        mpicc -std=c11 -O2 -Wall -Wextra -Wpedantic -Werror X.c \
#            $(pkg-config --cflags --libs --static rdma-direct)
#      and nothing else (mesh.h sits next to the sources);
#   3. runs each with `mpirun -np 4` and `mpirun -np 8`, short counts,
#      and checks every example's closing verdict (atomic_counter's
#      "verdict: PASS" among them); peer_loss kills one rank with
#      SIGKILL mid-transfer and runs under `mpirun --enable-recovery`
#      (Open MPI then lets the others finish), and its survivors' verdict
#      says whether their WRs to the dead rank all failed within the bound
#      and their own traffic went on (mpirun's exit status says nothing
#      about the survivors there, so the verdict line is the check);
#   4. after every run, fails if a /dev/shm/rdd-fab-* segment that run
#      created is left behind (a new segment whose creator, the pid in
#      its name, is gone; segments of other live programs are not ours).
#
#   scripts/mpi-examples.sh           the check above (well under 3 minutes on 2 cores)
#   scripts/mpi-examples.sh --bench   the figures of docs/benchmarks.md ("Scale-out on
#                                     the software fabric"): 2, 4, 8 and 16 ranks, longer runs
#
# mpirun options: --oversubscribe (the runs start more ranks than the
# machine has cores), --allow-run-as-root when run as root, and
# `--mca btl self,vader`: ranks of one host talk through shared memory
# only, so no network interface (a container may have none) is probed.
# Needs Open MPI (Debian's openmpi-bin and libopenmpi-dev:
# scripts/install-deps.sh). Honours CARGO_TARGET_DIR.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"

mode=check
case "${1:-}" in
  "") ;;
  --bench) mode=bench ;;
  *) echo "usage: $0 [--bench]" >&2; exit 2 ;;
esac

die() { echo "mpi-examples: FAILED: $*" >&2; exit 1; }
for tool in mpicc mpirun pkg-config; do
  command -v "$tool" >/dev/null ||
    die "no $tool (Debian: openmpi-bin libopenmpi-dev pkg-config; scripts/install-deps.sh)"
done

work=$(mktemp -d "${TMPDIR:-/tmp}/rdd-mpi.XXXXXX")
trap 'rm -rf "$work"' EXIT

# ---------------------------------------------------------------- install, build
FEATURES='' PREFIX="$work/prefix" bash scripts/install.sh
export PKG_CONFIG_PATH="$work/prefix/lib/pkgconfig"
examples=(alltoall_bw ring_lat atomic_counter p2p_vs_mpi peer_loss)
for ex in "${examples[@]}"; do
  echo "mpi-examples: building $ex" >&2
  # shellcheck disable=SC2046 # pkg-config's flags are words
  mpicc -std=c11 -O2 -Wall -Wextra -Wpedantic -Werror "examples/mpi/$ex.c" \
    $(pkg-config --cflags --libs --static rdma-direct) -o "$work/$ex"
done

# ---------------------------------------------------------------- runs
mpirun_opts=(--oversubscribe --mca btl self,vader)
[ "$(id -u)" != 0 ] || mpirun_opts+=(--allow-run-as-root)

if [ "$mode" = bench ]; then
  nps=(2 4 8 16)
  args_alltoall_bw=(--iters 50 --warmup 5)
  args_ring_lat=(--iters 1000 --warmup 100)
  args_atomic_counter=(--count 2000)
  args_p2p_vs_mpi=(--lat-iters 1000 --bw-iters 100)
  args_peer_loss=()
  limit=600
else
  nps=(4 8)
  args_alltoall_bw=(--iters 5 --warmup 1 --size 65536)
  args_ring_lat=(--iters 100 --warmup 10)
  args_atomic_counter=(--count 300)
  args_p2p_vs_mpi=(--lat-iters 100 --bw-iters 10 --bw-size 262144)
  args_peer_loss=()
  limit=90
fi

# The rdd-fab-* segment names in /dev/shm, one a line, sorted.
segments() {
  find /dev/shm -maxdepth 1 -name 'rdd-fab-*' -printf '%f\n' 2>/dev/null | LC_ALL=C sort
}

# Segments in $2 (a file of names) that are not in $1 and whose creator
# (the pid in the first 8 hex digits of the source tag,
# docs/spec/fabric.md §2) no longer runs.
leftovers() {
  local name pid
  LC_ALL=C comm -13 "$1" "$2" | while read -r name; do
    pid=$((16#${name:8:8}))
    [ -d "/proc/$pid" ] || echo "$name"
  done
}

# What line every example ends a good run with.
verdict_of() {
  case "$1" in
    alltoall_bw) echo 'every block of every round checked on its receiver: OK' ;;
    ring_lat) echo 'every ping checked (length, iteration, sender, payload): OK' ;;
    atomic_counter | peer_loss) echo 'verdict: PASS' ;;
    p2p_vs_mpi) echo "every ping and both streams' bytes checked: OK" ;;
  esac
}

runs=0
for np in "${nps[@]}"; do
  for ex in "${examples[@]}"; do
    declare -n ex_args="args_$ex"
    echo >&2
    echo "mpi-examples: mpirun -np $np $ex ${ex_args[*]}" >&2
    segments >"$work/before"
    status=0
    extra=()
    [ "$ex" != peer_loss ] || extra=(--enable-recovery)
    timeout --kill-after=10 "$limit" \
      mpirun "${mpirun_opts[@]}" "${extra[@]}" -np "$np" "$work/$ex" "${ex_args[@]}" \
      >"$work/out" 2>"$work/err" || status=$?
    cat "$work/out"
    if [ "$status" != 0 ]; then
      cat "$work/err" >&2
      [ "$status" != 124 ] || die "$ex at $np ranks did not finish in ${limit}s"
      die "$ex at $np ranks exited with status $status"
    fi
    grep -qxF " $(verdict_of "$ex")" "$work/out" ||
      { cat "$work/err" >&2; die "$ex at $np ranks: no '$(verdict_of "$ex")' line"; }
    # A device's segments are unlinked when its QPs are destroyed: by
    # the time mpirun returns, nothing of this run is in /dev/shm.
    segments >"$work/after"
    left=$(leftovers "$work/before" "$work/after")
    [ -z "$left" ] || die "$ex at $np ranks left shared-memory segments behind:
$left"
    unset -n ex_args
    runs=$((runs + 1))
  done
done
echo >&2
echo "mpi-examples: $runs runs passed (ranks: ${nps[*]}); no rdd-fab-* segment left in /dev/shm" >&2
