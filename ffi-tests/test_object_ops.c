/*
 * C11 tests of the per-opcode posts (rdd_qp_write ... rdd_qp_recv,
 * rdd_qp_ring, RDD_SEND_DEFER_DOORBELL) and the one-handle poll
 * (rdd_cq_poll_n) on the software device in step mode: every call's happy
 * path with the data checked at the peer, deferral (nothing executes
 * before the doorbell), and every bad-input status, each refusal leaving
 * the queue untouched.
 */
#define _POSIX_C_SOURCE 200809L

#include <stddef.h>

#include "harness.h"

#define BUF_LEN 4096u
#define ALL_REMOTE (RDD_ACCESS_REMOTE_WRITE | RDD_ACCESS_REMOTE_READ | RDD_ACCESS_REMOTE_ATOMIC)
#define SIG RDD_SEND_SIGNALED
#define DEFER RDD_SEND_DEFER_DOORBELL

/* ---- environment: two connected QPs, each with its own CQ and MR ---------- */

struct env {
    rdd_device *dev;
    rdd_pd *pd;
    rdd_cq *cq[2];
    rdd_qp *qp[2];
    rdd_mr *mr[2];
    uint8_t *buf[2];
    uint64_t addr[2];
    uint32_t lkey[2];
    uint32_t rkey[2];
};

static void env_mr(struct env *e, int i)
{
    void *a;
    MUST(rdd_mr_reg(e->pd, BUF_LEN, RDD_ACCESS_LOCAL_WRITE | ALL_REMOTE, &e->mr[i]));
    MUST(rdd_mr_addr(e->mr[i], &a));
    e->buf[i] = (uint8_t *)a;
    e->addr[i] = (uint64_t)(uintptr_t)a;
    MUST(rdd_mr_lkey(e->mr[i], &e->lkey[i]));
    MUST(rdd_mr_rkey(e->mr[i], &e->rkey[i]));
}

static void connect_pair(rdd_qp *a, rdd_qp *b)
{
    rdd_connect_attr attr = {ALL_REMOTE, 7, 7, 0, 0};
    rdd_qp_info ia, ib;
    MUST(rdd_qp_query_info(a, &ia));
    MUST(rdd_qp_query_info(b, &ib));
    MUST(rdd_qp_connect(a, &ib, &attr));
    MUST(rdd_qp_connect(b, &ia, &attr));
}

/* `cq0_depth` sizes QP 0's CQ; `unguarded` opts it out of the sizing guard. */
static void env_open_with(struct env *e, uint32_t cq0_depth, int unguarded,
                          const rdd_qp_init *init)
{
    int i;
    memset(e, 0, sizeof(*e));
    MUST(rdd_device_open_soft(NULL, &e->dev));
    MUST(rdd_pd_alloc(e->dev, &e->pd));
    MUST(rdd_cq_create(e->dev, cq0_depth, &e->cq[0]));
    if (unguarded) {
        MUST(rdd_cq_set_unguarded(e->cq[0], 1));
    }
    MUST(rdd_cq_create(e->dev, 2048, &e->cq[1]));
    for (i = 0; i < 2; i++) {
        MUST(rdd_qp_create(e->pd, e->cq[i], e->cq[i], init, &e->qp[i]));
        env_mr(e, i);
    }
    connect_pair(e->qp[0], e->qp[1]);
}

static void env_open(struct env *e)
{
    env_open_with(e, 2048, 0, NULL);
}

static void env_close(struct env *e)
{
    int i;
    for (i = 0; i < 2; i++) {
        CHECK_EQ(rdd_qp_destroy(e->qp[i]), RDD_STATUS_OK);
        CHECK_EQ(rdd_cq_destroy(e->cq[i]), RDD_STATUS_OK);
        CHECK_EQ(rdd_mr_free(e->mr[i]), RDD_STATUS_OK);
    }
    CHECK_EQ(rdd_pd_free(e->pd), RDD_STATUS_OK);
    CHECK_EQ(rdd_device_close(e->dev), RDD_STATUS_OK);
}

/* One device pass; returns the work done. */
static size_t step(struct env *e)
{
    size_t work = 0;
    MUST(rdd_device_step(e->dev, &work));
    return work;
}

/* Steps until `want` completions came from `cq` (rdd_cq_poll_n), at most
 * 100 passes; returns how many arrived. */
static int collect(struct env *e, rdd_cq *cq, rdd_wc *wc, int want)
{
    int got = 0, rounds = 0;
    while (got < want && rounds++ < 100) {
        int n;
        (void)step(e);
        n = rdd_cq_poll_n(cq, wc + got, (uint32_t)(want - got));
        if (n < 0) {
            fprintf(stderr, "rdd_cq_poll_n failed with %d\n", n);
            break;
        }
        got += n;
    }
    return got;
}

static uint64_t doorbells(rdd_qp *qp)
{
    uint64_t n = 0;
    MUST(rdd_qp_doorbells(qp, &n));
    return n;
}

static uint64_t load64(const uint8_t *p)
{
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}

static void store64(uint8_t *p, uint64_t v)
{
    memcpy(p, &v, 8);
}

static void fill(uint8_t *p, size_t n, uint8_t seed)
{
    size_t i;
    for (i = 0; i < n; i++) {
        p[i] = (uint8_t)(seed + i * 13);
    }
}

/* QP sizes for the tests that fill queues: one SGE, 16 inline bytes. */
static rdd_qp_init small_init(uint32_t wrs)
{
    rdd_qp_init init;
    memset(&init, 0, sizeof init);
    init.max_send_wr = wrs;
    init.max_recv_wr = wrs;
    init.max_send_sge = 1;
    init.max_recv_sge = 1;
    init.max_inline_data = 16;
    return init;
}

/* ---- happy paths ------------------------------------------------------------ */

