/*
 * The object-level SRQ tests (rdd_srq_*, rdd_qp_create_on_srq, SRQ
 * completions through rdd_cq_poll / rdd_cq_poll_n / rdd_cq_wait, the SRQ
 * limit event), written once in the common subset of C11 and C++17 and
 * run by test_srq.c and test_srq.cpp. Everything runs on the software
 * device in step mode; other devices answer rdd_srq_create with
 * RDD_STATUS_UNSUPPORTED (docs/c-api.md, "Shared receive queues").
 */
#ifndef RDD_FFI_TESTS_SRQ_CASES_H
#define RDD_FFI_TESTS_SRQ_CASES_H

#include "harness.h"

#define SRQ_NQP 3u      /* receiving QPs on the SRQ */
#define SRQ_PER_QP 8u   /* SENDs each peer sends per round */
#define SRQ_SLOT 64u    /* bytes per receive buffer */
#define SRQ_BUF 65536u

/* A forged handle of plausible shape: never allocated. */
#define SRQ_FORGED ((rdd_srq *)(uintptr_t)0x00000077000fff08ull)

/*
 * One device and PD; an SRQ; SRQ_NQP receiving QPs on it (QPs 0 and 1
 * complete on rcq[0], QP 2 on rcq[1]); SRQ_NQP sending peers on one CQ
 * (scq), each connected to its receiving QP; one MR for everything.
 */
struct srq_env {
    rdd_device *dev;
    rdd_pd *pd;
    rdd_srq *srq;
    rdd_cq *rcq[2];
    rdd_cq *scq;
    rdd_qp *rqp[SRQ_NQP];
    rdd_qp *sqp[SRQ_NQP];
    uint32_t rqpn[SRQ_NQP];
    rdd_mr *mr;
    uint8_t *buf;
    uint32_t lkey;
};

static void srq_env_open(struct srq_env *e, uint32_t max_wr)
{
    rdd_srq_init si;
    rdd_qp_info ri, sinfo;
    void *addr;
    unsigned i;

    memset(e, 0, sizeof(*e));
    MUST(rdd_device_open_soft(NULL, &e->dev));
    MUST(rdd_pd_alloc(e->dev, &e->pd));
    si.max_wr = max_wr;
    si.max_sge = 2;
    si.reserved = 0;
    MUST(rdd_srq_create(e->pd, &si, &e->srq));
    MUST(rdd_cq_create(e->dev, 2048, &e->rcq[0]));
    MUST(rdd_cq_create(e->dev, 2048, &e->rcq[1]));
    MUST(rdd_cq_create(e->dev, 1024, &e->scq));
    MUST(rdd_mr_reg(e->pd, SRQ_BUF, RDD_ACCESS_LOCAL_WRITE, &e->mr));
    MUST(rdd_mr_addr(e->mr, &addr));
    e->buf = (uint8_t *)addr;
    MUST(rdd_mr_lkey(e->mr, &e->lkey));
    for (i = 0; i < SRQ_NQP; i++) {
        rdd_cq *rc = e->rcq[i < 2 ? 0 : 1];
        MUST(rdd_qp_create_on_srq(e->pd, rc, rc, e->srq, NULL, &e->rqp[i]));
        MUST(rdd_qp_create(e->pd, e->scq, e->scq, NULL, &e->sqp[i]));
        MUST(rdd_qp_query_info(e->rqp[i], &ri));
        MUST(rdd_qp_query_info(e->sqp[i], &sinfo));
        e->rqpn[i] = ri.qpn;
        MUST(rdd_qp_connect(e->rqp[i], &sinfo, NULL));
        MUST(rdd_qp_connect(e->sqp[i], &ri, NULL));
    }
}

static void srq_env_close(struct srq_env *e)
{
    unsigned i;
    for (i = 0; i < SRQ_NQP; i++) {
        CHECK_EQ(rdd_qp_destroy(e->rqp[i]), RDD_STATUS_OK);
        CHECK_EQ(rdd_qp_destroy(e->sqp[i]), RDD_STATUS_OK);
    }
    CHECK_EQ(rdd_srq_destroy(e->srq), RDD_STATUS_OK);
    CHECK_EQ(rdd_cq_destroy(e->rcq[0]), RDD_STATUS_OK);
    CHECK_EQ(rdd_cq_destroy(e->rcq[1]), RDD_STATUS_OK);
    CHECK_EQ(rdd_cq_destroy(e->scq), RDD_STATUS_OK);
    CHECK_EQ(rdd_mr_free(e->mr), RDD_STATUS_OK);
    CHECK_EQ(rdd_pd_free(e->pd), RDD_STATUS_OK);
    CHECK_EQ(rdd_device_close(e->dev), RDD_STATUS_OK);
}

static rdd_sge srq_sge(const struct srq_env *e, size_t off, uint32_t len)
{
    rdd_sge s;
    s.addr = (uint64_t)(uintptr_t)(e->buf + off);
    s.length = len;
    s.lkey = e->lkey;
    return s;
}

/* The sender-side area of message `m`: after the receive slots. */
static size_t srq_send_off(unsigned m)
{
    return SRQ_BUF / 2 + (size_t)m * SRQ_SLOT;
}

