#!/usr/bin/env bash
# Real kernel RDMA (rxe and siw) for rdma-direct's verbs backend: builds and
# caches the test VM, builds the verbs tests and the examples on the host
# (`--features verbs`), and runs scripts/vm-suite.sh inside the VM.
#
#   scripts/vm-test.sh
#
# Time budget (2-core CI machine, TCG emulation): image build 2.5-3 min the
# first time (cached afterwards), host build ~2-4 min, VM suite ~1-3 min; every
# step has a timeout (VM_TIMEOUT for the VM run, default 1500 s).
# Needs root (the image build uses debootstrap; qemu comes from apt).
#
# Exit status: non-zero if anything fails (the VM suite's own status, 124 if
# the VM timed out, 125 if it could not boot).
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TERM_COLOR=never

echo "vm-test: building the VM image (cached after the first time)"
timeout 1200 bash scripts/softrdma-vm/build-vm.sh

echo "vm-test: building the verbs tests, the examples and the C test"
cargo build --release --features verbs --lib --examples
# The C ABI on kernel devices: ffi-tests/test_verbs.c against the
# verbs-enabled staticlib, plain and under ASan+UBSan (static sanitizer
# runtimes: the VM has the host's glibc but no compiler runtimes).
T=${CARGO_TARGET_DIR:-$PWD/target}
case $T in /*) ;; *) T=$PWD/$T ;; esac
mkdir -p "$T/ffi-verbs"
CFLAGS_V="-std=c11 -Wall -Wextra -Wpedantic -Werror -g -O1 -Iinclude -Iffi-tests"
LIBS_V="$T/release/librdma_direct.a -libverbs -lrdmacm -lmlx5 -lpthread -ldl -lm"
# shellcheck disable=SC2086
cc $CFLAGS_V -o "$T/ffi-verbs/test_verbs" ffi-tests/test_verbs.c $LIBS_V
# shellcheck disable=SC2086
cc $CFLAGS_V -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=all \
  -static-libasan -static-libubsan -o "$T/ffi-verbs/test_verbs_asan" ffi-tests/test_verbs.c $LIBS_V
# Every real-device test binary: the verbs backend, the raw uverbs layer,
# the direct rxe/siw data paths, and credit-based flow control.
TESTBIN=""
for t in verbs_device uverbs_raw direct_paths credit_verbs; do
  bin=$(cargo test --release --features verbs --test "$t" --no-run 2>&1 |
    sed -n "s/.*Executable tests\/$t.rs (\(.*\))\$/\1/p" | tail -n 1)
  if [ -z "$bin" ] || [ ! -x "$bin" ]; then
    echo "vm-test: could not find the $t test binary" >&2
    exit 1
  fi
  case $bin in /*) ;; *) bin=$PWD/$bin ;; esac
  TESTBIN=${TESTBIN:+$TESTBIN:}$bin
done
TESTBIN=$TESTBIN:$T/ffi-verbs/test_verbs:$T/ffi-verbs/test_verbs_asan
EXDIR=${CARGO_TARGET_DIR:-$PWD/target}/release/examples
case $EXDIR in /*) ;; *) EXDIR=$PWD/$EXDIR ;; esac

echo "vm-test: running the suite in the VM"
# The ':'-joined list is not a path vm-run.sh can see: share the test
# binaries' directory explicitly (all come from one target directory).
BINDIR=$(dirname "${TESTBIN%%:*}")
VM_SHARES=${VM_SHARES:+$VM_SHARES:}$BINDIR:$T/ffi-verbs VM_TIMEOUT=${VM_TIMEOUT:-1500} VM_TIME=1 \
  scripts/softrdma-vm/vm-run.sh bash scripts/vm-suite.sh "$TESTBIN" "$EXDIR"