static void test_rdma_ops(void)
{
    struct env e;
    rdd_wc wc[4];
    env_open(&e);

    /* WRITE: A's bytes 0..99 land at B + 512. */
    fill(e.buf[0], 100, 1);
    CHECK_EQ(rdd_qp_write(e.qp[0], 1, e.addr[0], 100, e.lkey[0], e.addr[1] + 512, e.rkey[1], SIG),
             RDD_STATUS_OK);
    CHECK_EQ(doorbells(e.qp[0]), 1);
    CHECK_EQ(collect(&e, e.cq[0], wc, 1), 1);
    CHECK_EQ(wc[0].wr_id, 1);
    CHECK_EQ(wc[0].status, RDD_WC_SUCCESS);
    CHECK_EQ(wc[0].opcode, RDD_WC_OP_RDMA_WRITE);
    CHECK_BYTES(e.buf[1] + 512, e.buf[0], 100);

    /* READ: B's bytes 512..611 come back into A + 2048. */
    memset(e.buf[0] + 2048, 0, 100);
    CHECK_EQ(rdd_qp_read(e.qp[0], 2, e.addr[0] + 2048, 100, e.lkey[0], e.addr[1] + 512, e.rkey[1],
                         SIG),
             RDD_STATUS_OK);
    CHECK_EQ(collect(&e, e.cq[0], wc, 1), 1);
    CHECK_EQ(wc[0].wr_id, 2);
    CHECK_EQ(wc[0].opcode, RDD_WC_OP_RDMA_READ);
    CHECK_EQ(wc[0].byte_len, 100);
    CHECK_BYTES(e.buf[0] + 2048, e.buf[1] + 512, 100);

    /* WRITE_WITH_IMM: data lands and a posted receive gets the immediate. */
    CHECK_EQ(rdd_qp_recv(e.qp[1], 70, e.addr[1] + 3000, 16, e.lkey[1], 0), RDD_STATUS_OK);
    fill(e.buf[0] + 200, 32, 9);
    CHECK_EQ(rdd_qp_write_imm(e.qp[0], 3, e.addr[0] + 200, 32, e.lkey[0], e.addr[1] + 1024,
                              e.rkey[1], 0xfeed0001u, SIG),
             RDD_STATUS_OK);
    CHECK_EQ(collect(&e, e.cq[1], wc, 1), 1);
    CHECK_EQ(wc[0].wr_id, 70);
    CHECK_EQ(wc[0].opcode, RDD_WC_OP_RECV_RDMA_WITH_IMM);
    CHECK_EQ(wc[0].imm_data, 0xfeed0001u);
    CHECK_EQ(wc[0].byte_len, 32);
    CHECK_BYTES(e.buf[1] + 1024, e.buf[0] + 200, 32);
    CHECK_EQ(collect(&e, e.cq[0], wc, 1), 1);
    CHECK_EQ(wc[0].wr_id, 3);

    /* FETCH_ADD: the old value comes back, the target grows. */
    store64(e.buf[1] + 8, 100);
    CHECK_EQ(rdd_qp_fetch_add(e.qp[0], 4, e.addr[0] + 128, e.lkey[0], e.addr[1] + 8, e.rkey[1], 5,
                              SIG),
             RDD_STATUS_OK);
    CHECK_EQ(collect(&e, e.cq[0], wc, 1), 1);
    CHECK_EQ(wc[0].opcode, RDD_WC_OP_FETCH_ADD);
    CHECK_EQ(wc[0].byte_len, 8);
    CHECK_EQ(load64(e.buf[0] + 128), 100);
    CHECK_EQ(load64(e.buf[1] + 8), 105);

    /* CMP_SWAP that matches, then one that does not. */
    CHECK_EQ(rdd_qp_cmp_swap(e.qp[0], 5, e.addr[0] + 136, e.lkey[0], e.addr[1] + 8, e.rkey[1], 105,
                             0x1122334455667788ull, SIG),
             RDD_STATUS_OK);
    CHECK_EQ(collect(&e, e.cq[0], wc, 1), 1);
    CHECK_EQ(wc[0].opcode, RDD_WC_OP_COMP_SWAP);
    CHECK_EQ(load64(e.buf[0] + 136), 105);
    CHECK_EQ(load64(e.buf[1] + 8), 0x1122334455667788ull);
    CHECK_EQ(rdd_qp_cmp_swap(e.qp[0], 6, e.addr[0] + 136, e.lkey[0], e.addr[1] + 8, e.rkey[1], 105,
                             7, SIG),
             RDD_STATUS_OK);
    CHECK_EQ(collect(&e, e.cq[0], wc, 1), 1);
    CHECK_EQ(wc[0].status, RDD_WC_SUCCESS);
    CHECK_EQ(load64(e.buf[0] + 136), 0x1122334455667788ull);
    CHECK_EQ(load64(e.buf[1] + 8), 0x1122334455667788ull);

    /* WRITE inline: the source buffer is free again at once. */
    {
        char msg[40];
        memcpy(msg, "inline write, copied at post time", 34);
        CHECK_EQ(rdd_qp_write_inline(e.qp[0], 7, msg, 34, e.addr[1] + 2048, e.rkey[1], SIG),
                 RDD_STATUS_OK);
        memset(msg, 'x', sizeof msg);
        CHECK_EQ(collect(&e, e.cq[0], wc, 1), 1);
        CHECK_EQ(wc[0].wr_id, 7);
        CHECK_EQ(wc[0].opcode, RDD_WC_OP_RDMA_WRITE);
        CHECK_BYTES(e.buf[1] + 2048, "inline write, copied at post time", 34);
    }
    /* Unsignaled work completes silently. */
    CHECK_EQ(rdd_qp_write(e.qp[0], 8, e.addr[0], 8, e.lkey[0], e.addr[1] + 8, e.rkey[1], 0),
             RDD_STATUS_OK);
    CHECK_EQ(collect(&e, e.cq[0], wc, 1), 0);
    CHECK_EQ(load64(e.buf[1] + 8), load64(e.buf[0]));
    env_close(&e);
}