/* Peer `p` sends `count` signaled 16-byte SENDs tagged (p, seq0 + k). */
static void srq_send(struct srq_env *e, unsigned p, unsigned seq0, unsigned count)
{
    unsigned k;
    size_t bad = 99;
    for (k = 0; k < count; k++) {
        unsigned m = p * 64u + seq0 + k;
        uint8_t *src = e->buf + srq_send_off(m);
        rdd_sge s = srq_sge(e, srq_send_off(m), 16);
        rdd_wr w;
        memset(src, 0, 16);
        src[0] = (uint8_t)(0xa0u + p);
        src[1] = (uint8_t)(seq0 + k);
        memset(&w, 0, sizeof(w));
        w.wr_id = m;
        w.opcode = RDD_WR_SEND;
        w.flags = RDD_SEND_SIGNALED;
        w.sg_list = &s;
        w.num_sge = 1;
        MUST(rdd_qp_post_send(e->sqp[p], &w, 1, &bad));
    }
}

/* Steps the device and drains the senders' CQ. */
static void srq_step(struct srq_env *e)
{
    rdd_wc wc[32];
    size_t work = 0;
    int n;
    MUST(rdd_device_step(e->dev, &work));
    do {
        n = rdd_cq_poll_n(e->scq, wc, 32);
        CHECK(n >= 0);
    } while (n > 0);
}

/*
 * Collects `want` receive completions from both receive CQs: rcq[0] with
 * rdd_cq_poll_n, rcq[1] with rdd_cq_poll (its QP list) or, when
 * `use_wait`, rdd_cq_wait in busy-poll mode. Returns how many arrived.
 */
static size_t srq_collect(struct srq_env *e, rdd_wc *out, size_t want, int use_wait)
{
    size_t got = 0;
    unsigned rounds = 0;
    while (got < want && rounds++ < 2000) {
        size_t n = 0;
        int k;
        srq_step(e);
        k = rdd_cq_poll_n(e->rcq[0], out + got, (uint32_t)(want - got));
        CHECK(k >= 0);
        if (k > 0) {
            got += (size_t)k;
        }
        if (got == want) {
            break;
        }
        if (use_wait) {
            rdd_status st = rdd_cq_wait(e->rcq[1], &e->rqp[2], 1, out + got, want - got,
                                        RDD_WAIT_BUSY_POLL, 1000ull, &n);
            CHECK(st == RDD_STATUS_OK || st == RDD_STATUS_TIMEOUT);
            if (st != RDD_STATUS_OK) {
                n = 0;
            }
        } else {
            CHECK_EQ(rdd_cq_poll(e->rcq[1], &e->rqp[2], 1, out + got, want - got, &n),
                     RDD_STATUS_OK);
        }
        got += n;
    }
    return got;
}

/* Which receiving QP index has number `qpn` (SRQ_NQP if none). */
static unsigned srq_qp_index(const struct srq_env *e, uint32_t qpn)
{
    unsigned i;
    for (i = 0; i < SRQ_NQP; i++) {
        if (e->rqpn[i] == qpn) {
            return i;
        }
    }
    return SRQ_NQP;
}

/*
 * Several QPs on one SRQ: every receive is completed exactly once, with
 * its own wr_id, the QP's number, the payload its peer sent in the
 * receive's buffer, and on the CQ of that QP. Three rounds, so the SRQ's
 * WQEs are reused in the order the completions freed them; receives are
 * posted by rdd_srq_post_recv (a list) and rdd_srq_recv (deferred, then
 * published by rdd_srq_ring or a non-deferred rdd_srq_recv).
 */
