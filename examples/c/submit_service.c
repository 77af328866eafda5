/*
 * submit_service: a DPDK-style poll-mode service with the rdma-direct C API.
 *
 * N worker threads submit RDMA WRITEs of a given size into one submission
 * service (rdd_submit_*). One poll-mode thread owns the QP pair: it drains
 * the submission ring in batches, posts each batch with one doorbell,
 * polls the CQ and routes every completion back to the worker that
 * submitted it. The workers reap their own completions. At the end every
 * WRITE has completed, the bytes at the target are checked, and the
 * program prints the per-stage counters and the latency from submission to
 * reaped completion.
 *
 * Build (from the repository root, after `cargo build --release`):
 *
 *     cc -std=c11 -O2 examples/c/submit_service.c -Iinclude \
 *         target/release/librdma_direct.a -lpthread -ldl -lm -o submit_service
 *
 * Run: ./submit_service [writes per worker] [bytes per write] [--step]
 *                       [--workers N] [--depth D]
 *   --step     the poll-mode thread also runs the device (rdd_device_step)
 *              instead of the device's own thread
 *   --workers  submitting threads (default 4, at most 64)
 *   --depth    WRITEs each worker keeps in flight at most (default 16, at
 *              most RDD_SUBMIT_COMPLETION_RING_SIZE); the latency is
 *              mostly queueing once the workers together keep more in
 *              flight than the device completes in that time
 */
#define _POSIX_C_SOURCE 200809L

#include <rdma_direct.h>

#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define MAX_WORKERS 64
#define MAX_BYTES 65536u
#define MAX_TOTAL (256u << 20) /* bytes written in all */

static void fail(const char *call, rdd_status s)
{
    char msg[160];
    size_t n = 0;
    if (rdd_status_str((uint32_t)s, msg, sizeof(msg), &n) != RDD_STATUS_OK) {
        strcpy(msg, "?");
    }
    fprintf(stderr, "submit_service: %s: %s (status %u)\n", call, msg, (unsigned)s);
    exit(1);
}

