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
#      SIGKILL mid-transfer under `mpirun --enable-recovery`, and its
#      verdict says whether the survivors' WRs to the dead rank all
#      failed within 250 ms (the fabric's liveness check) while their
#      own traffic went on;
#   4. after every run, fails if a /dev/shm/rdd-fab-* segment that run
#      created is left behind (a new segment whose creator, the pid in
#      its name, is gone; segments of other live programs are not ours).
#
#   scripts/mpi-examples.sh           the check above (well under 3 minutes on 2 cores)
#   scripts/mpi-examples.sh --bench   the figures of docs/benchmarks.md ("Scale-out on
#                                     the software fabric"): 2, 4, 8 and 16 ranks, longer runs
#   scripts/mpi-examples.sh --build PREFIX OUTDIR
#                                     step 2 only: the examples built against the library
#                                     installed at PREFIX (scripts/vm-test.sh installs the
#                                     verbs-enabled one and builds them so for
#                                     scripts/vm-mpi.sh, which runs them on rxe in the VM)
#
# The examples, their check arguments, verdict lines and mpirun's options
# (--oversubscribe, --mca btl self,vader, --allow-run-as-root as root)
# are in scripts/mpi-lib.sh, shared with scripts/vm-mpi.sh.
# Needs Open MPI (Debian's openmpi-bin and libopenmpi-dev:
# scripts/install-deps.sh). Honours CARGO_TARGET_DIR.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
# shellcheck source=scripts/mpi-lib.sh
. scripts/mpi-lib.sh

mode=check
case "${1:-}" in
  "") ;;
  --bench) mode=bench ;;
  --build) mode=build ;;
  *) echo "usage: $0 [--bench | --build PREFIX OUTDIR]" >&2; exit 2 ;;
esac
if [ "$mode" = build ] && { [ $# != 3 ] || [ ! -d "$2/lib/pkgconfig" ]; }; then
  echo "usage: $0 --build PREFIX OUTDIR (PREFIX: where scripts/install.sh installed the library)" >&2
  exit 2
fi

die() { echo "mpi-examples: FAILED: $*" >&2; exit 1; }
for tool in mpicc mpirun pkg-config; do
  command -v "$tool" >/dev/null ||
    die "no $tool (Debian: openmpi-bin libopenmpi-dev pkg-config; scripts/install-deps.sh)"
done

# build PREFIX OUTDIR: every example, against the library installed at PREFIX.
build() {
  local ex
  mkdir -p "$2"
  for ex in "${mpi_examples[@]}"; do
    echo "mpi-examples: building $ex" >&2
    # shellcheck disable=SC2046 # pkg-config's flags are words
    mpicc -std=c11 -O2 -Wall -Wextra -Wpedantic -Werror "examples/mpi/$ex.c" \
      $(PKG_CONFIG_PATH="$1/lib/pkgconfig" pkg-config --cflags --libs --static rdma-direct) \
      -o "$2/$ex"
  done
}
if [ "$mode" = build ]; then
  build "$(cd "$2" && pwd)" "$3"
  exit 0
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/rdd-mpi.XXXXXX")
trap 'rm -rf "$work"' EXIT

# ---------------------------------------------------------------- install, build
FEATURES='' PREFIX="$work/prefix" bash scripts/install.sh
build "$work/prefix" "$work"

# ---------------------------------------------------------------- runs
if [ "$mode" = bench ]; then
  nps=(2 4 8 16)
  args_alltoall_bw=(--iters 50 --warmup 5)
  args_ring_lat=(--iters 1000 --warmup 100)
  args_atomic_counter=(--count 2000)
  args_p2p_vs_mpi=(--lat-iters 1000 --bw-iters 100)
  limit=600
else
  nps=(4 8)   # and mpi-lib.sh's short arguments
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

runs=0
for np in "${nps[@]}"; do
  for ex in "${mpi_examples[@]}"; do
    declare -n ex_args="args_$ex"
    echo >&2
    echo "mpi-examples: mpirun -np $np $ex ${ex_args[*]}" >&2
    segments >"$work/before"
    status=0
    timeout --kill-after=10 "$limit" \
      mpirun "${mpirun_opts[@]}" ${mpi_opts_of[$ex]:-} -np "$np" "$work/$ex" "${ex_args[@]}" \
      >"$work/out" 2>"$work/err" || status=$?
    cat "$work/out"
    if [ "$status" != 0 ]; then
      cat "$work/err" >&2
      [ "$status" != 124 ] || die "$ex at $np ranks did not finish in ${limit}s"
      die "$ex at $np ranks exited with status $status"
    fi
    grep -qxF " $(mpi_verdict_of "$ex")" "$work/out" ||
      { cat "$work/err" >&2; die "$ex at $np ranks: no '$(mpi_verdict_of "$ex")' line"; }
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
