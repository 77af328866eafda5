/*
 * C11 tests of the buffer pool (rdd_pool_*) on the software device:
 * pool buffers used for RDMA WRITE and SEND/RECV with their lkey/rkey,
 * explicit size classes and counts, exhaustion, statistics, refused double,
 * foreign and edited frees, destroy with buffers outstanding, bad
 * configurations, NULL and forged handles, huge pages (whichever outcome the
 * machine allows), and threads allocating and freeing at once with every
 * buffer's bytes checked.
 */
#define _POSIX_C_SOURCE 200809L

#include <pthread.h>
#include <stddef.h>

#include "harness.h"

_Static_assert(sizeof(rdd_pool_config) == 48, "rdd_pool_config");
_Static_assert(sizeof(rdd_buf) == 32, "rdd_buf");
_Static_assert(sizeof(rdd_pool_usage) == 48, "rdd_pool_usage");
_Static_assert(sizeof(rdd_pool_class_usage) == 40, "rdd_pool_class_usage");
_Static_assert(offsetof(rdd_buf, token) == 8 && offsetof(rdd_buf, lkey) == 24, "rdd_buf");

static rdd_pool_config cfg_each(uint32_t n, uint32_t min, uint32_t max)
{
    rdd_pool_config c;
    memset(&c, 0, sizeof c);
    c.buffers_per_class = n;
    c.min_size = min;
    c.max_size = max;
    return c;
}

static void fill(const rdd_buf *b, uint8_t seed)
{
    uint32_t i;
    uint8_t *p = (uint8_t *)b->addr;
    for (i = 0; i < b->len; i++) {
        p[i] = (uint8_t)(seed + i * 13u);
    }
}

/* ---- RDMA WRITE and SEND with pool buffers ------------------------------ */

static void poll_one(rdd_device *dev, rdd_cq *cq, rdd_qp *qp, rdd_wc *wc)
{
    size_t n = 0, work = 0;
    unsigned rounds = 0;
    while (n == 0 && rounds++ < 100) {
        MUST(rdd_device_step(dev, &work));
        MUST(rdd_cq_poll(cq, &qp, 1, wc, 1, &n));
    }
    CHECK_EQ(n, 1);
}

