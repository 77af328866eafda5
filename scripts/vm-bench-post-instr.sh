#!/usr/bin/env bash
# User-space instructions per WR spent inside post_send alone (the crate's
# QpDriver::post_send of the direct rxe rings and of the verbs fallback),
# counted by callgrind with --toggle-collect, for one or more verbs_write
# binaries (e.g. built from two commits). Runs INSIDE the test VM:
#
#   export CARGO_TARGET_DIR=$PWD/target/h-bench
#   cargo bench --features verbs --bench verbs_write --no-run   # prints the binary
#   cp <binary> /tmp/vw/new        # (and an older build as /tmp/vw/old)
#   scripts/softrdma-vm/vm-run.sh bash scripts/vm-bench-post-instr.sh /tmp/vw/old /tmp/vw/new
#
# Per WR = (Ir(6000) - Ir(2000)) / 4000 for 8-byte RDMA WRITEs on rxe0, tx
# depth 128, one in 100 signaled, chains of up to 32 (verbs_write's bw
# mode). The counts are deterministic for a given binary.
set -euo pipefail
[ "${IN_RDMA_VM:-0}" = 1 ] || { echo "run inside the test VM (scripts/softrdma-vm/vm-run.sh)" >&2; exit 2; }
[ $# -ge 1 ] || { echo "usage: $0 VERBS_WRITE_BINARY..." >&2; exit 2; }
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
ir() { awk '/^summary:/ { print $2; exit }' "$1"; }
echo "| binary | data path | post_send instructions per WR |"
echo "|---|---|---:|"
for bin in "$@"; do
  for path in direct fallback; do
    for n in 2000 6000; do
      valgrind --tool=callgrind --callgrind-out-file="$T/cg.$n" \
        --toggle-collect='*QpDriver>::post_send*' \
        "$bin" --device "$RXE_DEV" --gid-index "$RXE_GID_INDEX" --mode bw --size 8 \
        --iters "$n" --tx-depth 128 --cq-mod 100 --data-path "$path" \
        > /dev/null 2> "$T/err" || { tail -n 20 "$T/err" >&2; exit 1; }
    done
    a=$(ir "$T/cg.2000"); c=$(ir "$T/cg.6000")
    echo "| $bin | $path | $(awk -v a="$a" -v c="$c" 'BEGIN { printf "%.1f", (c - a) / 4000 }') |"
  done
done