static void test_send_ops(void)
{
    struct env e;
    rdd_wc wc[4];
    int i;
    env_open(&e);

    /* SEND and SEND_WITH_IMM into receives posted with rdd_qp_recv. */
    for (i = 0; i < 2; i++) {
        CHECK_EQ(rdd_qp_recv(e.qp[1], 100 + (uint64_t)i, e.addr[1] + 1024 + 64 * (uint64_t)i, 64,
                             e.lkey[1], 0),
                 RDD_STATUS_OK);
    }
    memcpy(e.buf[0], "hello", 5);
    memcpy(e.buf[0] + 16, "world!", 6);
    CHECK_EQ(rdd_qp_send(e.qp[0], 1, e.addr[0], 5, e.lkey[0], SIG), RDD_STATUS_OK);
    CHECK_EQ(rdd_qp_send_imm(e.qp[0], 2, e.addr[0] + 16, 6, e.lkey[0], 0xabcd1234u, SIG),
             RDD_STATUS_OK);
    CHECK_EQ(collect(&e, e.cq[1], wc, 2), 2);
    CHECK_EQ(wc[0].wr_id, 100);
    CHECK_EQ(wc[0].opcode, RDD_WC_OP_RECV);
    CHECK_EQ(wc[0].byte_len, 5);
    CHECK_EQ(wc[0].wc_flags & RDD_WC_FLAG_WITH_IMM, 0);
    CHECK_BYTES(e.buf[1] + 1024, "hello", 5);
    CHECK_EQ(wc[1].wr_id, 101);
    CHECK_EQ(wc[1].byte_len, 6);
    CHECK_EQ(wc[1].wc_flags & RDD_WC_FLAG_WITH_IMM, RDD_WC_FLAG_WITH_IMM);
    CHECK_EQ(wc[1].imm_data, 0xabcd1234u);
    CHECK_BYTES(e.buf[1] + 1088, "world!", 6);
    CHECK_EQ(collect(&e, e.cq[0], wc, 2), 2);
    CHECK_EQ(wc[0].opcode, RDD_WC_OP_SEND);
    CHECK_EQ(wc[0].wr_id, 1);
    CHECK_EQ(wc[1].wr_id, 2);

    /* SEND inline, and the zero-length rules: an empty SEND (SGE or
     * inline, NULL data allowed then) arrives as a 0-byte message. */
    {
        char msg[16];
        memcpy(msg, "inline!", 7);
        CHECK_EQ(rdd_qp_recv(e.qp[1], 110, e.addr[1] + 2048, 64, e.lkey[1], 0), RDD_STATUS_OK);
        CHECK_EQ(rdd_qp_recv(e.qp[1], 111, e.addr[1] + 2112, 64, e.lkey[1], 0), RDD_STATUS_OK);
        CHECK_EQ(rdd_qp_recv(e.qp[1], 112, e.addr[1] + 2176, 64, e.lkey[1], 0), RDD_STATUS_OK);
        CHECK_EQ(rdd_qp_send_inline(e.qp[0], 3, msg, 7, SIG), RDD_STATUS_OK);
        memset(msg, 0, sizeof msg);
        CHECK_EQ(rdd_qp_send_inline(e.qp[0], 4, NULL, 0, SIG), RDD_STATUS_OK);
        CHECK_EQ(rdd_qp_send(e.qp[0], 5, e.addr[0], 0, e.lkey[0], SIG), RDD_STATUS_OK);
        CHECK_EQ(collect(&e, e.cq[1], wc, 3), 3);
        CHECK_EQ(wc[0].wr_id, 110);
        CHECK_EQ(wc[0].byte_len, 7);
        CHECK_BYTES(e.buf[1] + 2048, "inline!", 7);
        CHECK_EQ(wc[1].wr_id, 111);
        CHECK_EQ(wc[1].byte_len, 0);
        CHECK_EQ(wc[2].wr_id, 112);
        CHECK_EQ(wc[2].byte_len, 0);
        CHECK_EQ(collect(&e, e.cq[0], wc, 3), 3);
        CHECK_EQ(wc[2].wr_id, 5);
        CHECK_EQ(wc[2].status, RDD_WC_SUCCESS);
    }
    /* Zero-length WRITE and READ, and a zero-length inline WRITE. */
    CHECK_EQ(rdd_qp_write(e.qp[0], 6, e.addr[0], 0, e.lkey[0], e.addr[1], e.rkey[1], SIG),
             RDD_STATUS_OK);
    CHECK_EQ(rdd_qp_read(e.qp[0], 7, e.addr[0], 0, e.lkey[0], e.addr[1], e.rkey[1], SIG),
             RDD_STATUS_OK);
    CHECK_EQ(rdd_qp_write_inline(e.qp[0], 8, NULL, 0, e.addr[1], e.rkey[1], SIG), RDD_STATUS_OK);
    CHECK_EQ(collect(&e, e.cq[0], wc, 3), 3);
    for (i = 0; i < 3; i++) {
        CHECK_EQ(wc[i].wr_id, 6 + (uint64_t)i);
        CHECK_EQ(wc[i].status, RDD_WC_SUCCESS);
    }
    CHECK_EQ(doorbells(e.qp[0]), 8);
    env_close(&e);
}

/* ---- deferral ----------------------------------------------------------------- */