#define TRY(call)                                                                        \
    do {                                                                                 \
        rdd_status try_s_ = (call);                                                      \
        if (try_s_ != RDD_STATUS_OK) {                                                   \
            fail(#call, try_s_);                                                         \
        }                                                                                \
    } while (0)

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* What every thread reads; written before the threads start. */
static struct {
    rdd_device *dev;
    rdd_submit_service *svc;
    uint8_t *src, *dst;
    uint32_t lkey, rkey;
    unsigned long per_worker;
    uint32_t bytes;
    int step_mode;
    unsigned workers;
    unsigned long depth;
} g;

/* One worker's state: its latencies (submission to reaped completion) and
 * its back-pressure count. Each worker writes only its own. */
struct worker {
    pthread_t thread;
    unsigned idx;
    uint64_t *submitted_at; /* per write, by wr_id */
    uint64_t *latency_ns;
    unsigned long sq_full;
};

/* A worker's WRITE i goes from and to offset (idx * per_worker + i) * bytes. */
static size_t offset_of(unsigned idx, unsigned long i)
{
    return ((size_t)idx * g.per_worker + i) * g.bytes;
}

static void *worker_main(void *arg)
{
    struct worker *w = (struct worker *)arg;
    rdd_submitter *sub;
    unsigned long next = 0, done = 0;

    TRY(rdd_submit_register(g.svc, &sub));
    while (done < g.per_worker) {
        rdd_submit_completion c[64];
        size_t n = 0, i, bad;
        int progress = 0;
        while (next < g.per_worker && next - done < g.depth) {
            size_t off = offset_of(w->idx, next);
            rdd_submit_desc d;
            rdd_status s;
            memset(&d, 0, sizeof(d));
            d.wr_id = next;
            d.local_addr = (uint64_t)(uintptr_t)(g.src + off);
            d.remote_addr = (uint64_t)(uintptr_t)(g.dst + off);
            d.length = g.bytes;
            d.lkey = g.lkey;
            d.rkey = g.rkey;
            d.opcode = RDD_WR_RDMA_WRITE;
            w->submitted_at[next] = now_ns();
            s = rdd_submit_post(sub, &d, 1, &bad);
            if (s == RDD_STATUS_SQ_FULL) {
                w->sq_full++; /* back-pressure: reap, then submit again */
                break;
            }
            TRY(s);
            next++;
            progress = 1;
        }
        TRY(rdd_submit_reap(sub, c, 64, &n));
        if (n > 0) {
            uint64_t t = now_ns();
            for (i = 0; i < n; i++) {
                if (c[i].status != RDD_WC_SUCCESS || c[i].wr_id != done) {
                    fprintf(stderr, "submit_service: worker %u: write %llu: status %u (expected "
                                    "write %lu, success)\n",
                            w->idx, (unsigned long long)c[i].wr_id, c[i].status, done);
                    exit(1);
                }
                w->latency_ns[done] = t - w->submitted_at[done];
                done++;
            }
            progress = 1;
        }
        if (!progress) {
            sched_yield();
        }
    }
    TRY(rdd_submit_unregister(sub));
    return NULL;
}

/* The poll-mode thread: drains, posts, polls and routes until every
 * WRITE has completed; in step mode it runs the device too. */
static void *poller_main(void *arg)
{
    unsigned long total = g.per_worker * g.workers, done = 0;
    (void)arg;
    while (done < total) {
        size_t posted = 0, n = 0, work = 0;
        TRY(rdd_submit_drain(g.svc, &posted));
        if (g.step_mode) {
            TRY(rdd_device_step(g.dev, &work));
        }
        TRY(rdd_submit_complete(g.svc, &n));
        done += n;
        if (posted == 0 && n == 0 && work == 0) {
            sched_yield();
        }
    }
    return NULL;
}

static int cmp_u64(const void *x, const void *y)
{
    uint64_t a = *(const uint64_t *)x, b = *(const uint64_t *)y;
    return (a > b) - (a < b);
}

int main(int argc, char **argv)
{
    rdd_pd *pd;
    rdd_cq *cq[2];
    rdd_qp *qp[2];
    rdd_mr *src_mr, *dst_mr;
    rdd_qp_init init;
    rdd_qp_info info[2];
    rdd_connect_attr attr;
    rdd_submit_config cfg;
    rdd_submit_counters k;
    struct worker *w;
    pthread_t poller;
    uint64_t start, elapsed, *all;
    unsigned long total, i, bad_bytes = 0, sq_full = 0;
    size_t len, x;
    void *addr;
    int argi, pos = 0;
    unsigned j;

    g.per_worker = 10000;
    g.bytes = 64;
    g.workers = 4;
    g.depth = 16;
    for (argi = 1; argi < argc; argi++) {
        if (strcmp(argv[argi], "--step") == 0) {
            g.step_mode = 1;
        } else if (strcmp(argv[argi], "--workers") == 0 && argi + 1 < argc) {
            g.workers = (unsigned)strtoul(argv[++argi], NULL, 10);
        } else if (strcmp(argv[argi], "--depth") == 0 && argi + 1 < argc) {
            g.depth = strtoul(argv[++argi], NULL, 10);
        } else if (pos == 0) {
            g.per_worker = strtoul(argv[argi], NULL, 10);
            pos++;
        } else {
            g.bytes = (uint32_t)strtoul(argv[argi], NULL, 10);
        }
    }
    total = g.per_worker * g.workers;
    if (g.per_worker == 0 || g.bytes == 0 || g.bytes > MAX_BYTES || g.workers == 0 ||
        g.workers > MAX_WORKERS || g.depth == 0 || g.depth > RDD_SUBMIT_COMPLETION_RING_SIZE ||
        total * g.bytes > MAX_TOTAL) {
        fprintf(stderr,
                "usage: %s [writes per worker > 0] [bytes 1..%u] [--step] [--workers 1..%d]\n"
                "       [--depth 1..%d] (at most %u MiB written in all)\n",
                argv[0], MAX_BYTES, MAX_WORKERS, RDD_SUBMIT_COMPLETION_RING_SIZE,
                MAX_TOTAL >> 20);
        return 2;
    }
    len = (size_t)total * g.bytes;

    /* The QP pair: qp[0] is the service's, qp[1] the target that lets it
     * write into dst. */
    TRY(rdd_device_open_soft(NULL, &g.dev));
    TRY(rdd_pd_alloc(g.dev, &pd));
    memset(&init, 0, sizeof(init));
    init.max_send_wr = 256;
    init.max_recv_wr = 1;
    init.max_send_sge = 1;
    init.max_recv_sge = 1;
    for (j = 0; j < 2; j++) {
        TRY(rdd_cq_create(g.dev, 1024, &cq[j]));
        TRY(rdd_qp_create(pd, cq[j], cq[j], &init, &qp[j]));
    }
    TRY(rdd_mr_reg(pd, len, RDD_ACCESS_LOCAL_WRITE, &src_mr));
    TRY(rdd_mr_reg(pd, len, RDD_ACCESS_LOCAL_WRITE | RDD_ACCESS_REMOTE_WRITE, &dst_mr));
    TRY(rdd_mr_addr(src_mr, &addr));
    g.src = (uint8_t *)addr;
    TRY(rdd_mr_addr(dst_mr, &addr));
    g.dst = (uint8_t *)addr;
    TRY(rdd_mr_lkey(src_mr, &g.lkey));
    TRY(rdd_mr_rkey(dst_mr, &g.rkey));
    for (x = 0; x < len; x++) {
        g.src[x] = (uint8_t)(x * 131u + (x >> 11) + 1u);
    }
    TRY(rdd_qp_query_info(qp[0], &info[0]));
    TRY(rdd_qp_query_info(qp[1], &info[1]));
    memset(&attr, 0, sizeof(attr));
    attr.access = RDD_ACCESS_REMOTE_WRITE;
    attr.rnr_retry = 7;
    attr.retry_cnt = 7;
    TRY(rdd_qp_connect(qp[0], &info[1], NULL));
    TRY(rdd_qp_connect(qp[1], &info[0], &attr));

    /* The service: up to 256 WRITEs on the QP (its send queue), batches
     * of up to 32 (one doorbell each). */
    memset(&cfg, 0, sizeof(cfg));
    cfg.max_outstanding = 256;
    cfg.max_batch = 32;
    TRY(rdd_submit_create(qp[0], cq[0], &cfg, &g.svc));
    if (!g.step_mode) {
        TRY(rdd_device_start(g.dev));
    }

    w = (struct worker *)calloc(g.workers, sizeof(*w));
    all = (uint64_t *)malloc(total * sizeof(*all));
    if (w == NULL || all == NULL) {
        fprintf(stderr, "submit_service: out of memory\n");
        return 1;
    }
    for (j = 0; j < g.workers; j++) {
        w[j].idx = j;
        w[j].submitted_at = (uint64_t *)malloc(g.per_worker * sizeof(uint64_t));
        w[j].latency_ns = (uint64_t *)malloc(g.per_worker * sizeof(uint64_t));
        if (w[j].submitted_at == NULL || w[j].latency_ns == NULL) {
            fprintf(stderr, "submit_service: out of memory\n");
            return 1;
        }
    }

    start = now_ns();
    if (pthread_create(&poller, NULL, poller_main, NULL) != 0) {
        fprintf(stderr, "submit_service: pthread_create failed\n");
        return 1;
    }
    for (j = 0; j < g.workers; j++) {
        if (pthread_create(&w[j].thread, NULL, worker_main, &w[j]) != 0) {
            fprintf(stderr, "submit_service: pthread_create failed\n");
            return 1;
        }
    }
    for (j = 0; j < g.workers; j++) {
        pthread_join(w[j].thread, NULL);
    }
    pthread_join(poller, NULL);
    elapsed = now_ns() - start;
    if (!g.step_mode) {
        TRY(rdd_device_stop(g.dev)); /* joins the device thread */
    }

    /* Every byte of every WRITE, at the target. */
    for (x = 0; x < len; x++) {
        bad_bytes += g.dst[x] != g.src[x];
    }
    TRY(rdd_submit_stats(g.svc, &k));

    for (j = 0, i = 0; j < g.workers; j++) {
        memcpy(all + i, w[j].latency_ns, g.per_worker * sizeof(uint64_t));
        i += g.per_worker;
        sq_full += w[j].sq_full;
    }
    qsort(all, total, sizeof(*all), cmp_u64);

    printf("submit_service: %lu RDMA WRITEs of %u bytes from %u worker thread%s in %.3f s "
           "(%.2f M writes/s, %s mode)\n",
           total, g.bytes, g.workers, g.workers == 1 ? "" : "s", (double)elapsed / 1e9,
           (double)total / ((double)elapsed / 1e3), g.step_mode ? "step" : "thread");
    printf("submit_service: measured: latency from rdd_submit_post to the completion reaped by\n"
           "submit_service:   the same worker (ring, drain, post, device, CQ poll, routing, reap)\n"
           "submit_service:   with each worker keeping up to %lu WRITEs in flight, the wall time\n"
           "submit_service:   of the whole run, and the per-stage counters of the service\n",
           g.depth);
    printf("submit_service: device: the in-process software HCA (memory copies, no network and\n"
           "submit_service:   no NIC), %s\n",
           g.step_mode ? "stepped by the poll-mode thread" : "on its own busy-polling thread");
    {
        long cores = sysconf(_SC_NPROCESSORS_ONLN);
        unsigned pollers = g.workers + 1 + (g.step_mode ? 0u : 1u);
        printf("submit_service: %ld cores available, %u busy-polling threads (%u worker%s, the "
               "poll-mode thread%s; idle ones call sched_yield)\n",
               cores, pollers, g.workers, g.workers == 1 ? "" : "s",
               g.step_mode ? "" : ", the device thread");
        if (cores > 0 && (long)pollers > cores) {
            printf("submit_service: WARNING: more busy-polling threads than cores: the figures\n"
                   "submit_service:   include scheduler hand-offs and vary widely between runs\n");
        }
    }
    printf("submit_service: counters: submitted %llu, refused (ring full) %llu, refused (no "
           "credit) %llu,\n"
           "submit_service:   drained %llu, posted %llu, doorbells %llu (%.1f WRITEs each), "
           "QP full %llu,\n"
           "submit_service:   completed %llu (failed %llu), reaped %llu\n",
           (unsigned long long)k.submitted, (unsigned long long)k.refused_ring_full,
           (unsigned long long)k.refused_no_credit, (unsigned long long)k.drained,
           (unsigned long long)k.posted, (unsigned long long)k.doorbells,
           k.doorbells ? (double)k.posted / (double)k.doorbells : 0.0,
           (unsigned long long)k.qp_full, (unsigned long long)k.completed,
           (unsigned long long)k.failed, (unsigned long long)k.reaped);
    printf("submit_service: submit -> reaped latency us: min %.2f  median %.2f  p99 %.2f  max "
           "%.2f\n",
           (double)all[0] / 1e3, (double)all[total / 2] / 1e3,
           (double)all[total - 1 - total / 100] / 1e3, (double)all[total - 1] / 1e3);
    if (bad_bytes != 0 || k.completed != total || k.reaped != total || k.failed != 0 ||
        k.submitted != total || sq_full != k.refused_ring_full + k.refused_no_credit) {
        fprintf(stderr, "submit_service: FAILED: %lu wrong bytes at the target, counters above\n",
                bad_bytes);
        return 1;
    }
    printf("submit_service: every WRITE completed once, at its worker, in order; all %zu bytes "
           "checked at the target\n",
           len);

    TRY(rdd_submit_destroy(g.svc));
    for (j = 0; j < 2; j++) {
        TRY(rdd_qp_destroy(qp[j]));
        TRY(rdd_cq_destroy(cq[j]));
    }
    TRY(rdd_mr_free(src_mr));
    TRY(rdd_mr_free(dst_mr));
    TRY(rdd_pd_free(pd));
    TRY(rdd_device_close(g.dev));
    for (j = 0; j < g.workers; j++) {
        free(w[j].submitted_at);
        free(w[j].latency_ns);
    }
    free(w);
    free(all);
    return 0;
}
