/*
 * C11 tests of the object-level API on the software device: RC ping-pong
 * (step mode and thread mode), RDMA WRITE/READ/CAS/FAA with the memory
 * checked, batch posting with one doorbell, CQ arming, bounded waits, the
 * CQ sizing guard and headroom, one-call recovery and asynchronous events.
 * The bad paths are in test_object_errors.c.
 */
#define _POSIX_C_SOURCE 200809L

#include "object_env.h"

/* ---- happy paths ----------------------------------------------------------- */


static void test_pingpong_step(void)
{
    struct env e;
    rdd_qp_info a, b;
    uint32_t path = 0;
    env_open(&e, NULL, NULL, RDD_ACCESS_LOCAL_WRITE, NULL);
    CHECK_EQ(rdd_device_data_path(e.dev, &path), RDD_STATUS_OK);
    CHECK_EQ(path, RDD_DATA_PATH_SOFTWARE);
    CHECK_EQ(rdd_qp_query_info(e.qp[0], &a), RDD_STATUS_OK);
    CHECK_EQ(rdd_qp_query_info(e.qp[1], &b), RDD_STATUS_OK);
    CHECK(a.qpn != b.qpn);
    CHECK(a.mtu >= 256);
    pingpong(&e, 50);
    env_close(&e);
}

static void test_pingpong_thread(void)
{
    struct env e;
    env_open(&e, NULL, NULL, RDD_ACCESS_LOCAL_WRITE, NULL);
    CHECK_EQ(rdd_device_start(e.dev), RDD_STATUS_OK);
    CHECK_EQ(rdd_device_start(e.dev), RDD_STATUS_OK); /* idempotent */
    e.threaded = 1;
    pingpong(&e, 200);
    CHECK_EQ(rdd_device_stop(e.dev), RDD_STATUS_OK);
    CHECK_EQ(rdd_device_stop(e.dev), RDD_STATUS_OK);
    e.threaded = 0;
    pingpong(&e, 2); /* back in step mode */
    env_close(&e);
}

