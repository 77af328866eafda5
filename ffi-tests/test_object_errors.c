/*
 * C11 tests of the object-level API's bad paths on the software device:
 * NULL for every pointer parameter, destroyed and forged handles, double
 * destroy, rejected work requests (oversized SGE lists, unknown opcodes,
 * misaligned atomics, ...) that must leave the queue untouched, full
 * queues, destroying objects in the wrong order, refused creates and
 * connects, and status messages.
 */
#define _POSIX_C_SOURCE 200809L

#include "object_env.h"

/* ---- bad paths --------------------------------------------------------------- */

static void test_null_parameters(void)
{
    struct env e;
    rdd_device *dev = (rdd_device *)(uintptr_t)1;
    rdd_pd *pd = (rdd_pd *)(uintptr_t)1;
    rdd_mr *mr = (rdd_mr *)(uintptr_t)1;
    rdd_cq *cq = (rdd_cq *)(uintptr_t)1;
    rdd_qp *qp = (rdd_qp *)(uintptr_t)1;
    rdd_qp_info info;
    rdd_qp_caps caps;
    rdd_sge s;
    rdd_wr w;
    rdd_recv_wr r;
    rdd_wc wc[2];
    void *addr = &info;
    size_t n = 77, bad = 77, len = 77;
    uint32_t key = 77;
    uint64_t bells = 77;

    env_open(&e, NULL, NULL, RDD_ACCESS_LOCAL_WRITE, NULL);
    s = sge_at(&e, 0, 0, 8);
    w = wr_make(1, RDD_WR_SEND, 0, &s, 1);
    r = recv_make(1, &s, 1);
    memset(&info, 0xee, sizeof(info));

    /* Outputs. */
    CHECK_EQ(rdd_device_open_soft(NULL, NULL), RDD_STATUS_NULL_PARAMETER);
    CHECK_EQ(rdd_device_step(e.dev, NULL), RDD_STATUS_NULL_PARAMETER);
    CHECK_EQ(rdd_device_data_path(e.dev, NULL), RDD_STATUS_NULL_PARAMETER);
    CHECK_EQ(rdd_pd_alloc(e.dev, NULL), RDD_STATUS_NULL_PARAMETER);
    CHECK_EQ(rdd_mr_reg(e.pd, 64, 0, NULL), RDD_STATUS_NULL_PARAMETER);
    CHECK_EQ(rdd_mr_addr(e.mr[0], NULL), RDD_STATUS_NULL_PARAMETER);
    CHECK_EQ(rdd_mr_len(e.mr[0], NULL), RDD_STATUS_NULL_PARAMETER);
    CHECK_EQ(rdd_mr_lkey(e.mr[0], NULL), RDD_STATUS_NULL_PARAMETER);
    CHECK_EQ(rdd_mr_rkey(e.mr[0], NULL), RDD_STATUS_NULL_PARAMETER);
    CHECK_EQ(rdd_cq_create(e.dev, 8, NULL), RDD_STATUS_NULL_PARAMETER);
    CHECK_EQ(rdd_qp_create(e.pd, e.cq[0], e.cq[0], NULL, NULL), RDD_STATUS_NULL_PARAMETER);
    CHECK_EQ(rdd_qp_query_info(e.qp[0], NULL), RDD_STATUS_NULL_PARAMETER);
    CHECK_EQ(rdd_qp_query_caps(e.qp[0], NULL), RDD_STATUS_NULL_PARAMETER);
    CHECK_EQ(rdd_qp_doorbells(e.qp[0], NULL), RDD_STATUS_NULL_PARAMETER);
    CHECK_EQ(rdd_qp_post_send(e.qp[0], &w, 1, NULL), RDD_STATUS_NULL_PARAMETER);
    CHECK_EQ(rdd_qp_post_recv(e.qp[1], &r, 1, NULL), RDD_STATUS_NULL_PARAMETER);
    CHECK_EQ(rdd_cq_poll(e.cq[0], &e.qp[0], 1, wc, 2, NULL), RDD_STATUS_NULL_PARAMETER);

    /* Handles. */
    CHECK_EQ(rdd_device_close(NULL), RDD_STATUS_NULL_PARAMETER);
    CHECK_EQ(rdd_device_step(NULL, &n), RDD_STATUS_NULL_PARAMETER);
    CHECK_EQ(rdd_device_data_path(NULL, &key), RDD_STATUS_NULL_PARAMETER);
    CHECK_EQ(key, 77u);
    CHECK_EQ(rdd_device_start(NULL), RDD_STATUS_NULL_PARAMETER);
    CHECK_EQ(rdd_device_stop(NULL), RDD_STATUS_NULL_PARAMETER);
    CHECK_EQ(rdd_pd_alloc(NULL, &pd), RDD_STATUS_NULL_PARAMETER);
    CHECK_EQ(rdd_pd_free(NULL), RDD_STATUS_NULL_PARAMETER);
    CHECK_EQ(rdd_mr_reg(NULL, 64, 0, &mr), RDD_STATUS_NULL_PARAMETER);
    CHECK_EQ(rdd_mr_free(NULL), RDD_STATUS_NULL_PARAMETER);
    CHECK_EQ(rdd_mr_addr(NULL, &addr), RDD_STATUS_NULL_PARAMETER);
    CHECK_EQ(rdd_mr_len(NULL, &len), RDD_STATUS_NULL_PARAMETER);
    CHECK_EQ(rdd_mr_lkey(NULL, &key), RDD_STATUS_NULL_PARAMETER);
    CHECK_EQ(rdd_mr_rkey(NULL, &key), RDD_STATUS_NULL_PARAMETER);
    CHECK_EQ(rdd_cq_create(NULL, 8, &cq), RDD_STATUS_NULL_PARAMETER);
    CHECK_EQ(rdd_cq_destroy(NULL), RDD_STATUS_NULL_PARAMETER);
    CHECK_EQ(rdd_cq_poll(NULL, &e.qp[0], 1, wc, 2, &n), RDD_STATUS_NULL_PARAMETER);
    CHECK_EQ(rdd_cq_arm(NULL, 0), RDD_STATUS_NULL_PARAMETER);
    CHECK_EQ(rdd_qp_create(NULL, e.cq[0], e.cq[0], NULL, &qp), RDD_STATUS_NULL_PARAMETER);
    CHECK_EQ(rdd_qp_create(e.pd, NULL, e.cq[0], NULL, &qp), RDD_STATUS_NULL_PARAMETER);
    CHECK_EQ(rdd_qp_create(e.pd, e.cq[0], NULL, NULL, &qp), RDD_STATUS_NULL_PARAMETER);
    CHECK_EQ(rdd_qp_destroy(NULL), RDD_STATUS_NULL_PARAMETER);
    CHECK_EQ(rdd_qp_query_info(NULL, &info), RDD_STATUS_NULL_PARAMETER);
    CHECK_EQ(rdd_qp_query_caps(NULL, &caps), RDD_STATUS_NULL_PARAMETER);
    CHECK_EQ(rdd_qp_doorbells(NULL, &bells), RDD_STATUS_NULL_PARAMETER);
    CHECK_EQ(rdd_qp_connect(NULL, &info, NULL), RDD_STATUS_NULL_PARAMETER);
    CHECK_EQ(rdd_qp_post_send(NULL, &w, 1, &bad), RDD_STATUS_NULL_PARAMETER);
    CHECK_EQ(rdd_qp_post_recv(NULL, &r, 1, &bad), RDD_STATUS_NULL_PARAMETER);

    /* Inputs and arrays (NULL even with a zero count). */
    CHECK_EQ(rdd_qp_connect(e.qp[0], NULL, NULL), RDD_STATUS_NULL_PARAMETER);
    CHECK_EQ(rdd_qp_post_send(e.qp[0], NULL, 1, &bad), RDD_STATUS_NULL_PARAMETER);
    CHECK_EQ(rdd_qp_post_send(e.qp[0], NULL, 0, &bad), RDD_STATUS_NULL_PARAMETER);
    CHECK_EQ(rdd_qp_post_recv(e.qp[1], NULL, 1, &bad), RDD_STATUS_NULL_PARAMETER);
    CHECK_EQ(rdd_cq_poll(e.cq[0], NULL, 1, wc, 2, &n), RDD_STATUS_NULL_PARAMETER);
    CHECK_EQ(rdd_cq_poll(e.cq[0], &e.qp[0], 1, NULL, 2, &n), RDD_STATUS_NULL_PARAMETER);
    CHECK_EQ(rdd_cq_poll(e.cq[0], &e.qp[0], 1, NULL, 0, &n), RDD_STATUS_NULL_PARAMETER);
    {
        rdd_qp *nul = NULL;
        CHECK_EQ(rdd_cq_poll(e.cq[0], &nul, 1, wc, 2, &n), RDD_STATUS_NULL_PARAMETER);
    }

    /* Nothing was written through any output on failure. */
    CHECK(dev == (rdd_device *)(uintptr_t)1);
    CHECK(pd == (rdd_pd *)(uintptr_t)1);
    CHECK(mr == (rdd_mr *)(uintptr_t)1);
    CHECK(cq == (rdd_cq *)(uintptr_t)1);
    CHECK(qp == (rdd_qp *)(uintptr_t)1);
    CHECK(addr == (void *)&info);
    CHECK_EQ(n, 77);
    CHECK_EQ(bad, 77);
    CHECK_EQ(len, 77);
    CHECK_EQ(key, 77);
    CHECK_EQ(bells, 77);
    CHECK_EQ(info.qpn, 0xeeeeeeeeu);
    /* The queues are untouched: nothing executes, nothing completes. */
    CHECK_EQ(drain(&e, 0), 0);
    CHECK_EQ(drain(&e, 1), 0);
    pingpong(&e, 1);
    env_close(&e);
}

