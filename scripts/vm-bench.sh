#!/usr/bin/env bash
# RDMA WRITE message rate and latency: perftest (ib_write_bw, ib_write_lat)
# against this crate's verbs backend (benches/verbs_write.rs) on the same
# device, in the same VM session. Runs INSIDE the test VM; from the host:
#
#   export CARGO_TARGET_DIR=$PWD/target/h-bench
#   cargo bench --features verbs --bench verbs_write --no-run   # prints the binary's path
#   VM_TIMEOUT=600 scripts/softrdma-vm/vm-run.sh bash scripts/vm-bench.sh <verbs_write binary>
#
# (Copy the binary somewhere first if you rebuild while it runs: cargo
# overwrites it in place.)
#
# For each device (rxe0: perftest -x $RXE_GID_INDEX, QPs connected over TCP
# out of band; siw0: perftest -R, rdma_cm), each size and each mode (bw,
# lat) it runs perftest, then ours, then perftest and ours again, so every
# number exists twice and noise is visible. In bw mode it also runs ours
# with one WR per post call (`--batch 1`, perftest's own posting shape)
# after each of our runs. The perftest server runs in the background, the
# client connects to the device's IP; the client's result line is parsed
# (bw: bytes, iterations, BW peak, BW average, MsgRate; lat: bytes,
# iterations, t_min, t_max, t_typical, t_avg, t_stdev, p99, p99.9). Our
# runs use the TX depth and CQ moderation that perftest printed in the
# same round, and the same sizes and iteration counts.
#
# Prints every raw result as it comes, then Markdown tables: message rate,
# latency, and our user CPU time per WR (from getrusage around the measured
# loop). Ratios are ours / perftest: above 1.0 is better for the message
# rate, below 1.0 is better for the latency.
#
# Environment (defaults keep the whole run near 4 minutes under TCG):
#   BENCH_DEVICES     "rxe0 siw0"
#   BENCH_SIZES       "8 4096 65536"
#   BENCH_BW_ITERS    5000 (perftest's default) for sizes up to 4 KiB
#   BENCH_BW_ITERS_BIG 1000 for larger sizes
#   BENCH_LAT_ITERS   1000 (perftest's default) for sizes up to 4 KiB
#   BENCH_LAT_ITERS_BIG 200 for larger sizes (a 64 KiB round trip takes ms)
#   BENCH_LAT_ITERS_IWARP 300 on iWARP, any size (siw's round trips take ms)
#   BENCH_BATCH1      1: also run ours with --batch 1 in bw mode (0: skip)
#   BENCH_COMPARE     another verbs_write binary (e.g. built from an older
#                     commit): run right after ours, every time, with the
#                     same arguments, and compared in the CPU table
#   BENCH_TIMEOUT     60 seconds per process
#
# perftest computes times from the TSC and a CPU frequency it samples at
# start; on a loaded host that sampling can fail and the result is 0, inf or
# nan. Such a run is repeated once; if it stays invalid the table says
# "invalid".
#
# Exit status: 0 if every run produced a result; 1 if any failed or stayed
# invalid (the table shows "fail"/"invalid" there); 2 if not inside the VM
# or no binary given.
set -uo pipefail

if [ "${IN_RDMA_VM:-0}" != 1 ]; then
  echo "vm-bench.sh: run inside the test VM: scripts/softrdma-vm/vm-run.sh bash $0 BINARY" >&2
  exit 2
fi
BIN=${1:-}
if [ -z "$BIN" ] || [ ! -x "$BIN" ]; then
  echo "usage: vm-bench.sh PATH-TO-verbs_write-BINARY" >&2
  exit 2
fi
DEVICES=${BENCH_DEVICES:-"$RXE_DEV $SIW_DEV"}
SIZES=${BENCH_SIZES:-"8 4096 65536"}
BW_ITERS=${BENCH_BW_ITERS:-5000}
BW_ITERS_BIG=${BENCH_BW_ITERS_BIG:-1000}
LAT_ITERS=${BENCH_LAT_ITERS:-1000}
LAT_ITERS_BIG=${BENCH_LAT_ITERS_BIG:-200}
LAT_ITERS_IWARP=${BENCH_LAT_ITERS_IWARP:-300}
BATCH1=${BENCH_BATCH1:-1}
COMPARE=${BENCH_COMPARE:-}
T=${BENCH_TIMEOUT:-60}
LOG=$(mktemp -d)
trap 'rm -rf "$LOG"' EXIT
PORT=18515
FAILED=0
START=$SECONDS