static void srq_test_many_qps(void)
{
    enum { TOTAL = SRQ_NQP * SRQ_PER_QP };
    struct srq_env e;
    rdd_wc wc[TOTAL + 4];
    unsigned seen[TOTAL];
    unsigned per_qp[SRQ_NQP];
    unsigned round, i;

    srq_env_open(&e, 64);
    for (round = 0; round < 3; round++) {
        size_t bad = 77, got;
        rdd_recv_wr rw[TOTAL / 2];
        rdd_sge sg[TOTAL / 2];
        uint64_t base = 1000u * (round + 1u);
        memset(e.buf, 0, SRQ_BUF / 2);
        for (i = 0; i < TOTAL / 2; i++) {
            sg[i] = srq_sge(&e, (size_t)i * SRQ_SLOT, SRQ_SLOT);
            rw[i].wr_id = base + i;
            rw[i].sg_list = &sg[i];
            rw[i].num_sge = 1;
            rw[i].reserved = 0;
        }
        CHECK_EQ(rdd_srq_post_recv(e.srq, rw, TOTAL / 2, &bad), RDD_STATUS_OK);
        CHECK_EQ(bad, 77);
        for (i = TOTAL / 2; i < TOTAL; i++) {
            uint32_t fl = (round == 0 && i + 1 == TOTAL) ? 0u : RDD_SEND_DEFER_DOORBELL;
            CHECK_EQ(rdd_srq_recv(e.srq, base + i, (uint64_t)(uintptr_t)(e.buf + i * SRQ_SLOT),
                                  SRQ_SLOT, e.lkey, fl),
                     RDD_STATUS_OK);
        }
        if (round != 0) {
            CHECK_EQ(rdd_srq_ring(e.srq), RDD_STATUS_OK);
        }
        for (i = 0; i < SRQ_NQP; i++) {
            srq_send(&e, i, 0, SRQ_PER_QP);
        }
        got = srq_collect(&e, wc, TOTAL, round == 2);
        CHECK_EQ(got, TOTAL);
        memset(seen, 0, sizeof(seen));
        memset(per_qp, 0, sizeof(per_qp));
        for (i = 0; i < got; i++) {
            unsigned q = srq_qp_index(&e, wc[i].qp_num);
            uint64_t slot = wc[i].wr_id - base;
            CHECK_EQ(wc[i].status, RDD_WC_SUCCESS);
            CHECK_EQ(wc[i].opcode, RDD_WC_OP_RECV);
            CHECK_EQ(wc[i].byte_len, 16);
            CHECK(q < SRQ_NQP);
            CHECK(wc[i].wr_id >= base && slot < TOTAL);
            if (q >= SRQ_NQP || wc[i].wr_id < base || slot >= TOTAL) {
                continue;
            }
            seen[slot]++;
            per_qp[q]++;
            /* The payload in that receive's buffer came from q's peer. */
            CHECK_EQ(e.buf[slot * SRQ_SLOT], 0xa0u + q);
        }
        for (i = 0; i < TOTAL; i++) {
            CHECK_EQ(seen[i], 1);
        }
        for (i = 0; i < SRQ_NQP; i++) {
            CHECK_EQ(per_qp[i], SRQ_PER_QP);
        }
        /* Nothing more: no duplicate, no late entry. */
        CHECK_EQ(srq_collect(&e, wc, 4, 0), 0);
        CHECK_EQ(rdd_cq_poll_n(e.rcq[0], wc, 0), 0);
    }
    srq_env_close(&e);
}

/* The limit event: once per arm, naming the SRQ by its number. */
static void srq_test_limit_event(void)
{
    struct srq_env e;
    rdd_srq_attr a;
    rdd_async_event ev;
    rdd_wc wc[16];
    int found = 5;
    unsigned i, events = 0;

    srq_env_open(&e, 16);
    CHECK_EQ(rdd_srq_query(e.srq, &a), RDD_STATUS_OK);
    CHECK(a.max_wr >= 16);
    CHECK(a.max_sge >= 2);
    CHECK(a.srqn != 0);
    CHECK_EQ(a.limit, 0);
    for (i = 0; i < 6; i++) {
        MUST(rdd_srq_recv(e.srq, 500 + i, (uint64_t)(uintptr_t)(e.buf + i * SRQ_SLOT), SRQ_SLOT,
                          e.lkey, 0));
    }
    CHECK_EQ(rdd_srq_arm_limit(e.srq, 4), RDD_STATUS_OK);
    CHECK_EQ(rdd_srq_query(e.srq, &a), RDD_STATUS_OK);
    CHECK_EQ(a.limit, 4);
    /* Two taken: 4 left, not below the limit. */
    srq_send(&e, 0, 0, 2);
    CHECK_EQ(srq_collect(&e, wc, 2, 0), 2);
    CHECK_EQ(rdd_device_poll_async_event(e.dev, &ev, &found), RDD_STATUS_OK);
    CHECK_EQ(found, 0);
    /* The third leaves 3 < 4: one event, then the limit is disarmed. */
    srq_send(&e, 1, 2, 2);
    CHECK_EQ(srq_collect(&e, wc, 2, 0), 2);
    for (;;) {
        found = 0;
        CHECK_EQ(rdd_device_poll_async_event(e.dev, &ev, &found), RDD_STATUS_OK);
        if (!found) {
            break;
        }
        CHECK_EQ(ev.kind, RDD_EVENT_SRQ_LIMIT_REACHED);
        CHECK_EQ(ev.element, a.srqn);
        events++;
    }
    CHECK_EQ(events, 1);
    CHECK_EQ(rdd_srq_query(e.srq, &a), RDD_STATUS_OK);
    CHECK_EQ(a.limit, 0);
    /* Re-armed at 2 with 2 left: the next take fires it once more. */
    CHECK_EQ(rdd_srq_arm_limit(e.srq, 2), RDD_STATUS_OK);
    srq_send(&e, 2, 4, 2);
    CHECK_EQ(srq_collect(&e, wc, 2, 0), 2);
    events = 0;
    for (;;) {
        found = 0;
        CHECK_EQ(rdd_device_poll_async_event(e.dev, &ev, &found), RDD_STATUS_OK);
        if (!found) {
            break;
        }
        CHECK_EQ(ev.kind, RDD_EVENT_SRQ_LIMIT_REACHED);
        CHECK_EQ(ev.element, a.srqn);
        events++;
    }
    CHECK_EQ(events, 1);
    /* A limit above max_wr is refused and changes nothing. */
    CHECK_EQ(rdd_srq_arm_limit(e.srq, 3), RDD_STATUS_OK);
    CHECK_EQ(rdd_srq_arm_limit(e.srq, a.max_wr + 1), RDD_STATUS_INVALID_ATTRIBUTE);
    CHECK_EQ(rdd_srq_query(e.srq, &a), RDD_STATUS_OK);
    CHECK_EQ(a.limit, 3);
    CHECK_EQ(rdd_srq_arm_limit(e.srq, 0), RDD_STATUS_OK);
    CHECK_EQ(rdd_srq_query(e.srq, &a), RDD_STATUS_OK);
    CHECK_EQ(a.limit, 0);
    srq_env_close(&e);
}