static void test_defer(void)
{
    struct env e;
    rdd_wc wc[8];
    size_t bad = 99;
    int i;
    env_open(&e);

    /* Four deferred WRITEs: nothing executes until the doorbell. */
    fill(e.buf[0], 64, 3);
    memset(e.buf[1], 0, 64);
    for (i = 0; i < 4; i++) {
        CHECK_EQ(rdd_qp_write(e.qp[0], (uint64_t)i, e.addr[0] + 16 * (uint64_t)i, 16, e.lkey[0],
                              e.addr[1] + 16 * (uint64_t)i, e.rkey[1], SIG | DEFER),
                 RDD_STATUS_OK);
    }
    CHECK_EQ(doorbells(e.qp[0]), 0);
    CHECK_EQ(step(&e), 0);
    CHECK_EQ(step(&e), 0);
    CHECK_EQ(load64(e.buf[1]), 0);
    CHECK_EQ(rdd_cq_poll_n(e.cq[0], wc, 8), 0);
    CHECK_EQ(rdd_qp_ring(e.qp[0]), RDD_STATUS_OK);
    CHECK_EQ(doorbells(e.qp[0]), 1); /* four WQEs, one doorbell */
    CHECK_EQ(rdd_qp_ring(e.qp[0]), RDD_STATUS_OK); /* nothing pending */
    CHECK_EQ(doorbells(e.qp[0]), 1);
    CHECK_EQ(collect(&e, e.cq[0], wc, 4), 4);
    for (i = 0; i < 4; i++) {
        CHECK_EQ(wc[i].wr_id, (uint64_t)i);
    }
    CHECK_BYTES(e.buf[1], e.buf[0], 64);

    /* Deferred, then one without the bit: it rings for all three. */
    CHECK_EQ(rdd_qp_send_inline(e.qp[0], 10, "a", 1, SIG | DEFER), RDD_STATUS_OK);
    CHECK_EQ(rdd_qp_fetch_add(e.qp[0], 11, e.addr[0] + 128, e.lkey[0], e.addr[1] + 256, e.rkey[1],
                              1, SIG | DEFER),
             RDD_STATUS_OK);
    CHECK_EQ(rdd_qp_recv(e.qp[1], 50, e.addr[1] + 512, 8, e.lkey[1], 0), RDD_STATUS_OK);
    CHECK_EQ(step(&e), 0);
    CHECK_EQ(rdd_qp_write(e.qp[0], 12, e.addr[0], 8, e.lkey[0], e.addr[1] + 264, e.rkey[1], SIG),
             RDD_STATUS_OK);
    CHECK_EQ(doorbells(e.qp[0]), 2);
    CHECK_EQ(collect(&e, e.cq[0], wc, 3), 3);
    CHECK_EQ(wc[0].wr_id, 10);
    CHECK_EQ(wc[1].wr_id, 11);
    CHECK_EQ(wc[2].wr_id, 12);
    CHECK_EQ(collect(&e, e.cq[1], wc, 1), 1);
    CHECK_EQ(wc[0].byte_len, 1);

    /* The generic post rings deferred WQEs too. */
    CHECK_EQ(rdd_qp_write(e.qp[0], 13, e.addr[0], 8, e.lkey[0], e.addr[1], e.rkey[1], SIG | DEFER),
             RDD_STATUS_OK);
    CHECK_EQ(rdd_qp_post_send(e.qp[0], NULL, 0, &bad), RDD_STATUS_NULL_PARAMETER);
    CHECK_EQ(step(&e), 0);
    {
        rdd_wr w;
        memset(&w, 0, sizeof w);
        w.wr_id = 14;
        w.opcode = RDD_WR_NOP;
        w.flags = SIG;
        CHECK_EQ(rdd_qp_post_send(e.qp[0], &w, 1, &bad), RDD_STATUS_OK);
    }
    CHECK_EQ(doorbells(e.qp[0]), 3);
    CHECK_EQ(collect(&e, e.cq[0], wc, 2), 2);
    CHECK_EQ(wc[0].wr_id, 13);
    CHECK_EQ(wc[1].wr_id, 14);

    /* A deferred receive is invisible to the device until the ring: the
     * SEND waits (RNR retries), then lands. */
    CHECK_EQ(rdd_qp_recv(e.qp[1], 60, e.addr[1] + 1024, 64, e.lkey[1], DEFER), RDD_STATUS_OK);
    CHECK_EQ(rdd_qp_send_inline(e.qp[0], 15, "late", 4, SIG), RDD_STATUS_OK);
    for (i = 0; i < 5; i++) {
        (void)step(&e);
    }
    CHECK_EQ(rdd_cq_poll_n(e.cq[1], wc, 8), 0);
    CHECK_EQ(rdd_cq_poll_n(e.cq[0], wc, 8), 0);
    CHECK_EQ(rdd_qp_ring(e.qp[1]), RDD_STATUS_OK);
    CHECK_EQ(collect(&e, e.cq[1], wc, 1), 1);
    CHECK_EQ(wc[0].wr_id, 60);
    CHECK_BYTES(e.buf[1] + 1024, "late", 4);
    CHECK_EQ(collect(&e, e.cq[0], wc, 1), 1);
    CHECK_EQ(wc[0].wr_id, 15);
    CHECK_EQ(wc[0].status, RDD_WC_SUCCESS);
    env_close(&e);
}

/* ---- bad inputs ---------------------------------------------------------------- */

/* Every per-opcode call on `qp` with valid arguments of `e` and `flags`;
 * each must return `want`. */
static void all_ops_give(struct env *e, rdd_qp *qp, uint32_t flags, rdd_status want)
{
    uint64_t la = e->addr[0], ra = e->addr[1];
    uint32_t lk = e->lkey[0], rk = e->rkey[1];
    CHECK_EQ(rdd_qp_write(qp, 1, la, 8, lk, ra, rk, flags), want);
    CHECK_EQ(rdd_qp_write_imm(qp, 1, la, 8, lk, ra, rk, 1, flags), want);
    CHECK_EQ(rdd_qp_read(qp, 1, la, 8, lk, ra, rk, flags), want);
    CHECK_EQ(rdd_qp_send(qp, 1, la, 8, lk, flags), want);
    CHECK_EQ(rdd_qp_send_imm(qp, 1, la, 8, lk, 1, flags), want);
    CHECK_EQ(rdd_qp_write_inline(qp, 1, "12345678", 8, ra, rk, flags), want);
    CHECK_EQ(rdd_qp_send_inline(qp, 1, "12345678", 8, flags), want);
    CHECK_EQ(rdd_qp_fetch_add(qp, 1, la, lk, ra, rk, 1, flags), want);
    CHECK_EQ(rdd_qp_cmp_swap(qp, 1, la, lk, ra, rk, 1, 2, flags), want);
}