static void test_destroyed_handles(void)
{
    struct env e;
    rdd_device *dev2 = NULL;
    rdd_pd *pd2 = NULL;
    rdd_mr *mr2 = NULL;
    rdd_cq *cq2 = NULL;
    rdd_qp *qp2 = NULL;
    rdd_qp_info info;
    rdd_qp_caps caps;
    rdd_sge s;
    rdd_wr w;
    rdd_recv_wr r;
    rdd_wc wc[2];
    void *addr = NULL;
    size_t n = 77, bad = 77, len = 77;
    uint32_t key = 77;
    uint64_t bells = 77;

    env_open(&e, NULL, NULL, RDD_ACCESS_LOCAL_WRITE, NULL);
    s = sge_at(&e, 0, 0, 8);
    w = wr_make(1, RDD_WR_SEND, 0, &s, 1);
    r = recv_make(1, &s, 1);
    CHECK_EQ(rdd_qp_query_info(e.qp[1], &info), RDD_STATUS_OK);

    /* Separate objects to destroy, next to live ones. */
    MUST(rdd_device_open_soft(NULL, &dev2));
    MUST(rdd_pd_alloc(e.dev, &pd2));
    MUST(rdd_mr_reg(e.pd, 64, 0, &mr2));
    MUST(rdd_cq_create(e.dev, 256, &cq2));
    MUST(rdd_qp_create(e.pd, cq2, cq2, NULL, &qp2));
    CHECK_EQ(rdd_qp_destroy(qp2), RDD_STATUS_OK);
    CHECK_EQ(rdd_cq_destroy(cq2), RDD_STATUS_OK);
    CHECK_EQ(rdd_mr_free(mr2), RDD_STATUS_OK);
    CHECK_EQ(rdd_pd_free(pd2), RDD_STATUS_OK);
    CHECK_EQ(rdd_device_close(dev2), RDD_STATUS_OK);

    /* Every function rejects every destroyed handle. */
    CHECK_EQ(rdd_device_close(dev2), RDD_STATUS_INVALID_HANDLE);
    CHECK_EQ(rdd_device_step(dev2, &n), RDD_STATUS_INVALID_HANDLE);
    CHECK_EQ(rdd_device_data_path(dev2, &key), RDD_STATUS_INVALID_HANDLE);
    CHECK_EQ(key, 77u);
    CHECK_EQ(rdd_device_start(dev2), RDD_STATUS_INVALID_HANDLE);
    CHECK_EQ(rdd_device_stop(dev2), RDD_STATUS_INVALID_HANDLE);
    CHECK_EQ(rdd_pd_alloc(dev2, &pd2), RDD_STATUS_INVALID_HANDLE);
    CHECK_EQ(rdd_cq_create(dev2, 8, &cq2), RDD_STATUS_INVALID_HANDLE);
    CHECK_EQ(rdd_pd_free(pd2), RDD_STATUS_INVALID_HANDLE);
    CHECK_EQ(rdd_mr_reg(pd2, 64, 0, &mr2), RDD_STATUS_INVALID_HANDLE);
    CHECK_EQ(rdd_qp_create(pd2, e.cq[0], e.cq[0], NULL, &qp2), RDD_STATUS_INVALID_HANDLE);
    CHECK_EQ(rdd_mr_free(mr2), RDD_STATUS_INVALID_HANDLE);
    CHECK_EQ(rdd_mr_addr(mr2, &addr), RDD_STATUS_INVALID_HANDLE);
    CHECK_EQ(rdd_mr_len(mr2, &len), RDD_STATUS_INVALID_HANDLE);
    CHECK_EQ(rdd_mr_lkey(mr2, &key), RDD_STATUS_INVALID_HANDLE);
    CHECK_EQ(rdd_mr_rkey(mr2, &key), RDD_STATUS_INVALID_HANDLE);
    CHECK_EQ(rdd_cq_destroy(cq2), RDD_STATUS_INVALID_HANDLE);
    CHECK_EQ(rdd_cq_arm(cq2, 0), RDD_STATUS_INVALID_HANDLE);
    CHECK_EQ(rdd_cq_poll(cq2, &e.qp[0], 1, wc, 2, &n), RDD_STATUS_INVALID_HANDLE);
    CHECK_EQ(rdd_qp_create(e.pd, cq2, e.cq[0], NULL, &qp2), RDD_STATUS_INVALID_HANDLE);
    CHECK_EQ(rdd_qp_create(e.pd, e.cq[0], cq2, NULL, &qp2), RDD_STATUS_INVALID_HANDLE);
    CHECK_EQ(rdd_qp_destroy(qp2), RDD_STATUS_INVALID_HANDLE);
    CHECK_EQ(rdd_qp_query_info(qp2, &info), RDD_STATUS_INVALID_HANDLE);
    CHECK_EQ(rdd_qp_query_caps(qp2, &caps), RDD_STATUS_INVALID_HANDLE);
    CHECK_EQ(rdd_qp_doorbells(qp2, &bells), RDD_STATUS_INVALID_HANDLE);
    CHECK_EQ(rdd_qp_connect(qp2, &info, NULL), RDD_STATUS_INVALID_HANDLE);
    CHECK_EQ(rdd_qp_post_send(qp2, &w, 1, &bad), RDD_STATUS_INVALID_HANDLE);
    CHECK_EQ(rdd_qp_post_recv(qp2, &r, 1, &bad), RDD_STATUS_INVALID_HANDLE);
    /* A destroyed QP in a poll list (the CQ is live). */
    CHECK_EQ(rdd_cq_poll(e.cq[0], &qp2, 1, wc, 2, &n), RDD_STATUS_INVALID_HANDLE);

    /* Handles of the wrong kind, and values that were never handles. */
    CHECK_EQ(rdd_pd_free((rdd_pd *)(void *)e.qp[0]), RDD_STATUS_INVALID_HANDLE);
    CHECK_EQ(rdd_cq_destroy((rdd_cq *)(void *)e.mr[0]), RDD_STATUS_INVALID_HANDLE);
    CHECK_EQ(rdd_qp_post_send((rdd_qp *)(void *)e.cq[0], &w, 1, &bad),
             RDD_STATUS_INVALID_HANDLE);
    CHECK_EQ(rdd_device_close((rdd_device *)(void *)e.pd), RDD_STATUS_INVALID_HANDLE);
    CHECK_EQ(rdd_qp_destroy((rdd_qp *)(uintptr_t)0xdeadbeefcafef00dull), RDD_STATUS_INVALID_HANDLE);
    CHECK_EQ(rdd_qp_destroy((rdd_qp *)(void *)&info), RDD_STATUS_INVALID_HANDLE);
    CHECK_EQ(rdd_mr_lkey((const rdd_mr *)(uintptr_t)~(uintptr_t)0, &key), RDD_STATUS_INVALID_HANDLE);

    /* Outputs untouched, live objects unaffected. */
    CHECK(addr == NULL);
    CHECK_EQ(n, 77);
    CHECK_EQ(bad, 77);
    CHECK_EQ(len, 77);
    CHECK_EQ(key, 77);
    CHECK_EQ(bells, 77);
    pingpong(&e, 2);

    /* A new object may reuse a slot; the old handle still fails. */
    MUST(rdd_cq_create(e.dev, 256, &cq2));
    CHECK_EQ(rdd_cq_arm(cq2, 0), RDD_STATUS_OK);
    CHECK_EQ(rdd_cq_destroy(cq2), RDD_STATUS_OK);
    CHECK_EQ(rdd_cq_destroy(cq2), RDD_STATUS_INVALID_HANDLE);
    env_close(&e);

    /* Double destroy of everything env_close destroyed. */
    CHECK_EQ(rdd_qp_destroy(e.qp[0]), RDD_STATUS_INVALID_HANDLE);
    CHECK_EQ(rdd_cq_destroy(e.cq[0]), RDD_STATUS_INVALID_HANDLE);
    CHECK_EQ(rdd_mr_free(e.mr[0]), RDD_STATUS_INVALID_HANDLE);
    CHECK_EQ(rdd_pd_free(e.pd), RDD_STATUS_INVALID_HANDLE);
    CHECK_EQ(rdd_device_close(e.dev), RDD_STATUS_INVALID_HANDLE);
}

