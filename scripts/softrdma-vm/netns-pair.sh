#!/usr/bin/env bash
# Two "hosts" inside the test VM, each with its own software RDMA device and
# its own IPv4 address, joined by a veth pair, so a test can run a server on
# one side and a client on the other with real traffic crossing a link
# (not the driver's loopback shortcut). Run it INSIDE the VM, as root:
#
#   eval "$(scripts/softrdma-vm/netns-pair.sh up)"        rxe pair (default)
#   eval "$(scripts/softrdma-vm/netns-pair.sh up siw)"    siw pair
#   scripts/softrdma-vm/netns-pair.sh check   RDMA across the pair (PASS/FAIL lines)
#   scripts/softrdma-vm/netns-pair.sh env     print the variables of the pair again
#   scripts/softrdma-vm/netns-pair.sh down    remove everything `up` made
#
# e.g. from the host: scripts/softrdma-vm/vm-run.sh sh -c \
#        'scripts/softrdma-vm/netns-pair.sh up >/dev/null && scripts/softrdma-vm/netns-pair.sh check'
#
# `up` prints shell-sourceable variables on stdout (and its progress on stderr):
#   PAIR_TYPE  rxe or siw            PAIR_LAYOUT  netns or routed (below)
#   NS_A NS_B  network namespaces (empty in the routed layout)
#   EXEC_A EXEC_B  command prefix that runs a command on side A/B: "ip netns
#              exec rdd_a" or empty; use it as  $EXEC_A ib_write_bw ...
#   DEV_A DEV_B    RDMA devices      NETDEV_A NETDEV_B  their veth ends
#   IP_A IP_B      203.0.113.1 and 203.0.113.2 (TEST-NET-3, a documentation
#                  range: these addresses exist only inside the VM, which has
#                  no network interface to the outside)
#   GID_A GID_B    GID index for -g/-x: the IPv4 RoCEv2 entry for rxe (1 on
#                  these kernels: index 0 is the default fe80:: GID, also RoCEv2);
#                  0 for siw, whose only GID is MAC-based. siw connects
#                  through rdma_cm only (rping, perftest -R, ucmatose...).
#
# The two layouts, and why rxe does not get namespaces here:
#   netns   Namespaces rdd_a and rdd_b; veth end rdd_va (IP_A) in rdd_a,
#           rdd_vb (IP_B) in rdd_b; the RDMA device is created on each end
#           from inside its namespace. This is the layout for siw, and works
#           because siw opens its TCP sockets in the namespace of the
#           process that connects or listens.
#   routed  For rxe on the VM's kernels (Debian 6.1 and 6.12). Their rdma_rxe
#           has one UDP/4791 socket and does its route lookups in the initial
#           namespace only, so an rxe device on a netdev inside another
#           namespace can neither send nor receive: ibv_rc_pingpong fails
#           with "local QP operation error" and rping with
#           RDMA_CM_EVENT_UNREACHABLE (tried on both kernels; mainline
#           gained per-namespace rxe sockets only after 6.12). So both veth
#           ends stay in the initial namespace, and policy routing sends
#           every local packet for IP_B out of rdd_va and every one for IP_A
#           out of rdd_vb (the "local" table moves from rule 0 to rule 200;
#           accept_local=1 and rp_filter=0 let each end accept packets
#           whose source is the other end's local address). RoCEv2 traffic
#           between rdd_rxe_a and rdd_rxe_b really crosses the veth (`check`
#           verifies this from the veth's byte counters). Both sides run
#           in the same namespace, so EXEC_A/EXEC_B are empty.
#           PAIR_LAYOUT=netns forces the namespace layout for rxe, for a
#           kernel whose rxe supports namespaces.
#
# RDMA netns mode: this needs the default "shared" mode (`rdma system show`
# prints "netns shared"), in which every RDMA device is visible from every
# network namespace and rdma_cm picks the device whose netdev carries the
# address in the caller's namespace. In "exclusive" mode devices created by
# `rdma link add` stay in the initial namespace, `rdma dev set DEV netns NS`
# fails with "Operation not supported" for rxe and siw, and processes in
# rdd_a/rdd_b see no RDMA device at all. `up` refuses to run in exclusive mode.
#
# Environment: PAIR_LAYOUT (see above), CHECK_TIMEOUT (seconds per check in
# `check`, default 60), CHECK_ITERS (perftest iterations, default 200).
#
# Exit status: 0 success; 1 a step or a check failed; 2 usage error or not
# run as root inside the VM.
set -euo pipefail