static void test_bad_handles(void)
{
    struct env e;
    rdd_qp *dead;
    rdd_qp *forged = (rdd_qp *)(uintptr_t)0x123456789abcdef5ull;
    rdd_qp *stray = (rdd_qp *)(uintptr_t)(5u | 1u << 29);
    rdd_qp *wrong = NULL;
    env_open(&e);
    wrong = (rdd_qp *)(void *)e.cq[0];
    MUST(rdd_qp_create(e.pd, e.cq[0], e.cq[0], NULL, &dead));
    MUST(rdd_qp_destroy(dead));

    all_ops_give(&e, NULL, SIG, RDD_STATUS_NULL_PARAMETER);
    all_ops_give(&e, dead, SIG, RDD_STATUS_INVALID_HANDLE);
    all_ops_give(&e, forged, SIG, RDD_STATUS_INVALID_HANDLE);
    all_ops_give(&e, stray, SIG, RDD_STATUS_INVALID_HANDLE);
    all_ops_give(&e, wrong, SIG, RDD_STATUS_INVALID_HANDLE);
    /* A bad handle is reported before bad flags. */
    all_ops_give(&e, dead, 0x10, RDD_STATUS_INVALID_HANDLE);
    CHECK_EQ(rdd_qp_recv(NULL, 1, e.addr[1], 8, e.lkey[1], 0), RDD_STATUS_NULL_PARAMETER);
    CHECK_EQ(rdd_qp_recv(dead, 1, e.addr[1], 8, e.lkey[1], 0), RDD_STATUS_INVALID_HANDLE);
    CHECK_EQ(rdd_qp_recv(forged, 1, e.addr[1], 8, e.lkey[1], 0), RDD_STATUS_INVALID_HANDLE);
    CHECK_EQ(rdd_qp_recv(wrong, 1, e.addr[1], 8, e.lkey[1], 0), RDD_STATUS_INVALID_HANDLE);
    CHECK_EQ(rdd_qp_ring(NULL), RDD_STATUS_NULL_PARAMETER);
    CHECK_EQ(rdd_qp_ring(dead), RDD_STATUS_INVALID_HANDLE);
    CHECK_EQ(rdd_qp_ring(forged), RDD_STATUS_INVALID_HANDLE);
    CHECK_EQ(rdd_qp_ring(stray), RDD_STATUS_INVALID_HANDLE);
    CHECK_EQ(rdd_qp_ring(wrong), RDD_STATUS_INVALID_HANDLE);
    /* Nothing reached the live QPs. */
    CHECK_EQ(doorbells(e.qp[0]), 0);
    CHECK_EQ(step(&e), 0);
    env_close(&e);
}

static void test_bad_flags_and_state(void)
{
    struct env e;
    rdd_qp *idle;
    rdd_wc wc[2];
    env_open(&e);

    all_ops_give(&e, e.qp[0], RDD_SEND_INLINE, RDD_STATUS_INVALID_FLAGS);
    all_ops_give(&e, e.qp[0], 0x10, RDD_STATUS_INVALID_FLAGS);
    all_ops_give(&e, e.qp[0], 0x20000000u | SIG, RDD_STATUS_INVALID_FLAGS);
    CHECK_EQ(rdd_qp_recv(e.qp[1], 1, e.addr[1], 8, e.lkey[1], SIG), RDD_STATUS_INVALID_FLAGS);
    CHECK_EQ(rdd_qp_recv(e.qp[1], 1, e.addr[1], 8, e.lkey[1], 0x40), RDD_STATUS_INVALID_FLAGS);
    CHECK_EQ(doorbells(e.qp[0]), 0);
    CHECK_EQ(step(&e), 0);

    /* A QP that was never connected (RESET) takes no work. */
    MUST(rdd_qp_create(e.pd, e.cq[0], e.cq[0], NULL, &idle));
    all_ops_give(&e, idle, SIG, RDD_STATUS_INVALID_QP_STATE);
    all_ops_give(&e, idle, SIG | DEFER, RDD_STATUS_INVALID_QP_STATE);
    CHECK_EQ(rdd_qp_recv(idle, 1, e.addr[0], 8, e.lkey[0], 0), RDD_STATUS_INVALID_QP_STATE);
    CHECK_EQ(rdd_qp_ring(idle), RDD_STATUS_OK);
    CHECK_EQ(doorbells(idle), 0);
    /* A validation error wins over the state (as in rdd_qp_post_send). */
    CHECK_EQ(rdd_qp_fetch_add(idle, 1, e.addr[0], e.lkey[0], e.addr[1] + 4, e.rkey[1], 1, 0),
             RDD_STATUS_ATOMIC_UNALIGNED);
    MUST(rdd_qp_destroy(idle));

    /* Payload rules. */
    {
        rdd_qp_caps caps;
        static uint8_t big[1024];
        MUST(rdd_qp_query_caps(e.qp[0], &caps));
        CHECK(caps.max_inline_data < sizeof big);
        CHECK_EQ(rdd_qp_send_inline(e.qp[0], 1, big, caps.max_inline_data + 1, SIG),
                 RDD_STATUS_INLINE_TOO_LARGE);
        CHECK_EQ(rdd_qp_write_inline(e.qp[0], 1, big, caps.max_inline_data + 1, e.addr[1],
                                     e.rkey[1], SIG),
                 RDD_STATUS_INLINE_TOO_LARGE);
        CHECK_EQ(rdd_qp_send_inline(e.qp[0], 1, NULL, 1, SIG), RDD_STATUS_NULL_POINTER);
        CHECK_EQ(rdd_qp_write_inline(e.qp[0], 1, NULL, 8, e.addr[1], e.rkey[1], SIG),
                 RDD_STATUS_NULL_POINTER);
        /* Bad flags are reported before a bad payload. */
        CHECK_EQ(rdd_qp_send_inline(e.qp[0], 1, NULL, 1, 0x10), RDD_STATUS_INVALID_FLAGS);
        /* Exactly the limit is fine. */
        CHECK_EQ(rdd_qp_send_inline(e.qp[0], 1, big, caps.max_inline_data, 0), RDD_STATUS_OK);
        CHECK_EQ(doorbells(e.qp[0]), 1);
    }
    CHECK_EQ(rdd_qp_fetch_add(e.qp[0], 1, e.addr[0], e.lkey[0], e.addr[1] + 4, e.rkey[1], 1, SIG),
             RDD_STATUS_ATOMIC_UNALIGNED);
    CHECK_EQ(rdd_qp_cmp_swap(e.qp[0], 1, e.addr[0], e.lkey[0], e.addr[1] + 1, e.rkey[1], 1, 2,
                             SIG | DEFER),
             RDD_STATUS_ATOMIC_UNALIGNED);
    CHECK_EQ(rdd_qp_write(e.qp[0], 1, e.addr[0], 0x80000000u, e.lkey[0], e.addr[1], e.rkey[1],
                          SIG),
             RDD_STATUS_LENGTH_OVERFLOW);
    CHECK_EQ(rdd_qp_write_imm(e.qp[0], 1, e.addr[0], 0x80000000u, e.lkey[0], e.addr[1], e.rkey[1],
                              1, SIG),
             RDD_STATUS_LENGTH_OVERFLOW);
    CHECK_EQ(rdd_qp_read(e.qp[0], 1, e.addr[0], 0xffffffffu, e.lkey[0], e.addr[1], e.rkey[1], SIG),
             RDD_STATUS_LENGTH_OVERFLOW);
    CHECK_EQ(rdd_qp_send(e.qp[0], 1, e.addr[0], 0x80000000u, e.lkey[0], SIG),
             RDD_STATUS_LENGTH_OVERFLOW);
    CHECK_EQ(rdd_qp_send_imm(e.qp[0], 1, e.addr[0], 0x80000000u, e.lkey[0], 1, SIG),
             RDD_STATUS_LENGTH_OVERFLOW);
    CHECK_EQ(rdd_qp_recv(e.qp[1], 1, e.addr[1], 0x80000000u, e.lkey[1], 0),
             RDD_STATUS_LENGTH_OVERFLOW);
    /* None of the refused calls wrote or rang anything: only the one
     * unsignaled inline SEND above reaches the device (and with no
     * receive posted it waits for one). */
    CHECK_EQ(doorbells(e.qp[0]), 1);
    CHECK_EQ(rdd_cq_poll_n(e.cq[0], wc, 2), 0);
    CHECK_EQ(rdd_qp_ring(e.qp[0]), RDD_STATUS_OK);
    CHECK_EQ(doorbells(e.qp[0]), 1);
    env_close(&e);
}

