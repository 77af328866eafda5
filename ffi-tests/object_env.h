/*
 * The environment of the object-level C tests (test_object.c,
 * test_object_errors.c): one software device, one PD, two connected RC QPs
 * with their CQs and MRs, and the helpers both files use (waiting for and
 * draining completions, building SGEs and WRs, a SEND/RECV ping-pong).
 */
#ifndef RDD_FFI_TESTS_OBJECT_ENV_H
#define RDD_FFI_TESTS_OBJECT_ENV_H

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

static inline void env_open(struct env *e, const rdd_soft_config *cfg,
                            const rdd_qp_init *init, uint32_t mr_access,
                            const rdd_connect_attr *attr)
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
static inline void env_close(struct env *e)
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

static inline double now_s(void)
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
static inline size_t wait_wc(struct env *e, int side, rdd_wc *wc, size_t want)
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
static inline size_t drain(struct env *e, int side)
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

static inline rdd_sge sge_at(const struct env *e, int side, size_t off, uint32_t len)
{
    rdd_sge s;
    s.addr = (uint64_t)(uintptr_t)(e->buf[side] + off);
    s.length = len;
    s.lkey = e->lkey[side];
    return s;
}

static inline rdd_wr wr_make(uint64_t wr_id, uint32_t opcode, uint32_t flags, const rdd_sge *sg,
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

static inline rdd_recv_wr recv_make(uint64_t wr_id, const rdd_sge *sg, uint32_t num_sge)
{
    rdd_recv_wr r;
    memset(&r, 0, sizeof(r));
    r.wr_id = wr_id;
    r.sg_list = sg;
    r.num_sge = num_sge;
    return r;
}

/* `rounds` SEND/RECV exchanges each way; data, ids and lengths checked. */
static inline void pingpong(struct env *e, unsigned rounds)
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

#endif
