/*
 * The C object API on a kernel RDMA device (rxe and siw in the test VM,
 * where scripts/vm-suite.sh runs it): rdd_device_open_verbs, then the same
 * calls as on the software device. On rxe the QPs run on rdma-direct's own
 * rings by default (RDMA_DIRECT_DATA_PATH=fallback selects libibverbs'
 * provider): SEND with inline data into a posted receive, RDMA WRITE,
 * READ and FETCH_ADD with the memory checked, an event-mode wait, a chain
 * of 64 WRITEs, a bad rkey reported by rdd_qp_failed_wr, and one-call
 * recovery of both QPs, rdd_qp_write with RDD_SEND_DEFER_DOORBELL and
 * rdd_qp_ring (one doorbell per batch), and a memory window exposed through
 * rdd_mr_expose_to and revoked by LOCAL_INV. siw: the device opens, and rdd_qp_connect says
 * UNSUPPORTED (iWARP connects through rdma_cm, not offered in C yet). The
 * SRQ and UD calls (verbs_srq_ud.h): on both data paths an SRQ feeding
 * three RC QPs on rxe, its limit event and refusals on rxe and siw; a UD
 * ping on rxe, on both data paths, UD UNSUPPORTED on siw. On
 * both, rdd_qp_mlx5_desc and rdd_cq_mlx5_desc say UNSUPPORTED (no mlx5
 * queues to hand to the raw-queue level). Then the refusal tables of
 * refusals.h (shared with test_refusals.c on the software device): every
 * parameter of rdd_qp_connect, rdd_cq_create, rdd_qp_create and
 * rdd_mr_reg refused with its status and nothing changed, on rxe (where a
 * rate limit is refused after the kernel took INIT and RTR, and the QP
 * must be back in RESET and connect again) and on siw (connects are
 * UNSUPPORTED there, the create table applies).
 * Without RXE_DEV/SIW_DEV (a host without RDMA) it prints NOT RUN, unless
 * IN_RDMA_VM=1, where that is a failure.
 */
#define _POSIX_C_SOURCE 200809L

#include <stddef.h>
#include <time.h>

#include "harness.h"
#include "refusals.h"
#include "verbs_srq_ud.h"

#define BUF 4096u
#define ALL_REMOTE (RDD_ACCESS_REMOTE_WRITE | RDD_ACCESS_REMOTE_READ | RDD_ACCESS_REMOTE_ATOMIC)

struct side {
    rdd_cq *cq;
    rdd_qp *qp;
    rdd_mr *mr;
    uint8_t *buf;
    uint32_t lkey, rkey;
    rdd_qp_info info;
};

static rdd_sge sge(const struct side *s, size_t off, uint32_t len)
{
    rdd_sge g;
    g.addr = (uint64_t)(uintptr_t)(s->buf + off);
    g.length = len;
    g.lkey = s->lkey;
    return g;
}

static rdd_wr wr(uint64_t id, uint32_t op, uint32_t flags, const rdd_sge *sg, uint32_t n)
{
    rdd_wr w;
    memset(&w, 0, sizeof w);
    w.wr_id = id;
    w.opcode = op;
    w.flags = flags;
    w.sg_list = sg;
    w.num_sge = n;
    return w;
}

/* Waits (event mode, 10 s) for one completion of side `s`. */
static rdd_wc wait_one(struct side *s)
{
    rdd_wc wc;
    size_t n = 0;
    memset(&wc, 0, sizeof wc);
    CHECK_EQ(rdd_cq_wait(s->cq, &s->qp, 1, &wc, 1, RDD_WAIT_EVENT, 10000000000ull, &n),
             RDD_STATUS_OK);
    CHECK_EQ(n, 1);
    return wc;
}