static void test_full_queues(void)
{
    struct env e;
    rdd_qp_init init = small_init(4);
    rdd_wc wc[64];
    int i, posted = 0, recvs = 0;
    uint64_t bells;
    rdd_status s = RDD_STATUS_OK;
    env_open_with(&e, 2048, 0, &init);

    /* Deferred unsignaled WRITEs until the send queue is full. */
    for (i = 0; i < 1000; i++) {
        s = rdd_qp_write(e.qp[0], (uint64_t)i, e.addr[0], 8, e.lkey[0], e.addr[1], e.rkey[1],
                         DEFER);
        if (s != RDD_STATUS_OK) {
            break;
        }
        posted++;
    }
    CHECK_EQ(s, RDD_STATUS_SQ_FULL);
    CHECK(posted >= 4);
    all_ops_give(&e, e.qp[0], SIG, RDD_STATUS_SQ_FULL);
    CHECK_EQ(doorbells(e.qp[0]), 0);
    CHECK_EQ(step(&e), 0);
    CHECK_EQ(rdd_qp_ring(e.qp[0]), RDD_STATUS_OK);
    bells = doorbells(e.qp[0]);
    CHECK_EQ(bells, 1);
    /* The signalling guard made the last of them ask for a completion:
     * it retires them all, reported to nobody. */
    for (i = 0; i < 5; i++) {
        (void)step(&e);
        (void)rdd_cq_poll_n(e.cq[0], wc, 64);
    }
    CHECK_EQ(rdd_qp_write(e.qp[0], 99, e.addr[0], 8, e.lkey[0], e.addr[1], e.rkey[1], SIG),
             RDD_STATUS_OK);
    CHECK_EQ(collect(&e, e.cq[0], wc, 1), 1);
    CHECK_EQ(wc[0].wr_id, 99);

    /* Receives until the receive queue is full. */
    for (i = 0; i < 1000; i++) {
        s = rdd_qp_recv(e.qp[1], (uint64_t)i, e.addr[1], 8, e.lkey[1], i % 2 ? DEFER : 0);
        if (s != RDD_STATUS_OK) {
            break;
        }
        recvs++;
    }
    CHECK_EQ(s, RDD_STATUS_RQ_FULL);
    CHECK(recvs >= 4);
    env_close(&e);
}

/* On an unguarded CQ a per-opcode post is refused with CQ_FULL exactly
 * when rdd_qp_post_send of the same WR would be: one entry stays spare
 * for a CQE of the signalling guard, signaled sends and receives count. */
