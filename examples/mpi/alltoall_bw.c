/*
 * alltoall_bw: all-to-all RDMA WRITE bandwidth over a full mesh of RC QPs
 * built with rdd_mesh_create (MPI_Allgather as its allgather), on the
 * cross-process software fabric or a kernel RDMA device (--device,
 * mesh.h), in the style of perftest's ib_write_bw.
 *
 * Every round, every rank writes one block of `size` bytes into every
 * other rank's published region (one signaled WRITE per peer), waits for
 * its n - 1 completions (an RC completion means the data is in the
 * peer's memory), then all ranks meet in an MPI_Barrier. The region has
 * two halves used in alternate rounds, so a writer of round k + 1 never
 * touches the half its peer is still checking for round k: one barrier
 * per round suffices. After the barrier every rank checks every block it
 * received that round byte for byte: a stamp (source rank, round) in the
 * first 8 bytes and a pattern of the source rank and the round after
 * them. A mismatch, a failed completion, or a completion that does not
 * come in `--timeout` seconds aborts the job (exit non-zero).
 *
 * The timed part of a round is posting, the completions and the barrier
 * (not the fill or the check). Aggregate bandwidth is the bytes all ranks
 * wrote over the slowest rank's time; per rank is that over the ranks.
 *
 * Build (after scripts/install.sh into a prefix on PKG_CONFIG_PATH):
 *     mpicc -std=c11 -O2 alltoall_bw.c $(pkg-config --cflags --libs --static rdma-direct) \
 *         -o alltoall_bw
 * Run:
 *     mpirun -np 4 ./alltoall_bw [--wait MODE] [--size BYTES] [--iters N] [--warmup N] [--timeout S]
 * Defaults: sizes 64 B, 1 KiB, 16 KiB, 256 KiB; 100 rounds per size after
 * 5 warm-up rounds; 30 s per wait.
 */
#define _POSIX_C_SOURCE 200809L

#include "mesh.h"

static const unsigned long SIZES[] = {64, 1024, 16384, 262144};
#define NSIZES (sizeof(SIZES) / sizeof(SIZES[0]))
#define MAX_SIZE (4ul << 20)

/* Byte `i` of the block rank `src` writes in round `round`. */
static uint8_t pattern(uint32_t src, uint32_t round, size_t i)
{
    return (uint8_t)(i * 7u + src * 61u + round * 13u + (i >> 8));
}

/* Fills `buf` with rank `src`'s block of round `round`. */
static void fill(uint8_t *buf, size_t size, uint32_t src, uint32_t round)
{
    size_t i;
    for (i = 0; i < size; i++) {
        buf[i] = pattern(src, round, i);
    }
    if (size >= 8) {
        memcpy(buf, &src, 4);
        memcpy(buf + 4, &round, 4);
    }
}

/* The first byte of `got` that is not rank `src`'s block of `round`, or
 * `size`. */
static size_t check(const uint8_t *got, size_t size, uint32_t src, uint32_t round)
{
    size_t i = 0;
    if (size >= 8) {
        uint32_t s, r;
        memcpy(&s, got, 4);
        memcpy(&r, got + 4, 4);
        if (s != src) {
            return 0;
        }
        if (r != round) {
            return 4;
        }
        i = 8;
    }
    for (; i < size; i++) {
        if (got[i] != pattern(src, round, i)) {
            return i;
        }
    }
    return size;
}

/* Offset of rank `src`'s block in a region, in half `half`. */
static uint64_t slot(uint32_t half, uint32_t src, size_t stride)
{
    return ((uint64_t)half * (uint64_t)mx_size + src) * stride;
}

/* Runs `rounds` rounds of `size` bytes; returns this rank's timed
 * microseconds. `*round` counts rounds across sizes. */
static double run(struct mx_mesh *m, rdd_wc *wc, size_t size, size_t stride, unsigned long rounds,
                  uint32_t *round, double timeout_us)
{
    double busy = 0.0;
    unsigned long k;
    uint32_t me = (uint32_t)mx_rank, n = (uint32_t)mx_size, j;
    for (k = 0; k < rounds; k++, (*round)++) {
        uint32_t half = *round & 1u;
        double t0;
        fill(m->local_buf, size, me, *round);
        t0 = mx_now_us();
        /* Peers in the order rank + 1, rank + 2, ...: not all at rank 0 first. */
        for (j = 1; j < n; j++) {
            uint32_t p = (me + j) % n;
            rdd_status s = rdd_qp_write(m->qp[p], p, (uint64_t)(uintptr_t)m->local_buf,
                                        (uint32_t)size, m->local_lkey,
                                        m->peer_region[p].addr + slot(half, me, stride),
                                        m->peer_region[p].rkey, RDD_SEND_SIGNALED);
            if (s != RDD_STATUS_OK) {
                mx_fail("rdd_qp_write", s);
            }
        }
        mx_wait(&m->scq, wc, n - 1, timeout_us, "the round's WRITEs");
        MX_MPI(MPI_Barrier(MPI_COMM_WORLD));
        busy += mx_now_us() - t0;
        for (j = 0; j < n; j++) {
            size_t bad;
            if (j == me) {
                continue;
            }
            bad = check(m->region_buf + slot(half, j, stride), size, j, *round);
            if (bad != size) {
                char msg[160];
                snprintf(msg, sizeof(msg),
                         "round %u, %zu bytes: the block from rank %u differs at byte %zu", *round,
                         size, j, bad);
                mx_die(msg);
            }
        }
    }
    return busy;
}

