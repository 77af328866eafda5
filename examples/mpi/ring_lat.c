/*
 * ring_lat: latency of a token passed around a ring of ranks with RC
 * SENDs over a full mesh built with rdd_mesh_create (MPI_Allgather as
 * its allgather), on the cross-process software fabric or a kernel RDMA
 * device (--device, mesh.h).
 *
 * Rank r SENDs to rank r + 1 (mod n) and receives from rank r - 1. Each
 * iteration rank 0 sends a ping; every other rank, on receiving it,
 * forwards it to its right; the ping comes back to rank 0 after n hops.
 * Every ping carries its sender's send time (CLOCK_MONOTONIC, one clock
 * for all processes of the host), the iteration and the sender's rank;
 * the receiver checks the length, the iteration, the sender and the
 * payload pattern, and records the hop's one-way latency (send to
 * receive completion). Each rank keeps 8 receives posted on its QP
 * towards the left (the mesh's QPs connect with an infinite RNR retry,
 * so a ping that arrives before its receive waits for it).
 *
 * The per-rank figures (min, median, p99 of its hops) are gathered to
 * rank 0, which prints them, the min / median / p99 over ranks of the
 * per-rank medians, and the ring's round trip (and per hop) as rank 0
 * sees it. A wrong ping, a failed completion, or one that does not come
 * within `--timeout` seconds aborts the job (exit non-zero).
 *
 * Build (after scripts/install.sh into a prefix on PKG_CONFIG_PATH):
 *     mpicc -std=c11 -O2 ring_lat.c $(pkg-config --cflags --libs --static rdma-direct) \
 *         -o ring_lat
 * Run:
 *     mpirun -np 4 ./ring_lat [--wait MODE] [--size BYTES] [--iters N] [--warmup N] [--timeout S]
 * Defaults: 16-byte pings (the stamp, iteration and rank; at least 16),
 * 1000 round trips after 50 warm-up; 30 s per wait.
 */
#define _POSIX_C_SOURCE 200809L

#include "mesh.h"

#define RECV_DEPTH 8u
#define MAX_SIZE 65536ul

/* The head of every ping. */
struct ping {
    uint64_t stamp_ns;
    uint32_t iter;
    uint32_t src;
};

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* Byte `i` (past the head) of a ping from `src` in iteration `iter`. */
static uint8_t pattern(uint32_t src, uint32_t iter, size_t i)
{
    return (uint8_t)(i * 3u + src * 17u + iter * 5u);
}

struct ring {
    struct mx_mesh *m;
    size_t size;
    size_t stride;
    uint32_t left;
    uint32_t right;
    double timeout_us;
};

static uint8_t *recv_slot(const struct ring *r, uint64_t i)
{
    return r->m->local_buf + (1 + i) * r->stride;
}

static void post_recv(struct ring *r, uint64_t i)
{
    MX_TRY(rdd_qp_recv(r->m->qp[r->left], i, (uint64_t)(uintptr_t)recv_slot(r, i),
                       (uint32_t)r->size, r->m->local_lkey, 0));
}

/* Stamps and SENDs iteration `iter`'s ping to the right. */
static void send_ping(struct ring *r, uint32_t iter)
{
    struct ping h;
    rdd_wc wc[1];
    size_t i;
    uint8_t *buf = r->m->local_buf;
    for (i = sizeof(h); i < r->size; i++) {
        buf[i] = pattern((uint32_t)mx_rank, iter, i);
    }
    h.iter = iter;
    h.src = (uint32_t)mx_rank;
    h.stamp_ns = now_ns();
    memcpy(buf, &h, sizeof(h));
    MX_TRY(rdd_qp_send(r->m->qp[r->right], iter, (uint64_t)(uintptr_t)buf, (uint32_t)r->size,
                       r->m->local_lkey, RDD_SEND_SIGNALED));
    mx_wait(&r->m->scq, wc, 1, r->timeout_us, "the ping's SEND");
}

/* Waits for iteration `iter`'s ping from the left, checks it, posts the
 * receive again; returns the hop's one-way latency in microseconds. */
static double recv_ping(struct ring *r, uint32_t iter)
{
    rdd_wc wc[1];
    struct ping h;
    const uint8_t *got;
    uint64_t at;
    size_t i;
    char msg[200];
    mx_wait(&r->m->rcq, wc, 1, r->timeout_us, "the ping from the left");
    at = now_ns();
    if (wc[0].wr_id >= RECV_DEPTH || wc[0].byte_len != r->size) {
        snprintf(msg, sizeof(msg), "iteration %u: a receive of %u bytes (wr_id %llu), not %zu",
                 iter, (unsigned)wc[0].byte_len, (unsigned long long)wc[0].wr_id, r->size);
        mx_die(msg);
    }
    got = recv_slot(r, wc[0].wr_id);
    memcpy(&h, got, sizeof(h));
    if (h.iter != iter || h.src != r->left || h.stamp_ns > at) {
        snprintf(msg, sizeof(msg),
                 "iteration %u: a ping of iteration %u from rank %u (expected %u)", iter, h.iter,
                 h.src, r->left);
        mx_die(msg);
    }
    for (i = sizeof(h); i < r->size; i++) {
        if (got[i] != pattern(r->left, iter, i)) {
            snprintf(msg, sizeof(msg), "iteration %u: the ping differs at byte %zu", iter, i);
            mx_die(msg);
        }
    }
    post_recv(r, wc[0].wr_id);
    return (double)(at - h.stamp_ns) / 1e3;
}