/* Posts `w` expecting `want`; checks it posted nothing. */
static void reject(struct env *e, const rdd_wr *w, rdd_status want)
{
    size_t bad = 99;
    uint64_t before = 0, after = 0;
    CHECK_EQ(rdd_qp_doorbells(e->qp[0], &before), RDD_STATUS_OK);
    CHECK_EQ(rdd_qp_post_send(e->qp[0], w, 1, &bad), want);
    CHECK_EQ(bad, 0);
    CHECK_EQ(rdd_qp_doorbells(e->qp[0], &after), RDD_STATUS_OK);
    CHECK_EQ(after, before);
}

static void test_bad_work_requests(void)
{
    struct env e;
    rdd_connect_attr attr = {ALL_REMOTE, 7, 7, 0, 0};
    rdd_qp_caps caps;
    rdd_sge sg[64];
    rdd_wr w;
    rdd_recv_wr r;
    rdd_wc wc[2];
    size_t bad = 99;
    unsigned i;

    env_open(&e, NULL, NULL, RDD_ACCESS_LOCAL_WRITE | ALL_REMOTE, &attr);
    CHECK_EQ(rdd_qp_query_caps(e.qp[0], &caps), RDD_STATUS_OK);
    CHECK(caps.max_send_sge >= 4);
    CHECK(caps.max_inline_data >= 64);
    CHECK(caps.max_recv_sge >= 4);
    for (i = 0; i < 64; i++) {
        sg[i] = sge_at(&e, 0, i * 8, 8);
    }

    /* Oversized SGE lists. */
    w = wr_make(1, RDD_WR_SEND, RDD_SEND_SIGNALED, sg, caps.max_send_sge + 1);
    reject(&e, &w, RDD_STATUS_TOO_MANY_SGES);
    w.num_sge = 64;
    reject(&e, &w, RDD_STATUS_TOO_MANY_SGES);
    w.num_sge = 0xffffffffu;
    reject(&e, &w, RDD_STATUS_TOO_MANY_SGES);
    w.flags |= RDD_SEND_INLINE;
    w.num_sge = RDD_WR_MAX_INLINE_SGE + 1;
    reject(&e, &w, RDD_STATUS_TOO_MANY_SGES);
    /* Inline payload over max_inline_data. */
    w.num_sge = caps.max_inline_data / 8 + 1;
    if (w.num_sge <= RDD_WR_MAX_INLINE_SGE) {
        reject(&e, &w, RDD_STATUS_INLINE_TOO_LARGE);
    }
    /* Unknown opcodes and flags. */
    w = wr_make(1, 7, 0, sg, 1);
    reject(&e, &w, RDD_STATUS_INVALID_OPCODE);
    w.opcode = 0xffffffffu;
    reject(&e, &w, RDD_STATUS_INVALID_OPCODE);
    w.opcode = RDD_WR_NOP + 1;
    reject(&e, &w, RDD_STATUS_INVALID_OPCODE);
    w = wr_make(1, RDD_WR_SEND, 0x10, sg, 1);
    reject(&e, &w, RDD_STATUS_INVALID_FLAGS);
    /* Immediate on an opcode without one. */
    w = wr_make(1, RDD_WR_SEND, 0, sg, 1);
    w.imm_data = 1;
    reject(&e, &w, RDD_STATUS_INVALID_IMMEDIATE);
    /* NULL SGE array with entries; NULL inline payload. */
    w = wr_make(1, RDD_WR_SEND, 0, NULL, 1);
    reject(&e, &w, RDD_STATUS_NULL_POINTER);
    {
        rdd_sge nul = {0, 4, 0};
        w = wr_make(1, RDD_WR_SEND, RDD_SEND_INLINE, &nul, 1);
        reject(&e, &w, RDD_STATUS_NULL_POINTER);
    }
    /* Atomics: misaligned remote address, wrong local SGE, inline. */
    w = wr_make(1, RDD_WR_ATOMIC_FETCH_AND_ADD, 0, sg, 1);
    w.remote_addr = (uint64_t)(uintptr_t)e.buf[1] + 4;
    w.rkey = e.rkey[1];
    reject(&e, &w, RDD_STATUS_ATOMIC_UNALIGNED);
    w.opcode = RDD_WR_ATOMIC_CMP_AND_SWP;
    w.remote_addr = (uint64_t)(uintptr_t)e.buf[1] + 1;
    reject(&e, &w, RDD_STATUS_ATOMIC_UNALIGNED);
    w.remote_addr = (uint64_t)(uintptr_t)e.buf[1];
    w.num_sge = 2;
    reject(&e, &w, RDD_STATUS_ATOMIC_SGE_LENGTH);
    w.num_sge = 1;
    sg[0].length = 4;
    reject(&e, &w, RDD_STATUS_ATOMIC_SGE_LENGTH);
    sg[0].length = 8;
    w.flags = RDD_SEND_INLINE;
    reject(&e, &w, RDD_STATUS_INLINE_NOT_ALLOWED);
    /* A 2 GiB + message. */
    {
        rdd_sge big[2] = {{sg[0].addr, 0x40000000u, sg[0].lkey}, {sg[0].addr, 0x40000001u, 1}};
        w = wr_make(1, RDD_WR_RDMA_WRITE, 0, big, 2);
        reject(&e, &w, RDD_STATUS_LENGTH_OVERFLOW);
    }
    /* Misaligned WR array. */
    {
        uint64_t raw[(sizeof(rdd_wr) * 2) / 8 + 1];
        memset(raw, 0, sizeof(raw));
        bad = 99;
        CHECK_EQ(rdd_qp_post_send(e.qp[0], (const rdd_wr *)(void *)((uint8_t *)raw + 4), 1, &bad),
                 RDD_STATUS_INVALID_ARGUMENT);
        CHECK_EQ(bad, 0);
    }
    /* Receives: too many SGEs, reserved field, NULL list. */
    r = recv_make(1, sg, caps.max_recv_sge + 1);
    CHECK_EQ(rdd_qp_post_recv(e.qp[1], &r, 1, &bad), RDD_STATUS_TOO_MANY_SGES);
    r = recv_make(1, NULL, 1);
    CHECK_EQ(rdd_qp_post_recv(e.qp[1], &r, 1, &bad), RDD_STATUS_NULL_POINTER);
    r = recv_make(1, sg, 1);
    r.reserved = 5;
    CHECK_EQ(rdd_qp_post_recv(e.qp[1], &r, 1, &bad), RDD_STATUS_INVALID_ARGUMENT);

    /* Nothing reached either queue: no work, no completion. */
    CHECK_EQ(drain(&e, 0), 0);
    CHECK_EQ(drain(&e, 1), 0);

    /* Edge cases that are valid: NULL list with no entries, NOP,
     * zero-length SGEs skipped, an inline send. */
    w = wr_make(21, RDD_WR_NOP, RDD_SEND_SIGNALED, NULL, 0);
    CHECK_EQ(rdd_qp_post_send(e.qp[0], &w, 1, &bad), RDD_STATUS_OK);
    CHECK_EQ(wait_wc(&e, 0, wc, 1), 1);
    CHECK_EQ(wc[0].wr_id, 21);
    CHECK_EQ(wc[0].status, RDD_WC_SUCCESS);
    {
        static const char payload[] = "inline!";
        rdd_sge pieces[3];
        rdd_sge dst = sge_at(&e, 1, 2048, 64);
        pieces[0].addr = (uint64_t)(uintptr_t)payload;
        pieces[0].length = 3;
        pieces[0].lkey = 0;
        pieces[1].addr = 0;
        pieces[1].length = 0;
        pieces[1].lkey = 0;
        pieces[2].addr = (uint64_t)(uintptr_t)(payload + 3);
        pieces[2].length = 4;
        pieces[2].lkey = 0;
        r = recv_make(22, &dst, 1);
        CHECK_EQ(rdd_qp_post_recv(e.qp[1], &r, 1, &bad), RDD_STATUS_OK);
        w = wr_make(23, RDD_WR_SEND, RDD_SEND_INLINE | RDD_SEND_SIGNALED, pieces, 3);
        CHECK_EQ(rdd_qp_post_send(e.qp[0], &w, 1, &bad), RDD_STATUS_OK);
        CHECK_EQ(wait_wc(&e, 1, wc, 1), 1);
        CHECK_EQ(wc[0].byte_len, 7);
        CHECK_BYTES(e.buf[1] + 2048, payload, 7);
        CHECK_EQ(wait_wc(&e, 0, wc, 1), 1);
        CHECK_EQ(wc[0].wr_id, 23);
    }
    {
        rdd_sge three[3];
        rdd_sge dst = sge_at(&e, 1, 2048, 64);
        three[0] = sge_at(&e, 0, 0, 2);
        three[1] = sge_at(&e, 0, 100, 0);
        three[2] = sge_at(&e, 0, 4, 2);
        memcpy(e.buf[0], "ab..cd", 6);
        r = recv_make(24, &dst, 1);
        CHECK_EQ(rdd_qp_post_recv(e.qp[1], &r, 1, &bad), RDD_STATUS_OK);
        w = wr_make(25, RDD_WR_SEND, RDD_SEND_SIGNALED, three, 3);
        CHECK_EQ(rdd_qp_post_send(e.qp[0], &w, 1, &bad), RDD_STATUS_OK);
        CHECK_EQ(wait_wc(&e, 1, wc, 1), 1);
        CHECK_EQ(wc[0].byte_len, 4);
        CHECK_BYTES(e.buf[1] + 2048, "abcd", 4);
        CHECK_EQ(wait_wc(&e, 0, wc, 1), 1);
    }
    env_close(&e);
}

