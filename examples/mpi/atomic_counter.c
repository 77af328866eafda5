/*
 * atomic_counter: a shared counter in rank 0's memory, incremented by
 * every rank with RDMA FETCH_AND_ADD over a full mesh built with
 * rdd_mesh_create (MPI_Allgather as its allgather), on the cross-process
 * software fabric or a kernel RDMA device (--device, mesh.h).
 *
 * Every rank runs `--count` FETCH_AND_ADDs of 1 on one 8-byte word of
 * rank 0's published region, keeping up to `--window` of them
 * outstanding; each fetched (original) value lands in its own slot of a
 * local results region. Ranks 1..n-1 use their mesh QP towards rank 0;
 * rank 0 uses a loopback pair of QPs on its own device (a QP connected
 * to another QP of the same device), so its atomics are executed by the
 * same device thread, on the same word, as everyone else's.
 *
 * Checks, all of which must hold (exit 1 on every rank otherwise):
 * - rank 0: the counter equals size * count exactly;
 * - every rank: its fetched values strictly increase (its atomics run in
 *   the order it posted them, and others only add);
 * - rank 0, with every rank's values gathered: together they are exactly
 *   0 .. size * count - 1, each once (no increment lost or doubled).
 * Rank 0 prints "verdict: PASS" or "verdict: FAIL"; a failed completion
 * or one that does not come within `--timeout` seconds aborts the job.
 *
 * Build (after scripts/install.sh into a prefix on PKG_CONFIG_PATH):
 *     mpicc -std=c11 -O2 atomic_counter.c $(pkg-config --cflags --libs --static rdma-direct) \
 *         -o atomic_counter
 * Run:
 *     mpirun -np 4 ./atomic_counter [--wait MODE] [--count N] [--window W] [--timeout S]
 * Defaults: 10000 atomics per rank, 16 outstanding, 30 s per wait.
 */
#define _POSIX_C_SOURCE 200809L

#include "mesh.h"

#define MAX_WINDOW 64u
#define MAX_COUNT 1000000ul

/* The QP this rank issues its atomics on, and where they complete. */
struct issuer {
    rdd_qp *qp;
    struct mx_cq cq;
    /* Rank 0's loopback pair (NULL elsewhere): `pair` lists both QPs. */
    rdd_qp *peer;
    rdd_qp *pair[2];
};

/* Rank 0: two QPs of its own device connected to each other; the second
 * executes the first's atomics on the region. */
static void loopback(struct mx_mesh *m, struct issuer *is, uint32_t window)
{
    rdd_qp_init init = {window, 1, 1, 1, 0, 0};
    rdd_connect_attr req, resp;
    rdd_qp_info ia, ib;
    uint32_t depth = 0;
    rdd_qp_init both[2];
    both[0] = init;
    both[1] = init;
    MX_TRY(rdd_device_cq_depth_for(m->dev, both, 2, &depth));
    MX_TRY(rdd_cq_create(m->dev, depth, &is->cq.cq));
    MX_TRY(rdd_qp_create(m->pd, is->cq.cq, is->cq.cq, &init, &is->qp));
    MX_TRY(rdd_qp_create(m->pd, is->cq.cq, is->cq.cq, &init, &is->peer));
    is->pair[0] = is->qp;
    is->pair[1] = is->peer;
    is->cq.qps = is->pair;
    is->cq.n = 2;
    memset(&req, 0, sizeof(req));
    req.rnr_retry = 7;
    req.retry_cnt = 7;
    resp = req;
    resp.access = RDD_ACCESS_REMOTE_ATOMIC;
    MX_TRY(rdd_qp_query_info(is->qp, &ia));
    MX_TRY(rdd_qp_query_info(is->peer, &ib));
    MX_TRY(rdd_qp_connect(is->qp, &ib, &req));
    MX_TRY(rdd_qp_connect(is->peer, &ia, &resp));
}