static void test_cq_full(void)
{
    struct env e;
    rdd_qp_init init = small_init(64);
    rdd_wc wc[32];
    rdd_wr w;
    rdd_sge sg;
    size_t bad = 99;
    int i;
    env_open_with(&e, 8, 1, &init); /* QP 0's CQ: 16 entries, unguarded */

    for (i = 0; i < 15; i++) {
        CHECK_EQ(rdd_qp_write(e.qp[0], (uint64_t)i, e.addr[0], 8, e.lkey[0], e.addr[1], e.rkey[1],
                              SIG),
                 RDD_STATUS_OK);
    }
    /* The 16th signaled WR does not fit, whatever the opcode. */
    all_ops_give(&e, e.qp[0], SIG, RDD_STATUS_CQ_FULL);
    all_ops_give(&e, e.qp[0], SIG | DEFER, RDD_STATUS_CQ_FULL);
    sg.addr = e.addr[0];
    sg.length = 8;
    sg.lkey = e.lkey[0];
    memset(&w, 0, sizeof w);
    w.opcode = RDD_WR_RDMA_WRITE;
    w.flags = SIG;
    w.sg_list = &sg;
    w.num_sge = 1;
    w.remote_addr = e.addr[1];
    w.rkey = e.rkey[1];
    CHECK_EQ(rdd_qp_post_send(e.qp[0], &w, 1, &bad), RDD_STATUS_CQ_FULL);
    CHECK_EQ(bad, 0);
    /* Unsignaled work still fits (the spare entry is there). */
    CHECK_EQ(rdd_qp_write(e.qp[0], 20, e.addr[0], 8, e.lkey[0], e.addr[1], e.rkey[1], 0),
             RDD_STATUS_OK);
    CHECK_EQ(rdd_qp_send_inline(e.qp[0], 21, "x", 1, DEFER), RDD_STATUS_OK);
    /* Receives on that CQ: one fits, then none. */
    CHECK_EQ(rdd_qp_recv(e.qp[0], 30, e.addr[0] + 64, 8, e.lkey[0], 0), RDD_STATUS_OK);
    CHECK_EQ(rdd_qp_recv(e.qp[0], 31, e.addr[0] + 64, 8, e.lkey[0], 0), RDD_STATUS_CQ_FULL);
    /* Now the deferred SEND cannot be rung: no entry left for the guard's
     * possible CQE. Nothing is rung, by either kind of post. */
    bad = 99;
    CHECK_EQ(rdd_qp_ring(e.qp[0]), RDD_STATUS_CQ_FULL);
    w.flags = 0;
    CHECK_EQ(rdd_qp_post_send(e.qp[0], &w, 1, &bad), RDD_STATUS_CQ_FULL);
    CHECK_EQ(bad, 0);
    CHECK_EQ(doorbells(e.qp[0]), 16);
    /* Polling gives room back: 15 completions, then the deferred SEND
     * rings (and lands in QP 1's receive). */
    CHECK_EQ(collect(&e, e.cq[0], wc, 15), 15);
    CHECK_EQ(rdd_qp_recv(e.qp[1], 40, e.addr[1] + 64, 8, e.lkey[1], 0), RDD_STATUS_OK);
    CHECK_EQ(rdd_qp_ring(e.qp[0]), RDD_STATUS_OK);
    CHECK_EQ(doorbells(e.qp[0]), 17);
    CHECK_EQ(collect(&e, e.cq[1], wc, 1), 1);
    CHECK_EQ(wc[0].wr_id, 40);
    CHECK_EQ(wc[0].byte_len, 1);
    /* And signaled work fits again. */
    CHECK_EQ(rdd_qp_read(e.qp[0], 50, e.addr[0], 8, e.lkey[0], e.addr[1], e.rkey[1], SIG),
             RDD_STATUS_OK);
    CHECK_EQ(collect(&e, e.cq[0], wc, 1), 1);
    CHECK_EQ(wc[0].wr_id, 50);
    env_close(&e);
}

/* ---- the one-handle poll --------------------------------------------------------- */