/* Every refused call returns its status and writes nothing. */
static void srq_test_refusals(void)
{
    struct srq_env e;
    rdd_srq_init si;
    rdd_srq_attr a, a0;
    rdd_srq *out, *other_srq = NULL, *full = NULL;
    rdd_qp *qout;
    rdd_pd *pd2;
    rdd_cq *tiny;
    rdd_qp_caps caps;
    rdd_recv_wr rw[3];
    rdd_sge sg[8];
    size_t bad;
    uint64_t depth = 0, committed = 0, committed2 = 0;
    unsigned i;
    rdd_srq *sentinel = (rdd_srq *)(uintptr_t)0x5a5a5a00u;
    rdd_qp *qsentinel = (rdd_qp *)(uintptr_t)0x5a5a5a00u;

    srq_env_open(&e, 32);

    /* rdd_srq_create */
    si.max_wr = 8;
    si.max_sge = 1;
    si.reserved = 0;
    out = sentinel;
    CHECK_EQ(rdd_srq_create(NULL, &si, &out), RDD_STATUS_NULL_PARAMETER);
    CHECK_EQ(rdd_srq_create(e.pd, NULL, &out), RDD_STATUS_NULL_PARAMETER);
    CHECK_EQ(rdd_srq_create(e.pd, &si, NULL), RDD_STATUS_NULL_PARAMETER);
    CHECK_EQ(rdd_srq_create((rdd_pd *)(void *)e.rcq[0], &si, &out), RDD_STATUS_INVALID_HANDLE);
    si.reserved = 1;
    CHECK_EQ(rdd_srq_create(e.pd, &si, &out), RDD_STATUS_INVALID_ARGUMENT);
    si.reserved = 0;
    si.max_wr = 0;
    CHECK_EQ(rdd_srq_create(e.pd, &si, &out), RDD_STATUS_INVALID_ATTRIBUTE);
    si.max_wr = 32768;
    CHECK_EQ(rdd_srq_create(e.pd, &si, &out), RDD_STATUS_INVALID_ATTRIBUTE);
    si.max_wr = 8;
    si.max_sge = 0;
    CHECK_EQ(rdd_srq_create(e.pd, &si, &out), RDD_STATUS_INVALID_ATTRIBUTE);
    si.max_sge = 32;
    CHECK_EQ(rdd_srq_create(e.pd, &si, &out), RDD_STATUS_INVALID_ATTRIBUTE);
    CHECK(out == sentinel);

    /* Handle checks on every SRQ call; nothing written. */
    memset(&a0, 0xa5, sizeof(a0));
    a = a0;
    bad = 1234;
    rw[0].wr_id = 1;
    rw[0].sg_list = sg;
    rw[0].num_sge = 1;
    rw[0].reserved = 0;
    sg[0] = srq_sge(&e, 0, 64);
    CHECK_EQ(rdd_srq_query(NULL, &a), RDD_STATUS_NULL_PARAMETER);
    CHECK_EQ(rdd_srq_query(e.srq, NULL), RDD_STATUS_NULL_PARAMETER);
    CHECK_EQ(rdd_srq_query(SRQ_FORGED, &a), RDD_STATUS_INVALID_HANDLE);
    CHECK_EQ(rdd_srq_query((rdd_srq *)(void *)e.rqp[0], &a), RDD_STATUS_INVALID_HANDLE);
    CHECK_BYTES(&a, &a0, sizeof(a));
    CHECK_EQ(rdd_srq_post_recv(NULL, rw, 1, &bad), RDD_STATUS_NULL_PARAMETER);
    CHECK_EQ(rdd_srq_post_recv(e.srq, NULL, 1, &bad), RDD_STATUS_NULL_PARAMETER);
    CHECK_EQ(rdd_srq_post_recv(e.srq, rw, 1, NULL), RDD_STATUS_NULL_PARAMETER);
    CHECK_EQ(rdd_srq_post_recv(SRQ_FORGED, rw, 1, &bad), RDD_STATUS_INVALID_HANDLE);
    CHECK_EQ(bad, 1234);
    CHECK_EQ(rdd_srq_recv(NULL, 1, sg[0].addr, 64, e.lkey, 0), RDD_STATUS_NULL_PARAMETER);
    CHECK_EQ(rdd_srq_recv(SRQ_FORGED, 1, sg[0].addr, 64, e.lkey, 0), RDD_STATUS_INVALID_HANDLE);
    CHECK_EQ(rdd_srq_recv(e.srq, 1, sg[0].addr, 64, e.lkey, 0x80), RDD_STATUS_INVALID_FLAGS);
    CHECK_EQ(rdd_srq_ring(NULL), RDD_STATUS_NULL_PARAMETER);
    CHECK_EQ(rdd_srq_ring(SRQ_FORGED), RDD_STATUS_INVALID_HANDLE);
    CHECK_EQ(rdd_srq_arm_limit(NULL, 1), RDD_STATUS_NULL_PARAMETER);
    CHECK_EQ(rdd_srq_arm_limit(SRQ_FORGED, 1), RDD_STATUS_INVALID_HANDLE);
    CHECK_EQ(rdd_srq_destroy(NULL), RDD_STATUS_NULL_PARAMETER);
    CHECK_EQ(rdd_srq_destroy(SRQ_FORGED), RDD_STATUS_INVALID_HANDLE);

    /* Too many SGEs stops the list at that WR, the ones before posted. */
    CHECK_EQ(rdd_srq_query(e.srq, &a), RDD_STATUS_OK);
    for (i = 0; i < 8; i++) {
        sg[i] = srq_sge(&e, (size_t)i * SRQ_SLOT, SRQ_SLOT);
    }
    rw[1] = rw[0];
    rw[1].wr_id = 2;
    rw[1].num_sge = a.max_sge + 1;
    rw[2] = rw[0];
    rw[2].wr_id = 3;
    CHECK(a.max_sge + 1 <= 8);
    CHECK_EQ(rdd_srq_post_recv(e.srq, rw, 3, &bad), RDD_STATUS_TOO_MANY_SGES);
    CHECK_EQ(bad, 1);

    /* Posting a receive to a QP on an SRQ: refused, nothing written. */
    bad = 4321;
    CHECK_EQ(rdd_qp_post_recv(e.rqp[0], rw, 1, &bad), RDD_STATUS_INVALID_ATTRIBUTE);
    CHECK_EQ(bad, 4321);
    rw[1].num_sge = 0; /* a receive with no SGE: the stand-in would take it */
    CHECK_EQ(rdd_qp_post_recv(e.rqp[0], &rw[1], 1, &bad), RDD_STATUS_INVALID_ATTRIBUTE);
    CHECK_EQ(bad, 4321);
    CHECK_EQ(rdd_qp_recv(e.rqp[0], 9, sg[0].addr, 64, e.lkey, 0), RDD_STATUS_INVALID_ATTRIBUTE);
    CHECK_EQ(rdd_qp_recv(e.rqp[0], 9, sg[0].addr, 64, e.lkey, RDD_SEND_DEFER_DOORBELL),
             RDD_STATUS_INVALID_ATTRIBUTE);
    CHECK_EQ(rdd_qp_ring(e.rqp[0]), RDD_STATUS_OK);
    /* Recovery needs CQs that serve only the QP: rqp[0] shares its CQ
     * with rqp[1], so it is refused, unchanged (srq_test_recover recovers
     * a QP on an SRQ that has its own). */
    CHECK_EQ(rdd_qp_recover(e.rqp[0], NULL, NULL, 1000000ull, NULL, NULL, NULL),
             RDD_STATUS_RESOURCE_BUSY);
    CHECK_EQ(rdd_qp_query_caps(e.rqp[0], &caps), RDD_STATUS_OK);
    CHECK_EQ(caps.max_recv_sge, 0);
    /* The one receive posted above (wr_id 1) is the only one the SRQ
     * gives out: one SEND completes with it, a second finds none. */
    {
        rdd_wc wc[4];
        size_t got;
        unsigned k;
        srq_send(&e, 0, 0, 1);
        got = srq_collect(&e, wc, 1, 0);
        CHECK_EQ(got, 1);
        CHECK_EQ(wc[0].wr_id, 1);
        CHECK_EQ(wc[0].qp_num, e.rqpn[0]);
        srq_send(&e, 1, 1, 1);
        for (k = 0; k < 20; k++) {
            srq_step(&e);
        }
        CHECK_EQ(rdd_cq_poll_n(e.rcq[0], wc, 4), 0);
        /* Now give it one: the stalled SEND (RNR retry) completes. */
        CHECK_EQ(rdd_srq_recv(e.srq, 55, sg[1].addr, 64, e.lkey, 0), RDD_STATUS_OK);
        got = srq_collect(&e, wc, 1, 0);
        CHECK_EQ(got, 1);
        CHECK_EQ(wc[0].wr_id, 55);
        CHECK_EQ(wc[0].qp_num, e.rqpn[1]);
    }

    /* rdd_qp_create_on_srq */
    qout = qsentinel;
    CHECK_EQ(rdd_qp_create_on_srq(e.pd, e.rcq[0], e.rcq[0], NULL, NULL, &qout),
             RDD_STATUS_NULL_PARAMETER);
    CHECK_EQ(rdd_qp_create_on_srq(e.pd, e.rcq[0], e.rcq[0], SRQ_FORGED, NULL, &qout),
             RDD_STATUS_INVALID_HANDLE);
    CHECK_EQ(rdd_qp_create_on_srq(e.pd, e.rcq[0], e.rcq[0], e.srq, NULL, NULL),
             RDD_STATUS_NULL_PARAMETER);
    CHECK_EQ(rdd_qp_create_on_srq(e.pd, e.rcq[0], e.rcq[0], (rdd_srq *)(void *)e.pd, NULL,
                                  &qout),
             RDD_STATUS_INVALID_HANDLE);
    MUST(rdd_pd_alloc(e.dev, &pd2));
    si.max_wr = 4;
    si.max_sge = 1;
    MUST(rdd_srq_create(pd2, &si, &other_srq));
    CHECK_EQ(rdd_qp_create_on_srq(e.pd, e.rcq[0], e.rcq[0], other_srq, NULL, &qout),
             RDD_STATUS_INVALID_ARGUMENT);
    /* A receive CQ that cannot take the SRQ's max_wr: refused, nothing
     * charged anywhere. */
    MUST(rdd_cq_create(e.dev, 16, &tiny));
    MUST(rdd_cq_budget(e.scq, &depth, &committed));
    CHECK_EQ(rdd_qp_create_on_srq(e.pd, e.scq, tiny, e.srq, NULL, &qout),
             RDD_STATUS_CQ_TOO_SMALL);
    CHECK(qout == qsentinel);
    MUST(rdd_cq_budget(tiny, &depth, &committed2));
    CHECK_EQ(committed2, 0);
    MUST(rdd_cq_budget(e.scq, &depth, &committed2));
    CHECK_EQ(committed2, committed);
    /* The SRQ's max_wr is counted once per receive CQ, not once per QP,
     * and given back with the last QP of the SRQ on that CQ. */
    {
        rdd_cq *c3;
        rdd_qp *qa, *qb;
        CHECK_EQ(rdd_srq_query(e.srq, &a), RDD_STATUS_OK);
        MUST(rdd_cq_create(e.dev, 1024, &c3));
        MUST(rdd_qp_create_on_srq(e.pd, e.scq, c3, e.srq, NULL, &qa));
        MUST(rdd_cq_budget(c3, &depth, &committed));
        CHECK_EQ(committed, a.max_wr);
        MUST(rdd_qp_create_on_srq(e.pd, e.scq, c3, e.srq, NULL, &qb));
        MUST(rdd_cq_budget(c3, &depth, &committed));
        CHECK_EQ(committed, a.max_wr);
        CHECK_EQ(rdd_cq_destroy(c3), RDD_STATUS_RESOURCE_BUSY);
        CHECK_EQ(rdd_qp_destroy(qa), RDD_STATUS_OK);
        MUST(rdd_cq_budget(c3, &depth, &committed));
        CHECK_EQ(committed, a.max_wr);
        CHECK_EQ(rdd_qp_destroy(qb), RDD_STATUS_OK);
        MUST(rdd_cq_budget(c3, &depth, &committed));
        CHECK_EQ(committed, 0);
        CHECK_EQ(rdd_cq_destroy(c3), RDD_STATUS_OK);
    }

    /* Destroying a PD with an SRQ, or an SRQ with QPs: busy, unchanged. */
    CHECK_EQ(rdd_pd_free(pd2), RDD_STATUS_RESOURCE_BUSY);
    CHECK_EQ(rdd_srq_destroy(e.srq), RDD_STATUS_RESOURCE_BUSY);
    CHECK_EQ(rdd_srq_query(e.srq, &a), RDD_STATUS_OK);
    CHECK_EQ(rdd_srq_recv(e.srq, 56, sg[2].addr, 64, e.lkey, 0), RDD_STATUS_OK);

    /* A full SRQ: RQ_FULL at the first WR with no free WQE. */
    si.max_wr = 3;
    si.max_sge = 1;
    MUST(rdd_srq_create(e.pd, &si, &full));
    CHECK_EQ(rdd_srq_query(full, &a), RDD_STATUS_OK);
    for (i = 0; i < a.max_wr; i++) {
        CHECK_EQ(rdd_srq_recv(full, i, sg[0].addr, 64, e.lkey, RDD_SEND_DEFER_DOORBELL),
                 RDD_STATUS_OK);
    }
    CHECK_EQ(rdd_srq_recv(full, 99, sg[0].addr, 64, e.lkey, 0), RDD_STATUS_RQ_FULL);
    bad = 0;
    CHECK_EQ(rdd_srq_post_recv(full, rw, 1, &bad), RDD_STATUS_RQ_FULL);
    CHECK_EQ(bad, 0);
    CHECK_EQ(rdd_srq_ring(full), RDD_STATUS_OK);

    /* A destroyed SRQ: every call is INVALID_HANDLE, nothing written. */
    CHECK_EQ(rdd_srq_destroy(full), RDD_STATUS_OK);
    CHECK_EQ(rdd_srq_destroy(full), RDD_STATUS_INVALID_HANDLE);
    a = a0;
    bad = 1234;
    CHECK_EQ(rdd_srq_query(full, &a), RDD_STATUS_INVALID_HANDLE);
    CHECK_BYTES(&a, &a0, sizeof(a));
    CHECK_EQ(rdd_srq_post_recv(full, rw, 1, &bad), RDD_STATUS_INVALID_HANDLE);
    CHECK_EQ(bad, 1234);
    CHECK_EQ(rdd_srq_recv(full, 1, sg[0].addr, 64, e.lkey, 0), RDD_STATUS_INVALID_HANDLE);
    CHECK_EQ(rdd_srq_ring(full), RDD_STATUS_INVALID_HANDLE);
    CHECK_EQ(rdd_srq_arm_limit(full, 1), RDD_STATUS_INVALID_HANDLE);
    qout = qsentinel;
    CHECK_EQ(rdd_qp_create_on_srq(e.pd, e.rcq[0], e.rcq[0], full, NULL, &qout),
             RDD_STATUS_INVALID_HANDLE);
    CHECK(qout == qsentinel);

    CHECK_EQ(rdd_srq_destroy(other_srq), RDD_STATUS_OK);
    CHECK_EQ(rdd_pd_free(pd2), RDD_STATUS_OK);
    CHECK_EQ(rdd_cq_destroy(tiny), RDD_STATUS_OK);
    srq_env_close(&e);
}