NS_A=rdd_a NS_B=rdd_b
NETDEV_A=rdd_va NETDEV_B=rdd_vb
IP_A=203.0.113.1 IP_B=203.0.113.2
PREFIX=24
TABLE_TO_B=177 TABLE_TO_A=178       # routed layout: where packets for B / A leave
STATE=/run/rdd-netns-pair.env
SELF=$(basename "$0")

note() { echo "$SELF: $*" >&2; }
die() { note "$*"; exit 1; }
usage() { sed -n '2,/^set -euo/p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//' >&2; exit 2; }

[ "$(id -u)" = 0 ] || { note "must run as root (inside the VM: scripts/softrdma-vm/vm-run.sh ...)"; exit 2; }

# find_gid DEV IP: sets GID to the index of DEV's RoCEv2 GID for IPv4
# address IP, or to 0 for an iWARP device (its only GID is MAC-based); waits
# up to 5 s for the table to fill. (Builtins only: a fork is slow under TCG.)
find_gid() {
  local dev=$1 ip=$2 d=/sys/class/infiniband/$1/ports/1 g v ty want nt=
  read -r nt < "/sys/class/infiniband/$dev/node_type" || true
  case "$nt" in *RNIC*) GID=0; return 0 ;; esac
  printf -v want '0000:0000:0000:0000:0000:ffff:%02x%02x:%02x%02x' ${ip//./ }
  for _ in {1..50}; do
    for g in "$d"/gids/*; do
      read -r v < "$g" 2>/dev/null || continue
      [ "$v" = "$want" ] || continue
      read -r ty < "$d/gid_attrs/types/${g##*/}" 2>/dev/null || continue
      if [ "$ty" = "RoCE v2" ]; then GID=${g##*/}; return 0; fi
    done
    sleep 0.1
  done
  return 1
}

print_env() {
  local v
  for v in PAIR_TYPE PAIR_LAYOUT NS_A NS_B EXEC_A EXEC_B DEV_A DEV_B NETDEV_A NETDEV_B IP_A IP_B GID_A GID_B; do
    printf '%s=%q\n' "$v" "${!v}"
  done
}

# ------------------------------------------------------------ down
do_down() {
  local d rules
  for d in rdd_rxe_a rdd_rxe_b rdd_siw_a rdd_siw_b; do
    if [ -e "/sys/class/infiniband/$d" ]; then rdma link delete "$d" 2>/dev/null || true; fi
  done
  if [ -e "/run/netns/$NS_A" ]; then ip netns del "$NS_A" || true; fi
  if [ -e "/run/netns/$NS_B" ]; then ip netns del "$NS_B" || true; fi
  # deleting one veth end takes its peer with it
  if [ -e "/sys/class/net/$NETDEV_A" ]; then ip link del "$NETDEV_A" || true; fi
  if [ -e "/sys/class/net/$NETDEV_B" ]; then ip link del "$NETDEV_B" || true; fi
  rules=$(ip rule show)
  if [[ $rules == *"lookup $TABLE_TO_B"* || $rules == *"lookup $TABLE_TO_A"* || $rules == *"200:"*"lookup local"* ]]; then
    ip -force -batch - 2>/dev/null <<EOF || true
rule del pref 100 lookup $TABLE_TO_B
rule del pref 100 lookup $TABLE_TO_A
route flush table $TABLE_TO_B
route flush table $TABLE_TO_A
EOF
    # Put the local table back in front (as rule 0) where `up` moved it.
    if [[ $rules == *"200:"*"lookup local"* ]]; then
      [[ $rules == "0:"*"lookup local"* ]] || ip rule add pref 0 lookup local
      ip rule del pref 200 lookup local
    fi
  fi
  rm -f "$STATE"
}

