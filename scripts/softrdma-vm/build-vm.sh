#!/usr/bin/env bash
# Builds the rdma-direct test VM: a small Debian bookworm image whose kernel
# has the two software RDMA drivers, rdma_rxe (Soft-RoCE, RoCEv2 over UDP)
# and siw (soft-iWARP, over TCP), plus rdma-core's user space and tools.
# vm-run.sh (next to this file) boots it. The host kernel needs no RDMA
# support at all: everything RDMA happens inside the guest.
#
# Usage (as root; it installs host packages and runs debootstrap/chroot):
#   scripts/softrdma-vm/build-vm.sh              build, or reuse the cached image
#   KERNEL=6.12 scripts/softrdma-vm/build-vm.sh  second image on Debian's 6.12 LTS
#                                                kernel (use: VM_KERNEL=6.12 vm-run.sh)
#   FORCE=1 scripts/softrdma-vm/build-vm.sh      rebuild even when cached
#   scripts/softrdma-vm/build-vm.sh --host-tools only install the host packages
#                                                below (HOST_TOOLS), build nothing
#
# It is idempotent: when the cached image matches this recipe it returns in
# well under a second. A cold build takes about 3 minutes on a 2-core host
# (debootstrap is two thirds of it) and downloads about 250 MB from the
# Debian mirror; downloaded .debs and siw.ko stay cached in $VMDIR/work.
#
# What it installs on the host (apt, only when missing, never removing
# anything; the list is HOST_TOOLS below): debootstrap, e2fsprogs, xz-utils,
# zstd, binutils, make, gcc-12, libelf1 and qemu-system-x86. Where the
# host's qemu-utils comes from bookworm-backports, qemu-system-x86 must come
# from there too (bookworm's qemu-system-common conflicts with it), so the
# backports suite is added to apt's sources for it.
#
# Debian builds its kernels without CONFIG_RDMA_SIW, so siw.ko is compiled
# here out of tree from Debian's own linux-source and linux-headers packages
# of exactly the guest kernel's version, and installed as an "updates" module.
#
# Environment:
#   VMDIR     cache and output directory (default: ~/.cache/rdma-direct-vm)
#   KERNEL    6.1 (default, bookworm's linux-image-amd64, image in $VMDIR/img-6.1)
#             or 6.12 (newest 6.12 from bookworm-security, image in $VMDIR/img-6.12)
#   MIRROR    Debian mirror (default: the one this host's apt uses for bookworm)
#   SECURITY_MIRROR   the same for bookworm-security (only KERNEL=6.12 needs it)
#   FORCE=1   rebuild even if the cached image is current
#   KEEP_ROOTFS=1     keep the unpacked root tree after packing the image
#
# Output in $VMDIR/img-$KERNEL: vmlinuz, initrd.img, rootfs.img (raw ext4,
# sparse, opened read-only by vm-run.sh via a qemu snapshot), versions.txt,
# and vmlinux: the same kernel uncompressed, which qemu starts directly at
# its PVH entry point; under TCG that skips the firmware's real-mode boot and
# the kernel's self-decompression, about 8 s of every boot.
#
# Exit status: 0 image ready; 1 a step failed (its log tail is printed);
# 124 a step hit its timeout.
set -euo pipefail

HOST_TOOLS_ONLY=0
case "${1:-}" in
  "") ;;
  --host-tools) HOST_TOOLS_ONLY=1 ;;
  *) echo "usage: build-vm.sh [--host-tools]" >&2; exit 2 ;;
esac

VMDIR=${VMDIR:-$HOME/.cache/rdma-direct-vm}
KERNEL=${KERNEL:-6.1}
SUITE=bookworm
# Bump when the recipe changes in a way that needs existing images rebuilt.
RECIPE=4

case "$KERNEL" in
  6.1|6.12) ;;
  *) echo "build-vm.sh: KERNEL must be 6.1 or 6.12, not '$KERNEL'" >&2; exit 1 ;;
esac