static void open_side(rdd_device *dev, rdd_pd *pd, struct side *s)
{
    void *addr;
    rdd_qp_init init;
    memset(&init, 0, sizeof init);
    init.max_send_wr = 128;
    init.max_recv_wr = 16;
    init.max_send_sge = 2;
    init.max_recv_sge = 2;
    init.max_inline_data = 64;
    MUST(rdd_cq_create(dev, 512, &s->cq));
    MUST(rdd_qp_create(pd, s->cq, s->cq, &init, &s->qp));
    MUST(rdd_mr_reg(pd, BUF, RDD_ACCESS_LOCAL_WRITE | ALL_REMOTE, &s->mr));
    MUST(rdd_mr_addr(s->mr, &addr));
    s->buf = (uint8_t *)addr;
    MUST(rdd_mr_lkey(s->mr, &s->lkey));
    MUST(rdd_mr_rkey(s->mr, &s->rkey));
    MUST(rdd_qp_query_info(s->qp, &s->info));
}

/* rdd_qp_mlx5_desc / rdd_cq_mlx5_desc: rxe and siw QPs run on their own
 * rings (or libibverbs'), not on mlx5 queues, so there is no descriptor
 * to hand out; the outputs stay untouched. */
static void check_no_mlx5_desc(struct side *s)
{
    rdd_mlx5dv_qp dq, dq0;
    rdd_mlx5dv_cq dc, dc0;
    rdd_qp_caps caps, caps0;
    uint32_t qpn = 7;
    memset(&dq, 0x11, sizeof dq);
    memset(&dc, 0x11, sizeof dc);
    memset(&caps, 0x11, sizeof caps);
    dq0 = dq;
    dc0 = dc;
    caps0 = caps;
    CHECK_EQ(rdd_qp_mlx5_desc(s->qp, &dq, &caps, &qpn), RDD_STATUS_UNSUPPORTED);
    CHECK_EQ(rdd_cq_mlx5_desc(s->cq, &dc), RDD_STATUS_UNSUPPORTED);
    CHECK_EQ(qpn, 7);
    CHECK(memcmp(&dq, &dq0, sizeof dq) == 0);
    CHECK(memcmp(&dc, &dc0, sizeof dc) == 0);
    CHECK(memcmp(&caps, &caps0, sizeof caps) == 0);
}

static void close_side(struct side *s)
{
    CHECK_EQ(rdd_qp_destroy(s->qp), RDD_STATUS_OK);
    CHECK_EQ(rdd_cq_destroy(s->cq), RDD_STATUS_OK);
    CHECK_EQ(rdd_mr_free(s->mr), RDD_STATUS_OK);
}

/* A type-2 memory window from C (rxe has them): b exposes 1 KiB of a
 * region of its own, read-only, to a through a window bound on b's QP;
 * a READs through it; LOCAL_INV revokes it (a's READ then fails with a
 * remote access error and reads nothing); an exposure holds its region. */