static void test_poll_n(void)
{
    struct env e;
    rdd_qp *x[3], *peer[3], *dead;
    rdd_wc wc[16];
    unsigned seen[3] = {0, 0, 0};
    rdd_qp_info info[3];
    int i, j, n;
    env_open(&e);

    /* Arguments. */
    CHECK_EQ(rdd_cq_poll_n(NULL, wc, 4), -(int32_t)RDD_STATUS_NULL_PARAMETER);
    CHECK_EQ(rdd_cq_poll_n(e.cq[0], NULL, 4), -(int32_t)RDD_STATUS_NULL_PARAMETER);
    CHECK_EQ(rdd_cq_poll_n(e.cq[0], NULL, 0), -(int32_t)RDD_STATUS_NULL_PARAMETER);
    CHECK_EQ(rdd_cq_poll_n(e.cq[0], (rdd_wc *)(void *)((uint8_t *)wc + 4), 1),
             -(int32_t)RDD_STATUS_INVALID_ARGUMENT);
    CHECK_EQ(rdd_cq_poll_n(e.cq[0], wc, 0), 0);
    CHECK_EQ(rdd_cq_poll_n((rdd_cq *)(void *)e.qp[0], wc, 4),
             -(int32_t)RDD_STATUS_INVALID_HANDLE);
    CHECK_EQ(rdd_cq_poll_n((rdd_cq *)(uintptr_t)0x123456789abcde04ull, wc, 4),
             -(int32_t)RDD_STATUS_INVALID_HANDLE);
    CHECK_EQ(rdd_cq_poll_n(e.cq[0], wc, 4), 0);

    /* n = 0 and a short array leave the rest for the next call. */
    for (i = 0; i < 3; i++) {
        CHECK_EQ(rdd_qp_write(e.qp[0], 1 + (uint64_t)i, e.addr[0], 8, e.lkey[0], e.addr[1],
                              e.rkey[1], SIG),
                 RDD_STATUS_OK);
    }
    for (i = 0; i < 4; i++) {
        (void)step(&e);
    }
    CHECK_EQ(rdd_cq_poll_n(e.cq[0], wc, 0), 0);
    CHECK_EQ(rdd_cq_poll_n(e.cq[0], wc, 2), 2);
    CHECK_EQ(wc[0].wr_id, 1);
    CHECK_EQ(wc[1].wr_id, 2);
    CHECK_EQ(wc[1].qp_num, wc[0].qp_num);
    /* Mixing with the listed poll is fine. */
    {
        size_t cnt = 0;
        CHECK_EQ(rdd_cq_poll(e.cq[0], &e.qp[0], 1, wc, 4, &cnt), RDD_STATUS_OK);
        CHECK_EQ(cnt, 1);
        CHECK_EQ(wc[0].wr_id, 3);
    }

    /* Three more QPs complete on QP 0's CQ (their peers on QP 1's). */
    for (i = 0; i < 3; i++) {
        MUST(rdd_qp_create(e.pd, e.cq[0], e.cq[0], NULL, &x[i]));
        MUST(rdd_qp_create(e.pd, e.cq[1], e.cq[1], NULL, &peer[i]));
        connect_pair(x[i], peer[i]);
        MUST(rdd_qp_query_info(x[i], &info[i]));
    }
    for (j = 0; j < 2; j++) {
        for (i = 0; i < 3; i++) {
            CHECK_EQ(rdd_qp_write(x[i], (uint64_t)(10 * i + j), e.addr[0], 8, e.lkey[0],
                                  e.addr[1] + 8 * (uint64_t)i, e.rkey[1], SIG),
                     RDD_STATUS_OK);
        }
    }
    CHECK_EQ(collect(&e, e.cq[0], wc, 6), 6);
    for (i = 0; i < 6; i++) {
        int k = (int)(wc[i].wr_id / 10);
        CHECK(k >= 0 && k < 3);
        if (k >= 0 && k < 3) {
            CHECK_EQ(wc[i].qp_num, info[k].qpn);
            CHECK_EQ(wc[i].wr_id % 10, seen[k]); /* in order per QP */
            seen[k]++;
        }
        CHECK_EQ(wc[i].status, RDD_WC_SUCCESS);
    }
    CHECK_EQ(seen[0] + seen[1] + seen[2], 6);

    /* A destroyed QP: its completions still on the CQ are discarded, the
     * others' come through. */
    CHECK_EQ(rdd_qp_write(x[0], 100, e.addr[0], 8, e.lkey[0], e.addr[1], e.rkey[1], SIG),
             RDD_STATUS_OK);
    CHECK_EQ(rdd_qp_write(x[1], 101, e.addr[0], 8, e.lkey[0], e.addr[1], e.rkey[1], SIG),
             RDD_STATUS_OK);
    for (i = 0; i < 4; i++) {
        (void)step(&e);
    }
    dead = x[0];
    MUST(rdd_qp_destroy(x[0]));
    n = rdd_cq_poll_n(e.cq[0], wc, 16);
    CHECK_EQ(n, 1);
    CHECK_EQ(wc[0].wr_id, 101);
    CHECK_EQ(rdd_cq_poll_n(e.cq[0], wc, 16), 0);
    CHECK_EQ(rdd_qp_write(dead, 1, e.addr[0], 8, e.lkey[0], e.addr[1], e.rkey[1], SIG),
             RDD_STATUS_INVALID_HANDLE);
    MUST(rdd_qp_destroy(peer[0]));
    for (i = 1; i < 3; i++) {
        MUST(rdd_qp_destroy(x[i]));
        MUST(rdd_qp_destroy(peer[i]));
    }

    /* Separate send and receive CQs: each poll sees its own side. */
    {
        rdd_cq *scq, *rcq;
        rdd_qp *a, *b;
        MUST(rdd_cq_create(e.dev, 1024, &scq));
        MUST(rdd_cq_create(e.dev, 1024, &rcq));
        MUST(rdd_qp_create(e.pd, scq, rcq, NULL, &a));
        MUST(rdd_qp_create(e.pd, scq, rcq, NULL, &b));
        connect_pair(a, b);
        CHECK_EQ(rdd_qp_recv(b, 7, e.addr[1], 16, e.lkey[1], 0), RDD_STATUS_OK);
        CHECK_EQ(rdd_qp_send_inline(a, 8, "pq", 2, SIG), RDD_STATUS_OK);
        CHECK_EQ(collect(&e, rcq, wc, 1), 1);
        CHECK_EQ(wc[0].wr_id, 7);
        CHECK_EQ(wc[0].opcode, RDD_WC_OP_RECV);
        CHECK_EQ(collect(&e, scq, wc, 1), 1);
        CHECK_EQ(wc[0].wr_id, 8);
        CHECK_EQ(wc[0].opcode, RDD_WC_OP_SEND);
        CHECK_EQ(rdd_cq_destroy(scq), RDD_STATUS_RESOURCE_BUSY);
        MUST(rdd_qp_destroy(a));
        MUST(rdd_qp_destroy(b));
        /* Both unbound: the CQs go, and their handles are dead. */
        MUST(rdd_cq_destroy(scq));
        MUST(rdd_cq_destroy(rcq));
        CHECK_EQ(rdd_cq_poll_n(scq, wc, 4), -(int32_t)RDD_STATUS_INVALID_HANDLE);
    }
    env_close(&e);
    CHECK_EQ(rdd_cq_poll_n(e.cq[0], wc, 4), -(int32_t)RDD_STATUS_INVALID_HANDLE);
}

/* On an unguarded CQ the one-handle poll gives the posters their room
 * back, as rdd_cq_poll does. */
static void test_poll_n_headroom(void)
{
    struct env e;
    rdd_qp_init init = small_init(64);
    rdd_wc wc[32];
    int round, i;
    env_open_with(&e, 8, 1, &init);
    for (round = 0; round < 3; round++) {
        for (i = 0; i < 15; i++) {
            CHECK_EQ(rdd_qp_write(e.qp[0], (uint64_t)i, e.addr[0], 8, e.lkey[0], e.addr[1],
                                  e.rkey[1], SIG | (i % 4 ? DEFER : 0)),
                     RDD_STATUS_OK);
        }
        CHECK_EQ(rdd_qp_write(e.qp[0], 15, e.addr[0], 8, e.lkey[0], e.addr[1], e.rkey[1], SIG),
                 RDD_STATUS_CQ_FULL);
        CHECK_EQ(rdd_qp_ring(e.qp[0]), RDD_STATUS_OK);
        CHECK_EQ(collect(&e, e.cq[0], wc, 15), 15);
        CHECK_EQ(wc[14].wr_id, 14);
    }
    env_close(&e);
}

int main(void)
{
    test_rdma_ops();
    test_send_ops();
    test_defer();
    test_bad_handles();
    test_bad_flags_and_state();
    test_full_queues();
    test_cq_full();
    test_poll_n();
    test_poll_n_headroom();
    return h_finish("test_object_ops");
}
