#!/usr/bin/env bash
# Installs what rdma-direct's build, tests and benchmarks need on a Debian 12
# host: Debian packages, rustup, the pinned toolchains and the pinned cargo
# tools. Idempotent: when everything is present it changes nothing and
# takes about a second. Fails loudly, naming what is missing, when
# something cannot be installed.
#
#   scripts/install-deps.sh            host packages, rustup, both toolchains, cargo tools
#   scripts/install-deps.sh --vm       the same, plus the VM stage's host packages
#   scripts/install-deps.sh --vm-test  only what scripts/vm-test.sh needs: host packages,
#                                      rustup and the stable toolchain, the VM stage's
#                                      host packages (no nightly, no cargo tools)
#
# Pins (scripts/toolchains.sh, one place): the stable toolchain of
# rust-toolchain.toml, the dated nightly RDD_NIGHTLY (Miri, cargo-fuzz),
# cargo-fuzz CARGO_FUZZ_VERSION and cbindgen CBINDGEN_VERSION (reinstalled
# when the installed version differs).
#
# rustup: Debian 12 has no rustup package, so when rustup is absent the
# official rustup-init is downloaded from rustup's own server; where that
# server cannot be reached the script stops and says which toolchains to
# provide. When the dated nightly cannot be downloaded but an undated
# `nightly` from the same day is installed, it is registered under the
# dated name (see rdd_ensure_nightly in scripts/toolchains.sh).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
# shellcheck source=scripts/toolchains.sh
. scripts/toolchains.sh

# ---------------------------------------------------------------- apt lists
# Every Debian package a script runs on the host. Essential packages
# (coreutils, grep, sed, mawk, diffutils, tar, gzip, dpkg, apt) are taken
# as given.
APT_HOST=(
  # C and C++ compilers and the linker rustc drives; objdump (scripts/bench.sh)
  gcc g++ make binutils
  # the pkg-config build of examples/c (ffi-tests/run.sh); rdma-sys's build
  pkg-config
  # bindgen (build.rs and rdma-sys under --features verbs)
  clang libclang-dev
  # clang's libFuzzer and sanitizer runtimes (examples/c/fuzz_wr_builder.c,
  # built by ffi-tests/run.sh): only a Recommends of clang in bookworm
  libclang-rt-14-dev
  # --features verbs: libibverbs, librdmacm, libmlx5 (ibverbs-providers) and
  # the kernel's uverbs UAPI headers (linux-libc-dev, bindgen/uverbs_wrapper.h)
  libibverbs-dev librdmacm-dev ibverbs-providers linux-libc-dev
  # callgrind and python3: scripts/bench.sh, scripts/soft_bench.sh
  valgrind python3
  # Open MPI's mpicc and mpirun: the MPI examples (scripts/mpi-examples.sh;
  # scripts/vm-test.sh builds them with mpicc for scripts/vm-mpi.sh)
  openmpi-bin libopenmpi-dev
  # downloading rustup-init when rustup is missing
  curl ca-certificates
)
# The VM stage (scripts/vm-test.sh, scripts/softrdma-vm/) needs more on the
# host: debootstrap, e2fsprogs, xz-utils, zstd, binutils, make, gcc-12,
# libelf1 and qemu-system-x86 (image build, siw.ko, running the VM). Their
# list is HOST_TOOLS in scripts/softrdma-vm/build-vm.sh, which installs them
# (`--host-tools`; qemu-system-x86 comes from bookworm-backports where the
# host's qemu-utils does); --vm and --vm-test below run that. rdma-core's
# tools (ibverbs-utils, rdmacm-utils, perftest) and Open MPI's runtime for
# the MPI examples there are used only inside the VM and are installed into
# the image by build-vm.sh (GUEST_PKGS), not here.

want_nightly=1 want_tools=1 want_vm=0
case "${1:-}" in
  "") ;;
  --vm) want_vm=1 ;;
  --vm-test) want_vm=1 want_nightly=0 want_tools=0 ;;
  *) echo "usage: $0 [--vm | --vm-test]" >&2; exit 2 ;;
esac

say() { echo "install-deps: $*" >&2; }
die() { echo "install-deps: FAILED: $*" >&2; exit 1; }

# ---------------------------------------------------------------- apt
# missing_apt PKG...: the packages dpkg does not have installed.
missing_apt() {
  local p st
  for p in "$@"; do
    st=$(dpkg-query -W -f='${db:Status-Abbrev}' "$p" 2>/dev/null || true)
    case "$st" in ii*) ;; *) echo "$p" ;; esac
  done
}

