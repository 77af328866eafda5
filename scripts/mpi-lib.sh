# shellcheck shell=bash
# What scripts/mpi-examples.sh (on the host, over the software fabric)
# and scripts/vm-mpi.sh (in the test VM, over rxe) share: the MPI
# examples, their arguments for a short check, the line each ends a good
# run with, and mpirun's options. Sourced, not run.

# peer_loss kills one rank (SIGKILL) mid-transfer and checks the
# survivors' WRs to it fail within a bound while their own traffic goes
# on; it needs `mpirun --enable-recovery` (mpi_opts_of), or Open MPI ends
# the whole job when the rank dies, and then mpirun's exit status is 0
# whatever the survivors return: its verdict line is the check.
mpi_examples=(alltoall_bw ring_lat atomic_counter p2p_vs_mpi peer_loss)

# Short counts: the check, not the figures.
# shellcheck disable=SC2034 # read through `declare -n args_$ex`
args_alltoall_bw=(--iters 5 --warmup 1 --size 65536)
# shellcheck disable=SC2034
args_ring_lat=(--iters 100 --warmup 10)
# shellcheck disable=SC2034
args_atomic_counter=(--count 300)
# shellcheck disable=SC2034
args_p2p_vs_mpi=(--lat-iters 100 --bw-iters 10 --bw-size 262144)
# shellcheck disable=SC2034
args_peer_loss=()

# mpirun options of one example, beyond mpirun_opts.
# shellcheck disable=SC2034
declare -A mpi_opts_of=([peer_loss]=--enable-recovery)

# mpi_verdict_of EXAMPLE: the line it prints last after a good run.
mpi_verdict_of() {
  case "$1" in
    alltoall_bw) echo 'every block of every round checked on its receiver: OK' ;;
    ring_lat) echo 'every ping checked (length, iteration, sender, payload): OK' ;;
    atomic_counter | peer_loss) echo 'verdict: PASS' ;;
    p2p_vs_mpi) echo "every ping and both streams' bytes checked: OK" ;;
  esac
}

# --oversubscribe: the runs start more ranks than the machine has cores;
# `--mca btl self,vader`: ranks of one host talk through shared memory
# only, so no network interface (a container may have none) is probed;
# --allow-run-as-root when run as root (the VM runs everything as root).
mpirun_opts=(--oversubscribe --mca btl self,vader)
[ "$(id -u)" != 0 ] || mpirun_opts+=(--allow-run-as-root)
