#!/usr/bin/env bash
# Runs one command inside the rdma-direct test VM (built by build-vm.sh next
# to this file), where the kernel's software RDMA devices are up:
#   rxe0  Soft-RoCE (RoCEv2) on dummy netdev rdd_rxe0, IPv4 192.0.2.1
#   siw0  soft-iWARP        on dummy netdev rdd_siw0, IPv4 198.51.100.1
# Both addresses are documentation ranges that exist only inside the VM; the
# VM has no network interface to the outside at all.
#
# Usage:
#   scripts/softrdma-vm/vm-run.sh CMD [ARGS...]
#   scripts/softrdma-vm/vm-run.sh bash scripts/vm-smoke.sh
#   CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_RUNNER=$PWD/scripts/softrdma-vm/vm-run.sh cargo test
#
# CMD runs as root in the current directory. The host directories it needs
# are shared in over 9p at the same absolute paths: the current directory,
# this repository, VM_SHARES, and for CMD and every ARG that is an absolute
# path existing on the host, that directory or the file's directory (a cargo
# runner gets the test binary that way, wherever the target directory is).
# Paths in the guest's own system (/usr, /etc, /dev, ...) are never shared;
# the current directory or a VM_SHARES entry there is an error, so do not run
# it with /tmp itself as the current directory (/tmp/SOMETHING is fine). Host-built binaries run
# unchanged: the guest has the host's glibc and rdma-core versions (Debian
# bookworm, rdma-core 44).
# CMD's stdout and stderr stream back, byte for byte, to this script's stdout
# and stderr as they are written (each over its own virtio-serial port, about
# 25 MB/s under TCG; the relative order of the two streams is not kept). CMD's
# stdin is /dev/null. It runs with `ulimit -l unlimited` and sees:
#   RXE_DEV=rxe0 RXE_NETDEV=rdd_rxe0 RXE_IP=192.0.2.1 RXE_GID_INDEX=<IPv4 RoCEv2 GID>
#   SIW_DEV=siw0 SIW_NETDEV=rdd_siw0 SIW_IP=198.51.100.1
#   IN_RDMA_VM=1
# plus the host's RUST_*, CARGO_*, NEXTEST_* and TERM variables and those
# named in VM_PASSENV.
#
# Exit status: CMD's own status (128+N if a signal N killed it);
#   124  VM_TIMEOUT expired (the VM is killed);
#   125  the VM could not run CMD (no image, qemu or boot failure, RDMA setup
#        failed); the tail of the VM's console is printed to stderr;
#   126  CMD's working directory could not be entered in the VM.
#
# Environment:
#   VMDIR        image cache, as for build-vm.sh (default ~/.cache/rdma-direct-vm)
#   VM_KERNEL    6.1 (default) or 6.12 (needs KERNEL=6.12 build-vm.sh)
#   VM_TIMEOUT   seconds for the whole boot + run + poweroff (default 600)
#   VM_MEM       guest memory in MiB (default 2048)
#   VM_SMP       guest CPUs (default: host CPUs, at most 4)
#   VM_ACCEL     auto (default), kvm or tcg. auto picks kvm only when
#                /dev/kvm is usable AND the CPU flags show vmx/svm; hosts that
#                are themselves PVM guests have /dev/kvm but cannot run a stock
#                kernel usefully, so they get tcg (slower, still correct).
#   VM_PVH=0     boot the compressed vmlinuz through the firmware instead of
#                vmlinux at its PVH entry point (the default when build-vm.sh
#                made a vmlinux; about 8 s faster per boot under TCG)
#   VM_SHARES    more host directories to share, ':'-separated
#   VM_PASSENV   more host variable names to pass to CMD, space-separated
#   VM_NO_RDMA=1 do not create rxe0/siw0
#   VM_VERBOSE=1 copy the VM console (kernel log, boot steps) to stderr
#   VM_TIME=1    print the wall time of the run to stderr at the end
#
# Timing under TCG: a boot, a trivial command and the poweroff take about
# 10 s on an idle 2-core host, 15-20 s on a busy one. Absolute RDMA
# performance numbers inside the VM mean nothing.
set -uo pipefail

SELF_DIR=$(cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")" && pwd)
REPO_DIR=$(cd "$SELF_DIR/../.." && pwd)
VMDIR=${VMDIR:-$HOME/.cache/rdma-direct-vm}
VM_KERNEL=${VM_KERNEL:-6.1}
IMG=$VMDIR/img-$VM_KERNEL
VM_TIMEOUT=${VM_TIMEOUT:-600}
VM_MEM=${VM_MEM:-2048}
if [ -z "${VM_SMP:-}" ]; then
  VM_SMP=$(nproc); [ "$VM_SMP" -gt 4 ] && VM_SMP=4