static void test_full_queues(void)
{
    struct env e;
    rdd_qp_init init = {1, 1, 1, 1, 0, 0};
    rdd_sge s, d;
    rdd_wr w[64];
    rdd_recv_wr r[2];
    rdd_wc wc[64];
    size_t bad = 999, posted = 0;
    unsigned i;

    env_open(&e, NULL, &init, RDD_ACCESS_LOCAL_WRITE, NULL);
    s = sge_at(&e, 0, 0, 8);
    for (i = 0; i < 64; i++) {
        w[i] = wr_make(i, RDD_WR_NOP, RDD_SEND_SIGNALED, NULL, 0);
    }
    /* The device never runs: the ring fills up. */
    CHECK_EQ(rdd_qp_post_send(e.qp[0], w, 64, &bad), RDD_STATUS_SQ_FULL);
    CHECK(bad > 0 && bad < 64);
    posted = bad;
    /* Full stays full, and posts nothing. */
    bad = 999;
    CHECK_EQ(rdd_qp_post_send(e.qp[0], w, 1, &bad), RDD_STATUS_SQ_FULL);
    CHECK_EQ(bad, 0);
    /* After the device runs and the completions are polled, room again. */
    CHECK_EQ(wait_wc(&e, 0, wc, posted), posted);
    for (i = 0; i < posted; i++) {
        CHECK_EQ(wc[i].wr_id, i);
    }
    CHECK_EQ(drain(&e, 0), 0);
    CHECK_EQ(rdd_qp_post_send(e.qp[0], w, 1, &bad), RDD_STATUS_OK);
    CHECK_EQ(wait_wc(&e, 0, wc, 1), 1);

    /* Receive queue of one entry. */
    d = sge_at(&e, 1, 0, 64);
    r[0] = recv_make(1, &d, 1);
    r[1] = recv_make(2, &d, 1);
    CHECK_EQ(rdd_qp_post_recv(e.qp[1], r, 2, &bad), RDD_STATUS_RQ_FULL);
    CHECK_EQ(bad, 1);
    CHECK_EQ(rdd_qp_post_recv(e.qp[1], &r[1], 1, &bad), RDD_STATUS_RQ_FULL);
    (void)s;
    env_close(&e);
}

