/*
 * C11 tests of the object-level API on the software device: RC ping-pong
 * (step mode and thread mode), RDMA WRITE/READ/CAS/FAA with the memory
 * checked, batch posting with one doorbell, CQ arming, and the bad paths:
 * NULL for every pointer parameter, destroyed and forged handles, double
 * destroy, rejected work requests (oversized SGE lists, unknown opcodes,
 * misaligned atomics, ...) that must leave the queue untouched, full
 * queues, and destroying objects in the wrong order.
 */
#define _POSIX_C_SOURCE 200809L

#include <stddef.h>
#include <poll.h>
#include <time.h>

#include "harness.h"

_Static_assert(sizeof(rdd_qp_info) == 32, "rdd_qp_info");
_Static_assert(sizeof(rdd_connect_attr) == 8, "rdd_connect_attr");
_Static_assert(sizeof(rdd_qp_init) == 24, "rdd_qp_init");
_Static_assert(sizeof(rdd_soft_config) == 8, "rdd_soft_config");
_Static_assert(offsetof(rdd_qp_info, gid) == 12 && offsetof(rdd_qp_info, mtu) == 28, "info");

#define BUF_LEN 4096u
#define ALL_REMOTE (RDD_ACCESS_REMOTE_WRITE | RDD_ACCESS_REMOTE_READ | RDD_ACCESS_REMOTE_ATOMIC)

/* ---- environment: one device, one PD, two connected QPs ------------------ */

struct env {
    rdd_device *dev;
    rdd_pd *pd;
    rdd_cq *cq[2];
    rdd_qp *qp[2];
    rdd_mr *mr[2];
    uint8_t *buf[2];
    uint32_t lkey[2];
    uint32_t rkey[2];
    int threaded;
};

static void env_open(struct env *e, const rdd_soft_config *cfg, const rdd_qp_init *init,
                     uint32_t mr_access, const rdd_connect_attr *attr)
{
    rdd_qp_info info[2];
    void *addr;
    int i;

    memset(e, 0, sizeof(*e));
    MUST(rdd_device_open_soft(cfg, &e->dev));
    MUST(rdd_pd_alloc(e->dev, &e->pd));
    for (i = 0; i < 2; i++) {
        MUST(rdd_cq_create(e->dev, 256, &e->cq[i]));
        MUST(rdd_qp_create(e->pd, e->cq[i], e->cq[i], init, &e->qp[i]));
        MUST(rdd_mr_reg(e->pd, BUF_LEN, mr_access, &e->mr[i]));
        MUST(rdd_mr_addr(e->mr[i], &addr));
        e->buf[i] = (uint8_t *)addr;
        MUST(rdd_mr_lkey(e->mr[i], &e->lkey[i]));
        MUST(rdd_mr_rkey(e->mr[i], &e->rkey[i]));
        MUST(rdd_qp_query_info(e->qp[i], &info[i]));
    }
    MUST(rdd_qp_connect(e->qp[0], &info[1], attr));
    MUST(rdd_qp_connect(e->qp[1], &info[0], attr));
}

/* Tears down in the only valid order; every step must succeed. */
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

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/*
 * Collects `want` completions of QP `side` from its CQ: in step mode one
 * device pass per round, in thread mode spinning for up to 5 s. Returns
 * how many arrived (a poll error ends the wait).
 */
static size_t wait_wc(struct env *e, int side, rdd_wc *wc, size_t want)
{
    size_t got = 0;
    double deadline = now_s() + 5.0;
    unsigned rounds = 0;
    while (got < want) {
        size_t n = 0, work = 0;
        if (!e->threaded) {
            if (rounds++ > 1000 || rdd_device_step(e->dev, &work) != RDD_STATUS_OK) {
                break;
            }
        } else if (now_s() > deadline) {
            break;
        }
        if (rdd_cq_poll(e->cq[side], &e->qp[side], 1, wc + got, want - got, &n) !=
            RDD_STATUS_OK) {
            break;
        }
        got += n;
    }
    return got;
}

/* Runs the device dry and returns how many completions `side` has then. */
static size_t drain(struct env *e, int side)
{
    rdd_wc wc[16];
    size_t n = 0, work = 0, total = 0;
    int i;
    for (i = 0; i < 8; i++) {
        (void)rdd_device_step(e->dev, &work);
    }
    do {
        n = 0;
        (void)rdd_cq_poll(e->cq[side], &e->qp[side], 1, wc, 16, &n);
        total += n;
    } while (n != 0);
    return total;
}