int main(int argc, char **argv)
{
    unsigned long size = sizeof(struct ping), iters = 1000, warmup = 50, timeout_s = 30;
    struct mx_mesh m;
    struct mx_config cfg;
    struct ring r;
    double *hop, *trip, mine[3], *all = NULL;
    uint32_t k;
    int a;

    mx_init(&argc, &argv, "ring_lat", 2);
    for (a = 1; a < argc; a++) {
        if (mx_common_arg(argc, argv, &a)) {
            continue;
        } else if (strcmp(argv[a], "--size") == 0) {
            size = mx_number("--size", argv[++a], sizeof(struct ping), MAX_SIZE);
        } else if (strcmp(argv[a], "--iters") == 0) {
            iters = mx_number("--iters", argv[++a], 1, 10000000);
        } else if (strcmp(argv[a], "--warmup") == 0) {
            warmup = mx_number("--warmup", argv[++a], 0, 10000000);
        } else if (strcmp(argv[a], "--timeout") == 0) {
            timeout_s = mx_number("--timeout", argv[++a], 1, 3600);
        } else {
            mx_usage(MX_COMMON_USAGE " [--size BYTES] [--iters N] [--warmup N]"
                     " [--timeout S]");
        }
    }
    memset(&cfg, 0, sizeof(cfg));
    r.size = size;
    r.stride = (size + 63) & ~(size_t)63;
    /* Nothing is written remotely: the published region is a token one. */
    cfg.region_len = 64;
    cfg.region_access = RDD_ACCESS_LOCAL_WRITE;
    cfg.local_len = (1 + RECV_DEPTH) * r.stride;
    cfg.connect_access = 0;
    cfg.qp = (rdd_qp_init){4, RECV_DEPTH, 1, 1, 0, 0};
    mx_open(&m, &cfg);
    r.m = &m;
    r.left = (uint32_t)((mx_rank + mx_size - 1) % mx_size);
    r.right = (uint32_t)((mx_rank + 1) % mx_size);
    r.timeout_us = (double)timeout_s * 1e6;
    for (k = 0; k < RECV_DEPTH; k++) {
        post_recv(&r, k);
        mx_count_recv(&m, (uint32_t)size);
    }
    hop = calloc(iters, sizeof(*hop));
    trip = calloc(iters, sizeof(*trip));
    if (hop == NULL || trip == NULL) {
        mx_die("out of memory");
    }
    /* Every rank's receives are posted before the first ping. */
    MX_MPI(MPI_Barrier(MPI_COMM_WORLD));
    if (mx_rank == 0) {
        printf("---------------------------------------------------------------------------\n");
        printf("                    Ring SEND latency (rdma-direct, MPI mesh)\n");
        printf("---------------------------------------------------------------------------\n");
        mx_report_machine();
    }
    for (k = 0; k < warmup + iters; k++) {
        double lat;
        if (mx_rank == 0) {
            double t0 = mx_now_us();
            send_ping(&r, k);
            lat = recv_ping(&r, k);
            if (k >= warmup) {
                trip[k - warmup] = mx_now_us() - t0;
            }
        } else {
            lat = recv_ping(&r, k);
            send_ping(&r, k);
        }
        if (k >= warmup) {
            hop[k - warmup] = lat;
        }
    }
    qsort(hop, iters, sizeof(*hop), mx_cmp_double);
    mine[0] = hop[0];
    mine[1] = mx_quantile(hop, iters, 0.5);
    mine[2] = mx_quantile(hop, iters, 0.99);
    if (mx_rank == 0) {
        all = calloc((size_t)mx_size * 3, sizeof(*all));
        if (all == NULL) {
            mx_die("out of memory");
        }
    }
    MX_MPI(MPI_Gather(mine, 3, MPI_DOUBLE, all, 3, MPI_DOUBLE, 0, MPI_COMM_WORLD));
    mx_report_setup(&m);
    if (mx_rank == 0) {
        double *med = calloc((size_t)mx_size, sizeof(*med));
        int i;
        if (med == NULL) {
            mx_die("out of memory");
        }
        printf(" pings                    : %lu bytes, %lu round trips after %lu warm-up\n", size,
               iters, warmup);
        printf("---------------------------------------------------------------------------\n");
        printf(" %-6s %-10s %-14s %-14s %-14s\n", "rank", "from", "t_min[usec]", "t_median[usec]",
               "t_p99[usec]");
        for (i = 0; i < mx_size; i++) {
            printf(" %-6d %-10d %-14.2f %-14.2f %-14.2f\n", i, (i + mx_size - 1) % mx_size,
                   all[3 * i], all[3 * i + 1], all[3 * i + 2]);
            med[i] = all[3 * i + 1];
        }
        qsort(med, (size_t)mx_size, sizeof(*med), mx_cmp_double);
        qsort(trip, iters, sizeof(*trip), mx_cmp_double);
        printf("---------------------------------------------------------------------------\n");
        printf(" one-way hop latency, per-rank medians over %d ranks: min %.2f / median %.2f / "
               "p99 %.2f usec\n",
               mx_size, med[0], mx_quantile(med, (size_t)mx_size, 0.5),
               mx_quantile(med, (size_t)mx_size, 0.99));
        printf(" ring round trip (rank 0): median %.2f usec, %.2f usec per hop; p99 %.2f usec\n",
               mx_quantile(trip, iters, 0.5), mx_quantile(trip, iters, 0.5) / mx_size,
               mx_quantile(trip, iters, 0.99));
        printf(" every ping checked (length, iteration, sender, payload): OK\n");
        free(med);
        free(all);
    }
    free(hop);
    free(trip);
    mx_close(&m);
    MPI_Finalize();
    return 0;
}