/*
 * A receive error on an SRQ QP: the SEND is longer than the SRQ receive it
 * takes, so that receive completes in error (routed through the SRQ, its
 * wr_id and the QP's number), the QP goes to ERROR, and the device raises
 * RDD_EVENT_QP_LAST_WQE_REACHED for it once. The other QPs keep receiving
 * from the SRQ.
 */
static void srq_test_receive_error(void)
{
    struct srq_env e;
    rdd_async_event ev;
    rdd_wc wc[4];
    int found;
    unsigned last_wqe = 0, other = 0;

    srq_env_open(&e, 16);
    MUST(rdd_srq_recv(e.srq, 70, (uint64_t)(uintptr_t)e.buf, 8, e.lkey, 0));
    srq_send(&e, 0, 0, 1); /* 16 bytes into an 8-byte receive */
    CHECK_EQ(srq_collect(&e, wc, 1, 0), 1);
    CHECK_EQ(wc[0].wr_id, 70);
    CHECK_EQ(wc[0].qp_num, e.rqpn[0]);
    CHECK(wc[0].status != RDD_WC_SUCCESS);
    { /* the device raises the event when it next looks at the QP */
        unsigned k;
        for (k = 0; k < 8; k++) {
            srq_step(&e);
        }
    }
    for (;;) {
        found = 0;
        CHECK_EQ(rdd_device_poll_async_event(e.dev, &ev, &found), RDD_STATUS_OK);
        if (!found) {
            break;
        }
        if (ev.kind == RDD_EVENT_QP_LAST_WQE_REACHED) {
            CHECK_EQ(ev.element, e.rqpn[0]);
            last_wqe++;
        } else {
            CHECK(ev.kind != RDD_EVENT_SRQ_LIMIT_REACHED);
            other++;
        }
    }
    CHECK_EQ(last_wqe, 1);
    (void)other;
    /* QP 2 (the other CQ) still takes the SRQ's receives. */
    MUST(rdd_srq_recv(e.srq, 71, (uint64_t)(uintptr_t)(e.buf + SRQ_SLOT), SRQ_SLOT, e.lkey, 0));
    srq_send(&e, 2, 1, 1);
    CHECK_EQ(srq_collect(&e, wc, 1, 0), 1);
    CHECK_EQ(wc[0].wr_id, 71);
    CHECK_EQ(wc[0].qp_num, e.rqpn[2]);
    CHECK_EQ(wc[0].status, RDD_WC_SUCCESS);
    srq_env_close(&e);
}