# Per-device perftest flags, our flags and the address the client dials.
dev_setup() {
  case "$1" in
    "$RXE_DEV") PT_FLAGS="-d $1 -x $RXE_GID_INDEX"; OUR_FLAGS="--device $1 --gid-index $RXE_GID_INDEX"; ADDR=$RXE_IP; IWARP=0 ;;
    "$SIW_DEV") PT_FLAGS="-d $1 -R"; OUR_FLAGS="--device $1 --ip $SIW_IP"; ADDR=$SIW_IP; IWARP=1 ;;
    *) echo "vm-bench.sh: unknown device $1" >&2; exit 2 ;;
  esac
}

# perftest TOOL SIZE ITERS: server in the background, then the client; the
# client's output is left in $LOG/cli. Returns the client's (or server's)
# failure status.
perftest() {
  local tool=$1 size=$2 iters=$3 src=0 crc=0 spid
  PORT=$((PORT + 1))
  # shellcheck disable=SC2086
  timeout "$T" "$tool" $PT_FLAGS -F -p "$PORT" -s "$size" -n "$iters" > "$LOG/srv" 2>&1 &
  spid=$!
  # perftest's start-up (it samples the CPU frequency) can take seconds on
  # a loaded host; a client that dials too early gets "connection refused".
  for _ in $(seq 300); do
    rdma res show cm_id 2>/dev/null | grep -q "state LISTEN .*:$PORT " && break
    ss -Hltn "sport = :$PORT" 2>/dev/null | grep -q . && break
    sleep 0.1
  done
  # shellcheck disable=SC2086
  timeout "$T" "$tool" $PT_FLAGS -F -p "$PORT" -s "$size" -n "$iters" "$ADDR" > "$LOG/cli" 2>&1 || crc=$?
  # A server whose client failed would wait for its timeout.
  [ "$crc" = 0 ] || kill "$spid" 2>/dev/null
  wait "$spid" || src=$?
  [ "$crc" = 0 ] && crc=$src
  if [ "$crc" != 0 ]; then
    echo "  $tool failed (status $crc); client and server output:" >&2
    sed 's/^/    /' "$LOG/cli" "$LOG/srv" | tail -n 30 >&2
  fi
  return "$crc"
}

# valid_number X: a finite, positive number (perftest prints 0, inf or nan
# when its CPU-clock calibration fails, which happens on a loaded host).
valid_number() {
  awk -v a="$1" 'BEGIN { exit !(a ~ /^[0-9]+(\.[0-9]+)?$/ && a + 0 > 0) }'
}

# perftest_result TOOL SIZE ITERS FIELD: runs perftest (once more if its
# result is not a valid number) and sets PT_LINE to the client's result
# line and PT_VALUE to field FIELD of it (or "fail"/"invalid").
perftest_result() {
  local try
  PT_LINE="" PT_VALUE=fail
  for try in 1 2; do
    perftest "$1" "$2" "$3" || { PT_VALUE=fail; continue; }
    PT_LINE=$(result_line "$LOG/cli")
    PT_VALUE=$(awk -v f="$4" '{ print $f }' <<< "$PT_LINE")
    valid_number "$PT_VALUE" && return 0
    echo "  $1 $2: invalid result '$PT_LINE' (try $try; stderr: $(grep -m1 -iE 'correlation|mhz|warn' "$LOG/cli" "$LOG/srv" | head -1))" >&2
    PT_VALUE=invalid
  done
  return 1
}

# The first data line after the "#bytes" header (the numbers only).
result_line() {
  awk '/#bytes/ { h = 1; next } h && $1 ~ /^[0-9]+$/ { print; exit }' "$1"
}
# A "Name : value" header field of perftest's output.
header_field() {
  awk -F: -v k="$2" 'index($0, k) == 2 { gsub(/[ \t]/, "", $2); sub(/\[.*$/, "", $2); print $2; exit }' "$1"
}
# key=value from our output line.
field() { tr ' ' '\n' <<< "$1" | sed -n "s/^$2=//p"; }

# run_bin BIN ARGS...: runs a verbs_write binary on the current device; its
# line goes to stdout.
run_bin() {
  local bin=$1 out rc=0
  shift
  # shellcheck disable=SC2086
  out=$(timeout "$T" "$bin" $OUR_FLAGS "$@" 2> "$LOG/ours.err") || rc=$?
  if [ "$rc" != 0 ] || [ -z "$out" ]; then
    echo "  $bin $* failed (status $rc):" >&2
    sed 's/^/    /' "$LOG/ours.err" | tail -n 20 >&2
    return 1
  fi
  echo "$out"
}

