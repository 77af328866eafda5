#!/usr/bin/env bash
# Installs everything the build, tests and benchmarks need. Idempotent.
set -euo pipefail

need_apt=()
for p in libibverbs-dev librdmacm-dev linux-libc-dev libclang-dev clang pkg-config valgrind binutils make; do
  dpkg -s "$p" >/dev/null 2>&1 || need_apt+=("$p")
done
if [ ${#need_apt[@]} -gt 0 ]; then
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need_apt[@]}"
fi

rustup component add rustfmt clippy
rustup target add x86_64-unknown-none aarch64-unknown-none
rustup toolchain list | grep -q '^nightly' || rustup toolchain install nightly --profile minimal
rustup +nightly component add rustfmt miri rust-src

# Pinned cargo tools: scripts/header.sh installs its pinned cbindgen itself;
# cargo-fuzz drives the fuzz targets.
command -v cargo-fuzz >/dev/null || cargo install cargo-fuzz --locked