OUT=$VMDIR/img-$KERNEL
WORK=$VMDIR/work
ROOT=$WORK/root-$KERNEL
LOGS=$WORK/logs
START=$SECONDS

say() { printf '[build-vm +%3ds] %s\n' "$((SECONDS - START))" "$*" >&2; }
fail() { echo "build-vm.sh: $*" >&2; exit 1; }

# run_logged SECONDS LOGFILE CMD...: run CMD with a deadline, output to
# LOGFILE; on failure show the tail of the log and stop the build (exit 124
# on the deadline, 1 otherwise).
run_logged() {
  local limit=$1 logf=$2; shift 2
  local rc=0
  timeout -k 10 "$limit" "$@" >>"$logf" 2>&1 || rc=$?
  if [ "$rc" != 0 ]; then
    [ "$rc" = 124 ] && echo "build-vm.sh: timed out after ${limit}s: $*" >&2 \
                    || echo "build-vm.sh: failed (rc=$rc): $*" >&2
    tail -n 40 "$logf" >&2
    exit "$([ "$rc" = 124 ] && echo 124 || echo 1)"
  fi
}

# The URI this host's apt uses for a given suite (deb822 or one-line format).
apt_mirror_for() {
  local want=$1 f
  for f in /etc/apt/sources.list.d/*.sources; do
    [ -r "$f" ] || continue
    awk -v want="$want" '
      /^[[:space:]]*$/ { uri = "" }
      /^URIs:/         { uri = $2 }
      /^Suites:/       { for (i = 2; i <= NF; i++) if ($i == want && uri != "") { print uri; exit } }
    ' "$f"
  done
  if [ -r /etc/apt/sources.list ]; then
    awk -v want="$want" '$1 == "deb" && $3 == want { print $2; exit }' /etc/apt/sources.list
  fi
}
MIRROR=${MIRROR:-$(apt_mirror_for "$SUITE" | head -n 1)}
[ -n "$MIRROR" ] || fail "no '$SUITE' entry in apt's sources; set MIRROR"
SECURITY_MIRROR=${SECURITY_MIRROR:-$(apt_mirror_for "$SUITE-security" | head -n 1)}

# Packages of the guest. rdma tools: ibverbs-utils (ibv_devinfo,
# ibv_rc_pingpong, ...), rdmacm-utils (rping, ucmatose, rdma_server/client),
# perftest (ib_write_bw, ib_write_lat, ...), iproute2 (ip, rdma), valgrind
# (user-space instruction counts of the benchmarks, scripts/vm-bench-instr.sh),
# openmpi-bin (mpirun and libopenmpi3, the runtime of the MPI examples that
# scripts/vm-test.sh builds on the host with mpicc; scripts/vm-mpi.sh).
GUEST_PKGS=initramfs-tools,kmod,procps,iproute2,iputils-ping,rdma-core,libibverbs1,librdmacm1,ibverbs-providers,ibverbs-utils,rdmacm-utils,perftest,valgrind,openmpi-bin
[ "$KERNEL" = 6.1 ] && GUEST_PKGS=linux-image-amd64,$GUEST_PKGS
KEY=$(printf '%s|' "$RECIPE" "$SUITE" "$MIRROR" "$KERNEL" "$GUEST_PKGS" | sha256sum | cut -c1-20)

# ------------------------------------------------------------ host packages
apt_install() { # apt_install [apt-get options...] PKG...
  DEBIAN_FRONTEND=noninteractive run_logged 900 "$LOGS/host-apt.log" \
    apt-get install -y -q --no-install-recommends --no-remove "$@"
}

# Host packages this script and vm-run.sh use, each as PACKAGE=COMMAND: the
# command shows the package is there (no command: ask dpkg).
HOST_TOOLS=(debootstrap=debootstrap e2fsprogs=mkfs.ext4 xz-utils=xz zstd=zstd
            binutils=readelf make=make gcc-12=gcc-12 libelf1= qemu-system-x86=qemu-system-x86_64)

ensure_host_tools() {
  local missing=() want_qemu=0 t pkg cmd
  for t in "${HOST_TOOLS[@]}"; do
    pkg=${t%%=*} cmd=${t#*=}
    if [ -n "$cmd" ]; then
      command -v "$cmd" >/dev/null && continue
    else
      dpkg -s "$pkg" >/dev/null 2>&1 && continue
    fi
    if [ "$pkg" = qemu-system-x86 ]; then want_qemu=1; else missing+=("$pkg"); fi
  done
  [ ${#missing[@]} = 0 ] && [ $want_qemu = 0 ] && return 0

  [ "$(id -u)" = 0 ] || fail "run as root: host packages missing: ${missing[*]} $([ $want_qemu = 1 ] && echo qemu-system-x86)"
  mkdir -p "$LOGS"
  say "apt-get update"
  run_logged 300 "$LOGS/host-apt.log" apt-get update -q
  if [ ${#missing[@]} -gt 0 ]; then
    say "installing on the host: ${missing[*]}"
    apt_install "${missing[@]}"
  fi
  if [ $want_qemu = 1 ]; then
    local qu
    qu=$(dpkg-query -W -f='${Version}' qemu-utils 2>/dev/null || true)
    case "$qu" in
      *bpo12*)
        # qemu-utils is the backports build, which Breaks bookworm's
        # qemu-system-common: take qemu-system-x86 from backports as well.
        if ! grep -rqs -- "$SUITE-backports" /etc/apt/sources.list /etc/apt/sources.list.d/; then
          say "adding $SUITE-backports to apt's sources (for qemu-system-x86)"
          printf 'Types: deb\nURIs: %s\nSuites: %s-backports\nComponents: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n' \
            "$MIRROR" "$SUITE" > /etc/apt/sources.list.d/$SUITE-backports.sources
          run_logged 300 "$LOGS/host-apt.log" apt-get update -q
        fi
        say "installing qemu-system-x86 from $SUITE-backports (host qemu-utils is $qu)"
        apt_install -t "$SUITE-backports" qemu-system-x86 qemu-utils
        ;;
      *)
        say "installing qemu-system-x86"
        apt_install qemu-system-x86
        ;;
    esac
  fi
}

# pvh_kernel DIR: write DIR/vmlinux, the uncompressed ELF kernel inside
# DIR/vmlinuz, if it has a PVH entry note (Xen note type 0x12, which Debian's
# CONFIG_PVH kernels carry). Otherwise vm-run.sh boots vmlinuz as before.
pvh_kernel() {
  local dir=$1 fmt magic off
  if [ -s "$dir/vmlinux" ] || [ -f "$dir/no-pvh" ]; then return 0; fi
  local dec=()
  for fmt in xz zstd gzip; do
    case $fmt in
      xz)   magic='\xfd7zXZ\x00';     dec=(xz -dc --single-stream) ;;
      zstd) magic='\x28\xb5\x2f\xfd'; dec=(zstd -dcq) ;;
      gzip) magic='\x1f\x8b\x08';     dec=(gzip -dc) ;;
    esac
    off=$(LC_ALL=C grep -obUaP "$magic" "$dir/vmlinuz" | head -n 1 | cut -d: -f1 || true)
    [ -n "$off" ] || continue
    # the compressed kernel is followed by more of the bzImage: a decoder
    # may complain about that trailing data once it has written the kernel
    tail -c +$((off + 1)) "$dir/vmlinuz" | timeout 120 "${dec[@]}" > "$dir/vmlinux.tmp" 2>/dev/null || true
    if readelf -n "$dir/vmlinux.tmp" 2>/dev/null | grep -qE '\(0x00000012\)|PHYS32_ENTRY'; then
      mv "$dir/vmlinux.tmp" "$dir/vmlinux"
      say "vmlinux: PVH-bootable kernel ($fmt inside vmlinuz)"
      return 0
    fi
  done
  rm -f "$dir/vmlinux.tmp"
  : > "$dir/no-pvh"
  say "no PVH-bootable kernel found in vmlinuz; vm-run.sh will boot vmlinuz"
}

mkdir -p "$VMDIR" 2>/dev/null || fail "cannot create VMDIR=$VMDIR"
ensure_host_tools
[ "$HOST_TOOLS_ONLY" = 1 ] && exit 0

# ------------------------------------------------------------ cache check
if [ "${FORCE:-0}" != 1 ] && [ "$(cat "$OUT/stamp" 2>/dev/null)" = "$KEY" ] \
   && [ -s "$OUT/vmlinuz" ] && [ -s "$OUT/initrd.img" ] && [ -s "$OUT/rootfs.img" ]; then
  pvh_kernel "$OUT"
  say "image is current: $OUT"
  exit 0
fi
[ "$(id -u)" = 0 ] || fail "building the image needs root (debootstrap, chroot)"
mkdir -p "$WORK/debs" "$LOGS"
: > "$LOGS/build-$KERNEL.log"
BLOG=$LOGS/build-$KERNEL.log
say "building image for kernel $KERNEL in $VMDIR (logs: $LOGS)"

# ------------------------------------------------------------ root tree
# Reused across runs (e.g. after a failed siw build) while its key matches.
if [ "$(cat "$ROOT/.rdd-key" 2>/dev/null)" != "$KEY" ]; then
  rm -rf "$ROOT"
  say "debootstrap $SUITE (minbase) from $MIRROR"
  run_logged 1200 "$BLOG" debootstrap --variant=minbase --cache-dir="$WORK/debs" \
    --include="$GUEST_PKGS" "$SUITE" "$ROOT" "$MIRROR"
  if [ "$KERNEL" = 6.12 ]; then
    [ -n "$SECURITY_MIRROR" ] || fail "no '$SUITE-security' entry in apt's sources; set SECURITY_MIRROR"
    printf 'deb %s %s main\ndeb %s %s-security main\n' "$MIRROR" "$SUITE" "$SECURITY_MIRROR" "$SUITE" \
      > "$ROOT/etc/apt/sources.list"
    run_logged 300 "$BLOG" chroot "$ROOT" apt-get update -q
    k612=$(chroot "$ROOT" apt-cache search --names-only '^linux-image-6\.12\.[0-9]+\+deb12-amd64$' \
           | awk '{print $1}' | sort -V | tail -n 1)
    [ -n "$k612" ] || fail "bookworm-security has no linux-image-6.12.*+deb12-amd64"
    say "installing $k612 in the guest"
    DEBIAN_FRONTEND=noninteractive run_logged 900 "$BLOG" \
      chroot "$ROOT" apt-get install -y -q --no-install-recommends "$k612"
    chroot "$ROOT" apt-get clean
  fi
  echo "$KEY" > "$ROOT/.rdd-key"
fi

KVER=$(ls "$ROOT/usr/lib/modules" | sort -V | tail -n 1)
[ -n "$KVER" ] || fail "no kernel modules in the root tree"
KPKG_VER=$(chroot "$ROOT" dpkg-query -W -f='${Version}' "linux-image-$KVER")
say "guest kernel $KVER (package version $KPKG_VER)"

# ------------------------------------------------------------ siw.ko
SIW_KO=$WORK/siw-$KVER-$KPKG_VER.ko
if [ ! -s "$SIW_KO" ]; then
  say "building siw.ko for $KVER out of tree"
  SB=$WORK/siw-build
  rm -rf "$SB"; mkdir -p "$SB/debs" "$SB/tree" "$SB/src"
  src_pkg=linux-source-$(echo "$KVER" | cut -d. -f1-2)
  # The headers package depends on its -common twin and on linux-kbuild;
  # all of them come from the same source version as the kernel.
  hdr_deps=$(apt-cache depends "linux-headers-$KVER=$KPKG_VER" 2>/dev/null \
             | awk '$1 == "Depends:" && $2 ~ /^linux-(headers|kbuild)-/ { print $2 }' | sort -u || true)
  if [ -z "$hdr_deps" ]; then
    run_logged 300 "$BLOG" apt-get update -q
    hdr_deps=$(apt-cache depends "linux-headers-$KVER=$KPKG_VER" \
               | awk '$1 == "Depends:" && $2 ~ /^linux-(headers|kbuild)-/ { print $2 }' | sort -u)
  fi
  [ -n "$hdr_deps" ] || fail "apt knows no linux-headers-$KVER=$KPKG_VER"
  want=("linux-headers-$KVER=$KPKG_VER" "$src_pkg=$KPKG_VER")
  for p in $hdr_deps; do want+=("$p=$KPKG_VER"); done
  say "downloading ${want[*]}"
  (cd "$SB/debs" && run_logged 900 "$BLOG" apt-get download -q "${want[@]}")
  for d in "$SB"/debs/linux-headers-*.deb "$SB"/debs/linux-kbuild-*.deb; do
    dpkg-deb -x "$d" "$SB/tree"
  done
  hdr=$SB/tree/usr/src/linux-headers-$KVER
  [ -f "$hdr/Makefile" ] || fail "headers for $KVER not found after unpacking"
  # The arch headers' Makefile includes the -common headers by absolute path.
  sed -i "s|^include /usr/src/|include $SB/tree/usr/src/|" "$hdr/Makefile"
  # linux-source holds one big tar.xz; pull out drivers/infiniband/sw/siw only.
  SRC_DEB=$(ls "$SB"/debs/"${src_pkg}"_*.deb) SRC_PKG=$src_pkg SRC_OUT=$SB/src \
    run_logged 600 "$BLOG" bash -o pipefail -c '
      dpkg-deb --fsys-tarfile "$SRC_DEB" | tar -xO "./usr/src/$SRC_PKG.tar.xz" | xz -dc \
        | tar -x -C "$SRC_OUT" --strip-components=4 "$SRC_PKG/drivers/infiniband/sw/siw"'
  [ -f "$SB/src/siw/siw_main.c" ] || fail "siw sources not found in $src_pkg"
  say "compiling siw"
  run_logged 900 "$BLOG" make -C "$hdr" M="$SB/src/siw" CONFIG_RDMA_SIW=m \
    CONFIG_DEBUG_INFO_BTF_MODULES= modules
  strip --strip-debug -o "$SIW_KO.tmp" "$SB/src/siw/siw.ko"
  mv "$SIW_KO.tmp" "$SIW_KO"
  rm -rf "$SB"
fi
install -D -m 0644 "$SIW_KO" "$ROOT/usr/lib/modules/$KVER/updates/siw.ko"

# ------------------------------------------------------------ configure
say "configuring the guest"
# Module trees a headless virtio guest never loads (a few hundred MB).
mods=$ROOT/usr/lib/modules/$KVER/kernel
rm -rf "$mods"/sound "$mods"/net/{bluetooth,mac80211,wireless} \
  "$mods"/drivers/{gpu,media,staging,iio,hwmon,usb,hid,platform,bluetooth,isdn,mmc,input,video} \
  "$mods"/drivers/{thunderbolt,mtd,leds,nfc,edac,fpga,gnss,w1,ata,firewire,pcmcia,power} \
  "$mods"/drivers/net/{wireless,ethernet,can,usb}
chroot "$ROOT" depmod -a "$KVER"
# Fail now, not at boot, if a module the VM loads went missing.
chroot "$ROOT" modprobe -S "$KVER" --show-depends \
  rdma_rxe siw ib_uverbs rdma_ucm ib_umad dummy veth 9p 9pnet_virtio virtio_console >/dev/null \
  || fail "a module the VM needs is missing"

# A small initramfs holding only what mounting a virtio-blk ext4 root needs.
sed -i 's/^MODULES=.*/MODULES=list/' "$ROOT/etc/initramfs-tools/initramfs.conf"
printf '%s\n' virtio_pci virtio_blk ext4 crc32c_generic > "$ROOT/etc/initramfs-tools/modules"
# No udev in it: its coldplug costs seconds per boot under TCG, and the
# kernel's devtmpfs creates /dev/vda by itself.
rm -f "$ROOT/usr/share/initramfs-tools/hooks/udev" \
  "$ROOT/usr/share/initramfs-tools/scripts/init-top/udev" \
  "$ROOT/usr/share/initramfs-tools/scripts/init-bottom/udev"
rm -f "$ROOT/boot/initrd.img-$KVER"
run_logged 300 "$BLOG" chroot "$ROOT" update-initramfs -c -k "$KVER"
[ -s "$ROOT/boot/initrd.img-$KVER" ] || fail "update-initramfs made no initrd"

# PID 1 of the guest. It only mounts the control share that vm-run.sh
# exports and runs the boot script found there, so changing what a boot
# does never needs a new image.
cat > "$ROOT/sbin/rdd-vm-init" <<'EOF'
#!/bin/sh
# rdma-direct test VM, PID 1: hand over to vm-run.sh's boot script.
PATH=/usr/sbin:/usr/bin:/sbin:/bin
export PATH
# initramfs-tools hands over with /proc and /sys already mounted
mountpoint -q /proc || mount -t proc proc /proc
mountpoint -q /sys || mount -t sysfs sysfs /sys
modprobe 9pnet_virtio && modprobe 9p
mkdir -p /rdd-ctl
if mount -t 9p -o trans=virtio,version=9p2000.L,cache=none rdd-ctl /rdd-ctl \
   && [ -f /rdd-ctl/boot.sh ]; then
  exec /bin/bash /rdd-ctl/boot.sh
fi
echo "rdd-vm-init: control share or boot.sh missing, powering off" > /dev/console
echo o > /proc/sysrq-trigger
sleep 10
EOF
chmod 0755 "$ROOT/sbin/rdd-vm-init"
echo rdd-vm > "$ROOT/etc/hostname"
printf '127.0.0.1\tlocalhost\n127.0.1.1\trdd-vm\n::1\tlocalhost\n' > "$ROOT/etc/hosts"
: > "$ROOT/etc/resolv.conf"
rm -rf "$ROOT"/var/cache/apt/archives/*.deb "$ROOT"/var/cache/apt/*.bin "$ROOT"/var/lib/apt/lists/* \
  "$ROOT"/usr/share/doc/* "$ROOT"/usr/share/man/* "$ROOT"/usr/share/info/* "$ROOT"/usr/share/locale/*

# ------------------------------------------------------------ pack
STAGE=$VMDIR/.img-$KERNEL.new
rm -rf "$STAGE"; mkdir -p "$STAGE"
{
  echo "kernel $KVER $KPKG_VER (siw.ko built out of tree)"
  chroot "$ROOT" dpkg-query -W -f='${Package} ${Version}\n' \
    libc6 rdma-core libibverbs1 librdmacm1 ibverbs-providers ibverbs-utils rdmacm-utils perftest iproute2 valgrind
} > "$STAGE/versions.txt"
cp "$ROOT/boot/vmlinuz-$KVER" "$STAGE/vmlinuz"
pvh_kernel "$STAGE"
cp "$ROOT/boot/initrd.img-$KVER" "$STAGE/initrd.img"
rm -f "$ROOT"/boot/initrd.img-*            # booted with -kernel/-initrd, not from /boot
used_mb=$(du -sm --exclude=.rdd-key "$ROOT" | cut -f1)
size_mb=$((used_mb + used_mb / 4 + 256))
say "packing rootfs.img (${used_mb} MiB used, ${size_mb} MiB file)"
run_logged 600 "$BLOG" mkfs.ext4 -q -F -L rdd-root -O ^has_journal -E root_owner=0:0 \
  -d "$ROOT" "$STAGE/rootfs.img" "${size_mb}M"
echo "$KEY" > "$STAGE/stamp"
rm -rf "$OUT"; mv "$STAGE" "$OUT"
if [ "${KEEP_ROOTFS:-0}" != 1 ]; then rm -rf "$ROOT"; fi
say "done: $OUT ($(du -sm "$OUT" | cut -f1) MiB on disk)"
sed 's/^/  /' "$OUT/versions.txt" >&2
