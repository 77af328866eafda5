/*
 * C11 real-threads test of the submission service, run plain, under
 * ASan+UBSan, and under ThreadSanitizer (`make check-tsan`): four worker
 * threads submit RDMA WRITEs and reap their own completions, one
 * poll-mode thread drains and completes, a second would-be poller keeps
 * calling rdd_submit_drain (each call either runs or is refused with
 * RESOURCE_BUSY) and reads the counters, and the device runs on its own
 * thread. Every WRITE must complete once, in its worker's order, with
 * the bytes at the target.
 */
#define _POSIX_C_SOURCE 200809L

#include <pthread.h>
#include <time.h>

#include "submit_env.h"

#define WORKERS 4
#define PER_WORKER 1500u
#define CHUNK 64u

/* Each field is written by one thread only and read after the joins. */
struct shared {
    struct env *e;
    rdd_submit_service *svc;
    int poll_failures;  /* the poller's */
    int rogue_failures; /* the second poller's */
    unsigned long busy_seen, rogue_ok;
};

struct worker {
    struct shared *sh;
    unsigned idx;
    int failed;
    unsigned long sq_full;
};

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void *worker_main(void *arg)
{
    struct worker *w = (struct worker *)arg;
    struct env *e = w->sh->e;
    rdd_submitter *sub;
    rdd_submit_completion c[32];
    uint64_t next = 0, done = 0;
    double deadline = now_s() + 60.0;

    if (rdd_submit_register(w->sh->svc, &sub) != RDD_STATUS_OK) {
        w->failed = 1;
        return NULL;
    }
    while (done < PER_WORKER && now_s() < deadline) {
        size_t n = 0, i, bad;
        while (next < PER_WORKER) {
            size_t off = ((size_t)w->idx * PER_WORKER + next) * CHUNK;
            rdd_submit_desc d = desc_at(e, next, off, (uint32_t)(1 + (off / CHUNK) % CHUNK));
            /* The worker writes its own source bytes first: the device
             * reads them after the ring and the post publish them. */
            memset(e->s + off, (int)(0x11 * (w->idx + 1)) ^ (int)(next & 0xff), d.length);
            rdd_status s = rdd_submit_post(sub, &d, 1, &bad);
            if (s == RDD_STATUS_SQ_FULL) {
                w->sq_full++;
                break;
            }
            if (s != RDD_STATUS_OK) {
                w->failed = 2;
                break;
            }
            next++;
        }
        if (rdd_submit_reap(sub, c, 32, &n) != RDD_STATUS_OK) {
            w->failed = 3;
            break;
        }
        for (i = 0; i < n; i++) {
            if (c[i].wr_id != done || c[i].status != RDD_WC_SUCCESS) {
                w->failed = 4;
            }
            done++;
        }
        if (w->failed) {
            break;
        }
    }
    if (done != PER_WORKER) {
        w->failed = w->failed ? w->failed : 5;
    }
    if (rdd_submit_unregister(sub) != RDD_STATUS_OK) {
        w->failed = 6;
    }
    return NULL;
}

static void *poller_main(void *arg)
{
    struct shared *sh = (struct shared *)arg;
    size_t total = 0;
    double deadline = now_s() + 60.0;
    while (total < (size_t)WORKERS * PER_WORKER && now_s() < deadline) {
        size_t posted = 0, n = 0;
        rdd_status s = rdd_submit_drain(sh->svc, &posted);
        if (s != RDD_STATUS_OK && s != RDD_STATUS_RESOURCE_BUSY) {
            sh->poll_failures++;
            break;
        }
        s = rdd_submit_complete(sh->svc, &n);
        if (s == RDD_STATUS_OK) {
            total += n;
        } else if (s != RDD_STATUS_RESOURCE_BUSY) {
            sh->poll_failures++;
            break;
        }
    }
    if (total != (size_t)WORKERS * PER_WORKER) {
        sh->poll_failures++;
    }
    return NULL;
}