# ------------------------------------------------------------ up
do_up() {
  PAIR_TYPE=${1:-rxe}
  case "$PAIR_TYPE" in
    rxe) PAIR_LAYOUT=${PAIR_LAYOUT:-routed} ;;
    siw) PAIR_LAYOUT=${PAIR_LAYOUT:-netns} ;;
    *) note "device type must be rxe or siw, not '$PAIR_TYPE'"; exit 2 ;;
  esac
  case "$PAIR_LAYOUT" in netns|routed) ;; *) note "PAIR_LAYOUT must be netns or routed"; exit 2 ;; esac
  DEV_A=rdd_${PAIR_TYPE}_a DEV_B=rdd_${PAIR_TYPE}_b

  modprobe -a veth "rdma_$PAIR_TYPE" 2>/dev/null || modprobe -a veth "$PAIR_TYPE" \
    || die "cannot load the veth/$PAIR_TYPE modules"
  if rdma system show 2>/dev/null | grep -q 'netns exclusive'; then
    die "the RDMA subsystem is in exclusive netns mode; the pair needs 'rdma system set netns shared'"
  fi
  do_down

  ip link add "$NETDEV_A" type veth peer name "$NETDEV_B"
  local ns_a='' ns_b=''  # `ip -n NS` options
  if [ "$PAIR_LAYOUT" = netns ]; then
    EXEC_A="ip netns exec $NS_A" EXEC_B="ip netns exec $NS_B"
    ns_a="-n $NS_A" ns_b="-n $NS_B"
    ip netns add "$NS_A"
    ip netns add "$NS_B"
    ip link set "$NETDEV_A" netns "$NS_A"
    ip link set "$NETDEV_B" netns "$NS_B"
  else
    NS_A='' NS_B='' EXEC_A='' EXEC_B=''
  fi
  # IPv6 off on the veth ends: nothing here uses it, and DAD only adds noise.
  $EXEC_A sysctl -qw "net.ipv6.conf.$NETDEV_A.disable_ipv6=1" || true
  $EXEC_B sysctl -qw "net.ipv6.conf.$NETDEV_B.disable_ipv6=1" || true
  ip $ns_a -batch - <<EOF
link set lo up
addr add $IP_A/$PREFIX dev $NETDEV_A
link set $NETDEV_A up
EOF
  ip $ns_b -batch - <<EOF
link set lo up
addr add $IP_B/$PREFIX dev $NETDEV_B
link set $NETDEV_B up
EOF
  if [ "$PAIR_LAYOUT" = routed ]; then
    local n keys=()
    for n in all default "$NETDEV_A" "$NETDEV_B"; do
      keys+=("net.ipv4.conf.$n.accept_local=1" "net.ipv4.conf.$n.rp_filter=0")
    done
    sysctl -qw "${keys[@]}"
    # Locally sent packets for B leave through A's end and vice versa; only
    # arriving packets reach the local table, which now comes after.
    ip -batch - <<EOF
route add $IP_B/32 dev $NETDEV_A src $IP_A table $TABLE_TO_B
route add $IP_A/32 dev $NETDEV_B src $IP_B table $TABLE_TO_A
rule add pref 100 iif lo to $IP_B lookup $TABLE_TO_B
rule add pref 100 iif lo to $IP_A lookup $TABLE_TO_A
rule add pref 200 lookup local
rule del pref 0 lookup local
EOF
  fi
  # The link must carry packets before the RDMA devices are made: siw takes
  # its port state from the netdev when it is created. ping -w retries each
  # second until the veth's carrier is up.
  $EXEC_B ping -q -c 1 -w 10 "$IP_A" >/dev/null || die "no IPv4 connectivity from $IP_B to $IP_A"
  local side nd ex dev st ok
  for side in A B; do
    nd=NETDEV_$side ex=EXEC_$side dev=DEV_$side
    ${!ex} rdma link add "${!dev}" type "$PAIR_TYPE" netdev "${!nd}" \
      || die "rdma link add ${!dev} type $PAIR_TYPE netdev ${!nd} failed"
    ok=0 st=
    for _ in {1..50}; do
      read -r st < "/sys/class/infiniband/${!dev}/ports/1/state" 2>/dev/null || true
      [[ $st == *ACTIVE* ]] && { ok=1; break; }
      sleep 0.1
    done
    [ $ok = 1 ] || die "${!dev}: port 1 is '$st', not ACTIVE"
  done
  find_gid "$DEV_A" "$IP_A" || die "$DEV_A has no IPv4 RoCEv2 GID for $IP_A"
  GID_A=$GID
  find_gid "$DEV_B" "$IP_B" || die "$DEV_B has no IPv4 RoCEv2 GID for $IP_B"
  GID_B=$GID
  print_env > "$STATE"
  note "up: $PAIR_TYPE pair, $PAIR_LAYOUT layout: $DEV_A ($IP_A, gid $GID_A) <-> $DEV_B ($IP_B, gid $GID_B)"
  print_env
}