mapfile -t need_apt < <(missing_apt "${APT_HOST[@]}")
if [ ${#need_apt[@]} -gt 0 ]; then
  say "installing Debian packages: ${need_apt[*]}"
  SUDO=""
  if [ "$(id -u)" != 0 ]; then
    command -v sudo >/dev/null || die "not root and no sudo: install these Debian packages as root: ${need_apt[*]}"
    SUDO=sudo
  fi
  $SUDO apt-get update -qq || die "apt-get update (needed for: ${need_apt[*]})"
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need_apt[@]}" ||
    die "apt-get install ${need_apt[*]}"
  mapfile -t still < <(missing_apt "${need_apt[@]}")
  [ ${#still[@]} = 0 ] || die "still not installed after apt-get: ${still[*]}"
fi

# ---------------------------------------------------------------- rustup
if ! command -v rustup >/dev/null 2>&1; then
  host=$(uname -m)-unknown-linux-gnu
  # RUSTUP_UPDATE_ROOT: rustup's own variable for where rustup-init lives
  url=${RUSTUP_UPDATE_ROOT:-https://static.rust-lang.org/rustup}/dist/$host/rustup-init
  say "rustup is not installed (Debian 12 has no package for it); fetching rustup-init from $url"
  tmp=$(mktemp -d "${TMPDIR:-/tmp}/rustup-init.XXXXXX")
  trap 'rm -rf "$tmp"' EXIT
  if curl --proto '=https' --tlsv1.2 -sSf --connect-timeout 20 --max-time 300 -o "$tmp/rustup-init" "$url" &&
     curl --proto '=https' --tlsv1.2 -sSf --connect-timeout 20 --max-time 60 -o "$tmp/rustup-init.sha256" "$url.sha256"; then
    [ "$(cut -d' ' -f1 "$tmp/rustup-init.sha256")" = "$(sha256sum "$tmp/rustup-init" | cut -d' ' -f1)" ] ||
      die "rustup-init does not match its published sha256"
    chmod +x "$tmp/rustup-init"
    "$tmp/rustup-init" -y --default-toolchain none --profile minimal || die "rustup-init"
    hash -r
    command -v rustup >/dev/null || die "rustup-init ran but rustup is not in ${CARGO_HOME:-$HOME/.cargo}/bin"
  else
    die "rustup is not installed and rustup-init cannot be downloaded from $url.
  Debian 12 packages no rustup. Install rustup by other means, with these toolchains:
    $RDD_STABLE (components ${RDD_STABLE_COMPONENTS[*]}; targets ${RDD_STABLE_TARGETS[*]})
    $RDD_NIGHTLY (components ${RDD_NIGHTLY_COMPONENTS[*]}; for Miri and fuzzing)
  then run this script again."
  fi
fi

# ---------------------------------------------------------------- toolchains
rdd_ensure_stable || die "the stable toolchain $RDD_STABLE (see above)"
if [ "$want_nightly" = 1 ]; then
  rdd_ensure_nightly || die "the nightly toolchain $RDD_NIGHTLY (see above)"
fi

# ---------------------------------------------------------------- cargo tools
# scripts/header.sh and scripts/fuzz.sh check the same pins.
if [ "$want_tools" = 1 ]; then
  rdd_ensure_cargo_tool cbindgen "$CBINDGEN_VERSION" cbindgen || die "cbindgen $CBINDGEN_VERSION"
  rdd_ensure_cargo_tool cargo-fuzz "$CARGO_FUZZ_VERSION" cargo fuzz || die "cargo-fuzz $CARGO_FUZZ_VERSION"
fi

# ---------------------------------------------------------------- VM stage
if [ "$want_vm" = 1 ]; then
  [ "$(id -u)" = 0 ] || die "the VM stage's host packages are installed as root (scripts/softrdma-vm/build-vm.sh --host-tools)"
  bash scripts/softrdma-vm/build-vm.sh --host-tools || die "the VM stage's host packages (scripts/softrdma-vm/build-vm.sh --host-tools)"
fi

summary="$RDD_STABLE"
[ "$want_nightly" = 1 ] && summary+=", $RDD_NIGHTLY"
[ "$want_tools" = 1 ] && summary+=", cbindgen $CBINDGEN_VERSION, cargo-fuzz $CARGO_FUZZ_VERSION"
[ "$want_vm" = 1 ] && summary+=", the VM stage's host packages"
say "ready: Debian packages, $(rustup --version 2>/dev/null | head -n 1 | cut -d' ' -f1-2), $summary"