# ours CASE VALUE EXTRA ARGS...: runs our binary (and the BENCH_COMPARE one
# right after it) with ARGS and records fields VALUE (the result) and EXTRA
# (user CPU per WR in bw, t_min in lat) under R[$dev,$size,CASE,...,$rep].
ours() {
  local case=$1 value=$2 cpu=$3 line t0 who bin
  shift 3
  for who in us cmp; do
    if [ "$who" = us ]; then bin=$BIN; else bin=$COMPARE; fi
    [ -n "$bin" ] || continue
    t0=$SECONDS
    if line=$(run_bin "$bin" "$@"); then
      echo "$who $dev $case: $line ($((SECONDS - t0)) s)"
      R[$dev,$size,$case,$who,$rep]=$(field "$line" "$value")
      R[$dev,$size,$case,${who}cpu,$rep]=$(field "$line" "$cpu")
    else
      R[$dev,$size,$case,$who,$rep]=fail; FAILED=1
    fi
  done
}

declare -A R   # R[device,size,case,who,rep] = value

echo "vm-bench: kernel $(uname -r); $(dpkg-query -W -f='${Package} ${Version}' perftest 2>/dev/null); $(nproc) CPUs; load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "vm-bench: binary $BIN${COMPARE:+; compared with $COMPARE}"
for dev in $DEVICES; do
  dev_setup "$dev"
  for size in $SIZES; do
    if [ "$size" -le 4096 ]; then bw_iters=$BW_ITERS; else bw_iters=$BW_ITERS_BIG; fi
    if [ "$IWARP" = 1 ]; then lat_iters=$LAT_ITERS_IWARP
    elif [ "$size" -le 4096 ]; then lat_iters=$LAT_ITERS; else lat_iters=$LAT_ITERS_BIG; fi
    R[$dev,$size,bw_iters]=$bw_iters
    R[$dev,$size,lat_iters]=$lat_iters
    for rep in 1 2; do
      # ---- message rate
      t0=$SECONDS
      perftest_result ib_write_bw "$size" "$bw_iters" 5 || FAILED=1
      R[$dev,$size,bw,pt,$rep]=$PT_VALUE
      depth=$(header_field "$LOG/cli" "TX depth")
      cqmod=$(header_field "$LOG/cli" "CQ Moderation")
      depth=${depth:-128} cqmod=${cqmod:-${R[$dev,$size,cqmod]:-100}}
      R[$dev,$size,cqmod]=$cqmod
      echo "perftest $dev bw size=$size rep=$rep tx_depth=$depth cq_mod=$cqmod: $PT_LINE ($((SECONDS - t0)) s)"
      ours bw msg_rate_mpps user_us_per_wr --mode bw --size "$size" --iters "$bw_iters" --tx-depth "$depth" --cq-mod "$cqmod"
      if [ "$BATCH1" = 1 ]; then
        ours b1 msg_rate_mpps user_us_per_wr --mode bw --size "$size" --iters "$bw_iters" --tx-depth "$depth" --cq-mod "$cqmod" --batch 1
      fi
      # ---- latency
      t0=$SECONDS
      perftest_result ib_write_lat "$size" "$lat_iters" 5 || FAILED=1
      R[$dev,$size,lat,pt,$rep]=$PT_VALUE
      R[$dev,$size,lat,ptmin,$rep]=$(awk '{ print $3 }' <<< "$PT_LINE")
      echo "perftest $dev lat size=$size rep=$rep: $PT_LINE ($((SECONDS - t0)) s)"
      ours lat t_typical_us t_min_us --mode lat --size "$size" --iters "$lat_iters"
    done
  done
done

# ratio A B: A / B with 2 decimals, or "-" if either is missing.
ratio() {
  awk -v a="$1" -v b="$2" 'BEGIN { if (a ~ /^[0-9.]+$/ && b ~ /^[0-9.]+$/ && a + 0 > 0 && b + 0 > 0) printf "%.2f×", a / b; else printf "-" }'
}
# kmsg MPPS: messages per second, 3 significant digits.
kmsg() {
  awk -v a="$1" 'BEGIN {
    if (a !~ /^[0-9.]+$/) { printf "%s", a; exit }
    v = a * 1e6
    if (v >= 1000) printf "%.0f", v; else if (v >= 100) printf "%.1f", v; else printf "%.2f", v
  }'
}