static void test_wrong_order(void)
{
    rdd_device *dev = NULL;
    rdd_pd *pd = NULL;
    rdd_mr *mr = NULL;
    rdd_cq *scq = NULL, *rcq = NULL;
    rdd_qp *qp = NULL;

    MUST(rdd_device_open_soft(NULL, &dev));
    MUST(rdd_pd_alloc(dev, &pd));
    MUST(rdd_cq_create(dev, 256, &scq));
    MUST(rdd_cq_create(dev, 256, &rcq));
    MUST(rdd_mr_reg(pd, 128, RDD_ACCESS_LOCAL_WRITE, &mr));
    MUST(rdd_qp_create(pd, scq, rcq, NULL, &qp));
    CHECK_EQ(rdd_device_start(dev), RDD_STATUS_OK);

    CHECK_EQ(rdd_device_close(dev), RDD_STATUS_RESOURCE_BUSY);
    CHECK_EQ(rdd_pd_free(pd), RDD_STATUS_RESOURCE_BUSY);
    CHECK_EQ(rdd_cq_destroy(scq), RDD_STATUS_RESOURCE_BUSY);
    CHECK_EQ(rdd_cq_destroy(rcq), RDD_STATUS_RESOURCE_BUSY);
    CHECK_EQ(rdd_qp_destroy(qp), RDD_STATUS_OK);
    CHECK_EQ(rdd_cq_destroy(rcq), RDD_STATUS_OK);
    CHECK_EQ(rdd_pd_free(pd), RDD_STATUS_RESOURCE_BUSY); /* the MR */
    CHECK_EQ(rdd_device_close(dev), RDD_STATUS_RESOURCE_BUSY);
    CHECK_EQ(rdd_mr_free(mr), RDD_STATUS_OK);
    CHECK_EQ(rdd_pd_free(pd), RDD_STATUS_OK);
    CHECK_EQ(rdd_device_close(dev), RDD_STATUS_RESOURCE_BUSY); /* the CQ */
    CHECK_EQ(rdd_cq_destroy(scq), RDD_STATUS_OK);
    /* Closing a running device stops its thread. */
    CHECK_EQ(rdd_device_close(dev), RDD_STATUS_OK);
}