load_state() {
  [ -f "$STATE" ] || die "no pair is up (run '$SELF up' first)"
  # shellcheck disable=SC1090
  . "$STATE"
}

# ------------------------------------------------------------ check
# wait_listen EXEC PORT: until something on that side listens on PORT,
# through rdma_cm (rdma res) or a TCP socket (ss); at most 15 s.
wait_listen() {
  local ex=$1 port=$2
  for _ in $(seq 150); do
    $ex rdma res show cm_id 2>/dev/null | grep -q "state LISTEN .*:$port " && return 0
    $ex ss -Hltn "sport = :$port" 2>/dev/null | grep -q . && return 0
    sleep 0.1
  done
  return 0        # let the client try anyway; its failure is reported
}

FAILS=0
# run_pair NAME PORT "server command" "client command": server on side A,
# client on side B, each bounded by CHECK_TIMEOUT.
run_pair() {
  local name=$1 port=$2 srv=$3 cli=$4 t=${CHECK_TIMEOUT:-60} log
  log=$(mktemp -d)
  local t0=${EPOCHREALTIME/./}
  timeout "$t" $EXEC_A bash -c "$srv" > "$log/server" 2>&1 & local spid=$!
  wait_listen "$EXEC_A" "$port"
  local crc=0 src=0
  timeout "$t" $EXEC_B bash -c "$cli" > "$log/client" 2>&1 || crc=$?
  wait "$spid" || src=$?
  if [ "$crc" = 0 ] && [ "$src" = 0 ]; then
    echo "PASS pair-$name ($(( (${EPOCHREALTIME/./} - t0) / 1000 )) ms)"
  else
    echo "FAIL pair-$name (server rc=$src, client rc=$crc)"
    echo "  server: $srv"; sed 's/^/    /' "$log/server" | tail -n 15
    echo "  client: $cli"; sed 's/^/    /' "$log/client" | tail -n 15
    FAILS=$((FAILS + 1))
  fi
  rm -rf "$log"
}

rx_bytes_a() { $EXEC_A cat "/sys/class/net/$NETDEV_A/statistics/rx_bytes"; }

do_check() {
  load_state
  local iters=${CHECK_ITERS:-200}
  echo "pair: $PAIR_TYPE/$PAIR_LAYOUT $DEV_A $IP_A (gid $GID_A) <-> $DEV_B $IP_B (gid $GID_B)"
  run_pair rping 7174 "rping -s -a $IP_A -C 10 -V" "rping -c -a $IP_A -I $IP_B -C 10 -V"
  local before after
  before=$(rx_bytes_a)
  run_pair ib_write_bw-rdmacm 18515 "ib_write_bw -d $DEV_A -x $GID_A -R -n $iters -F" \
    "ib_write_bw -d $DEV_B -x $GID_B -R -n $iters -F $IP_A"
  after=$(rx_bytes_a)
  # The client wrote iters x 64 KiB to the server: it must have crossed the veth.
  if [ $((after - before)) -ge $((iters * 65536)) ]; then
    echo "PASS pair-traffic-on-veth ($((after - before)) bytes arrived on $NETDEV_A)"
  else
    echo "FAIL pair-traffic-on-veth (only $((after - before)) bytes arrived on $NETDEV_A, want >= $((iters * 65536)))"
    FAILS=$((FAILS + 1))
  fi
  if [ "$PAIR_TYPE" = rxe ]; then
    # Out-of-band QP exchange over TCP, no rdma_cm: iWARP cannot do this.
    run_pair ibv_rc_pingpong 18515 "ibv_rc_pingpong -d $DEV_A -g $GID_A -n 200" \
      "ibv_rc_pingpong -d $DEV_B -g $GID_B -n 200 $IP_A"
  fi
  [ "$FAILS" = 0 ]
}

case "${1:-}" in
  up)    shift; do_up "$@" ;;
  down)  do_down; note "down" ;;
  check) do_check ;;
  env)   load_state; print_env ;;
  -h|--help|help) usage ;;
  *) usage ;;
esac