fi

vm_fail() { echo "vm-run.sh: $*" >&2; exit 125; }

[ $# -gt 0 ] || vm_fail "usage: vm-run.sh CMD [ARGS...]"
for f in vmlinuz initrd.img rootfs.img; do
  [ -s "$IMG/$f" ] || vm_fail "no VM image at $IMG (run scripts/softrdma-vm/build-vm.sh$([ "$VM_KERNEL" != 6.1 ] && echo " with KERNEL=$VM_KERNEL"))"
done
command -v qemu-system-x86_64 >/dev/null || vm_fail "qemu-system-x86_64 is missing (build-vm.sh installs it)"
case "$VM_TIMEOUT" in ''|*[!0-9]*) vm_fail "VM_TIMEOUT must be a whole number of seconds";; esac

case "${VM_ACCEL:-auto}" in
  auto) if [ -r /dev/kvm ] && [ -w /dev/kvm ] && grep -qwE 'vmx|svm' /proc/cpuinfo; then ACCEL=kvm; else ACCEL=tcg; fi ;;
  kvm|tcg) ACCEL=$VM_ACCEL ;;
  *) vm_fail "VM_ACCEL must be auto, kvm or tcg" ;;
esac

CTL=$(mktemp -d "${TMPDIR:-/tmp}/rdd-vm.XXXXXX") || vm_fail "mktemp failed"
# qemu runs under `timeout` (for VM_TIMEOUT): TIMEOUT_PID is the pid of
# timeout, and qemu is its child, in timeout's own process group (so a
# terminal's Ctrl-C never reaches it). Killing timeout alone would leave
# qemu running: stop_vm signals the qemu process itself.
TIMEOUT_PID=
READERS=()
# qemu_pid: the pid of the qemu process under timeout, if it still runs
# (from qemu's -pidfile, else timeout's child list; only a process whose
# parent is our timeout counts, so a stale or reused pid is never hit).
# shellcheck disable=SC2317  # reached from the EXIT trap
qemu_pid() {
  local p
  [ -n "$TIMEOUT_PID" ] || return 0
  p=$(cat "$CTL/qemu.pid" 2>/dev/null || true)
  [ -n "$p" ] || p=$(cut -d' ' -f1 "/proc/$TIMEOUT_PID/task/$TIMEOUT_PID/children" 2>/dev/null || true)
  case "$p" in ''|*[!0-9]*) return 0 ;; esac
  # /proc/PID/stat: "PID (COMM) STATE PPID ..."
  [ "$(sed 's/.*) //' "/proc/$p/stat" 2>/dev/null | cut -d' ' -f2)" = "$TIMEOUT_PID" ] && echo "$p"
  return 0
}
# running PID: the process exists and is not a zombie (a SIGKILL from
# `timeout -k` also kills timeout, so its child may be left unreaped).
# shellcheck disable=SC2317  # reached from the EXIT trap
running() {
  kill -0 "$1" 2>/dev/null && [ "$(sed 's/.*) //' "/proc/$1/stat" 2>/dev/null | cut -d' ' -f1)" != Z ]
}
# stop_vm: SIGTERM to qemu (it exits at once; the disk is a snapshot, so
# nothing is lost) and to timeout (which passes it on to qemu too), up to
# 5 s for both to go, then SIGKILL; then reap timeout.
# shellcheck disable=SC2317  # reached from the EXIT trap
stop_vm() {
  [ -n "$TIMEOUT_PID" ] || return 0
  local q _
  q=$(qemu_pid)
  [ -n "$q" ] && kill -TERM "$q" 2>/dev/null
  kill -TERM "$TIMEOUT_PID" 2>/dev/null
  for _ in $(seq 50); do
    running "$TIMEOUT_PID" || { [ -n "$q" ] && running "$q"; } || break
    sleep 0.1
  done
  if [ -n "$q" ] && running "$q"; then
    echo "vm-run.sh: qemu (pid $q) did not stop on SIGTERM; killing it" >&2
    kill -KILL "$q" 2>/dev/null
  fi
  kill -KILL "$TIMEOUT_PID" 2>/dev/null
  wait "$TIMEOUT_PID" 2>/dev/null
  TIMEOUT_PID=
}
# shellcheck disable=SC2317  # reached from the EXIT trap
on_exit() {
  stop_vm
  local p
  for p in "${READERS[@]}"; do kill "$p" 2>/dev/null; done
  rm -rf "$CTL"
}
trap on_exit EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
trap 'exit 129' HUP