static void test_rdma_with_pool_buffers(void)
{
    rdd_device *dev;
    rdd_pd *pd;
    rdd_cq *cq[2];
    rdd_qp *qp[2];
    rdd_qp_info info[2];
    rdd_connect_attr attr;
    rdd_pool *pool;
    rdd_pool_config c = cfg_each(4, 64, 4096);
    rdd_buf src, dst, msg, rx;
    rdd_sge s, d;
    rdd_wr w;
    rdd_recv_wr r;
    rdd_wc wc;
    size_t bad = 0;
    int i;

    MUST(rdd_device_open_soft(NULL, &dev));
    MUST(rdd_pd_alloc(dev, &pd));
    memset(&attr, 0, sizeof attr);
    attr.access = RDD_ACCESS_REMOTE_WRITE;
    attr.rnr_retry = 7;
    attr.retry_cnt = 7;
    for (i = 0; i < 2; i++) {
        MUST(rdd_cq_create(dev, 256, &cq[i]));
        MUST(rdd_qp_create(pd, cq[i], cq[i], NULL, &qp[i]));
        MUST(rdd_qp_query_info(qp[i], &info[i]));
    }
    MUST(rdd_qp_connect(qp[0], &info[1], &attr));
    MUST(rdd_qp_connect(qp[1], &info[0], &attr));

    c.remote_access = RDD_ACCESS_REMOTE_WRITE;
    MUST(rdd_pool_create(pd, &c, &pool));

    /* WRITE: 3000 bytes from one pool buffer into another, by its rkey. */
    MUST(rdd_pool_alloc(pool, 3000, &src));
    MUST(rdd_pool_alloc(pool, 4096, &dst));
    CHECK_EQ(src.capacity, 4096);
    CHECK(src.addr != dst.addr);
    CHECK_EQ(src.lkey, dst.lkey);
    fill(&src, 3);
    s.addr = (uint64_t)(uintptr_t)src.addr;
    s.length = src.len;
    s.lkey = src.lkey;
    memset(&w, 0, sizeof w);
    w.wr_id = 1;
    w.opcode = RDD_WR_RDMA_WRITE;
    w.flags = RDD_SEND_SIGNALED;
    w.sg_list = &s;
    w.num_sge = 1;
    w.remote_addr = (uint64_t)(uintptr_t)dst.addr + 64;
    w.rkey = dst.rkey;
    CHECK_EQ(rdd_qp_post_send(qp[0], &w, 1, &bad), RDD_STATUS_OK);
    poll_one(dev, cq[0], qp[0], &wc);
    CHECK_EQ(wc.status, RDD_WC_SUCCESS);
    CHECK_BYTES((uint8_t *)dst.addr + 64, src.addr, 3000);

    /* SEND into a receive posted on a pool buffer. */
    MUST(rdd_pool_alloc(pool, 200, &msg));
    MUST(rdd_pool_alloc(pool, 256, &rx));
    fill(&msg, 9);
    d.addr = (uint64_t)(uintptr_t)rx.addr;
    d.length = rx.capacity;
    d.lkey = rx.lkey;
    memset(&r, 0, sizeof r);
    r.wr_id = 7;
    r.sg_list = &d;
    r.num_sge = 1;
    CHECK_EQ(rdd_qp_post_recv(qp[1], &r, 1, &bad), RDD_STATUS_OK);
    s.addr = (uint64_t)(uintptr_t)msg.addr;
    s.length = msg.len;
    s.lkey = msg.lkey;
    memset(&w, 0, sizeof w);
    w.wr_id = 2;
    w.opcode = RDD_WR_SEND;
    w.flags = RDD_SEND_SIGNALED;
    w.sg_list = &s;
    w.num_sge = 1;
    CHECK_EQ(rdd_qp_post_send(qp[0], &w, 1, &bad), RDD_STATUS_OK);
    poll_one(dev, cq[1], qp[1], &wc);
    CHECK_EQ(wc.status, RDD_WC_SUCCESS);
    CHECK_EQ(wc.wr_id, 7);
    CHECK_EQ(wc.byte_len, 200);
    CHECK_BYTES(rx.addr, msg.addr, 200);
    poll_one(dev, cq[0], qp[0], &wc);
    CHECK_EQ(wc.wr_id, 2);

    /* Teardown: the pool holds the PD; destroy waits for the buffers. */
    for (i = 0; i < 2; i++) {
        CHECK_EQ(rdd_qp_destroy(qp[i]), RDD_STATUS_OK);
        CHECK_EQ(rdd_cq_destroy(cq[i]), RDD_STATUS_OK);
    }
    CHECK_EQ(rdd_pd_free(pd), RDD_STATUS_RESOURCE_BUSY);
    CHECK_EQ(rdd_pool_destroy(pool), RDD_STATUS_RESOURCE_BUSY);
    CHECK_EQ(rdd_pool_free(pool, &src), RDD_STATUS_OK);
    CHECK_EQ(rdd_pool_free(pool, &dst), RDD_STATUS_OK);
    CHECK_EQ(rdd_pool_free(pool, &msg), RDD_STATUS_OK);
    CHECK_EQ(rdd_pool_destroy(pool), RDD_STATUS_RESOURCE_BUSY);
    CHECK_EQ(rdd_pool_free(pool, &rx), RDD_STATUS_OK);
    CHECK_EQ(rdd_pool_destroy(pool), RDD_STATUS_OK);
    CHECK_EQ(rdd_pd_free(pd), RDD_STATUS_OK);
    CHECK_EQ(rdd_device_close(dev), RDD_STATUS_OK);
}

/* ---- classes, exhaustion, statistics, frees ------------------------------ */

