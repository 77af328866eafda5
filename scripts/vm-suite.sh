#!/usr/bin/env bash
# The real-kernel RDMA suite. Runs INSIDE the test VM (scripts/softrdma-vm),
# started by scripts/vm-test.sh, which builds everything on the host first:
#
#   scripts/softrdma-vm/vm-run.sh bash scripts/vm-suite.sh TEST_BINS EXAMPLES_DIR C_EXAMPLES_DIR \
#     MPI_EXAMPLES_DIR
#
# TEST_BINS is a ':'-separated list of test binaries (tests/verbs_device.rs,
# tests/uverbs_raw.rs, ...), each run with one test thread. C_EXAMPLES_DIR
# holds the C examples vm-test.sh built against the installed verbs-enabled
# library with pkg-config, MPI_EXAMPLES_DIR the MPI examples it built
# against that library with mpicc.
#
# Stages (each must pass; the first failure fails the suite, after the
# remaining stages have run so one run shows every failure):
#   smoke      rdma-core's own tools on rxe0/siw0 and on the two-host
#              (veth) pair: the test bed itself works (scripts/vm-smoke.sh)
#   verbs      tests/verbs_device.rs on rxe0 and siw0: every opcode with
#              memory checked, bad rkey, flush on ERROR, typed WR errors,
#              rdma_cm on both transports, waits with events and timeouts,
#              async events, SRQs (rxe and siw, both data paths) and UD
#              (rxe, both data paths; refused with Unsupported on siw);
#              tests/uverbs_raw.rs: raw uverbs CQs and QPs;
#              tests/direct_paths.rs: our own rxe/siw rings (wrap-around,
#              talking to libibverbs' provider, a destroyed peer, a random
#              workload, doorbells per batch); tests/credit_verbs.rs:
#              credit-based flow control on rxe (a slow receiver: RNR
#              retry-exceeded errors without it, no RNR NAK and every
#              message in order with CreditQp) and its typed Unsupported on
#              siw; ffi-tests/test_verbs.c: the C object API on rxe and siw,
#              plain and under ASan+UBSan (with verbs_srq_ud.h: the C SRQ
#              calls on rxe and siw and the UD calls on rxe, both data
#              paths, and UD's UNSUPPORTED on siw)
#   interop    the examples against ibv_rc_pingpong and rping, and on each
#              device in-process; disconnects, rejections and refusals
#              reported at once, and exit statuses (scripts/vm-interop.sh)
#   c-examples examples/c/pingpong.c and write_bw.c, built against the
#              installed library with pkg-config only, on rxe0 (plain and
#              under ASan+UBSan), and their refusal on siw0, which needs
#              rdma_cm (scripts/vm-c-examples.sh)
#   mpi        examples/mpi/ (all-to-all WRITE bandwidth, ring SEND latency,
#              a FETCH_AND_ADD counter, rdma-direct vs MPI point to point),
#              each one `mpirun -np 4` in the VM with its verdict checked:
#              4 ranks on rxe0, and 4 ranks across the two rxe devices of
#              the veth pair (ranks 0,1 on one, 2,3 on the other) with the
#              RoCE traffic counted on both veth ends; GIDs checked against
#              sysfs, an unknown device and a wrong GID index refused
#              loudly (scripts/vm-mpi.sh)
#   (the verbs, interop, c-examples and mpi stages run twice: on rdma-direct's
#   own rxe/siw rings, RDMA_DIRECT_DATA_PATH=direct, and on libibverbs'
#   providers, =fallback)
#   two-host   our programs on the two devices of the veth pair: pingpong
#              (rxe, out-of-band) and rping (siw, rdma_cm, in two network
#              namespaces) (scripts/vm-two-host.sh)
#
# Exit status: 0 all stages passed; 1 a stage failed; 2 usage / not in the VM.
set -uo pipefail

if [ "${IN_RDMA_VM:-0}" != 1 ]; then
  echo "vm-suite.sh: run inside the test VM (scripts/vm-test.sh does that)" >&2
  exit 2
fi
if [ $# -ne 4 ] || [ -z "$1" ] || [ ! -d "$2" ] || [ ! -d "$3" ] || [ ! -d "$4" ]; then
  echo "usage: vm-suite.sh TEST_BINS EXAMPLES_DIR C_EXAMPLES_DIR MPI_EXAMPLES_DIR" >&2
  exit 2
fi
HERE=$(cd "$(dirname "$0")" && pwd)
TESTBIN=$1 EXDIR=$2 CEXDIR=$3 MPIEXDIR=$4
failed=()
SECONDS=0

stage() { # stage NAME CMD...
  local name=$1 t0=$SECONDS rc=0; shift
  printf '\n==== vm stage: %s ====\n' "$name"
  "$@" || rc=$?
  if [ "$rc" = 0 ]; then
    echo "==== vm stage $name: PASS ($((SECONDS - t0)) s)"
  else
    echo "==== vm stage $name: FAIL (rc=$rc, $((SECONDS - t0)) s)"
    failed+=("$name")
  fi
}

stage smoke bash "$HERE/vm-smoke.sh"
IFS=: read -r -a TESTBINS <<<"$TESTBIN"
# The device tests and the interop checks run on both data paths rxe and
# siw have: rdma-direct's own rings ("direct", the default) and
# libibverbs' provider ("fallback").
for path in direct fallback; do
  for t in "${TESTBINS[@]}"; do
    [ -x "$t" ] || { echo "vm-suite.sh: not executable: $t" >&2; exit 2; }
    name=$(basename "$t" | sed 's/-[0-9a-f]*$//')
    # The raw uverbs layer and the direct-path tests (which pick their
    # paths themselves) run once.
    case $name in uverbs_raw|direct_paths) [ "$path" = fallback ] && continue ;; esac
    stage "$path:$name" env RDMA_DIRECT_DATA_PATH=$path \
      ASAN_OPTIONS=halt_on_error=1:detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
      timeout 600 "$t" --test-threads=1
  done
  stage "$path:interop" env RDMA_DIRECT_DATA_PATH=$path bash "$HERE/vm-interop.sh" "$EXDIR"
  stage "$path:c-examples" env RDMA_DIRECT_DATA_PATH=$path bash "$HERE/vm-c-examples.sh" "$CEXDIR"
  stage "$path:mpi" env RDMA_DIRECT_DATA_PATH=$path bash "$HERE/vm-mpi.sh" "$MPIEXDIR"
done
stage two-host bash "$HERE/vm-two-host.sh" "$EXDIR"

echo
if [ ${#failed[@]} -eq 0 ]; then
  echo "vm-suite: all stages passed in ${SECONDS}s"
  exit 0
fi
echo "vm-suite: FAILED stages: ${failed[*]} (${SECONDS}s)"
exit 1