int main(int argc, char **argv)
{
    unsigned long one_size = 0, iters = 100, warmup = 5, timeout_s = 30, i;
    size_t stride;
    uint32_t round = 0;
    struct mx_mesh m;
    struct mx_config cfg;
    rdd_wc *wc;
    int a;

    mx_init(&argc, &argv, "alltoall_bw", 2);
    for (a = 1; a < argc; a++) {
        if (mx_common_arg(argc, argv, &a)) {
            continue;
        } else if (strcmp(argv[a], "--size") == 0) {
            one_size = mx_number("--size", argv[++a], 1, MAX_SIZE);
        } else if (strcmp(argv[a], "--iters") == 0) {
            iters = mx_number("--iters", argv[++a], 1, 100000000);
        } else if (strcmp(argv[a], "--warmup") == 0) {
            warmup = mx_number("--warmup", argv[++a], 0, 100000000);
        } else if (strcmp(argv[a], "--timeout") == 0) {
            timeout_s = mx_number("--timeout", argv[++a], 1, 3600);
        } else {
            mx_usage(MX_COMMON_USAGE " [--size BYTES] [--iters N] [--warmup N]"
                     " [--timeout S]");
        }
    }
    stride = one_size ? one_size : SIZES[NSIZES - 1];
    stride = (stride + 63) & ~(size_t)63;

    memset(&cfg, 0, sizeof(cfg));
    cfg.region_len = 2 * (size_t)mx_size * stride;
    cfg.region_access = RDD_ACCESS_LOCAL_WRITE | RDD_ACCESS_REMOTE_WRITE;
    cfg.local_len = stride;
    cfg.connect_access = RDD_ACCESS_REMOTE_WRITE;
    /* One WRITE per QP per round; no receives. */
    cfg.qp = (rdd_qp_init){16, 1, 1, 1, 0, 0};
    mx_open(&m, &cfg);
    wc = calloc((size_t)mx_size, sizeof(*wc));
    if (wc == NULL) {
        mx_die("out of memory");
    }

    if (mx_rank == 0) {
        printf("---------------------------------------------------------------------------\n");
        printf("                    All-to-all RDMA WRITE bandwidth (rdma-direct, MPI mesh)\n");
        printf("---------------------------------------------------------------------------\n");
        mx_report_machine();
    }
    /* One warm-up round maps every link before the memory figures. */
    run(&m, wc, one_size ? one_size : SIZES[0], stride, 1, &round, timeout_s * 1e6);
    mx_report_setup(&m);
    if (mx_rank == 0) {
        printf(" rounds per size          : %lu after %lu warm-up (one MPI_Barrier each)\n",
               iters, warmup);
        printf("---------------------------------------------------------------------------\n");
        printf(" %-10s %-9s %-20s %-20s %-12s %-10s %s\n", "#bytes", "#rounds",
               "BW aggregate[MiB/s]", "BW per rank[MiB/s]", "round[us]", "MsgRate[Mpps]",
               "check");
    }
    for (i = 0; i < (one_size ? 1 : NSIZES); i++) {
        size_t size = one_size ? one_size : SIZES[i];
        double us, slowest = 0.0;
        run(&m, wc, size, stride, warmup, &round, timeout_s * 1e6);
        us = run(&m, wc, size, stride, iters, &round, timeout_s * 1e6);
        MX_MPI(MPI_Allreduce(&us, &slowest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD));
        if (mx_rank == 0) {
            double msgs = (double)iters * (double)mx_size * (double)(mx_size - 1);
            double agg = msgs * (double)size / (slowest / 1e6) / (1024.0 * 1024.0);
            printf(" %-10zu %-9lu %-20.2f %-20.2f %-12.1f %-13.4f %s\n", size, iters, agg,
                   agg / mx_size, slowest / (double)iters, msgs / slowest, "OK");
            fflush(stdout);
        }
    }
    if (mx_rank == 0) {
        printf("---------------------------------------------------------------------------\n");
        printf(" every block of every round checked on its receiver: OK\n");
    }
    free(wc);
    mx_close(&m);
    MPI_Finalize();
    return 0;
}