static void test_rxe_window(rdd_pd *pd, struct side *a, struct side *b)
{
    rdd_mr *owned;
    rdd_exposure *e;
    rdd_exposure_info info;
    rdd_wr w;
    rdd_sge g;
    rdd_wc wc;
    void *p;
    uint8_t *ob;
    size_t bad = 0;
    int posted = -1, i;

    MUST(rdd_mr_reg(pd, BUF, RDD_ACCESS_LOCAL_WRITE | RDD_ACCESS_MW_BIND, &owned));
    MUST(rdd_mr_addr(owned, &p));
    ob = (uint8_t *)p;
    for (i = 0; i < (int)BUF; i++) {
        ob[i] = (uint8_t)(i * 3 + 1);
    }
    MUST(rdd_mr_expose_to(owned, b->qp, 900, RDD_SEND_SIGNALED, 1024, 1024, RDD_REMOTE_READ, &e));
    MUST(rdd_exposure_get_info(e, &info));
    CHECK_EQ(info.is_window, 1);
    wc = wait_one(b);
    CHECK_EQ(wc.wr_id, 900);
    CHECK_EQ(wc.status, RDD_WC_SUCCESS);
    CHECK_EQ(wc.opcode, 5); /* IBV_WC_BIND_MW */
    CHECK_EQ(rdd_mr_free(owned), RDD_STATUS_RESOURCE_BUSY);

    memset(a->buf, 0, 256);
    g = sge(a, 0, 256);
    w = wr(901, RDD_WR_RDMA_READ, RDD_SEND_SIGNALED, &g, 1);
    w.remote_addr = info.addr;
    w.rkey = info.rkey;
    MUST(rdd_qp_post_send(a->qp, &w, 1, &bad));
    wc = wait_one(a);
    CHECK_EQ(wc.status, RDD_WC_SUCCESS);
    CHECK_BYTES(a->buf, ob + 1024, 256);

    MUST(rdd_exposure_invalidate(e, b->qp, 902, RDD_SEND_SIGNALED, &posted));
    CHECK_EQ(posted, 1);
    wc = wait_one(b);
    CHECK_EQ(wc.wr_id, 902);
    CHECK_EQ(wc.status, RDD_WC_SUCCESS);
    CHECK_EQ(wc.opcode, 6); /* IBV_WC_LOCAL_INV */

    memset(a->buf, 0, 256);
    w.wr_id = 903;
    MUST(rdd_qp_post_send(a->qp, &w, 1, &bad));
    wc = wait_one(a);
    CHECK_EQ(wc.wr_id, 903);
    CHECK_EQ(wc.status, RDD_WC_REM_ACCESS_ERR);
    for (i = 0; i < 256; i++) {
        CHECK_EQ(a->buf[i], 0);
    }
    CHECK_EQ(rdd_exposure_free(e), RDD_STATUS_OK);
    CHECK_EQ(rdd_mr_free(owned), RDD_STATUS_OK);
}

/* Counts the completions rdd_qp_recover hands over. */
static void count_wc(void *ctx, const rdd_wc *wc)
{
    (void)wc;
    (*(unsigned *)ctx)++;
}

/* Unsignaled WRITEs the device executed, at the tail of the send queue
 * (issue 17, item 1): they have no completion of their own, and recovery
 * finishes anyway (its drain marker retires them), reporting nothing; the
 * QPs reconnect and work. */
static void test_rxe_drain_marker(struct side *a, struct side *b, const rdd_connect_attr *attr)
{
    rdd_wr w[4];
    rdd_sge s[4];
    rdd_wc wc;
    rdd_recovery rec;
    size_t bad = 0;
    unsigned calls = 0;
    time_t deadline;
    int i;

    memset(b->buf + 1024, 0, 32);
    for (i = 0; i < 4; i++) {
        a->buf[1024 + i * 8] = (uint8_t)(0x40 + i);
        s[i] = sge(a, 1024 + (size_t)i * 8, 8);
        w[i] = wr(200 + (uint64_t)i, RDD_WR_RDMA_WRITE, i == 0 ? RDD_SEND_SIGNALED : 0, &s[i], 1);
        w[i].remote_addr = (uint64_t)(uintptr_t)(b->buf + 1024 + (size_t)i * 8);
        w[i].rkey = b->rkey;
    }
    MUST(rdd_qp_post_send(a->qp, w, 4, &bad));
    wc = wait_one(a);
    CHECK_EQ(wc.wr_id, 200);
    CHECK_EQ(wc.status, RDD_WC_SUCCESS);
    deadline = time(NULL) + 10;
    while (memcmp(b->buf + 1024, a->buf + 1024, 32) != 0 && time(NULL) < deadline) {
    }
    CHECK_BYTES(b->buf + 1024, a->buf + 1024, 32);
    memset(&rec, 0xff, sizeof rec);
    CHECK_EQ(rdd_qp_recover(a->qp, NULL, NULL, 10000000000ull, count_wc, &calls, &rec),
             RDD_STATUS_OK);
    CHECK_EQ(rec.reported, 0);
    CHECK_EQ(calls, 0u);
    MUST(rdd_qp_query_info(a->qp, &a->info));
    MUST(rdd_qp_recover(b->qp, &a->info, attr, 10000000000ull, NULL, NULL, NULL));
    MUST(rdd_qp_query_info(b->qp, &b->info));
    MUST(rdd_qp_connect(a->qp, &b->info, attr));
    MUST(rdd_qp_post_send(a->qp, &w[0], 1, &bad));
    wc = wait_one(a);
    CHECK_EQ(wc.wr_id, 200);
    CHECK_EQ(wc.status, RDD_WC_SUCCESS);
}

