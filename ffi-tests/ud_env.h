/*
 * The environment of the object-level UD tests (ud_cases.h): one device,
 * PD, CQ, two UD QPs and an RC QP, one MR and two address handles on the
 * software device in step mode, and the helpers the cases share (step,
 * drain, find a receive, doorbell and drop counters). Common subset of
 * C11 and C++17.
 */
#ifndef RDD_FFI_TESTS_UD_ENV_H
#define RDD_FFI_TESTS_UD_ENV_H

#include "harness.h"

#define UD_GRH 40u
#define UD_QKEY 0x11110000u
#define UD_NDEST 16u
#define UD_SLOT 256u     /* bytes per receive slot (GRH area included) */
#define UD_BUF (1u << 20)
#define UD_SEND_OFF (UD_BUF / 2)

/* A forged handle of plausible shape (kind 9, an AH): never allocated. */
#define UD_FORGED_AH ((rdd_ah *)(uintptr_t)0x00000077000fff09ull)

/*
 * One device and PD, one CQ for everything, UD QPs a and b, one RC QP (to
 * refuse UD work on), one MR; `ah` is a plain (LID-routed, SL 3) address
 * handle, `ahg` a global one.
 */
struct ud_env {
    rdd_device *dev;
    rdd_pd *pd;
    rdd_cq *cq;
    rdd_qp *a, *b, *rc;
    uint32_t aqpn, bqpn;
    uint32_t mtu;
    uint8_t gid[16];
    rdd_mr *mr;
    uint8_t *buf;
    uint32_t lkey;
    rdd_ah *ah, *ahg;
};

static rdd_ah_attr ud_attr(int global)
{
    rdd_ah_attr at;
    memset(&at, 0, sizeof(at));
    at.dlid = 1;
    at.sl = 3;
    if (global) {
        at.is_global = 1;
        at.hop_limit = 64;
        at.traffic_class = 0x28;
        at.flow_label = 0x12345;
    }
    return at;
}

static uint32_t ud_qpn(rdd_qp *q)
{
    rdd_qp_info i;
    MUST(rdd_qp_query_info(q, &i));
    return i.qpn;
}

static void ud_env_open(struct ud_env *e)
{
    rdd_qp_info info;
    rdd_ah_attr at;
    void *addr;

    memset(e, 0, sizeof(*e));
    MUST(rdd_device_open_soft(NULL, &e->dev));
    MUST(rdd_pd_alloc(e->dev, &e->pd));
    MUST(rdd_cq_create(e->dev, 8192, &e->cq));
    MUST(rdd_qp_create_ud(e->pd, e->cq, e->cq, NULL, &e->a));
    MUST(rdd_qp_create_ud(e->pd, e->cq, e->cq, NULL, &e->b));
    MUST(rdd_qp_create(e->pd, e->cq, e->cq, NULL, &e->rc));
    MUST(rdd_qp_ready_ud(e->a, UD_QKEY));
    MUST(rdd_qp_ready_ud(e->b, UD_QKEY));
    MUST(rdd_qp_query_info(e->a, &info));
    e->aqpn = info.qpn;
    e->mtu = info.mtu;
    memcpy(e->gid, info.gid, 16);
    e->bqpn = ud_qpn(e->b);
    MUST(rdd_mr_reg(e->pd, UD_BUF, RDD_ACCESS_LOCAL_WRITE, &e->mr));
    MUST(rdd_mr_addr(e->mr, &addr));
    e->buf = (uint8_t *)addr;
    MUST(rdd_mr_lkey(e->mr, &e->lkey));
    at = ud_attr(0);
    MUST(rdd_ah_create(e->pd, &at, &e->ah));
    at = ud_attr(1);
    MUST(rdd_ah_create(e->pd, &at, &e->ahg));
}

static void ud_env_close(struct ud_env *e)
{
    CHECK_EQ(rdd_ah_destroy(e->ah), RDD_STATUS_OK);
    CHECK_EQ(rdd_ah_destroy(e->ahg), RDD_STATUS_OK);
    CHECK_EQ(rdd_qp_destroy(e->a), RDD_STATUS_OK);
    CHECK_EQ(rdd_qp_destroy(e->b), RDD_STATUS_OK);
    CHECK_EQ(rdd_qp_destroy(e->rc), RDD_STATUS_OK);
    CHECK_EQ(rdd_cq_destroy(e->cq), RDD_STATUS_OK);
    CHECK_EQ(rdd_mr_free(e->mr), RDD_STATUS_OK);
    CHECK_EQ(rdd_pd_free(e->pd), RDD_STATUS_OK);
    CHECK_EQ(rdd_device_close(e->dev), RDD_STATUS_OK);
}

static uint64_t ud_addr(const struct ud_env *e, size_t off)
{
    return (uint64_t)(uintptr_t)(e->buf + off);
}

static void ud_step(struct ud_env *e)
{
    size_t work = 0;
    MUST(rdd_device_step(e->dev, &work));
}

/* Polls everything on the CQ (rdd_cq_poll_n) into `wc`, at most `max`. */
static unsigned ud_drain(struct ud_env *e, rdd_wc *wc, unsigned max)
{
    unsigned got = 0;
    int n;
    do {
        n = rdd_cq_poll_n(e->cq, wc + got, max - got);
        CHECK(n >= 0);
        if (n > 0) {
            got += (unsigned)n;
        }
    } while (n > 0 && got < max);
    return got;
}

/* The receive among `wc[0..n]` (exactly one expected), or NULL. */
static const rdd_wc *ud_find_recv(const rdd_wc *wc, unsigned n, uint64_t wr_id)
{
    unsigned i;
    const rdd_wc *r = NULL;
    for (i = 0; i < n; i++) {
        if ((wc[i].opcode & RDD_WC_OP_RECV) != 0 && wc[i].wr_id == wr_id) {
            CHECK(r == NULL);
            r = &wc[i];
        }
    }
    return r;
}

static uint64_t ud_doorbells(rdd_qp *q)
{
    uint64_t d = 0;
    MUST(rdd_qp_doorbells(q, &d));
    return d;
}

static rdd_ud_drops ud_drops(struct ud_env *e)
{
    rdd_ud_drops d;
    MUST(rdd_device_ud_drops(e->dev, &d));
    return d;
}

#endif