static void test_classes_stats_and_frees(rdd_pd *pd)
{
    static const uint32_t sizes[2] = {4096, 64}; /* any order */
    static const uint32_t counts[2] = {3, 1};    /* smallest class first */
    rdd_pool_config c;
    rdd_pool *pool, *other;
    rdd_buf a, b, x, big, spare, copy;
    rdd_pool_usage u;
    rdd_pool_class_usage cu;

    memset(&c, 0, sizeof c);
    c.num_sizes = 2;
    c.sizes = sizes;
    c.counts = counts;
    MUST(rdd_pool_create(pd, &c, &pool));

    MUST(rdd_pool_stats(pool, &u));
    CHECK_EQ(u.region_bytes, 3 * 64 + 4096);
    CHECK_EQ(u.num_classes, 2);
    CHECK_EQ(u.buffers_in_use, 0);
    CHECK_EQ(u.huge_pages, 0);
    CHECK(u.fragmentation == 0.0);

    /* Lengths outside the classes, and outputs untouched on failure. */
    memset(&spare, 0xab, sizeof spare);
    copy = spare;
    CHECK_EQ(rdd_pool_alloc(pool, 0, &spare), RDD_STATUS_INVALID_ATTRIBUTE);
    CHECK_EQ(rdd_pool_alloc(pool, 4097, &spare), RDD_STATUS_INVALID_ATTRIBUTE);
    CHECK_BYTES(&spare, &copy, sizeof spare);

    MUST(rdd_pool_alloc(pool, 10, &a));
    MUST(rdd_pool_alloc(pool, 64, &b));
    MUST(rdd_pool_alloc(pool, 1, &x));
    CHECK_EQ(a.capacity, 64);
    CHECK_EQ(x.capacity, 64);
    CHECK_EQ((uintptr_t)a.addr % 64, 0);
    /* The 64-byte class is empty: the 4 KiB class serves; then nothing. */
    MUST(rdd_pool_alloc(pool, 1, &big));
    CHECK_EQ(big.capacity, 4096);
    CHECK_EQ((uintptr_t)big.addr % 4096, 0);
    CHECK_EQ(rdd_pool_alloc(pool, 1, &spare), RDD_STATUS_RESOURCE_EXHAUSTED);
    CHECK_BYTES(&spare, &copy, sizeof spare);

    MUST(rdd_pool_stats(pool, &u));
    CHECK_EQ(u.buffers_in_use, 4);
    CHECK_EQ(u.bytes_in_use, 3 * 64 + 4096);
    CHECK_EQ(u.bytes_requested, 10 + 64 + 1 + 1);
    CHECK(u.fragmentation > 0.98 && u.fragmentation < 0.99);
    MUST(rdd_pool_class_stats(pool, 0, &cu));
    CHECK_EQ(cu.size, 64);
    CHECK_EQ(cu.capacity, 3);
    CHECK_EQ(cu.in_use, 3);
    CHECK_EQ(cu.free, 0);
    CHECK_EQ(cu.high_water, 3);
    CHECK_EQ(cu.bytes_requested, 75);
    MUST(rdd_pool_class_stats(pool, 1, &cu));
    CHECK_EQ(cu.size, 4096);
    CHECK_EQ(cu.in_use, 1);
    CHECK_EQ(rdd_pool_class_stats(pool, 2, &cu), RDD_STATUS_INVALID_ARGUMENT);

    /* Double free, stale copy, edited copies, another pool's buffer. */
    CHECK_EQ(rdd_pool_free(pool, &a), RDD_STATUS_OK);
    CHECK_EQ(rdd_pool_free(pool, &a), RDD_STATUS_NO_SUCH_OBJECT);
    MUST(rdd_pool_alloc(pool, 8, &spare)); /* the same slot again (LIFO) */
    CHECK(spare.addr == a.addr);
    CHECK(spare.token != a.token);
    CHECK_EQ(rdd_pool_free(pool, &a), RDD_STATUS_NO_SUCH_OBJECT);
    copy = b;
    copy.addr = (uint8_t *)copy.addr + 64;
    CHECK_EQ(rdd_pool_free(pool, &copy), RDD_STATUS_NO_SUCH_OBJECT);
    copy = b;
    copy.lkey ^= 1;
    CHECK_EQ(rdd_pool_free(pool, &copy), RDD_STATUS_NO_SUCH_OBJECT);
    copy = b;
    copy.token = ~(uint64_t)0;
    CHECK_EQ(rdd_pool_free(pool, &copy), RDD_STATUS_NO_SUCH_OBJECT);
    {
        rdd_pool_config oc = cfg_each(1, 64, 64);
        rdd_buf o;
        MUST(rdd_pool_create(pd, &oc, &other));
        MUST(rdd_pool_alloc(other, 8, &o));
        CHECK_EQ(rdd_pool_free(pool, &o), RDD_STATUS_NO_SUCH_OBJECT);
        CHECK_EQ(rdd_pool_free(other, &b), RDD_STATUS_NO_SUCH_OBJECT);
        CHECK_EQ(rdd_pool_free(other, &o), RDD_STATUS_OK);
        CHECK_EQ(rdd_pool_destroy(other), RDD_STATUS_OK);
        CHECK_EQ(rdd_pool_alloc(other, 8, &o), RDD_STATUS_INVALID_HANDLE);
        CHECK_EQ(rdd_pool_destroy(other), RDD_STATUS_INVALID_HANDLE);
    }
    MUST(rdd_pool_stats(pool, &u));
    CHECK_EQ(u.buffers_in_use, 4);

    CHECK_EQ(rdd_pool_destroy(pool), RDD_STATUS_RESOURCE_BUSY);
    CHECK_EQ(rdd_pool_free(pool, &b), RDD_STATUS_OK);
    CHECK_EQ(rdd_pool_free(pool, &x), RDD_STATUS_OK);
    CHECK_EQ(rdd_pool_free(pool, &big), RDD_STATUS_OK);
    CHECK_EQ(rdd_pool_free(pool, &spare), RDD_STATUS_OK);
    MUST(rdd_pool_stats(pool, &u));
    CHECK_EQ(u.buffers_in_use, 0);
    CHECK_EQ(u.bytes_requested, 0);
    MUST(rdd_pool_class_stats(pool, 0, &cu));
    CHECK_EQ(cu.free, 3);
    CHECK_EQ(cu.high_water, 3);
    CHECK_EQ(rdd_pool_destroy(pool), RDD_STATUS_OK);
}