/* RDD_SEND_DEFER_DOORBELL on rdma-direct's rxe ring: deferred rdd_qp_write
 * calls make no provider call, one rdd_qp_ring rings them all (one
 * doorbell), they complete in order with the data written; a deferred
 * WRITE then one without the bit: one doorbell for both; rdd_qp_ring with
 * nothing pending does nothing; rdd_qp_recover with deferred WRITEs
 * pending reports each exactly once. On the libibverbs fallback
 * (RDMA_DIRECT_DATA_PATH=fallback) the bit is a hint: each call rings. */
static void test_rxe_deferred(struct side *a, struct side *b, const rdd_connect_attr *attr)
{
    const char *path = getenv("RDMA_DIRECT_DATA_PATH");
    int direct = !(path && strcmp(path, "fallback") == 0);
    uint64_t before = 0, after = 0;
    rdd_wc wc;
    rdd_recovery rec;
    unsigned calls = 0;
    int i;

    for (i = 0; i < 128; i++) {
        a->buf[1024 + i] = (uint8_t)(i * 5 + 3);
    }
    memset(b->buf + 1024, 0, 128);
    MUST(rdd_qp_doorbells(a->qp, &before));
    for (i = 0; i < 16; i++) {
        MUST(rdd_qp_write(a->qp, 300 + (uint64_t)i, (uint64_t)(uintptr_t)(a->buf + 1024 + i * 8), 8,
                          a->lkey, (uint64_t)(uintptr_t)(b->buf + 1024 + i * 8), b->rkey,
                          RDD_SEND_SIGNALED | RDD_SEND_DEFER_DOORBELL));
    }
    MUST(rdd_qp_doorbells(a->qp, &after));
    CHECK_EQ(after - before, direct ? 0u : 16u);
    MUST(rdd_qp_ring(a->qp));
    MUST(rdd_qp_doorbells(a->qp, &after));
    CHECK_EQ(after - before, direct ? 1u : 16u);
    for (i = 0; i < 16; i++) {
        wc = wait_one(a);
        CHECK_EQ(wc.wr_id, 300 + (uint64_t)i);
        CHECK_EQ(wc.status, RDD_WC_SUCCESS);
    }
    CHECK_BYTES(b->buf + 1024, a->buf + 1024, 128);

    /* Nothing pending: nothing rung. */
    MUST(rdd_qp_ring(a->qp));
    MUST(rdd_qp_doorbells(a->qp, &before));
    CHECK_EQ(before, after);

    /* Deferred, then without the bit: one doorbell for both. */
    MUST(rdd_qp_write(a->qp, 320, (uint64_t)(uintptr_t)(a->buf + 1024), 8, a->lkey,
                      (uint64_t)(uintptr_t)(b->buf + 2048), b->rkey,
                      RDD_SEND_SIGNALED | RDD_SEND_DEFER_DOORBELL));
    MUST(rdd_qp_write(a->qp, 321, (uint64_t)(uintptr_t)(a->buf + 1032), 8, a->lkey,
                      (uint64_t)(uintptr_t)(b->buf + 2056), b->rkey, RDD_SEND_SIGNALED));
    MUST(rdd_qp_doorbells(a->qp, &after));
    CHECK_EQ(after - before, direct ? 1u : 2u);
    wc = wait_one(a);
    CHECK_EQ(wc.wr_id, 320);
    wc = wait_one(a);
    CHECK_EQ(wc.wr_id, 321);
    CHECK_EQ(wc.status, RDD_WC_SUCCESS);
    CHECK_BYTES(b->buf + 2048, a->buf + 1024, 16);

    /* Recovery with deferred WRITEs pending (never rung on the direct
     * ring): each is reported exactly once. */
    for (i = 0; i < 4; i++) {
        MUST(rdd_qp_write(a->qp, 330 + (uint64_t)i, (uint64_t)(uintptr_t)(a->buf + 1024), 8,
                          a->lkey, (uint64_t)(uintptr_t)(b->buf + 3000), b->rkey,
                          RDD_SEND_SIGNALED | RDD_SEND_DEFER_DOORBELL));
    }
    memset(&rec, 0xff, sizeof rec);
    CHECK_EQ(rdd_qp_recover(a->qp, NULL, NULL, 10000000000ull, count_wc, &calls, &rec),
             RDD_STATUS_OK);
    CHECK_EQ(rec.reported, 4);
    CHECK_EQ(calls, 4u);
    MUST(rdd_qp_ring(a->qp)); /* nothing is left pending: a no-op */
    MUST(rdd_qp_query_info(a->qp, &a->info));
    MUST(rdd_qp_recover(b->qp, &a->info, attr, 10000000000ull, NULL, NULL, NULL));
    MUST(rdd_qp_query_info(b->qp, &b->info));
    MUST(rdd_qp_connect(a->qp, &b->info, attr));
}