/* A second would-be poller: each of its calls either runs (the first
 * poller was between calls) or is refused with RESOURCE_BUSY. It also
 * reads the counters, which only ever grow. Stops after a fixed number of
 * tries. */
static void *rogue_main(void *arg)
{
    struct shared *sh = (struct shared *)arg;
    uint64_t last_submitted = 0, last_completed = 0;
    unsigned i;
    for (i = 0; i < 20000; i++) {
        size_t n = 0;
        rdd_submit_counters k;
        rdd_status s = rdd_submit_drain(sh->svc, &n);
        if (s == RDD_STATUS_RESOURCE_BUSY) {
            sh->busy_seen++;
        } else if (s == RDD_STATUS_OK) {
            sh->rogue_ok++;
        } else {
            sh->rogue_failures++;
        }
        if (rdd_submit_stats(sh->svc, &k) != RDD_STATUS_OK || k.submitted < last_submitted ||
            k.completed < last_completed) {
            sh->rogue_failures++;
        }
        last_submitted = k.submitted;
        last_completed = k.completed;
    }
    return NULL;
}

static void test_threads(void)
{
    struct env e;
    struct shared sh;
    struct worker w[WORKERS];
    pthread_t tw[WORKERS], tp, tr;
    rdd_submit_config cfg;
    rdd_submit_counters k;
    size_t i, j;

    env_open(&e, 256, 1);
    memset(&cfg, 0, sizeof(cfg));
    cfg.max_outstanding = 256;
    memset(&sh, 0, sizeof(sh));
    sh.e = &e;
    sh.svc = svc_create(&e, &cfg);
    MUST(rdd_device_start(e.dev));
    CHECK_EQ(pthread_create(&tp, NULL, poller_main, &sh), 0);
    CHECK_EQ(pthread_create(&tr, NULL, rogue_main, &sh), 0);
    for (i = 0; i < WORKERS; i++) {
        memset(&w[i], 0, sizeof(w[i]));
        w[i].sh = &sh;
        w[i].idx = (unsigned)i;
        CHECK_EQ(pthread_create(&tw[i], NULL, worker_main, &w[i]), 0);
    }
    for (i = 0; i < WORKERS; i++) {
        CHECK_EQ(pthread_join(tw[i], NULL), 0);
        CHECK_EQ(w[i].failed, 0);
    }
    CHECK_EQ(pthread_join(tp, NULL), 0);
    CHECK_EQ(pthread_join(tr, NULL), 0);
    CHECK_EQ(sh.poll_failures, 0);
    CHECK_EQ(sh.rogue_failures, 0);
    /* Stopping the device joins its thread: its writes happen before the
     * checks below. */
    MUST(rdd_device_stop(e.dev));
    for (i = 0; i < WORKERS; i++) {
        for (j = 0; j < PER_WORKER; j++) {
            size_t off = (i * PER_WORKER + j) * CHUNK;
            size_t len = 1 + (off / CHUNK) % CHUNK;
            if (memcmp(e.d + off, e.s + off, len) != 0) {
                CHECK_BYTES(e.d + off, e.s + off, len);
                break;
            }
        }
    }
    k = counters(sh.svc);
    CHECK_EQ(k.submitted, (uint64_t)WORKERS * PER_WORKER);
    CHECK_EQ(k.posted, (uint64_t)WORKERS * PER_WORKER);
    CHECK_EQ(k.completed, (uint64_t)WORKERS * PER_WORKER);
    CHECK_EQ(k.reaped, (uint64_t)WORKERS * PER_WORKER);
    CHECK(k.doorbells <= k.posted);
    printf("test_threads: %u WRITEs from %d workers, %llu doorbells, %lu second-poller calls "
           "refused (RESOURCE_BUSY), %lu ran\n",
           WORKERS * PER_WORKER, WORKERS, (unsigned long long)k.doorbells, sh.busy_seen,
           sh.rogue_ok);
    MUST(rdd_submit_destroy(sh.svc));
    env_close(&e);
}

int main(void)
{
    test_threads();
    return h_finish("test_submit_threads");
}