int main(int argc, char **argv)
{
    unsigned long count = 10000, window = 16, timeout_s = 30, i;
    uint64_t target_addr, *results, *all = NULL, counter = 0;
    uint32_t target_rkey;
    struct mx_mesh m;
    struct mx_config cfg;
    struct issuer is;
    rdd_wc wc[MAX_WINDOW];
    unsigned long posted = 0, done = 0;
    double t0, us, slowest = 0.0;
    int ok = 1, all_ok = 0, a;

    mx_init(&argc, &argv, "atomic_counter", 2);
    for (a = 1; a < argc; a++) {
        if (mx_common_arg(argc, argv, &a)) {
            continue;
        } else if (strcmp(argv[a], "--count") == 0) {
            count = mx_number("--count", argv[++a], 1, MAX_COUNT);
        } else if (strcmp(argv[a], "--window") == 0) {
            window = mx_number("--window", argv[++a], 1, MAX_WINDOW);
        } else if (strcmp(argv[a], "--timeout") == 0) {
            timeout_s = mx_number("--timeout", argv[++a], 1, 3600);
        } else {
            mx_usage(MX_COMMON_USAGE " [--count N] [--window W] [--timeout S]");
        }
    }
    memset(&cfg, 0, sizeof(cfg));
    cfg.region_len = 64; /* the counter is its first word */
    cfg.region_access = RDD_ACCESS_LOCAL_WRITE | RDD_ACCESS_REMOTE_ATOMIC;
    cfg.local_len = count * sizeof(uint64_t);
    cfg.connect_access = RDD_ACCESS_REMOTE_ATOMIC;
    cfg.qp = (rdd_qp_init){(uint32_t)window, 1, 1, 1, 0, 0};
    mx_open(&m, &cfg);
    results = (uint64_t *)(void *)m.local_buf;

    memset(&is, 0, sizeof(is));
    if (mx_rank == 0) {
        loopback(&m, &is, (uint32_t)window);
        target_addr = (uint64_t)(uintptr_t)m.region_buf;
        MX_TRY(rdd_mr_rkey(m.region, &target_rkey));
        /* The counter starts at 0; nobody touches it before the barrier. */
        __atomic_store_n((uint64_t *)(void *)m.region_buf, 0, __ATOMIC_RELAXED);
    } else {
        is.qp = m.qp[0];
        is.cq = m.scq;
        target_addr = m.peer_region[0].addr;
        target_rkey = m.peer_region[0].rkey;
    }
    for (i = 0; i < count; i++) {
        results[i] = UINT64_MAX;
    }
    if (mx_rank == 0) {
        printf("---------------------------------------------------------------------------\n");
        printf("               Shared counter by RDMA FETCH_AND_ADD (rdma-direct, MPI mesh)\n");
        printf("---------------------------------------------------------------------------\n");
        mx_report_machine();
    }
    MX_MPI(MPI_Barrier(MPI_COMM_WORLD));

    t0 = mx_now_us();
    while (done < count) {
        while (posted < count && posted - done < window) {
            rdd_status s = rdd_qp_fetch_add(is.qp, posted,
                                            (uint64_t)(uintptr_t)&results[posted], m.local_lkey,
                                            target_addr, target_rkey, 1, RDD_SEND_SIGNALED);
            if (s != RDD_STATUS_OK) {
                mx_fail("rdd_qp_fetch_add", s);
            }
            posted++;
        }
        /* At least one completion, within the deadline; then whatever else is there. */
        mx_wait(&is.cq, wc, 1, timeout_s * 1e6, "a FETCH_AND_ADD");
        if (wc[0].wr_id != done) {
            mx_die("a FETCH_AND_ADD completed out of order");
        }
        done++;
    }
    us = mx_now_us() - t0;
    MX_MPI(MPI_Allreduce(&us, &slowest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD));
    /* Every rank's atomics have completed: the counter is final. */
    MX_MPI(MPI_Barrier(MPI_COMM_WORLD));

    for (i = 1; i < count; i++) {
        if (results[i] <= results[i - 1]) {
            fprintf(stderr,
                    "atomic_counter[%d]: fetched values do not strictly increase: #%lu = %llu, "
                    "#%lu = %llu\n",
                    mx_rank, i - 1, (unsigned long long)results[i - 1], i,
                    (unsigned long long)results[i]);
            ok = 0;
            break;
        }
    }
    if (mx_rank == 0) {
        all = calloc((size_t)mx_size * count, sizeof(*all));
        if (all == NULL) {
            mx_die("out of memory");
        }
    }
    MX_MPI(MPI_Gather(results, (int)count, MPI_UINT64_T, all, (int)count, MPI_UINT64_T, 0,
                      MPI_COMM_WORLD));
    mx_report_setup(&m);
    if (mx_rank == 0) {
        uint64_t expect = (uint64_t)mx_size * count, k, *seen;
        counter = __atomic_load_n((uint64_t *)(void *)m.region_buf, __ATOMIC_ACQUIRE);
        printf(" atomics                  : %lu FETCH_AND_ADD of 1 per rank, %lu outstanding "
               "(rank 0 on a loopback QP pair)\n",
               count, window);
        printf(" rate                     : %.4f M atomics/s aggregate, %.2f usec per atomic "
               "per rank\n",
               (double)expect / slowest, slowest / (double)count);
        printf(" counter                  : %llu, expected %llu (size %d x %lu)\n",
               (unsigned long long)counter, (unsigned long long)expect, mx_size, count);
        if (counter != expect) {
            fprintf(stderr, "atomic_counter[0]: the counter is %llu, not %llu\n",
                    (unsigned long long)counter, (unsigned long long)expect);
            ok = 0;
        }
        /* Every value 0..expect-1 fetched exactly once, by some rank. */
        seen = calloc((size_t)expect, sizeof(*seen));
        if (seen == NULL) {
            mx_die("out of memory");
        }
        for (k = 0; k < expect; k++) {
            uint64_t v = all[k];
            if (v >= expect || seen[v]++ != 0) {
                fprintf(stderr,
                        "atomic_counter[0]: rank %llu's atomic #%llu fetched %llu: %s\n",
                        (unsigned long long)(k / count), (unsigned long long)(k % count),
                        (unsigned long long)v, v >= expect ? "out of range" : "fetched twice");
                ok = 0;
                break;
            }
        }
        free(seen);
        free(all);
    }
    MX_MPI(MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD));
    if (mx_rank == 0) {
        printf(" fetched values           : %s\n",
               all_ok ? "strictly increasing on every rank, each of 0..size*count-1 once"
                      : "WRONG (see the messages above)");
        printf("---------------------------------------------------------------------------\n");
        printf(" verdict: %s\n", all_ok ? "PASS" : "FAIL");
        fflush(stdout);
    }
    if (is.peer != NULL) {
        MX_TRY(rdd_qp_destroy(is.qp));
        MX_TRY(rdd_qp_destroy(is.peer));
        MX_TRY(rdd_cq_destroy(is.cq.cq));
    }
    mx_close(&m);
    MPI_Finalize();
    return all_ok ? 0 : 1;
}