# pair KEY: "run1 / run2" of R[KEY,rep] through FORMAT (a function).
pair() { echo "$($2 "${R[$1,1]:-fail}") / $($2 "${R[$1,2]:-fail}")"; }
same() { printf "%s" "$1"; }
# ratios A B: "a1/b1 / a2/b2".
ratios() { echo "$(ratio "${R[$1,1]:-fail}" "${R[$2,1]:-fail}") / $(ratio "${R[$1,2]:-fail}" "${R[$2,2]:-fail}")"; }

echo
echo "### Message rate (RDMA WRITE, messages/s; two runs each, in the order run)"
echo
if [ "$BATCH1" = 1 ]; then
  echo "| device | size | iterations | CQ moderation | perftest ib_write_bw | ours | ours / perftest | ours, 1 WR per call | 1 WR per call / perftest |"
  echo "|---|---:|---:|---:|---:|---:|---:|---:|---:|"
else
  echo "| device | size | iterations | CQ moderation | perftest ib_write_bw | ours | ours / perftest |"
  echo "|---|---:|---:|---:|---:|---:|---:|"
fi
for dev in $DEVICES; do
  for size in $SIZES; do
    k=$dev,$size
    row="| $dev | $size | ${R[$k,bw_iters]} | ${R[$k,cqmod]:-?} | $(pair "$k,bw,pt" kmsg) | $(pair "$k,bw,us" kmsg) | **$(ratios "$k,bw,us" "$k,bw,pt")**"
    if [ "$BATCH1" = 1 ]; then
      row="$row | $(pair "$k,b1,us" kmsg) | $(ratios "$k,b1,us" "$k,bw,pt")"
    fi
    echo "$row |"
  done
done
echo
echo "### Latency (RDMA WRITE ping-pong, one-way µs = RTT/2; typical = median; two runs each)"
echo
echo "| device | size | iterations | perftest ib_write_lat t_typical | ours t_typical | ours / perftest | perftest t_min | ours t_min |"
echo "|---|---:|---:|---:|---:|---:|---:|---:|"
for dev in $DEVICES; do
  for size in $SIZES; do
    k=$dev,$size
    echo "| $dev | $size | ${R[$k,lat_iters]} | $(pair "$k,lat,pt" same) | $(pair "$k,lat,us" same) | **$(ratios "$k,lat,us" "$k,lat,pt")** | $(pair "$k,lat,ptmin" same) | $(pair "$k,lat,uscpu" same) |"
  done
done
echo
echo "### Our user CPU time per WR in bw mode (getrusage of the posting thread)"
echo
echo "On siw the posting thread mostly spins on an empty CQ (siw sends from a"
echo "kernel thread), so there this is polling time, not posting cost."
echo
if [ -n "$COMPARE" ]; then
  echo
  echo "Compared with \`$COMPARE\` (run right after ours each time): results and user CPU, two runs each."
  echo
  echo "| device | size | case | ours | compared | ours / compared | ours user µs/WR | compared user µs/WR |"
  echo "|---|---:|---|---:|---:|---:|---:|---:|"
else
  echo "| device | size | case | ours user µs/WR |"
  echo "|---|---:|---|---:|"
fi
for dev in $DEVICES; do
  for size in $SIZES; do
    k=$dev,$size
    for case in bw b1 lat; do
      [ -n "${R[$k,$case,us,1]:-}" ] || continue
      case $case in
        bw) name="bw, chains"; fmt=kmsg ;;
        b1) name="bw, 1 WR per call"; fmt=kmsg ;;
        lat) name="lat t_typical µs"; fmt=same ;;
      esac
      if [ -n "$COMPARE" ]; then
        if [ "$case" = lat ]; then cpu="- | -"; else cpu="$(pair "$k,$case,uscpu" same) | $(pair "$k,$case,cmpcpu" same)"; fi
        echo "| $dev | $size | $name | $(pair "$k,$case,us" $fmt) | $(pair "$k,$case,cmp" $fmt) | $(ratios "$k,$case,us" "$k,$case,cmp") | $cpu |"
      elif [ "$case" != lat ]; then
        echo "| $dev | $size | $name | $(pair "$k,$case,uscpu" same) |"
      fi
    done
  done
done
echo
echo "vm-bench: $((SECONDS - START)) s"
exit "$FAILED"