# ------------------------------------------------------------ 9p shares
# A share must not cover a directory the guest's own system lives in.
# add_share DIR [quiet]: with quiet, such a directory is skipped, not an error.
SHARES=()
add_share() {
  local d
  d=$(readlink -f -- "$1" 2>/dev/null) || return 0
  [ -d "$d" ] || return 0
  case "$d" in
    /|/bin|/boot|/dev|/etc|/lib|/lib64|/proc|/rdd-ctl|/run|/sbin|/sys|/usr|/var|/tmp| \
    /dev/*|/proc/*|/sys/*|/run/*|/usr/*|/etc/*|/bin/*|/sbin/*|/lib/*|/lib64/*|/boot/*)
      [ "${2:-}" = quiet ] && return 0
      vm_fail "will not share $d: it would hide (part of) the guest's own system" ;;
  esac
  local s
  for s in "${SHARES[@]}"; do
    case "$d/" in "$s"/*) return 0 ;; esac          # already inside a share
  done
  # A new share that contains existing ones replaces them.
  local keep=()
  for s in "${SHARES[@]}"; do
    case "$s/" in "$d"/*) ;; *) keep+=("$s") ;; esac
  done
  SHARES=("${keep[@]}" "$d")
}
add_share "$PWD"
add_share "$REPO_DIR"
IFS=: read -r -a extra_shares <<< "${VM_SHARES:-}"
for s in "${extra_shares[@]}"; do [ -n "$s" ] && add_share "$s"; done
for a in "$@"; do
  case "$a" in
    /*) if [ -d "$a" ]; then add_share "$a" quiet
        elif [ -e "$a" ]; then add_share "$(dirname -- "$a")" quiet; fi ;;
  esac
done

# Each share is a PCI device, and the guest's PCI bus has 32 slots.
[ ${#SHARES[@]} -le 16 ] || vm_fail "too many directories to share (${#SHARES[@]}); share a common parent with VM_SHARES"
QEMU_SHARES=()
: > "$CTL/shares"
n=0
for s in "${SHARES[@]}"; do
  QEMU_SHARES+=(-fsdev "local,id=fs$n,path=${s//,/,,},security_model=none"
                -device "virtio-9p-pci,fsdev=fs$n,mount_tag=rdd$n")
  printf 'rdd%d\t%s\n' "$n" "$s" >> "$CTL/shares"
  n=$((n + 1))
done

# ------------------------------------------------------------ the command
# Written as a bash script with every word %q-quoted, so any argument
# survives the trip unchanged.
{
  echo '# generated by vm-run.sh'
  for v in $(compgen -e); do
    case "$v" in
      RUST_*|CARGO_*|NEXTEST_*|TERM) declare -p "$v" 2>/dev/null ;;
    esac
  done
  for v in ${VM_PASSENV:-}; do
    [ -n "${!v+set}" ] && declare -p "$v" 2>/dev/null
  done
  if [ "$PWD" != "$(pwd -P)" ]; then
    # The working directory was reached through a symlink the guest lacks.
    printf 'if [ ! -e %q ]; then mkdir -p %q && ln -s %q %q; fi\n' \
      "$PWD" "$(dirname -- "$PWD")" "$(pwd -P)" "$PWD"
  fi
  printf 'cd %q || { echo "vm-run.sh: cannot enter %q in the VM" >&2; exit 126; }\n' "$PWD" "$PWD"
  printf 'exec'
  printf ' %q' "$@"
  printf '\n'
} > "$CTL/cmd.sh"
printf 'VM_NO_RDMA=%q\n' "${VM_NO_RDMA:-0}" > "$CTL/settings"

# ------------------------------------------------------------ guest boot script
# Runs as PID 1 (started by /sbin/rdd-vm-init in the image). Its own output
# goes to the console (ttyS0); CMD's stdout and stderr go to the virtio-serial
# ports named rdd.stdout and rdd.stderr.
cat > "$CTL/boot.sh" <<'GUEST'
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
export HOME=/root LANG=C.UTF-8
exec </dev/null >/dev/console 2>&1
step() { echo "[rdd-vm $(cut -d' ' -f1 /proc/uptime)] $*"; }
poweroff_with() {   # poweroff_with STATUS [setup]
  [ "${2:-}" = setup ] && : > /rdd-ctl/setup-failed
  echo "$1" > /rdd-ctl/rc.new && mv /rdd-ctl/rc.new /rdd-ctl/rc
  step "status $1, powering off"
  kill -KILL -1 2>/dev/null
  sync
  # Unmount the host shares so every write the command made reaches the host.
  awk '$3 == "9p" && $2 != "/rdd-ctl" { print $2 }' /proc/mounts | sort -r \
    | while read -r m; do umount -l "$m"; done
  echo o > /proc/sysrq-trigger
  sleep 60
}
. /rdd-ctl/settings
step "boot script started"
mount -t devtmpfs devtmpfs /dev 2>/dev/null
mkdir -p /dev/pts /dev/shm
mount -t devpts devpts /dev/pts
mount -t tmpfs tmpfs /dev/shm
mount -t tmpfs tmpfs /run
mount -t tmpfs tmpfs /tmp
hostname rdd-vm
ip link set lo up
while IFS=$'\t' read -r tag dir; do
  mkdir -p "$dir" && mount -t 9p -o trans=virtio,version=9p2000.L,msize=512000,cache=mmap,access=client "$tag" "$dir" \
    || { step "cannot mount host share $dir"; poweroff_with 125 setup; }
done < /rdd-ctl/shares

if [ "$VM_NO_RDMA" != 1 ]; then
  step "RDMA setup"
  modprobe -a ib_uverbs rdma_ucm ib_umad rdma_rxe siw veth && modprobe dummy numdummies=0 \
    || { step "modprobe failed"; poweroff_with 125 setup; }
  ip link add rdd_rxe0 type dummy && ip addr add 192.0.2.1/24 dev rdd_rxe0 \
    && ip link set rdd_rxe0 up && rdma link add rxe0 type rxe netdev rdd_rxe0 \
    || { step "rxe0 setup failed"; poweroff_with 125 setup; }
  ip link add rdd_siw0 type dummy && ip addr add 198.51.100.1/24 dev rdd_siw0 \
    && ip link set rdd_siw0 up && rdma link add siw0 type siw netdev rdd_siw0 \
    || { step "siw0 setup failed"; poweroff_with 125 setup; }
  # rxe fills its GID table from the netdev's addresses; wait until the
  # IPv4 RoCEv2 entry is there, and tell CMD its index.
  RXE_GID_INDEX=
  for _ in $(seq 50); do
    for g in /sys/class/infiniband/rxe0/ports/1/gids/*; do
      i=${g##*/}
      case "$(cat "$g" 2>/dev/null)" in
        0000:0000:0000:0000:0000:ffff:*)
          [ "$(cat /sys/class/infiniband/rxe0/ports/1/gid_attrs/types/$i 2>/dev/null)" = "RoCE v2" ] \
            && { RXE_GID_INDEX=$i; break 2; } ;;
      esac
    done
    sleep 0.1
  done
  [ -n "$RXE_GID_INDEX" ] || { step "rxe0 has no IPv4 RoCEv2 GID"; poweroff_with 125 setup; }
  export RXE_DEV=rxe0 RXE_NETDEV=rdd_rxe0 RXE_IP=192.0.2.1 RXE_GID_INDEX
  export SIW_DEV=siw0 SIW_NETDEV=rdd_siw0 SIW_IP=198.51.100.1
  rdma link show
