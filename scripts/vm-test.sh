#!/usr/bin/env bash
# Real kernel RDMA (rxe and siw) for rdma-direct's verbs backend: builds and
# caches the test VM, builds the verbs tests and the examples on the host
# (`--features verbs`), installs the verbs-enabled C library into a prefix
# and builds the C examples against it with pkg-config and the MPI examples
# with mpicc, and runs scripts/vm-suite.sh inside the VM.
#
#   scripts/vm-test.sh
#
# Time budget (2-core CI machine, TCG emulation): image build 2.5-3 min the
# first time (cached afterwards), host build ~2-4 min, VM suite ~4-6 min; every
# step has a timeout (VM_TIMEOUT for the VM run, default 1500 s).
#
# Preconditions, checked before anything is built (each failure says what
# is needed and exits 1; nothing is skipped):
#   root          apt-get installs packages; the image build runs
#                 debootstrap and chroot
#   Debian 12     the image is Debian bookworm, and the test binaries built
#                 here run in it against its glibc and rdma-core 44
#   packages      scripts/install-deps.sh --vm-test installs what is
#                 missing: the host build packages (libibverbs-dev,
#                 librdmacm-dev, libclang-dev, clang, gcc, ...; without them
#                 the rdma-sys build fails), rustup and the stable toolchain,
#                 and the VM stage's host packages (debootstrap, qemu, ...;
#                 HOST_TOOLS in scripts/softrdma-vm/build-vm.sh)
#
# Exit status: non-zero if anything fails (1 a precondition; the VM suite's
# own status, 124 if the VM timed out, 125 if it could not boot).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
# shellcheck source=scripts/toolchains.sh
. scripts/toolchains.sh   # cargo's bin directory on PATH (a fresh rustup)
export CARGO_TERM_COLOR=never

need() {
  echo "vm-test: cannot run: $*" >&2
  exit 1
}
if [ "$(id -u)" != 0 ]; then
  need "it must run as root (it installs Debian packages with apt-get and builds the VM image with debootstrap and chroot); run: sudo scripts/vm-test.sh"
fi
os_id=$( (. /etc/os-release && echo "${ID:-unknown} ${VERSION_ID:-}") 2>/dev/null || echo "unknown (no /etc/os-release)")
if [ "$os_id" != "debian 12" ]; then
  os_name=$( (. /etc/os-release && echo "${PRETTY_NAME:-$ID $VERSION_ID}") 2>/dev/null || echo "$os_id")
  need "it needs a Debian 12 (bookworm) host, and this one is $os_name: the test VM is Debian bookworm, and the test binaries built here run inside it against bookworm's glibc and rdma-core"
fi
echo "vm-test: checking the prerequisites (scripts/install-deps.sh --vm-test)"
if ! bash scripts/install-deps.sh --vm-test; then
  need "its prerequisites are missing and could not be installed; the lines above name them (the host's Debian packages are APT_HOST in scripts/install-deps.sh, the VM stage's are HOST_TOOLS in scripts/softrdma-vm/build-vm.sh, the toolchain is rust-toolchain.toml's)"
fi

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

# The C examples as a C user builds them: the verbs-enabled library
# installed into a prefix (scripts/install.sh, FEATURES=verbs), then
# examples/c/pingpong.c and write_bw.c compiled outside the source tree
# with nothing but pkg-config (--static: the .pc file names libibverbs,
# librdmacm and libmlx5 in Requires.private), plain and under ASan+UBSan
# (static sanitizer runtimes, as above). scripts/vm-c-examples.sh runs
# them on rxe0 and siw0.
echo "vm-test: installing the verbs-enabled C library and building the C examples with pkg-config"
CPREFIX=$T/c-prefix CEXDIR=$T/c-examples
rm -rf "$CPREFIX" "$CEXDIR"
mkdir -p "$CEXDIR"
PREFIX=$CPREFIX FEATURES=verbs bash scripts/install.sh
cp examples/c/pingpong.c examples/c/write_bw.c examples/c/common.h "$CEXDIR/"
PC_FLAGS=$(PKG_CONFIG_PATH=$CPREFIX/lib/pkgconfig pkg-config --cflags --libs --static rdma-direct)
CFLAGS_X="-std=c11 -Wall -Wextra -Wpedantic -Werror"
SAN_X="-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=all -static-libasan -static-libubsan"
: > "$CEXDIR/BUILD"
for ex in pingpong write_bw; do
  for variant in plain asan; do
    if [ "$variant" = plain ]; then
      cmd="cc $CFLAGS_X -O2 $ex.c \$(pkg-config --cflags --libs --static rdma-direct) -o $ex"
      # shellcheck disable=SC2086
      (cd "$CEXDIR" && cc $CFLAGS_X -O2 "$ex.c" $PC_FLAGS -o "$ex")
    else
      cmd="cc $CFLAGS_X -g -O1 $SAN_X $ex.c \$(pkg-config --cflags --libs --static rdma-direct) -o ${ex}_asan"
      # shellcheck disable=SC2086
      (cd "$CEXDIR" && cc $CFLAGS_X -g -O1 $SAN_X "$ex.c" $PC_FLAGS -o "${ex}_asan")
    fi
    echo "$cmd" >> "$CEXDIR/BUILD"
  done
done
echo "vm-test: C examples built in $CEXDIR with: pkg-config --cflags --libs --static rdma-direct = $PC_FLAGS"

# The MPI examples (examples/mpi/), built with mpicc against the same
# installed library exactly as scripts/mpi-examples.sh builds them for the
# host; scripts/vm-mpi.sh runs them on rxe0 and across the veth pair (the
# guest has Open MPI's runtime: GUEST_PKGS in build-vm.sh).
echo "vm-test: building the MPI examples with mpicc against the installed library"
MPIEXDIR=$T/mpi-examples
rm -rf "$MPIEXDIR"
bash scripts/mpi-examples.sh --build "$CPREFIX" "$MPIEXDIR"

echo "vm-test: running the suite in the VM"
# The ':'-joined list is not a path vm-run.sh can see: share the test
# binaries' directory explicitly (all come from one target directory).
BINDIR=$(dirname "${TESTBIN%%:*}")
VM_SHARES=${VM_SHARES:+$VM_SHARES:}$BINDIR:$T/ffi-verbs:$CEXDIR:$MPIEXDIR VM_TIMEOUT=${VM_TIMEOUT:-1500} VM_TIME=1 \
  scripts/softrdma-vm/vm-run.sh bash scripts/vm-suite.sh "$TESTBIN" "$EXDIR" "$CEXDIR" "$MPIEXDIR"