static rdd_sge sge_at(const struct env *e, int side, size_t off, uint32_t len)
{
    rdd_sge s;
    s.addr = (uint64_t)(uintptr_t)(e->buf[side] + off);
    s.length = len;
    s.lkey = e->lkey[side];
    return s;
}

static rdd_wr wr_make(uint64_t wr_id, uint32_t opcode, uint32_t flags, const rdd_sge *sg,
                      uint32_t num_sge)
{
    rdd_wr w;
    memset(&w, 0, sizeof(w));
    w.wr_id = wr_id;
    w.opcode = opcode;
    w.flags = flags;
    w.sg_list = sg;
    w.num_sge = num_sge;
    return w;
}

static rdd_recv_wr recv_make(uint64_t wr_id, const rdd_sge *sg, uint32_t num_sge)
{
    rdd_recv_wr r;
    memset(&r, 0, sizeof(r));
    r.wr_id = wr_id;
    r.sg_list = sg;
    r.num_sge = num_sge;
    return r;
}

/* ---- happy paths ----------------------------------------------------------- */

/* `rounds` SEND/RECV exchanges each way; data, ids and lengths checked. */
static void pingpong(struct env *e, unsigned rounds)
{
    unsigned i;
    int side;
    size_t bad = 999;
    for (i = 0; i < rounds; i++) {
        for (side = 0; side < 2; side++) {
            int peer = 1 - side;
            char msg[32];
            int len = snprintf(msg, sizeof(msg), "%s %u", side == 0 ? "ping" : "pong", i);
            rdd_sge dst = sge_at(e, peer, 2048, 64);
            rdd_sge src = sge_at(e, side, 0, (uint32_t)len);
            rdd_recv_wr r = recv_make(1000 + i, &dst, 1);
            uint32_t op = (i % 2) ? RDD_WR_SEND_WITH_IMM : RDD_WR_SEND;
            rdd_wr w = wr_make(i, op, RDD_SEND_SIGNALED, &src, 1);
            rdd_wc wc[2];
            if (op == RDD_WR_SEND_WITH_IMM) {
                w.imm_data = 0xabc00000u | i;
            }
            memcpy(e->buf[side], msg, (size_t)len);
            memset(e->buf[peer] + 2048, 0, 64);
            CHECK_EQ(rdd_qp_post_recv(e->qp[peer], &r, 1, &bad), RDD_STATUS_OK);
            CHECK_EQ(rdd_qp_post_send(e->qp[side], &w, 1, &bad), RDD_STATUS_OK);
            CHECK_EQ(wait_wc(e, peer, wc, 1), 1);
            CHECK_EQ(wc[0].status, RDD_WC_SUCCESS);
            CHECK_EQ(wc[0].opcode, RDD_WC_OP_RECV);
            CHECK_EQ(wc[0].wr_id, 1000 + i);
            CHECK_EQ(wc[0].byte_len, (uint32_t)len);
            if (op == RDD_WR_SEND_WITH_IMM) {
                CHECK_EQ(wc[0].wc_flags & RDD_WC_FLAG_WITH_IMM, RDD_WC_FLAG_WITH_IMM);
                CHECK_EQ(wc[0].imm_data, 0xabc00000u | i);
            }
            CHECK_BYTES(e->buf[peer] + 2048, msg, (size_t)len);
            CHECK_EQ(wait_wc(e, side, wc, 1), 1);
            CHECK_EQ(wc[0].status, RDD_WC_SUCCESS);
            CHECK_EQ(wc[0].opcode, RDD_WC_OP_SEND);
            CHECK_EQ(wc[0].wr_id, i);
        }
    }
    CHECK_EQ(bad, 999);
}

static void test_pingpong_step(void)
{
    struct env e;
    rdd_qp_info a, b;
    env_open(&e, NULL, NULL, RDD_ACCESS_LOCAL_WRITE, NULL);
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
    test_null_parameters();
    test_destroyed_handles();
    test_bad_work_requests();
    test_full_queues();
    test_wrong_order();
    test_create_and_connect_errors();
    test_status_messages();
    test_wait();
    test_cq_guard();
    test_cq_headroom();
    test_recover();
    test_recover_refusals();
    test_async_events();
    return h_finish("test_object");
}