/* ---- bad arguments and configurations ------------------------------------ */

static void test_bad_arguments(rdd_pd *pd)
{
    static const uint32_t odd[2] = {64, 100};
    rdd_pool_config c = cfg_each(1, 64, 128);
    rdd_pool *pool = NULL;
    rdd_pool *forged = (rdd_pool *)(uintptr_t)0x1234506;
    rdd_buf b;
    rdd_pool_usage u;
    rdd_pool_class_usage cu;

    CHECK_EQ(rdd_pool_create(NULL, &c, &pool), RDD_STATUS_NULL_PARAMETER);
    CHECK_EQ(rdd_pool_create(pd, NULL, &pool), RDD_STATUS_NULL_PARAMETER);
    CHECK_EQ(rdd_pool_create(pd, &c, NULL), RDD_STATUS_NULL_PARAMETER);
    CHECK_EQ(rdd_pool_create((rdd_pd *)(uintptr_t)0x5502, &c, &pool),
             RDD_STATUS_INVALID_HANDLE);

    /* No sizing, two sizings, unknown bits, atomics, NULL sizes. */
    c = cfg_each(0, 0, 0);
    CHECK_EQ(rdd_pool_create(pd, &c, &pool), RDD_STATUS_INVALID_ARGUMENT);
    c = cfg_each(1, 0, 0);
    c.total_bytes = 1 << 20;
    CHECK_EQ(rdd_pool_create(pd, &c, &pool), RDD_STATUS_INVALID_ARGUMENT);
    c = cfg_each(1, 0, 0);
    c.flags = 0x80;
    CHECK_EQ(rdd_pool_create(pd, &c, &pool), RDD_STATUS_INVALID_ARGUMENT);
    c = cfg_each(1, 0, 0);
    c.remote_access = RDD_ACCESS_REMOTE_ATOMIC;
    CHECK_EQ(rdd_pool_create(pd, &c, &pool), RDD_STATUS_INVALID_ARGUMENT);
    c = cfg_each(1, 0, 0);
    c.remote_access = RDD_ACCESS_LOCAL_WRITE;
    CHECK_EQ(rdd_pool_create(pd, &c, &pool), RDD_STATUS_INVALID_ARGUMENT);
    c = cfg_each(1, 0, 0);
    c.num_sizes = 2;
    CHECK_EQ(rdd_pool_create(pd, &c, &pool), RDD_STATUS_INVALID_ARGUMENT);

    /* Sizes and counts that break the rules. */
    c = cfg_each(1, 0, 0);
    c.num_sizes = 2;
    c.sizes = odd;
    CHECK_EQ(rdd_pool_create(pd, &c, &pool), RDD_STATUS_INVALID_ATTRIBUTE);
    c = cfg_each(1, 48, 256);
    CHECK_EQ(rdd_pool_create(pd, &c, &pool), RDD_STATUS_INVALID_ATTRIBUTE);
    c = cfg_each(1, 256, 64);
    CHECK_EQ(rdd_pool_create(pd, &c, &pool), RDD_STATUS_INVALID_ATTRIBUTE);
    c = cfg_each(0, 0, 0);
    c.total_bytes = 4096; /* 11 default classes: no 64 KiB buffer fits */
    CHECK_EQ(rdd_pool_create(pd, &c, &pool), RDD_STATUS_INVALID_ATTRIBUTE);
    CHECK(pool == NULL);

    /* Huge pages: a region that is not a multiple of 2 MiB is refused up
     * front with a clear status, not the kernel's EINVAL. */
    c = cfg_each(1, 64, 128);
    c.flags = RDD_POOL_HUGE_PAGES;
    CHECK_EQ(rdd_pool_create(pd, &c, &pool), RDD_STATUS_HUGE_PAGES_UNAVAILABLE);
    {
        /* 2 MiB: works with a free huge page, HUGE_PAGES_UNAVAILABLE
         * without one. Either is fine; anything else is not. */
        rdd_status s;
        c = cfg_each(0, 4096, 65536);
        c.total_bytes = 2u << 20;
        c.flags = RDD_POOL_HUGE_PAGES;
        s = rdd_pool_create(pd, &c, &pool);
        CHECK(s == RDD_STATUS_OK || s == RDD_STATUS_HUGE_PAGES_UNAVAILABLE);
        if (s == RDD_STATUS_OK) {
            MUST(rdd_pool_stats(pool, &u));
            CHECK_EQ(u.huge_pages, 1);
            CHECK_EQ(rdd_pool_destroy(pool), RDD_STATUS_OK);
            printf("test_pool: huge pages available: 2 MiB pool created\n");
        } else {
            printf("test_pool: no free huge pages: HUGE_PAGES_UNAVAILABLE\n");
        }
    }

    /* NULL outputs and handles, forged handles. */
    c = cfg_each(1, 64, 64);
    MUST(rdd_pool_create(pd, &c, &pool));
    CHECK_EQ(rdd_pool_alloc(pool, 8, NULL), RDD_STATUS_NULL_PARAMETER);
    CHECK_EQ(rdd_pool_alloc(NULL, 8, &b), RDD_STATUS_NULL_PARAMETER);
    CHECK_EQ(rdd_pool_alloc(forged, 8, &b), RDD_STATUS_INVALID_HANDLE);
    CHECK_EQ(rdd_pool_alloc((rdd_pool *)(uintptr_t)pd, 8, &b), RDD_STATUS_INVALID_HANDLE);
    CHECK_EQ(rdd_pool_free(pool, NULL), RDD_STATUS_NULL_PARAMETER);
    CHECK_EQ(rdd_pool_free(NULL, &b), RDD_STATUS_NULL_PARAMETER);
    CHECK_EQ(rdd_pool_stats(pool, NULL), RDD_STATUS_NULL_PARAMETER);
    CHECK_EQ(rdd_pool_stats(forged, &u), RDD_STATUS_INVALID_HANDLE);
    CHECK_EQ(rdd_pool_class_stats(pool, 0, NULL), RDD_STATUS_NULL_PARAMETER);
    CHECK_EQ(rdd_pool_class_stats(NULL, 0, &cu), RDD_STATUS_NULL_PARAMETER);
    CHECK_EQ(rdd_pool_destroy(NULL), RDD_STATUS_NULL_PARAMETER);
    CHECK_EQ(rdd_pool_destroy(forged), RDD_STATUS_INVALID_HANDLE);
    CHECK_EQ(rdd_pool_destroy(pool), RDD_STATUS_OK);
}