static void test_cqe128(void)
{
    struct env e;
    rdd_soft_config cfg = {128, 0};
    env_open(&e, &cfg, NULL, RDD_ACCESS_LOCAL_WRITE, NULL);
    pingpong(&e, 3);
    env_close(&e);
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

static void test_rdma(void)
{
    struct env e;
    rdd_connect_attr attr = {ALL_REMOTE, 7, 7, 0, 0};
    size_t bad = 999;
    rdd_wc wc[4];
    rdd_sge s, d;
    rdd_wr w;
    rdd_recv_wr r;
    unsigned i;

    env_open(&e, NULL, NULL, RDD_ACCESS_LOCAL_WRITE | ALL_REMOTE, &attr);

    /* WRITE: A's bytes 0..99 land at B + 512. */
    for (i = 0; i < 100; i++) {
        e.buf[0][i] = (uint8_t)(i * 7 + 1);
    }
    s = sge_at(&e, 0, 0, 100);
    w = wr_make(1, RDD_WR_RDMA_WRITE, RDD_SEND_SIGNALED, &s, 1);
    w.remote_addr = (uint64_t)(uintptr_t)(e.buf[1] + 512);
    w.rkey = e.rkey[1];
    CHECK_EQ(rdd_qp_post_send(e.qp[0], &w, 1, &bad), RDD_STATUS_OK);
    CHECK_EQ(wait_wc(&e, 0, wc, 1), 1);
    CHECK_EQ(wc[0].status, RDD_WC_SUCCESS);
    CHECK_EQ(wc[0].opcode, RDD_WC_OP_RDMA_WRITE);
    CHECK_BYTES(e.buf[1] + 512, e.buf[0], 100);

    /* WRITE_WITH_IMM consumes a receive on B and carries the immediate. */
    d = sge_at(&e, 1, 3000, 8);
    r = recv_make(77, &d, 1);
    CHECK_EQ(rdd_qp_post_recv(e.qp[1], &r, 1, &bad), RDD_STATUS_OK);
    s = sge_at(&e, 0, 10, 16);
    w = wr_make(2, RDD_WR_RDMA_WRITE_WITH_IMM, RDD_SEND_SIGNALED, &s, 1);
    w.remote_addr = (uint64_t)(uintptr_t)(e.buf[1] + 1024);
    w.rkey = e.rkey[1];
    w.imm_data = 0x5eed;
    CHECK_EQ(rdd_qp_post_send(e.qp[0], &w, 1, &bad), RDD_STATUS_OK);
    CHECK_EQ(wait_wc(&e, 1, wc, 1), 1);
    CHECK_EQ(wc[0].opcode, RDD_WC_OP_RECV_RDMA_WITH_IMM);
    CHECK_EQ(wc[0].wr_id, 77);
    CHECK_EQ(wc[0].imm_data, 0x5eed);
    CHECK_EQ(wc[0].byte_len, 16);
    CHECK_BYTES(e.buf[1] + 1024, e.buf[0] + 10, 16);
    CHECK_EQ(wait_wc(&e, 0, wc, 1), 1);
    CHECK_EQ(wc[0].opcode, RDD_WC_OP_RDMA_WRITE);

    /* READ: B's bytes 512..611 come back into A + 2048. */
    s = sge_at(&e, 0, 2048, 100);
    w = wr_make(3, RDD_WR_RDMA_READ, RDD_SEND_SIGNALED, &s, 1);
    w.remote_addr = (uint64_t)(uintptr_t)(e.buf[1] + 512);
    w.rkey = e.rkey[1];
    memset(e.buf[0] + 2048, 0, 100);
    CHECK_EQ(rdd_qp_post_send(e.qp[0], &w, 1, &bad), RDD_STATUS_OK);
    CHECK_EQ(wait_wc(&e, 0, wc, 1), 1);
    CHECK_EQ(wc[0].opcode, RDD_WC_OP_RDMA_READ);
    CHECK_EQ(wc[0].byte_len, 100);
    CHECK_BYTES(e.buf[0] + 2048, e.buf[0], 100);

    /* CAS that matches: B's word swapped, old value returned to A. */
    store64(e.buf[1] + 8, 41);
    s = sge_at(&e, 0, 128, 8);
    w = wr_make(4, RDD_WR_ATOMIC_CMP_AND_SWP, RDD_SEND_SIGNALED, &s, 1);
    w.remote_addr = (uint64_t)(uintptr_t)(e.buf[1] + 8);
    w.rkey = e.rkey[1];
    w.compare_add = 41;
    w.swap = 0x1122334455667788ull;
    CHECK_EQ(rdd_qp_post_send(e.qp[0], &w, 1, &bad), RDD_STATUS_OK);
    CHECK_EQ(wait_wc(&e, 0, wc, 1), 1);
    CHECK_EQ(wc[0].opcode, RDD_WC_OP_COMP_SWAP);
    CHECK_EQ(wc[0].status, RDD_WC_SUCCESS);
    CHECK_EQ(load64(e.buf[1] + 8), 0x1122334455667788ull);
    CHECK_EQ(load64(e.buf[0] + 128), 41);

    /* CAS that does not match: unchanged, current value returned. */
    w.compare_add = 41;
    w.swap = 5;
    CHECK_EQ(rdd_qp_post_send(e.qp[0], &w, 1, &bad), RDD_STATUS_OK);
    CHECK_EQ(wait_wc(&e, 0, wc, 1), 1);
    CHECK_EQ(load64(e.buf[1] + 8), 0x1122334455667788ull);
    CHECK_EQ(load64(e.buf[0] + 128), 0x1122334455667788ull);

    /* FAA three times from both sides of the word. */
    store64(e.buf[1] + 16, 100);
    for (i = 0; i < 3; i++) {
        s = sge_at(&e, 0, 136, 8);
        w = wr_make(5 + i, RDD_WR_ATOMIC_FETCH_AND_ADD, RDD_SEND_SIGNALED, &s, 1);
        w.remote_addr = (uint64_t)(uintptr_t)(e.buf[1] + 16);
        w.rkey = e.rkey[1];
        w.compare_add = 10;
        CHECK_EQ(rdd_qp_post_send(e.qp[0], &w, 1, &bad), RDD_STATUS_OK);
        CHECK_EQ(wait_wc(&e, 0, wc, 1), 1);
        CHECK_EQ(wc[0].opcode, RDD_WC_OP_FETCH_ADD);
        CHECK_EQ(wc[0].byte_len, 8);
        CHECK_EQ(load64(e.buf[0] + 136), 100 + 10 * i);
    }
    CHECK_EQ(load64(e.buf[1] + 16), 130);
    CHECK_EQ(bad, 999);

    /* Without remote access on the QP, a WRITE is an invalid request at
     * the responder (as rxe's check_op_valid has it; docs/spec/responder.md
     * §2) and the QP goes to the error state: later work is flushed. */
    env_close(&e);
    env_open(&e, NULL, NULL, RDD_ACCESS_LOCAL_WRITE | ALL_REMOTE, NULL);
    s = sge_at(&e, 0, 0, 8);
    w = wr_make(9, RDD_WR_RDMA_WRITE, RDD_SEND_SIGNALED, &s, 1);
    w.remote_addr = (uint64_t)(uintptr_t)e.buf[1];
    w.rkey = e.rkey[1];
    CHECK_EQ(rdd_qp_post_send(e.qp[0], &w, 1, &bad), RDD_STATUS_OK);
    CHECK_EQ(wait_wc(&e, 0, wc, 1), 1);
    CHECK_EQ(wc[0].status, RDD_WC_REM_INV_REQ_ERR);
    CHECK_EQ(wc[0].wr_id, 9);
    CHECK_EQ(rdd_qp_post_send(e.qp[0], &w, 1, &bad), RDD_STATUS_OK);
    CHECK_EQ(wait_wc(&e, 0, wc, 1), 1);
    CHECK_EQ(wc[0].status, RDD_WC_WR_FLUSH_ERR);
    {
        /* The WR that broke the QP, as it was posted (the flush after it
         * does not replace it), and what usually causes its status. */
        rdd_failed_wr f;
        int found = -1;
        char why[512];
        size_t n = 0;
        memset(&f, 0xee, sizeof f);
        CHECK_EQ(rdd_qp_failed_wr(e.qp[0], &f, &found), RDD_STATUS_OK);
        CHECK_EQ(found, 1);
        CHECK_EQ(f.wr_id, 9);
        CHECK_EQ(f.status, RDD_WC_REM_INV_REQ_ERR);
        CHECK_EQ(f.opcode, RDD_WC_OP_RDMA_WRITE);
        CHECK_EQ(f.recv, 0);
        CHECK_EQ(f.remote_addr, (uint64_t)(uintptr_t)e.buf[1]);
        CHECK_EQ(f.rkey, e.rkey[1]);
        CHECK_EQ(f.local_addr, s.addr);
        CHECK_EQ(f.lkey, s.lkey);
        CHECK_EQ(f.length, 8);
        CHECK(f.syndrome != 0);
        CHECK_EQ(rdd_wc_status_causes(f.status, why, sizeof why, &n), RDD_STATUS_OK);
        CHECK(strstr(why, "access flags do not enable the operation") != NULL);
        CHECK_EQ(n, strlen(why) + 1);
        CHECK_EQ(rdd_qp_failed_wr(e.qp[1], &f, &found), RDD_STATUS_OK);
        CHECK_EQ(found, 0);
        CHECK_EQ(rdd_qp_failed_wr(e.qp[0], NULL, &found), RDD_STATUS_NULL_PARAMETER);
    }
    env_close(&e);

    /* A wrong lkey is caught by the device: local protection error. */
    env_open(&e, NULL, NULL, RDD_ACCESS_LOCAL_WRITE, NULL);
    s = sge_at(&e, 0, 0, 8);
    s.lkey ^= 0x40;
    w = wr_make(10, RDD_WR_SEND, RDD_SEND_SIGNALED, &s, 1);
    CHECK_EQ(rdd_qp_post_send(e.qp[0], &w, 1, &bad), RDD_STATUS_OK);
    CHECK_EQ(wait_wc(&e, 0, wc, 1), 1);
    CHECK_EQ(wc[0].status, RDD_WC_LOC_PROT_ERR);
    env_close(&e);
}

static void test_batch(void)
{
    struct env e;
    rdd_connect_attr attr = {RDD_ACCESS_REMOTE_WRITE, 7, 7, 0, 0};
    rdd_wr w[8];
    rdd_sge s[8];
    rdd_recv_wr r[8];
    rdd_sge d[8];
    rdd_wc wc[16];
    uint64_t bells = 0;
    size_t bad = 999;
    unsigned i;

    env_open(&e, NULL, NULL, RDD_ACCESS_LOCAL_WRITE | RDD_ACCESS_REMOTE_WRITE, &attr);
    for (i = 0; i < 8; i++) {
        e.buf[0][i * 16] = (uint8_t)(0xa0 + i);
        s[i] = sge_at(&e, 0, i * 16, 16);
        d[i] = sge_at(&e, 1, 2048 + i * 64, 64);
        r[i] = recv_make(100 + i, &d[i], 1);
        if (i % 2) {
            w[i] = wr_make(i, RDD_WR_RDMA_WRITE, RDD_SEND_SIGNALED, &s[i], 1);
            w[i].remote_addr = (uint64_t)(uintptr_t)(e.buf[1] + 1024 + i * 16);
            w[i].rkey = e.rkey[1];
        } else {
            w[i] = wr_make(i, RDD_WR_SEND, RDD_SEND_SIGNALED, &s[i], 1);
        }
    }
    CHECK_EQ(rdd_qp_doorbells(e.qp[0], &bells), RDD_STATUS_OK);
    CHECK_EQ(bells, 0);
    CHECK_EQ(rdd_qp_post_recv(e.qp[1], r, 8, &bad), RDD_STATUS_OK);
    CHECK_EQ(rdd_qp_post_send(e.qp[0], w, 8, &bad), RDD_STATUS_OK);
    CHECK_EQ(rdd_qp_doorbells(e.qp[0], &bells), RDD_STATUS_OK);
    CHECK_EQ(bells, 1); /* eight WQEs, one doorbell */
    CHECK_EQ(wait_wc(&e, 0, wc, 8), 8);
    for (i = 0; i < 8; i++) {
        CHECK_EQ(wc[i].wr_id, i);
        CHECK_EQ(wc[i].status, RDD_WC_SUCCESS);
    }
    CHECK_EQ(wait_wc(&e, 1, wc, 4), 4); /* the four SENDs */
    for (i = 0; i < 4; i++) {
        CHECK_EQ(wc[i].wr_id, 100 + i);
        CHECK_EQ(e.buf[1][2048 + i * 64], 0xa0 + 2 * i);
    }
    for (i = 1; i < 8; i += 2) {
        CHECK_BYTES(e.buf[1] + 1024 + i * 16, e.buf[0] + i * 16, 16);
    }

    /* A bad WR in the middle: the three before it are posted and rung
     * with one doorbell, it and the rest are not. */
    w[3].opcode = 0x77;
    CHECK_EQ(rdd_qp_post_send(e.qp[0], w, 8, &bad), RDD_STATUS_INVALID_OPCODE);
    CHECK_EQ(bad, 3);
    CHECK_EQ(rdd_qp_doorbells(e.qp[0], &bells), RDD_STATUS_OK);
    CHECK_EQ(bells, 2);
    CHECK_EQ(wait_wc(&e, 0, wc, 3), 3);
    CHECK_EQ(wc[2].wr_id, 2);
    CHECK_EQ(drain(&e, 0), 0);
    /* The first WR rejected: nothing posted, no doorbell. */
    bad = 999;
    CHECK_EQ(rdd_qp_post_send(e.qp[0], &w[3], 1, &bad), RDD_STATUS_INVALID_OPCODE);
    CHECK_EQ(bad, 0);
    CHECK_EQ(rdd_qp_doorbells(e.qp[0], &bells), RDD_STATUS_OK);
    CHECK_EQ(bells, 2);
    /* An empty batch is fine and rings nothing. */
    CHECK_EQ(rdd_qp_post_send(e.qp[0], w, 0, &bad), RDD_STATUS_OK);
    CHECK_EQ(rdd_qp_post_recv(e.qp[1], r, 0, &bad), RDD_STATUS_OK);
    CHECK_EQ(rdd_qp_doorbells(e.qp[0], &bells), RDD_STATUS_OK);
    CHECK_EQ(bells, 2);
    /* Receives also stop at the first bad one. */
    r[2].reserved = 1;
    CHECK_EQ(rdd_qp_post_recv(e.qp[1], r, 4, &bad), RDD_STATUS_INVALID_ARGUMENT);
    CHECK_EQ(bad, 2);
    env_close(&e);
}

static void test_arm(void)
{
    struct env e;
    env_open(&e, NULL, NULL, RDD_ACCESS_LOCAL_WRITE, NULL);
    CHECK_EQ(rdd_cq_arm(e.cq[0], 0), RDD_STATUS_OK);
    CHECK_EQ(rdd_cq_arm(e.cq[0], RDD_CQ_ARM_SOLICITED), RDD_STATUS_OK);
    CHECK_EQ(rdd_cq_arm(e.cq[0], 2), RDD_STATUS_INVALID_ARGUMENT);
    CHECK_EQ(rdd_cq_arm(NULL, 0), RDD_STATUS_NULL_PARAMETER);
    pingpong(&e, 1); /* arming does not disturb polling */
    CHECK_EQ(rdd_cq_arm(e.cq[1], 0), RDD_STATUS_OK);
    env_close(&e);
    CHECK_EQ(rdd_cq_arm(e.cq[0], 0), RDD_STATUS_INVALID_HANDLE);
}

/* Waiting with a bound, in every mode: an idle wait returns TIMEOUT on
 * time (not early, not never), a completion ends the wait, bad modes and
 * NULL parameters are refused. */
static void test_wait(void)
{
    struct env e;
    rdd_wc wc[4];
    size_t n = 99, bad = 999;
    int fd = -1;
    uint32_t mode;
    env_open(&e, NULL, NULL, RDD_ACCESS_LOCAL_WRITE, NULL);
    MUST(rdd_device_start(e.dev));
    e.threaded = 1;
    CHECK_EQ(rdd_cq_event_fd(e.cq[0], &fd), RDD_STATUS_OK);
    CHECK(fd >= 0);
    for (mode = RDD_WAIT_BUSY_POLL; mode <= RDD_WAIT_ADAPTIVE; mode++) {
        double t0 = now_s();
        rdd_sge rs = sge_at(&e, 1, 0, 64);
        rdd_recv_wr r = recv_make(200 + mode, &rs, 1);
        rdd_sge s = sge_at(&e, 0, 0, 8);
        rdd_wr w = wr_make(100 + mode, RDD_WR_SEND, RDD_SEND_SIGNALED, &s, 1);
        n = 99;
        CHECK_EQ(rdd_cq_wait(e.cq[0], &e.qp[0], 1, wc, 4, mode, 50000000ull, &n),
                 RDD_STATUS_TIMEOUT);
        CHECK_EQ(n, 99); /* outputs only on success: TIMEOUT writes nothing */
        CHECK(now_s() - t0 >= 0.049);
        CHECK(now_s() - t0 < 5.0);
        MUST(rdd_qp_post_recv(e.qp[1], &r, 1, &bad));
        MUST(rdd_qp_post_send(e.qp[0], &w, 1, &bad));
        CHECK_EQ(rdd_cq_wait(e.cq[0], &e.qp[0], 1, wc, 4, mode, 5000000000ull, &n),
                 RDD_STATUS_OK);
        CHECK_EQ(n, 1);
        CHECK_EQ(wc[0].wr_id, 100 + mode);
        CHECK_EQ(rdd_cq_wait(e.cq[1], &e.qp[1], 1, wc, 4, mode, 5000000000ull, &n),
                 RDD_STATUS_OK);
        CHECK_EQ(n, 1);
        CHECK_EQ(wc[0].wr_id, 200 + mode);
    }
    CHECK_EQ(rdd_cq_wait(e.cq[0], &e.qp[0], 1, wc, 4, 7, 0, &n), RDD_STATUS_INVALID_ARGUMENT);
    CHECK_EQ(rdd_cq_wait(e.cq[0], &e.qp[0], 1, wc, 4, RDD_WAIT_EVENT, 0, NULL),
             RDD_STATUS_NULL_PARAMETER);
    CHECK_EQ(rdd_cq_wait(e.cq[0], &e.qp[1], 1, wc, 4, RDD_WAIT_EVENT, 0, &n),
             RDD_STATUS_INVALID_ARGUMENT);
    CHECK_EQ(rdd_cq_event_fd(e.cq[0], NULL), RDD_STATUS_NULL_PARAMETER);
    MUST(rdd_device_stop(e.dev));
    e.threaded = 0;
    env_close(&e);
}

/* The CQ sizing guard: a QP whose queues could overfill its CQ when
 * flushed is refused with CQ_TOO_SMALL and charges nothing; destroying a
 * QP gives its charge back; the opt-out lets it through. */
static void test_cq_guard(void)
{
    rdd_device *dev;
    rdd_pd *pd;
    rdd_cq *cq;
    rdd_qp *a, *b;
    uint64_t depth = 0, committed = 99;
    rdd_qp_init init;
    memset(&init, 0, sizeof init);
    init.max_send_wr = 64;
    init.max_recv_wr = 64;
    init.max_send_sge = 1;
    init.max_recv_sge = 1;
    MUST(rdd_device_open_soft(NULL, &dev));
    MUST(rdd_pd_alloc(dev, &pd));
    MUST(rdd_cq_create(dev, 64, &cq)); /* 128 entries */
    CHECK_EQ(rdd_cq_budget(cq, &depth, &committed), RDD_STATUS_OK);
    CHECK_EQ(depth, 128);
    CHECK_EQ(committed, 0);
    MUST(rdd_qp_create(pd, cq, cq, &init, &a)); /* 64 + 64: exactly fits */
    CHECK_EQ(rdd_cq_budget(cq, &depth, &committed), RDD_STATUS_OK);
    CHECK_EQ(committed, 128);
    CHECK_EQ(rdd_qp_create(pd, cq, cq, &init, &b), RDD_STATUS_CQ_TOO_SMALL);
    CHECK_EQ(rdd_cq_budget(cq, &depth, &committed), RDD_STATUS_OK);
    CHECK_EQ(committed, 128);
    MUST(rdd_qp_destroy(a));
    CHECK_EQ(rdd_cq_budget(cq, &depth, &committed), RDD_STATUS_OK);
    CHECK_EQ(committed, 0);
    MUST(rdd_qp_create(pd, cq, cq, &init, &a));
    CHECK_EQ(rdd_cq_set_unguarded(cq, 1), RDD_STATUS_OK);
    MUST(rdd_qp_create(pd, cq, cq, &init, &b)); /* opted out: allowed */
    CHECK_EQ(rdd_cq_budget(cq, &depth, &committed), RDD_STATUS_OK);
    CHECK_EQ(committed, 256);
    CHECK_EQ(rdd_cq_budget(cq, NULL, &committed), RDD_STATUS_NULL_PARAMETER);
    MUST(rdd_qp_destroy(b));
    MUST(rdd_qp_destroy(a));
    MUST(rdd_cq_destroy(cq));
    MUST(rdd_pd_free(pd));
    MUST(rdd_device_close(dev));
}

/* The run-time half of the guard: on an unguarded CQ, posting counts the
 * completions the work will produce (signaled sends, receives, one spare
 * for a CQE the signalling guard may add) against the CQ's depth and
 * refuses what could overrun it with CQ_FULL; polling gives room back. */
static void test_cq_headroom(void)
{
    struct env e;
    rdd_cq *small;
    rdd_qp_info info[2];
    rdd_connect_attr attr = {RDD_ACCESS_REMOTE_WRITE, 7, 7, 0, 0};
    rdd_qp_init init;
    rdd_wc wc[32];
    rdd_wr w[20];
    rdd_recv_wr r[2];
    rdd_sge s;
    size_t bad = 0, n = 0, got = 0, work = 0;
    uint64_t depth = 0, committed = 0;
    int i;
    void *addr;

    memset(&init, 0, sizeof init);
    init.max_send_wr = 64;
    init.max_recv_wr = 64;
    init.max_send_sge = 1;
    init.max_recv_sge = 1;
    memset(&e, 0, sizeof e);
    MUST(rdd_device_open_soft(NULL, &e.dev));
    MUST(rdd_pd_alloc(e.dev, &e.pd));
    MUST(rdd_cq_create(e.dev, 8, &small)); /* 16 entries */
    CHECK_EQ(rdd_cq_budget(small, &depth, &committed), RDD_STATUS_OK);
    CHECK_EQ(depth, 16);
    CHECK_EQ(rdd_cq_set_unguarded(small, 1), RDD_STATUS_OK);
    e.cq[0] = small;
    MUST(rdd_cq_create(e.dev, 256, &e.cq[1]));
    for (i = 0; i < 2; i++) {
        MUST(rdd_qp_create(e.pd, e.cq[i], e.cq[i], &init, &e.qp[i]));
        MUST(rdd_mr_reg(e.pd, BUF_LEN, RDD_ACCESS_LOCAL_WRITE | RDD_ACCESS_REMOTE_WRITE,
                        &e.mr[i]));
        MUST(rdd_mr_addr(e.mr[i], &addr));
        e.buf[i] = (uint8_t *)addr;
        MUST(rdd_mr_lkey(e.mr[i], &e.lkey[i]));
        MUST(rdd_mr_rkey(e.mr[i], &e.rkey[i]));
        MUST(rdd_qp_query_info(e.qp[i], &info[i]));
    }
    MUST(rdd_qp_connect(e.qp[0], &info[1], &attr));
    MUST(rdd_qp_connect(e.qp[1], &info[0], &attr));

    s = sge_at(&e, 0, 0, 8);
    for (i = 0; i < 20; i++) {
        w[i] = wr_make((uint64_t)i, RDD_WR_RDMA_WRITE, RDD_SEND_SIGNALED, &s, 1);
        w[i].remote_addr = (uint64_t)(uintptr_t)e.buf[1];
        w[i].rkey = e.rkey[1];
    }
    /* 15 signaled WRITEs fit a 16-entry CQ (one entry stays spare). */
    CHECK_EQ(rdd_qp_post_send(e.qp[0], w, 20, &bad), RDD_STATUS_CQ_FULL);
    CHECK_EQ(bad, 15);
    /* Unsignaled work is still accepted. */
    w[0].flags = 0;
    CHECK_EQ(rdd_qp_post_send(e.qp[0], w, 1, &bad), RDD_STATUS_OK);
    w[0].flags = RDD_SEND_SIGNALED;
    /* One receive still fits, a second does not. */
    r[0] = recv_make(70, &s, 1);
    r[1] = recv_make(71, &s, 1);
    CHECK_EQ(rdd_qp_post_recv(e.qp[0], r, 2, &bad), RDD_STATUS_CQ_FULL);
    CHECK_EQ(bad, 1);
    for (i = 0; i < 64 && got < 15; i++) {
        MUST(rdd_device_step(e.dev, &work));
        n = 0;
        MUST(rdd_cq_poll(e.cq[0], &e.qp[0], 1, wc, 32, &n));
        got += n;
    }
    CHECK_EQ(got, 15);
    /* The room is back. */
    CHECK_EQ(rdd_qp_post_send(e.qp[0], &w[15], 5, &bad), RDD_STATUS_OK);
    got = 0;
    for (i = 0; i < 64 && got < 5; i++) {
        MUST(rdd_device_step(e.dev, &work));
        n = 0;
        MUST(rdd_cq_poll(e.cq[0], &e.qp[0], 1, wc, 32, &n));
        got += n;
    }
    CHECK_EQ(got, 5);
    env_close(&e);
}

/* ---- one-call recovery ---------------------------------------------------- */

struct seen {
    unsigned count[32];
    uint32_t status[32];
    unsigned calls;
};

static void record_wc(void *ctx, const rdd_wc *wc)
{
    struct seen *s = (struct seen *)ctx;
    s->calls++;
    if (wc->wr_id < 32) {
        s->count[wc->wr_id]++;
        s->status[wc->wr_id] = wc->status;
    }
}

/* An error in the middle of a batch: rdd_qp_recover reports every
 * outstanding WR exactly once (the flushed unsignaled ones too), names the
 * failed WR, resets, reconnects, and the QP carries on. */
static void test_recover(void)
{
    struct env e;
    struct seen s;
    rdd_connect_attr attr = {ALL_REMOTE, 7, 7, 0, 0};
    rdd_qp_info info[2];
    rdd_recovery rec;
    rdd_wc wc[32];
    rdd_wr w[24];
    rdd_sge sg[24];
    size_t bad = 0, n = 0;
    double deadline;
    int i, failed = 0;
    uint64_t id;
    unsigned before;

    memset(&s, 0, sizeof s);
    env_open(&e, NULL, NULL, RDD_ACCESS_LOCAL_WRITE | ALL_REMOTE, &attr);
    MUST(rdd_device_start(e.dev));
    e.threaded = 1;
    for (i = 0; i < 24; i++) {
        sg[i] = sge_at(&e, 0, (size_t)i * 8, 8);
        w[i] = wr_make((uint64_t)i, RDD_WR_RDMA_WRITE,
                       (i % 4 == 3 || i == 10) ? RDD_SEND_SIGNALED : 0, &sg[i], 1);
        w[i].remote_addr = (uint64_t)(uintptr_t)(e.buf[1] + (size_t)i * 8);
        w[i].rkey = i == 10 ? e.rkey[1] ^ 0x7700u : e.rkey[1];
    }
    MUST(rdd_qp_post_send(e.qp[0], w, 24, &bad));
    deadline = now_s() + 5.0;
    while (!failed && now_s() < deadline) {
        n = 0;
        MUST(rdd_cq_poll(e.cq[0], &e.qp[0], 1, wc, 32, &n));
        for (i = 0; i < (int)n; i++) {
            record_wc(&s, &wc[i]);
            failed |= wc[i].status != RDD_WC_SUCCESS;
        }
    }
    CHECK(failed);
    /* The peer's CQ is its own; a QP on a shared CQ is refused below. */
    memset(&rec, 0xff, sizeof rec);
    before = s.calls;
    CHECK_EQ(rdd_qp_recover(e.qp[0], NULL, NULL, 5000000000ull, record_wc, &s, &rec),
             RDD_STATUS_OK);
    CHECK_EQ(rec.has_failure, 1);
    CHECK_EQ(rec.failure.wr_id, 10);
    CHECK_EQ(rec.failure.status, RDD_WC_REM_ACCESS_ERR);
    CHECK_EQ(rec.failure.rkey, e.rkey[1] ^ 0x7700u);
    CHECK_EQ(rec.reserved, 0);
    for (id = 0; id < 24; id++) {
        if (id < 10) {
            /* Before the failure: signaled ones succeeded once, unsignaled
             * ones were retired silently. */
            CHECK_EQ(s.count[id], (id % 4 == 3) ? 1u : 0u);
            if (id % 4 == 3) {
                CHECK_EQ(s.status[id], RDD_WC_SUCCESS);
            }
        } else {
            CHECK_EQ(s.count[id], 1u);
            CHECK_EQ(s.status[id], id == 10 ? RDD_WC_REM_ACCESS_ERR : RDD_WC_WR_FLUSH_ERR);
        }
    }
    CHECK_EQ(rec.reported, (uint64_t)(s.calls - before));
    CHECK_EQ(s.calls, 16u); /* 3 and 7, then 10..23 */
    /* Both sides come back: the peer recovers towards us, we reconnect. */
    MUST(rdd_qp_query_info(e.qp[0], &info[0]));
    CHECK_EQ(rdd_qp_recover(e.qp[1], &info[0], &attr, 5000000000ull, NULL, NULL, NULL),
             RDD_STATUS_OK);
    MUST(rdd_qp_query_info(e.qp[1], &info[1]));
    MUST(rdd_qp_connect(e.qp[0], &info[1], &attr));
    w[10].rkey = e.rkey[1];
    w[10].flags = RDD_SEND_SIGNALED;
    memset(e.buf[1] + 80, 0, 8);
    memset(e.buf[0] + 80, 0x5a, 8);
    MUST(rdd_qp_post_send(e.qp[0], &w[10], 1, &bad));
    CHECK_EQ(wait_wc(&e, 0, wc, 1), 1);
    CHECK_EQ(wc[0].wr_id, 10);
    CHECK_EQ(wc[0].status, RDD_WC_SUCCESS);
    CHECK_EQ(memcmp(e.buf[1] + 80, e.buf[0] + 80, 8), 0);
    MUST(rdd_device_stop(e.dev));
    e.threaded = 0;
    env_close(&e);
}

/* Recovery never hangs (a device that does not flush: TIMEOUT) and never
 * eats another QP's completions (a shared CQ: RESOURCE_BUSY). */
static void test_recover_refusals(void)
{
    struct env e;
    rdd_wc wc[4];
    rdd_sge rs;
    rdd_wr w;
    size_t bad = 0;
    double t0;
    rdd_device *dev;
    rdd_pd *pd;
    rdd_cq *cq;
    rdd_qp *a, *b;

    env_open(&e, NULL, NULL, RDD_ACCESS_LOCAL_WRITE, NULL);
    rs = sge_at(&e, 0, 0, 8);
    w = wr_make(1, RDD_WR_SEND, RDD_SEND_SIGNALED, &rs, 1);
    MUST(rdd_qp_post_send(e.qp[0], &w, 1, &bad));
    /* Step mode and nobody steps: the flush never comes. */
    t0 = now_s();
    CHECK_EQ(rdd_qp_recover(e.qp[0], NULL, NULL, 50000000ull, NULL, NULL, NULL),
             RDD_STATUS_TIMEOUT);
    CHECK(now_s() - t0 < 5.0);
    /* Once the device runs, the same call finishes the job. */
    (void)drain(&e, 0);
    CHECK_EQ(rdd_qp_recover(e.qp[0], NULL, NULL, 50000000ull, NULL, NULL, NULL),
             RDD_STATUS_OK);
    (void)wc;
    env_close(&e);

    MUST(rdd_device_open_soft(NULL, &dev));
    MUST(rdd_pd_alloc(dev, &pd));
    MUST(rdd_cq_create(dev, 1024, &cq));
    MUST(rdd_qp_create(pd, cq, cq, NULL, &a));
    MUST(rdd_qp_create(pd, cq, cq, NULL, &b));
    CHECK_EQ(rdd_qp_recover(a, NULL, NULL, 0, NULL, NULL, NULL), RDD_STATUS_RESOURCE_BUSY);
    MUST(rdd_qp_destroy(b));
    CHECK_EQ(rdd_qp_recover(a, NULL, NULL, 0, NULL, NULL, NULL), RDD_STATUS_OK);
    CHECK_EQ(rdd_qp_recover(NULL, NULL, NULL, 0, NULL, NULL, NULL), RDD_STATUS_NULL_PARAMETER);
    MUST(rdd_qp_destroy(a));
    MUST(rdd_cq_destroy(cq));
    MUST(rdd_pd_free(pd));
    MUST(rdd_device_close(dev));
}

/* Asynchronous device events: none while quiet; a CQ overrun (a flush of
 * unsignaled work into an unguarded CQ) raises RDD_EVENT_CQ_ERR, and the
 * event fd is readable exactly while one is pending. */
static void test_async_events(void)
{
    struct env e;
    rdd_cq *small;
    rdd_qp_info info[2];
    rdd_connect_attr attr = {RDD_ACCESS_REMOTE_WRITE, 7, 7, 0, 0};
    rdd_async_event ev;
    rdd_wr w[8];
    rdd_sge s;
    size_t bad = 0, work = 0;
    int i, fd = -1, found = 7;
    void *addr;
    struct pollfd pfd;

    memset(&e, 0, sizeof e);
    MUST(rdd_device_open_soft(NULL, &e.dev));
    MUST(rdd_pd_alloc(e.dev, &e.pd));
    CHECK_EQ(rdd_device_poll_async_event(e.dev, &ev, &found), RDD_STATUS_OK);
    CHECK_EQ(found, 0);
    CHECK_EQ(rdd_device_async_event_fd(e.dev, &fd), RDD_STATUS_OK);
    CHECK(fd >= 0);
    pfd.fd = fd;
    pfd.events = POLLIN;
    pfd.revents = 0;
    CHECK_EQ(poll(&pfd, 1, 0), 0);
    CHECK_EQ(rdd_device_poll_async_event(e.dev, NULL, &found), RDD_STATUS_NULL_PARAMETER);
    CHECK_EQ(rdd_device_async_event_fd(NULL, &fd), RDD_STATUS_NULL_PARAMETER);

    MUST(rdd_cq_create(e.dev, 3, &small)); /* 4 entries */
    MUST(rdd_cq_set_unguarded(small, 1));
    e.cq[0] = small;
    MUST(rdd_cq_create(e.dev, 256, &e.cq[1]));
    for (i = 0; i < 2; i++) {
        MUST(rdd_qp_create(e.pd, e.cq[i], e.cq[i], NULL, &e.qp[i]));
        MUST(rdd_mr_reg(e.pd, BUF_LEN, RDD_ACCESS_LOCAL_WRITE | RDD_ACCESS_REMOTE_WRITE,
                        &e.mr[i]));
        MUST(rdd_mr_addr(e.mr[i], &addr));
        e.buf[i] = (uint8_t *)addr;
        MUST(rdd_mr_lkey(e.mr[i], &e.lkey[i]));
        MUST(rdd_mr_rkey(e.mr[i], &e.rkey[i]));
        MUST(rdd_qp_query_info(e.qp[i], &info[i]));
    }
    MUST(rdd_qp_connect(e.qp[0], &info[1], &attr));
    MUST(rdd_qp_connect(e.qp[1], &info[0], &attr));
    s = sge_at(&e, 0, 0, 8);
    for (i = 0; i < 8; i++) {
        w[i] = wr_make((uint64_t)i, RDD_WR_RDMA_WRITE, 0, &s, 1);
        w[i].remote_addr = (uint64_t)(uintptr_t)e.buf[1];
        w[i].rkey = e.rkey[1];
    }
    MUST(rdd_qp_post_send(e.qp[0], w, 8, &bad));
    /* Step mode, not stepped: recovery moves the QP to ERROR, then times
     * out waiting for the flush. */
    CHECK_EQ(rdd_qp_recover(e.qp[0], NULL, NULL, 1000000ull, NULL, NULL, NULL),
             RDD_STATUS_TIMEOUT);
    for (i = 0; i < 8; i++) {
        MUST(rdd_device_step(e.dev, &work));
    }
    CHECK_EQ(poll(&pfd, 1, 0), 1);
    CHECK_EQ(rdd_device_poll_async_event(e.dev, &ev, &found), RDD_STATUS_OK);
    CHECK_EQ(found, 1);
    CHECK_EQ(ev.kind, RDD_EVENT_CQ_ERR);
    CHECK_EQ(rdd_device_poll_async_event(e.dev, &ev, &found), RDD_STATUS_OK);
    CHECK_EQ(found, 0);
    pfd.revents = 0;
    CHECK_EQ(poll(&pfd, 1, 0), 0);
    env_close(&e);
}

int main(void)
{
    test_pingpong_step();
    test_pingpong_thread();
    test_cqe128();
    test_rdma();
    test_batch();
    test_arm();
    test_wait();
    test_cq_guard();
    test_cq_headroom();
    test_recover();
    test_recover_refusals();
    test_async_events();
    return h_finish("test_object");
}