/* The data path rdd_device_data_path must report for rxe and siw: their
 * direct rings unless RDMA_DIRECT_DATA_PATH asks for the fallback. */
static void check_data_path(rdd_device *dev)
{
    const char *env = getenv("RDMA_DIRECT_DATA_PATH");
    int fallback = env && (strcmp(env, "fallback") == 0 || strcmp(env, "portable") == 0);
    uint32_t path = 0;
    MUST(rdd_device_data_path(dev, &path));
    CHECK_EQ(path, fallback ? RDD_DATA_PATH_FALLBACK : RDD_DATA_PATH_DIRECT);
}

static void test_rxe(const char *name)
{
    rdd_device *dev;
    rdd_pd *pd;
    struct side a, b;
    rdd_connect_attr attr = {ALL_REMOTE, 7, 7, 0, 0};
    rdd_wr w[64];
    rdd_sge s[64], rs;
    rdd_recv_wr r;
    rdd_wc wc;
    rdd_failed_wr f;
    rdd_recovery rec;
    size_t bad = 0, work = 0;
    uint64_t before = 0, after = 0, counter;
    int i, found = 0;
    const char *hello = "hello from C on a kernel device";

    MUST(rdd_device_open_verbs(name, &dev));
    check_data_path(dev);
    CHECK_EQ(rdd_device_step(dev, &work), RDD_STATUS_UNSUPPORTED);
    CHECK_EQ(rdd_device_start(dev), RDD_STATUS_UNSUPPORTED);
    MUST(rdd_pd_alloc(dev, &pd));
    open_side(dev, pd, &a);
    open_side(dev, pd, &b);
    check_no_mlx5_desc(&a);
    CHECK(a.info.qpn != b.info.qpn);
    MUST(rdd_qp_connect(a.qp, &b.info, &attr));
    MUST(rdd_qp_connect(b.qp, &a.info, &attr));

    /* SEND with inline data into a posted receive. */
    rs = sge(&b, 0, 256);
    memset(&r, 0, sizeof r);
    r.wr_id = 500;
    r.sg_list = &rs;
    r.num_sge = 1;
    MUST(rdd_qp_post_recv(b.qp, &r, 1, &bad));
    s[0].addr = (uint64_t)(uintptr_t)hello;
    s[0].length = (uint32_t)strlen(hello);
    s[0].lkey = 0;
    w[0] = wr(1, RDD_WR_SEND, RDD_SEND_SIGNALED | RDD_SEND_INLINE, &s[0], 1);
    MUST(rdd_qp_post_send(a.qp, &w[0], 1, &bad));
    wc = wait_one(&a);
    CHECK_EQ(wc.wr_id, 1);
    CHECK_EQ(wc.status, RDD_WC_SUCCESS);
    wc = wait_one(&b);
    CHECK_EQ(wc.wr_id, 500);
    CHECK_EQ(wc.status, RDD_WC_SUCCESS);
    CHECK_EQ(wc.byte_len, strlen(hello));
    CHECK_BYTES(b.buf, hello, strlen(hello));

    /* WRITE, then READ it back, then FETCH_ADD. */
    for (i = 0; i < 256; i++) {
        a.buf[1024 + i] = (uint8_t)(i * 7 + 1);
    }
    s[0] = sge(&a, 1024, 256);
    w[0] = wr(2, RDD_WR_RDMA_WRITE, RDD_SEND_SIGNALED, &s[0], 1);
    w[0].remote_addr = (uint64_t)(uintptr_t)(b.buf + 1024);
    w[0].rkey = b.rkey;
    MUST(rdd_qp_post_send(a.qp, &w[0], 1, &bad));
    wc = wait_one(&a);
    CHECK_EQ(wc.status, RDD_WC_SUCCESS);
    CHECK_BYTES(b.buf + 1024, a.buf + 1024, 256);
    s[0] = sge(&a, 2048, 256);
    w[0] = wr(3, RDD_WR_RDMA_READ, RDD_SEND_SIGNALED, &s[0], 1);
    w[0].remote_addr = (uint64_t)(uintptr_t)(b.buf + 1024);
    w[0].rkey = b.rkey;
    MUST(rdd_qp_post_send(a.qp, &w[0], 1, &bad));
    wc = wait_one(&a);
    CHECK_EQ(wc.status, RDD_WC_SUCCESS);
    CHECK_BYTES(a.buf + 2048, b.buf + 1024, 256);
    counter = 40;
    memcpy(b.buf + 3072, &counter, 8);
    s[0] = sge(&a, 3000, 8);
    w[0] = wr(4, RDD_WR_ATOMIC_FETCH_AND_ADD, RDD_SEND_SIGNALED, &s[0], 1);
    w[0].remote_addr = (uint64_t)(uintptr_t)(b.buf + 3072);
    w[0].rkey = b.rkey;
    w[0].compare_add = 2;
    MUST(rdd_qp_post_send(a.qp, &w[0], 1, &bad));
    wc = wait_one(&a);
    CHECK_EQ(wc.status, RDD_WC_SUCCESS);
    memcpy(&before, a.buf + 3000, 8);
    memcpy(&after, b.buf + 3072, 8);
    CHECK_EQ(before, 40);
    CHECK_EQ(after, 42);

    /* A chain of 64 WRITEs, the last one signaled: few provider calls. */
    MUST(rdd_qp_doorbells(a.qp, &before));
    for (i = 0; i < 64; i++) {
        s[i] = sge(&a, 1024 + (size_t)i * 4, 4);
        w[i] = wr(100 + (uint64_t)i, RDD_WR_RDMA_WRITE, i == 63 ? RDD_SEND_SIGNALED : 0, &s[i], 1);
        w[i].remote_addr = (uint64_t)(uintptr_t)(b.buf + 512 + (size_t)i * 4);
        w[i].rkey = b.rkey;
    }
    MUST(rdd_qp_post_send(a.qp, w, 64, &bad));
    MUST(rdd_qp_doorbells(a.qp, &after));
    CHECK(after - before <= 4);
    wc = wait_one(&a);
    CHECK_EQ(wc.wr_id, 163);
    CHECK_EQ(wc.status, RDD_WC_SUCCESS);
    CHECK_BYTES(b.buf + 512, a.buf + 1024, 256);

    /* A bad rkey: the failed WR is reported, then both QPs recover. */
    s[0] = sge(&a, 0, 8);
    w[0] = wr(7, RDD_WR_RDMA_WRITE, RDD_SEND_SIGNALED, &s[0], 1);
    w[0].remote_addr = (uint64_t)(uintptr_t)b.buf;
    w[0].rkey = b.rkey ^ 0x00ffff00u;
    MUST(rdd_qp_post_send(a.qp, &w[0], 1, &bad));
    wc = wait_one(&a);
    CHECK_EQ(wc.wr_id, 7);
    CHECK_EQ(wc.status, RDD_WC_REM_ACCESS_ERR);
    MUST(rdd_qp_failed_wr(a.qp, &f, &found));
    CHECK_EQ(found, 1);
    CHECK_EQ(f.wr_id, 7);
    CHECK_EQ(f.rkey, b.rkey ^ 0x00ffff00u);
    MUST(rdd_qp_recover(a.qp, NULL, NULL, 10000000000ull, NULL, NULL, &rec));
    CHECK_EQ(rec.has_failure, 1);
    MUST(rdd_qp_query_info(a.qp, &a.info));
    MUST(rdd_qp_recover(b.qp, &a.info, &attr, 10000000000ull, NULL, NULL, NULL));
    MUST(rdd_qp_query_info(b.qp, &b.info));
    MUST(rdd_qp_connect(a.qp, &b.info, &attr));
    a.buf[0] = 0x5a;
    w[0].rkey = b.rkey;
    MUST(rdd_qp_post_send(a.qp, &w[0], 1, &bad));
    wc = wait_one(&a);
    CHECK_EQ(wc.status, RDD_WC_SUCCESS);
    CHECK_EQ(b.buf[0], 0x5a);

    test_rxe_drain_marker(&a, &b, &attr);
    test_rxe_deferred(&a, &b, &attr);
    test_rxe_window(pd, &a, &b);

    close_side(&a);
    close_side(&b);
    CHECK_EQ(rdd_pd_free(pd), RDD_STATUS_OK);
    CHECK_EQ(rdd_device_close(dev), RDD_STATUS_OK);
}