fi
export IN_RDMA_VM=1
ulimit -l unlimited

# The ports appear once the host has announced them, shortly after the
# driver loads; devtmpfs makes their /dev nodes.
modprobe virtio_console || { step "modprobe virtio_console failed"; poweroff_with 125 setup; }
OUT_PORT= ERR_PORT=
for _ in $(seq 100); do
  for p in /sys/class/virtio-ports/*; do
    case "$(cat "$p/name" 2>/dev/null)" in
      rdd.stdout) OUT_PORT=/dev/${p##*/} ;;
      rdd.stderr) ERR_PORT=/dev/${p##*/} ;;
    esac
  done
  [ -c "$OUT_PORT" ] && [ -c "$ERR_PORT" ] && break
  sleep 0.05
done
[ -c "$OUT_PORT" ] && [ -c "$ERR_PORT" ] || { step "no stdout/stderr ports"; poweroff_with 125 setup; }

# CMD writes into pipes (no tty, as under CI); cat copies them to the ports.
mkfifo /run/rdd-out /run/rdd-err
cat /run/rdd-out > "$OUT_PORT" & out_copy=$!
cat /run/rdd-err > "$ERR_PORT" & err_copy=$!
step "running the command"
bash /rdd-ctl/cmd.sh < /dev/null > /run/rdd-out 2> /run/rdd-err
rc=$?
# The copies end once every writer has gone. Background processes CMD left
# behind may keep the pipes open: give them 3 s, then they are killed.
for _ in $(seq 30); do
  kill -0 $out_copy 2>/dev/null || kill -0 $err_copy 2>/dev/null || break
  sleep 0.1
done
poweroff_with "$rc"
GUEST

# ------------------------------------------------------------ run qemu
mkfifo "$CTL/out" "$CTL/err" || vm_fail "mkfifo failed"
cat "$CTL/out" & READERS+=($!)
cat "$CTL/err" >&2 & READERS+=($!)
if [ "${VM_VERBOSE:-0}" = 1 ]; then
  mkfifo "$CTL/console"
  cat "$CTL/console" >&2 & READERS+=($!)
  KLOG="loglevel=6"
else
  KLOG="quiet loglevel=3"
fi
[ -p "$CTL/console" ] || : > "$CTL/console"
KERNEL_FILE=$IMG/vmlinuz
if [ "${VM_PVH:-1}" != 0 ] && [ -s "$IMG/vmlinux" ]; then KERNEL_FILE=$IMG/vmlinux; fi
if [ "$ACCEL" = kvm ]; then
  ACCEL_ARGS=(-accel kvm -cpu host)
else
  # shellcheck disable=SC2054  # the commas belong to one qemu option
  ACCEL_ARGS=(-accel tcg,thread=multi,tb-size=256 -cpu max)
fi

t0=$SECONDS
timeout -k 5 "$VM_TIMEOUT" qemu-system-x86_64 \
  -name rdd-vm -nodefaults -no-user-config -display none -no-reboot \
  "${ACCEL_ARGS[@]}" -m "$VM_MEM" -smp "$VM_SMP" \
  -kernel "$KERNEL_FILE" -initrd "$IMG/initrd.img" \
  -append "console=ttyS0 root=/dev/vda rw rootfstype=ext4 init=/sbin/rdd-vm-init panic=-1 mitigations=off $KLOG" \
  -drive "if=virtio,format=raw,file=$IMG/rootfs.img,snapshot=on,cache=unsafe" \
  -device virtio-rng-pci \
  -fsdev "local,id=ctl,path=$CTL,security_model=none" -device virtio-9p-pci,fsdev=ctl,mount_tag=rdd-ctl \
  "${QEMU_SHARES[@]}" \
  -chardev "file,id=con,path=$CTL/console" -serial chardev:con \
  -device virtio-serial-pci,id=vser \
  -chardev "file,id=out,path=$CTL/out" -device virtserialport,bus=vser.0,chardev=out,name=rdd.stdout \
  -chardev "file,id=err,path=$CTL/err" -device virtserialport,bus=vser.0,chardev=err,name=rdd.stderr \
  -pidfile "$CTL/qemu.pid" \
  < /dev/null > "$CTL/qemu.log" 2>&1 &
TIMEOUT_PID=$!
# A trapped signal (INT, TERM, HUP) ends this wait at once; its trap exits,
# and on_exit stops qemu.
wait "$TIMEOUT_PID"
qemu_rc=$?
TIMEOUT_PID=

# If qemu never opened a FIFO, its reader still blocks in open(): an
# O_RDWR open of our own completes that open, and closing it gives EOF.
for f in out err console; do
  if [ -p "$CTL/$f" ]; then exec {fd}<>"$CTL/$f"; exec {fd}>&-; fi
done
for p in "${READERS[@]}"; do wait "$p" 2>/dev/null; done
READERS=()

[ "${VM_TIME:-0}" = 1 ] && echo "vm-run.sh: $((SECONDS - t0)) s in the VM" >&2
if [ -f "$CTL/rc" ]; then
  rc=$(cat "$CTL/rc")
  case "$rc" in ''|*[!0-9]*) vm_fail "bad exit status '$rc' from the VM" ;; esac
  if [ -f "$CTL/setup-failed" ]; then
    echo "vm-run.sh: the VM failed to set up before running the command" >&2
    if [ ! -p "$CTL/console" ]; then
      echo "---- VM console (last lines) ----" >&2; tail -n 30 "$CTL/console" >&2
    fi
  fi
  exit "$rc"
fi
if [ "$qemu_rc" = 124 ] || [ "$qemu_rc" = 137 ]; then
  echo "vm-run.sh: timed out after ${VM_TIMEOUT}s (VM_TIMEOUT)" >&2
  if [ ! -p "$CTL/console" ]; then
    echo "---- VM console (last lines) ----" >&2; tail -n 10 "$CTL/console" >&2
  fi
  exit 124
fi
echo "vm-run.sh: the VM stopped without reporting a status (qemu exit $qemu_rc)" >&2
echo "---- qemu ----" >&2; tail -n 20 "$CTL/qemu.log" >&2
if [ ! -p "$CTL/console" ]; then
  echo "---- VM console (last lines) ----" >&2; tail -n 40 "$CTL/console" >&2
fi
exit 125