/* What rdd_qp_recover reported, in order. */
struct srq_seen {
    uint64_t wr_id[8];
    uint32_t status[8];
    unsigned n;
};

static void srq_record(void *ctx, const rdd_wc *wc)
{
    struct srq_seen *s = (struct srq_seen *)ctx;
    if (s->n < 8) {
        s->wr_id[s->n] = wc->wr_id;
        s->status[s->n] = wc->status;
    }
    s->n++;
}

/* Polls `cq` until `want` completions, bounded; steps `dev` first in each
 * round unless it is NULL (its device thread runs). */
static size_t srq_wait_n(rdd_device *dev, rdd_cq *cq, rdd_wc *out, size_t want)
{
    size_t got = 0;
    unsigned rounds = 0;
    while (got < want && rounds++ < 2000000u) {
        int k;
        if (dev != NULL) {
            size_t work = 0;
            MUST(rdd_device_step(dev, &work));
        }
        k = rdd_cq_poll_n(cq, out + got, (uint32_t)(want - got));
        CHECK(k >= 0);
        if (k > 0) {
            got += (size_t)k;
        }
    }
    return got;
}

/*
 * rdd_qp_recover of a QP on an SRQ with CQs of its own: its failed and
 * flushed sends are reported, it is reconnected, and the receives still in
 * the SRQ serve it afterwards, in order.
 */