/* ---- threads -------------------------------------------------------------- */

#define THREADS 4
#define HOLD 6
#define ROUNDS 20000

struct worker {
    rdd_pool *pool;
    unsigned id;
    unsigned long allocs;
    unsigned long errors;
};

/* Every byte of a live buffer holds its owner's mark: a buffer shared by
 * two holders would be overwritten by the other. */
static int intact(const rdd_buf *b, uint8_t mark)
{
    const uint8_t *p = (const uint8_t *)b->addr;
    uint32_t i;
    for (i = 0; i < b->len; i++) {
        if (p[i] != mark) {
            return 0;
        }
    }
    return 1;
}

static void *worker_main(void *arg)
{
    struct worker *w = (struct worker *)arg;
    rdd_buf live[HOLD];
    uint8_t mark[HOLD];
    unsigned n = 0, i;
    uint32_t x = 2463534242u + w->id * 7919u;

    for (i = 0; i < ROUNDS; i++) {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        if (n < HOLD && (n == 0 || (x & 1))) {
            size_t len = 1 + (x >> 8) % 1024;
            rdd_status s = rdd_pool_alloc(w->pool, len, &live[n]);
            if (s == RDD_STATUS_OK) {
                mark[n] = (uint8_t)((w->id << 6) | (i & 0x3f));
                memset(live[n].addr, mark[n], live[n].len);
                n++;
                w->allocs++;
            } else if (s != RDD_STATUS_RESOURCE_EXHAUSTED) {
                w->errors++;
            }
        } else {
            unsigned k = (x >> 16) % n;
            if (!intact(&live[k], mark[k])) {
                w->errors++;
            }
            if (rdd_pool_free(w->pool, &live[k]) != RDD_STATUS_OK) {
                w->errors++;
            }
            live[k] = live[n - 1];
            mark[k] = mark[n - 1];
            n--;
        }
    }
    while (n > 0) {
        n--;
        if (!intact(&live[n], mark[n]) || rdd_pool_free(w->pool, &live[n]) != RDD_STATUS_OK) {
            w->errors++;
        }
    }
    return NULL;
}