static void test_create_and_connect_errors(void)
{
    struct env e;
    rdd_device *dev2 = NULL;
    rdd_cq *cq2 = NULL, *cq = (rdd_cq *)(uintptr_t)1;
    rdd_qp *qp = (rdd_qp *)(uintptr_t)1;
    rdd_mr *mr = (rdd_mr *)(uintptr_t)1;
    rdd_device *dev = (rdd_device *)(uintptr_t)1;
    rdd_soft_config cfg = {96, 0};
    rdd_qp_init init;
    rdd_qp_info info;
    rdd_connect_attr attr = {0, 7, 7, 0, 0};
    size_t len = 0;

    CHECK_EQ(rdd_device_open_soft(&cfg, &dev), RDD_STATUS_INVALID_ARGUMENT);
    CHECK(dev == (rdd_device *)(uintptr_t)1);

    env_open(&e, NULL, NULL, RDD_ACCESS_LOCAL_WRITE, NULL);
    CHECK_EQ(rdd_cq_create(e.dev, 0, &cq), RDD_STATUS_INVALID_ATTRIBUTE);
    CHECK_EQ(rdd_cq_create(e.dev, 1u << 20, &cq), RDD_STATUS_INVALID_ATTRIBUTE);
    CHECK(cq == (rdd_cq *)(uintptr_t)1);

    CHECK_EQ(rdd_mr_reg(e.pd, 64, 0x20, &mr), RDD_STATUS_INVALID_ARGUMENT);
    CHECK_EQ(rdd_mr_reg(e.pd, 64, RDD_ACCESS_REMOTE_WRITE, &mr), RDD_STATUS_INVALID_ATTRIBUTE);
    CHECK_EQ(rdd_mr_reg(e.pd, 64, RDD_ACCESS_REMOTE_ATOMIC, &mr), RDD_STATUS_INVALID_ATTRIBUTE);
    CHECK_EQ(rdd_mr_reg(e.pd, (size_t)RDD_MR_MAX_LEN + 1, 0, &mr), RDD_STATUS_INVALID_ARGUMENT);
    CHECK_EQ(rdd_mr_reg(e.pd, SIZE_MAX, 0, &mr), RDD_STATUS_INVALID_ARGUMENT);
    /* An empty region is refused, as kernel devices refuse it (the
     * kernel's ib_umem_get pins no zero-page range). */
    CHECK_EQ(rdd_mr_reg(e.pd, 0, RDD_ACCESS_REMOTE_READ, &mr), RDD_STATUS_INVALID_ARGUMENT);
    CHECK(mr == (rdd_mr *)(uintptr_t)1);
    MUST(rdd_mr_reg(e.pd, 12345, RDD_ACCESS_LOCAL_WRITE, &mr));
    CHECK_EQ(rdd_mr_len(mr, &len), RDD_STATUS_OK);
    CHECK_EQ(len, 12345);
    {
        void *addr = NULL;
        uint32_t lk = 0, rk = 1;
        CHECK_EQ(rdd_mr_addr(mr, &addr), RDD_STATUS_OK);
        CHECK(addr != NULL && ((uintptr_t)addr % 4096) == 0);
        CHECK_EQ(rdd_mr_lkey(mr, &lk), RDD_STATUS_OK);
        CHECK_EQ(rdd_mr_rkey(mr, &rk), RDD_STATUS_OK);
        CHECK_EQ(lk, rk);
    }
    CHECK_EQ(rdd_mr_free(mr), RDD_STATUS_OK);

    init.max_send_wr = 8;
    init.max_recv_wr = 8;
    init.max_send_sge = 31;
    init.max_recv_sge = 1;
    init.max_inline_data = 0;
    init.flags = 0;
    CHECK_EQ(rdd_qp_create(e.pd, e.cq[0], e.cq[0], &init, &qp), RDD_STATUS_INVALID_ATTRIBUTE);
    init.max_send_sge = 1;
    init.max_send_wr = 0;
    CHECK_EQ(rdd_qp_create(e.pd, e.cq[0], e.cq[0], &init, &qp), RDD_STATUS_INVALID_ATTRIBUTE);
    init.max_send_wr = 8;
    init.flags = 0x80;
    CHECK_EQ(rdd_qp_create(e.pd, e.cq[0], e.cq[0], &init, &qp), RDD_STATUS_INVALID_ARGUMENT);
    CHECK(qp == (rdd_qp *)(uintptr_t)1);

    /* Objects of two devices do not mix. */
    MUST(rdd_device_open_soft(NULL, &dev2));
    MUST(rdd_cq_create(dev2, 256, &cq2));
    CHECK_EQ(rdd_qp_create(e.pd, cq2, cq2, NULL, &qp), RDD_STATUS_INVALID_ARGUMENT);
    CHECK_EQ(rdd_qp_create(e.pd, e.cq[0], cq2, NULL, &qp), RDD_STATUS_INVALID_ARGUMENT);
    CHECK(qp == (rdd_qp *)(uintptr_t)1);
    CHECK_EQ(rdd_cq_destroy(cq2), RDD_STATUS_OK);
    CHECK_EQ(rdd_device_close(dev2), RDD_STATUS_OK);

    /* A QP of the poll's CQ must not be left out, repeated or foreign. */
    {
        rdd_qp *extra = NULL;
        rdd_qp *list[3];
        rdd_wc wc[2];
        size_t n = 77;
        MUST(rdd_qp_create(e.pd, e.cq[0], e.cq[1], NULL, &extra));
        list[0] = e.qp[0];
        list[1] = e.qp[0];
        list[2] = extra;
        CHECK_EQ(rdd_cq_poll(e.cq[0], list, 1, wc, 2, &n), RDD_STATUS_INVALID_ARGUMENT);
        CHECK_EQ(rdd_cq_poll(e.cq[0], list, 2, wc, 2, &n), RDD_STATUS_INVALID_ARGUMENT);
        list[1] = e.qp[1];
        CHECK_EQ(rdd_cq_poll(e.cq[0], list, 2, wc, 2, &n), RDD_STATUS_INVALID_ARGUMENT);
        CHECK_EQ(n, 77);
        list[1] = extra;
        CHECK_EQ(rdd_cq_poll(e.cq[0], list, 2, wc, 2, &n), RDD_STATUS_OK);
        CHECK_EQ(n, 0);
        list[0] = e.qp[1];
        CHECK_EQ(rdd_cq_poll(e.cq[1], list, 2, wc, 2, &n), RDD_STATUS_OK);
        CHECK_EQ(rdd_qp_destroy(extra), RDD_STATUS_OK);
    }

    /* Connect: only from RESET, checked attributes. */
    CHECK_EQ(rdd_qp_query_info(e.qp[1], &info), RDD_STATUS_OK);
    CHECK_EQ(rdd_qp_connect(e.qp[0], &info, NULL), RDD_STATUS_INVALID_QP_STATE);
    /* Traffic class and SL are accepted; unknown access bits are not. */
    attr.traffic_class = 0x68;
    attr.sl = 3;
    attr.access = 0x100;
    CHECK_EQ(rdd_qp_connect(e.qp[0], &info, &attr), RDD_STATUS_INVALID_ARGUMENT);
    {
        rdd_qp *fresh = NULL;
        rdd_sge s = sge_at(&e, 0, 0, 8);
        rdd_wr w = wr_make(1, RDD_WR_SEND, 0, &s, 1);
        size_t bad = 9;
        MUST(rdd_qp_create(e.pd, e.cq[0], e.cq[0], NULL, &fresh));
        /* Posting before connect: wrong state, nothing written. */
        CHECK_EQ(rdd_qp_post_send(fresh, &w, 1, &bad), RDD_STATUS_INVALID_QP_STATE);
        CHECK_EQ(bad, 0);
        attr.access = 0;
        attr.rnr_retry = 8;
        CHECK_EQ(rdd_qp_connect(fresh, &info, &attr), RDD_STATUS_INVALID_ATTRIBUTE);
        CHECK_EQ(rdd_qp_destroy(fresh), RDD_STATUS_OK);
        /* A rate limit the software device cannot pace: a typed refusal. */
        MUST(rdd_qp_create(e.pd, e.cq[0], e.cq[0], NULL, &fresh));
        CHECK_EQ(rdd_qp_set_rate_limit(fresh, 10000), RDD_STATUS_OK);
        attr.rnr_retry = 7;
        CHECK_EQ(rdd_qp_connect(fresh, &info, &attr), RDD_STATUS_UNSUPPORTED);
        CHECK_EQ(rdd_qp_set_rate_limit(NULL, 1), RDD_STATUS_NULL_PARAMETER);
        CHECK_EQ(rdd_qp_destroy(fresh), RDD_STATUS_OK);
    }
    pingpong(&e, 1);
    env_close(&e);
}

static void test_status_messages(void)
{
    char buf[160];
    size_t n = 0;
    CHECK_EQ(rdd_status_str(RDD_STATUS_RESOURCE_BUSY, buf, sizeof(buf), &n), RDD_STATUS_OK);
    CHECK(n > 1 && strlen(buf) + 1 == n);
    CHECK_EQ(rdd_status_str(RDD_STATUS_INVALID_HANDLE, buf, sizeof(buf), &n), RDD_STATUS_OK);
    CHECK(strstr(buf, "handle") != NULL);
}

int main(void)
{
    test_null_parameters();
    test_destroyed_handles();
    test_bad_work_requests();
    test_full_queues();
    test_wrong_order();
    test_create_and_connect_errors();
    test_status_messages();
    return h_finish("test_object_errors");
}