static void test_siw(const char *name)
{
    rdd_device *dev;
    rdd_pd *pd;
    struct side a, b;
    MUST(rdd_device_open_verbs(name, &dev));
    check_data_path(dev);
    MUST(rdd_pd_alloc(dev, &pd));
    open_side(dev, pd, &a);
    open_side(dev, pd, &b);
    check_no_mlx5_desc(&a);
    CHECK_EQ(rdd_qp_connect(a.qp, &b.info, NULL), RDD_STATUS_UNSUPPORTED);
    close_side(&a);
    close_side(&b);
    CHECK_EQ(rdd_pd_free(pd), RDD_STATUS_OK);
    CHECK_EQ(rdd_device_close(dev), RDD_STATUS_OK);
}

int main(void)
{
    const char *rxe = getenv("RXE_DEV");
    const char *siw = getenv("SIW_DEV");
    const char *vm = getenv("IN_RDMA_VM");
    rdd_device *dev = NULL;
    CHECK_EQ(rdd_device_open_verbs("no-such-device", &dev), RDD_STATUS_NO_DEVICE);
    CHECK_EQ(rdd_device_open_verbs(NULL, NULL), RDD_STATUS_NULL_PARAMETER);
    if (!rxe && !siw) {
        if (vm && strcmp(vm, "1") == 0) {
            fprintf(stderr, "test_verbs: IN_RDMA_VM=1 but RXE_DEV/SIW_DEV are not set\n");
            return 1;
        }
        printf("test_verbs: NOT RUN: no RDMA device on this host\n");
        return h_finish("test_verbs");
    }
    if (rxe) {
        test_rxe(rxe);
        test_srq_ud(rxe, 1);
        run_device_refusal_tests(REFUSAL_RXE, rxe);
    }
    if (siw) {
        test_siw(siw);
        test_srq_ud(siw, 0);
        run_device_refusal_tests(REFUSAL_SIW, siw);
    }
    return h_finish("test_verbs");
}