static void test_threads(rdd_pd *pd)
{
    rdd_pool_config c = cfg_each(4, 64, 1024); /* 5 classes x 4: 20 for up to 24 */
    rdd_pool *pool;
    pthread_t t[THREADS];
    struct worker w[THREADS];
    rdd_pool_usage u;
    rdd_pool_class_usage cu;
    unsigned i;

    MUST(rdd_pool_create(pd, &c, &pool));
    for (i = 0; i < THREADS; i++) {
        w[i].pool = pool;
        w[i].id = i;
        w[i].allocs = 0;
        w[i].errors = 0;
        CHECK_EQ(pthread_create(&t[i], NULL, worker_main, &w[i]), 0);
    }
    for (i = 0; i < THREADS; i++) {
        CHECK_EQ(pthread_join(t[i], NULL), 0);
        CHECK_EQ(w[i].errors, 0);
        CHECK(w[i].allocs > 0);
    }
    MUST(rdd_pool_stats(pool, &u));
    CHECK_EQ(u.buffers_in_use, 0);
    CHECK_EQ(u.bytes_requested, 0);
    for (i = 0; i < u.num_classes; i++) {
        MUST(rdd_pool_class_stats(pool, i, &cu));
        CHECK_EQ(cu.free, cu.capacity);
        CHECK(cu.high_water <= cu.capacity);
    }
    CHECK_EQ(rdd_pool_destroy(pool), RDD_STATUS_OK);
}

int main(void)
{
    rdd_device *dev;
    rdd_pd *pd;

    test_rdma_with_pool_buffers();

    MUST(rdd_device_open_soft(NULL, &dev));
    MUST(rdd_pd_alloc(dev, &pd));
    test_classes_stats_and_frees(pd);
    test_bad_arguments(pd);
    test_threads(pd);
    CHECK_EQ(rdd_pd_free(pd), RDD_STATUS_OK);
    CHECK_EQ(rdd_device_close(dev), RDD_STATUS_OK);
    return h_finish("test_pool");
}