static void srq_test_recover(void)
{
    struct srq_env e;
    rdd_cq *tcq, *xcq;
    rdd_qp *tx, *rx;
    rdd_qp_info ti, xi;
    rdd_recovery rec;
    struct srq_seen seen;
    rdd_wc wc[4];
    rdd_sge s;
    rdd_wr w[2];
    size_t bad = 0;
    unsigned k;

    srq_env_open(&e, 16);
    MUST(rdd_cq_create(e.dev, 256, &tcq));
    MUST(rdd_cq_create(e.dev, 256, &xcq));
    MUST(rdd_qp_create(e.pd, tcq, tcq, NULL, &tx));
    MUST(rdd_qp_create_on_srq(e.pd, xcq, xcq, e.srq, NULL, &rx));
    MUST(rdd_qp_query_info(tx, &ti));
    MUST(rdd_qp_query_info(rx, &xi));
    MUST(rdd_qp_connect(tx, &xi, NULL));
    MUST(rdd_qp_connect(rx, &ti, NULL));
    for (k = 0; k < 4; k++) {
        MUST(rdd_srq_recv(e.srq, 200 + k, (uint64_t)(uintptr_t)(e.buf + k * SRQ_SLOT), SRQ_SLOT,
                          e.lkey, 0));
    }
    s = srq_sge(&e, srq_send_off(0), 16);
    e.buf[srq_send_off(0)] = 0x41;
    MUST(rdd_qp_send(tx, 1, s.addr, s.length, s.lkey, RDD_SEND_SIGNALED));
    CHECK_EQ(srq_wait_n(e.dev, xcq, wc, 1), 1);
    CHECK_EQ(wc[0].wr_id, 200);
    CHECK_EQ(wc[0].status, RDD_WC_SUCCESS);
    CHECK_EQ(wc[0].qp_num, xi.qpn);
    CHECK_EQ(srq_wait_n(e.dev, tcq, wc, 1), 1);

    /* The SRQ QP breaks: a send with a bad lkey, then one the error
     * flushes. */
    memset(w, 0, sizeof(w));
    s.lkey = 0xdeadbeefu;
    w[0].wr_id = 50;
    w[0].opcode = RDD_WR_SEND;
    w[0].flags = RDD_SEND_SIGNALED;
    w[0].sg_list = &s;
    w[0].num_sge = 1;
    w[1] = w[0];
    w[1].wr_id = 51;
    MUST(rdd_qp_post_send(rx, &w[0], 1, &bad));
    MUST(rdd_qp_post_send(rx, &w[1], 1, &bad));
    for (k = 0; k < 8; k++) {
        size_t work = 0;
        MUST(rdd_device_step(e.dev, &work));
    }
    /* From here on the device thread runs (recovery waits for it). */
    MUST(rdd_device_start(e.dev));

    /* The requester drains and stays in RESET; the SRQ QP recovers towards
     * it; the requester connects back. */
    MUST(rdd_qp_recover(tx, NULL, NULL, 10000000000ull, NULL, NULL, NULL));
    MUST(rdd_qp_query_info(tx, &ti));
    memset(&seen, 0, sizeof(seen));
    memset(&rec, 0, sizeof(rec));
    MUST(rdd_qp_recover(rx, &ti, NULL, 10000000000ull, srq_record, &seen, &rec));
    CHECK_EQ(seen.n, 2);
    CHECK_EQ(seen.wr_id[0], 50);
    CHECK_EQ(seen.status[0], RDD_WC_LOC_PROT_ERR);
    CHECK_EQ(seen.wr_id[1], 51);
    CHECK_EQ(seen.status[1], RDD_WC_WR_FLUSH_ERR);
    CHECK_EQ(rec.reported, 2);
    CHECK_EQ(rec.has_failure, 1);
    CHECK_EQ(rec.failure.wr_id, 50);
    MUST(rdd_qp_query_info(rx, &xi));
    MUST(rdd_qp_connect(tx, &xi, NULL));

    /* The three receives the SRQ still holds serve it, in order. */
    for (k = 0; k < 3; k++) {
        MUST(rdd_qp_send(tx, 10 + k, s.addr, s.length, e.lkey, RDD_SEND_SIGNALED));
    }
    CHECK_EQ(srq_wait_n(NULL, xcq, wc, 3), 3);
    for (k = 0; k < 3; k++) {
        CHECK_EQ(wc[k].wr_id, 201 + k);
        CHECK_EQ(wc[k].status, RDD_WC_SUCCESS);
        CHECK_EQ(wc[k].qp_num, xi.qpn);
        CHECK_EQ(e.buf[(1 + k) * SRQ_SLOT], 0x41);
    }
    CHECK_EQ(srq_wait_n(NULL, tcq, wc, 3), 3);
    CHECK_EQ(rdd_qp_destroy(rx), RDD_STATUS_OK);
    CHECK_EQ(rdd_qp_destroy(tx), RDD_STATUS_OK);
    CHECK_EQ(rdd_cq_destroy(xcq), RDD_STATUS_OK);
    CHECK_EQ(rdd_cq_destroy(tcq), RDD_STATUS_OK);
    srq_env_close(&e);
}

static int run_srq_tests(const char *name)
{
    srq_test_recover();
    srq_test_receive_error();
    srq_test_many_qps();
    srq_test_limit_event();
    srq_test_refusals();
    return h_finish(name);
}

#endif
