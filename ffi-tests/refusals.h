/*
 * The table-driven refusal tests shared by test_refusals.c and
 * test_refusals.cpp (C11 and C++17, the software device) and
 * test_verbs.c (rxe and siw in the VM): for every object-level control
 * call and every parameter, an invalid value gets its typed status, the
 * object is exactly as before (rdd_qp_query, the CQ budget, the untouched
 * outputs), and the same call with valid values then succeeds. Also, on
 * the software device, rdd_qp_query, rdd_device_cq_depth_for and the name
 * functions.
 *
 * Entry points: run_refusal_tests (the software device, everything) and
 * run_device_refusal_tests (a kernel device: the connect and create
 * tables). Per device:
 * - rxe: the same tables; the rate limit is refused at RTS, after the
 *   kernel took INIT and RTR, so it tests the rollback to RESET on a real
 *   device; the create limits are values above any kernel device's
 *   (the device's own limits are not visible from C).
 * - siw (iWARP): rdd_qp_connect is UNSUPPORTED once its arguments are
 *   readable (NULL and handle checks come first): iWARP connects through
 *   rdma_cm, which the C API does not offer, so no connect succeeds
 *   there and nothing is sent; the create table applies unchanged.
 */
#ifndef RDD_FFI_TESTS_REFUSALS_H
#define RDD_FFI_TESTS_REFUSALS_H

#include <time.h>

#include "harness.h"

#define SENTINEL ((void *)(uintptr_t)0x5a5a5a5a)
/* A handle value the library never hands out. */
#define FORGED_QP ((rdd_qp *)(uintptr_t)0x7777777701ull)

/* The device the tables run on. */
enum refusal_kind { REFUSAL_SOFT, REFUSAL_RXE, REFUSAL_SIW };
static enum refusal_kind g_kind = REFUSAL_SOFT;
static const char *g_dev_name = NULL;

/* A fresh device of the kind under test. */
static void target_open(rdd_device **out)
{
    if (g_kind == REFUSAL_SOFT) {
        MUST(rdd_device_open_soft(NULL, out));
    } else {
        MUST(rdd_device_open_verbs(g_dev_name, out));
    }
}

/* Two QPs in RESET on one device, each with its own CQ. */
struct pair {
    rdd_device *dev;
    rdd_pd *pd;
    rdd_cq *cq[2];
    rdd_qp *qp[2];
    rdd_mr *mr;
    uint32_t lkey;
    uint8_t *buf;
};

static const rdd_qp_init DEFAULT_INIT = {64, 64, 4, 4, 64, 0};

static void pair_open(struct pair *p)
{
    uint32_t depth = 0;
    void *addr = NULL;
    int i;
    target_open(&p->dev);
    MUST(rdd_pd_alloc(p->dev, &p->pd));
    MUST(rdd_device_cq_depth_for(p->dev, &DEFAULT_INIT, 1, &depth));
    for (i = 0; i < 2; i++) {
        MUST(rdd_cq_create(p->dev, depth, &p->cq[i]));
        MUST(rdd_qp_create(p->pd, p->cq[i], p->cq[i], NULL, &p->qp[i]));
    }
    MUST(rdd_mr_reg(p->pd, 4096, RDD_ACCESS_LOCAL_WRITE, &p->mr));
    MUST(rdd_mr_lkey(p->mr, &p->lkey));
    MUST(rdd_mr_addr(p->mr, &addr));
    p->buf = (uint8_t *)addr;
}

static void pair_close(struct pair *p)
{
    int i;
    MUST(rdd_mr_free(p->mr));
    for (i = 0; i < 2; i++) {
        MUST(rdd_qp_destroy(p->qp[i]));
        MUST(rdd_cq_destroy(p->cq[i]));
    }
    MUST(rdd_pd_free(p->pd));
    MUST(rdd_device_close(p->dev));
}

static rdd_qp_attr query(rdd_qp *qp)
{
    rdd_qp_attr a;
    memset(&a, 0xee, sizeof a);
    MUST(rdd_qp_query(qp, &a));
    return a;
}

static void step_all(rdd_device *dev)
{
    size_t work = 1;
    int i;
    for (i = 0; i < 64 && work != 0; i++) {
        MUST(rdd_device_step(dev, &work));
    }
}

/* One completion of QP `i` (the software device runs in this thread;
 * a kernel device is waited for, 10 s at most). */
static void poll_one(struct pair *p, int i, rdd_wc *wc)
{
    time_t deadline = time(NULL) + 10;
    size_t n = 0;
    for (;;) {
        if (g_kind == REFUSAL_SOFT) {
            step_all(p->dev);
        }
        CHECK_EQ(rdd_cq_poll(p->cq[i], &p->qp[i], 1, wc, 1, &n), RDD_STATUS_OK);
        if (n != 0 || time(NULL) > deadline) {
            break;
        }
    }
    CHECK_EQ(n, 1);
}

/* A SEND from QP 1 arrives at QP 0: the connection works. */
static void send_works(struct pair *p)
{
    rdd_sge rs, ss;
    rdd_recv_wr r;
    rdd_wr w;
    rdd_wc wc;
    size_t bad = 0;
    memcpy(p->buf + 64, "ping", 4);
    memset(p->buf, 0, 64);
    rs.addr = (uint64_t)(uintptr_t)p->buf;
    rs.length = 64;
    rs.lkey = p->lkey;
    ss.addr = (uint64_t)(uintptr_t)(p->buf + 64);
    ss.length = 4;
    ss.lkey = p->lkey;
    memset(&r, 0, sizeof r);
    r.wr_id = 7;
    r.sg_list = &rs;
    r.num_sge = 1;
    memset(&w, 0, sizeof w);
    w.wr_id = 8;
    w.opcode = RDD_WR_SEND;
    w.flags = RDD_SEND_SIGNALED;
    w.sg_list = &ss;
    w.num_sge = 1;
    MUST(rdd_qp_post_recv(p->qp[0], &r, 1, &bad));
    MUST(rdd_qp_post_send(p->qp[1], &w, 1, &bad));
    poll_one(p, 0, &wc);
    CHECK_EQ(wc.wr_id, 7);
    CHECK_EQ(wc.status, RDD_WC_SUCCESS);
    poll_one(p, 1, &wc);
    CHECK_EQ(wc.wr_id, 8);
    CHECK_EQ(wc.status, RDD_WC_SUCCESS);
    CHECK(memcmp(p->buf, "ping", 4) == 0);
}

/* ---- rdd_qp_connect: every parameter ----------------------------------- */

enum connect_field {
    CF_QPN,
    CF_PSN,
    CF_RESERVED,
    CF_ACCESS_MW_BIND,
    CF_ACCESS_UNKNOWN,
    CF_RNR_RETRY,
    CF_RETRY_CNT,
    CF_SL,
    CF_RATE_LIMIT,
    CF_NULL_REMOTE,
    CF_BAD_HANDLE,
    CF_NULL_QP,
    CF_COUNT
};

struct connect_case {
    enum connect_field field;
    const char *what;
    rdd_status want;
};

static const struct connect_case CONNECT_CASES[] = {
    {CF_QPN, "remote.qpn wider than 24 bits", RDD_STATUS_INVALID_ATTRIBUTE},
    {CF_PSN, "remote.psn wider than 24 bits", RDD_STATUS_INVALID_ATTRIBUTE},
    {CF_RESERVED, "remote.reserved = 1", RDD_STATUS_INVALID_ARGUMENT},
    {CF_ACCESS_MW_BIND, "access: an MR-only bit", RDD_STATUS_INVALID_ARGUMENT},
    {CF_ACCESS_UNKNOWN, "access: an unknown bit", RDD_STATUS_INVALID_ARGUMENT},
    {CF_RNR_RETRY, "rnr_retry = 8", RDD_STATUS_INVALID_ATTRIBUTE},
    {CF_RETRY_CNT, "retry_cnt = 8", RDD_STATUS_INVALID_ATTRIBUTE},
    {CF_SL, "sl = 16", RDD_STATUS_INVALID_ATTRIBUTE},
    /* Refused at RTS, after INIT and RTR (rxe: the kernel took both; on
     * the direct path rdma-direct refuses it, the kernel's MODIFY_QP has
     * no rate-limit field; on the fallback libibverbs): rolled back. */
    {CF_RATE_LIMIT, "a rate limit the device cannot pace", RDD_STATUS_UNSUPPORTED},
    {CF_NULL_REMOTE, "remote NULL", RDD_STATUS_NULL_PARAMETER},
    {CF_BAD_HANDLE, "a forged QP handle", RDD_STATUS_INVALID_HANDLE},
    {CF_NULL_QP, "qp NULL", RDD_STATUS_NULL_PARAMETER},
};

/* What a case gets on the device under test: on iWARP every connect
 * whose arguments are readable is UNSUPPORTED. */
static rdd_status connect_want(const struct connect_case *c)
{
    if (g_kind != REFUSAL_SIW || c->field == CF_NULL_REMOTE || c->field == CF_BAD_HANDLE ||
        c->field == CF_NULL_QP) {
        return c->want;
    }
    return RDD_STATUS_UNSUPPORTED;
}

static void test_connect_refusals(void)
{
    size_t i;
    for (i = 0; i < sizeof CONNECT_CASES / sizeof CONNECT_CASES[0]; i++) {
        const struct connect_case *c = &CONNECT_CASES[i];
        rdd_status want = connect_want(c);
        struct pair p;
        rdd_qp_info i0, i1, remote;
        rdd_connect_attr attr = {0, 7, 7, 0, 0};
        rdd_qp_attr before, after;
        rdd_qp *target;
        const rdd_qp_info *rp = &remote;
        rdd_status s;
        pair_open(&p);
        MUST(rdd_qp_query_info(p.qp[0], &i0));
        MUST(rdd_qp_query_info(p.qp[1], &i1));
        if (g_kind != REFUSAL_SIW) {
            MUST(rdd_qp_connect(p.qp[1], &i0, NULL));
        }
        target = p.qp[0];
        remote = i1;
        switch (c->field) {
        case CF_QPN: remote.qpn = 1u << 24; break;
        case CF_PSN: remote.psn = 1u << 24; break;
        case CF_RESERVED: remote.reserved = 1; break;
        case CF_ACCESS_MW_BIND: attr.access = RDD_ACCESS_MW_BIND; break;
        case CF_ACCESS_UNKNOWN: attr.access = 0x100; break;
        case CF_RNR_RETRY: attr.rnr_retry = 8; break;
        case CF_RETRY_CNT: attr.retry_cnt = 8; break;
        case CF_SL: attr.sl = 16; break;
        case CF_RATE_LIMIT: MUST(rdd_qp_set_rate_limit(target, 1000)); break;
        case CF_NULL_REMOTE: rp = NULL; break;
        case CF_BAD_HANDLE: break;
        case CF_NULL_QP: break;
        case CF_COUNT: break;
        }
        before = query(target);
        s = rdd_qp_connect(c->field == CF_BAD_HANDLE ? FORGED_QP
                           : c->field == CF_NULL_QP ? NULL
                                                    : target,
                           rp, &attr);
        if (s != want) {
            fprintf(stderr, "%s: connect case '%s': got %s, want %s\n",
                    g_dev_name ? g_dev_name : "soft", c->what, rdd_status_name(s),
                    rdd_status_name(want));
        }
        CHECK_EQ(s, want);
        after = query(target);
        CHECK_BYTES(&after, &before, sizeof before);
        CHECK_EQ(after.state, RDD_QP_STATE_RESET);
        CHECK_EQ(after.connected, 0);
        /* The same call with valid values then succeeds. */
        MUST(rdd_qp_set_rate_limit(target, 0));
        if (g_kind == REFUSAL_SIW) {
            /* No connect succeeds on iWARP from C. */
            CHECK_EQ(rdd_qp_connect(target, &i1, NULL), RDD_STATUS_UNSUPPORTED);
            pair_close(&p);
            continue;
        }
        CHECK_EQ(rdd_qp_connect(target, &i1, NULL), RDD_STATUS_OK);
        after = query(target);
        CHECK_EQ(after.state, RDD_QP_STATE_RTS);
        CHECK_EQ(after.connected, 1);
        CHECK_EQ(after.dest_qpn, i1.qpn);
        send_works(&p);
        pair_close(&p);
    }
}

/* A second connect (not in RESET) is INVALID_QP_STATE and changes
 * nothing; the attributes connected with are reported. */
static void test_connect_twice(void)
{
    struct pair p;
    rdd_qp_info i0, i1;
    rdd_connect_attr attr = {RDD_ACCESS_REMOTE_WRITE, 5, 6, 32, 3};
    rdd_qp_attr a, b;
    pair_open(&p);
    MUST(rdd_qp_query_info(p.qp[0], &i0));
    MUST(rdd_qp_query_info(p.qp[1], &i1));
    MUST(rdd_qp_connect(p.qp[1], &i0, NULL));
    CHECK_EQ(rdd_qp_connect(p.qp[0], &i1, &attr), RDD_STATUS_OK);
    a = query(p.qp[0]);
    CHECK_EQ(a.state, RDD_QP_STATE_RTS);
    CHECK_EQ(a.recovery, RDD_QP_RECOVERY_NONE);
    CHECK_EQ(a.connected, 1);
    CHECK_EQ(a.dest_qpn, i1.qpn);
    CHECK_EQ(a.rq_psn, i1.psn);
    CHECK_EQ(a.sq_psn, i0.psn);
    CHECK_EQ(a.path_mtu, i1.mtu);
    CHECK_EQ(a.dest_lid, i1.lid);
    CHECK_BYTES(a.dest_gid, i1.gid, 16);
    CHECK_EQ(a.access, RDD_ACCESS_REMOTE_WRITE);
    CHECK_EQ(a.rnr_retry, 5);
    CHECK_EQ(a.retry_cnt, 6);
    CHECK_EQ(a.traffic_class, 32);
    CHECK_EQ(a.sl, 3);
    CHECK_EQ(a.timeout, 14);
    CHECK_EQ(a.min_rnr_timer, 12);
    CHECK_EQ(a.max_rd_atomic, 1);
    CHECK_EQ(a.rate_limit_kbps, 0);
    CHECK_EQ(a.reserved, 0);
    CHECK_EQ(a.reserved2, 0);
    CHECK_EQ(rdd_qp_connect(p.qp[0], &i1, NULL), RDD_STATUS_INVALID_QP_STATE);
    b = query(p.qp[0]);
    CHECK_BYTES(&b, &a, sizeof a);
    send_works(&p);
    pair_close(&p);
}

/* ---- rdd_qp_create: every field of rdd_qp_init ------------------------- */

struct init_case {
    const char *what;
    rdd_qp_init init;
    rdd_status want;
};

static const struct init_case INIT_CASES[] = {
    {"max_send_wr 0", {0, 64, 4, 4, 64, 0}, RDD_STATUS_INVALID_ATTRIBUTE},
    {"max_send_wr 2^16", {1u << 16, 64, 4, 4, 64, 0}, RDD_STATUS_INVALID_ATTRIBUTE},
    {"max_recv_wr 2^16", {64, 1u << 16, 4, 4, 64, 0}, RDD_STATUS_INVALID_ATTRIBUTE},
    {"max_send_sge 31", {64, 64, 31, 4, 64, 0}, RDD_STATUS_INVALID_ATTRIBUTE},
    {"max_recv_sge 65", {64, 64, 4, 65, 64, 0}, RDD_STATUS_INVALID_ATTRIBUTE},
    {"max_inline_data 513", {64, 64, 4, 4, 513, 0}, RDD_STATUS_INVALID_ATTRIBUTE},
    {"flags: an unknown bit", {64, 64, 4, 4, 64, 2}, RDD_STATUS_INVALID_ARGUMENT},
};

/* The same fields on a kernel device, with values above what any of them
 * takes (C cannot see the device's own limits; tests/verbs_device's
 * refusals_create tries one above each). */
static const struct init_case KERNEL_INIT_CASES[] = {
    {"max_send_wr 0", {0, 64, 4, 4, 64, 0}, RDD_STATUS_INVALID_ATTRIBUTE},
    {"max_send_wr 2^30", {1u << 30, 64, 4, 4, 64, 0}, RDD_STATUS_INVALID_ATTRIBUTE},
    {"max_recv_wr 2^30", {64, 1u << 30, 4, 4, 64, 0}, RDD_STATUS_INVALID_ATTRIBUTE},
    {"max_send_sge 4096", {64, 64, 4096, 4, 64, 0}, RDD_STATUS_INVALID_ATTRIBUTE},
    {"max_recv_sge 4096", {64, 64, 4, 4096, 64, 0}, RDD_STATUS_INVALID_ATTRIBUTE},
    {"max_inline_data 2^16", {64, 64, 4, 4, 1u << 16, 0}, RDD_STATUS_INVALID_ATTRIBUTE},
    {"flags: an unknown bit", {64, 64, 4, 4, 64, 2}, RDD_STATUS_INVALID_ARGUMENT},
};

/* rdd_device_open_soft: the CQE size (software device only). */
static void test_soft_config_refusal(void)
{
    rdd_device *dout = (rdd_device *)SENTINEL;
    rdd_soft_config cfg = {32, 0};
    CHECK_EQ(rdd_device_open_soft(&cfg, &dout), RDD_STATUS_INVALID_ARGUMENT);
    CHECK(dout == (rdd_device *)SENTINEL);
    cfg.cqe_size = 128;
    MUST(rdd_device_open_soft(&cfg, &dout));
    MUST(rdd_device_close(dout));
}

static void test_create_refusals(void)
{
    rdd_device *dev, *dev2;
    rdd_pd *pd;
    rdd_cq *cq, *cq2, *small;
    rdd_qp *qp;
    rdd_mr *mr;
    rdd_cq *cout = (rdd_cq *)SENTINEL;
    rdd_qp *qout = (rdd_qp *)SENTINEL;
    rdd_mr *mout = (rdd_mr *)SENTINEL;
    rdd_soft_config cfg = {128, 0};
    const struct init_case *cases = g_kind == REFUSAL_SOFT ? INIT_CASES : KERNEL_INIT_CASES;
    size_t ncases = g_kind == REFUSAL_SOFT ? sizeof INIT_CASES / sizeof INIT_CASES[0]
                                           : sizeof KERNEL_INIT_CASES / sizeof KERNEL_INIT_CASES[0];
    uint64_t depth = 0, committed = 0;
    uint32_t need = 0;
    size_t i;
    if (g_kind == REFUSAL_SOFT) {
        MUST(rdd_device_open_soft(&cfg, &dev)); /* 128-byte CQEs */
    } else {
        target_open(&dev);
    }
    MUST(rdd_pd_alloc(dev, &pd));
    /* rdd_cq_create: the depth (above the software device's limit; a
     * kernel device's limit is not visible from C, UINT32_MAX is above
     * all of them). */
    CHECK_EQ(rdd_cq_create(dev, 0, &cout), RDD_STATUS_INVALID_ATTRIBUTE);
    if (g_kind == REFUSAL_SOFT) {
        CHECK_EQ(rdd_cq_create(dev, 32768, &cout), RDD_STATUS_INVALID_ATTRIBUTE);
    }
    CHECK_EQ(rdd_cq_create(dev, UINT32_MAX, &cout), RDD_STATUS_INVALID_ATTRIBUTE);
    CHECK(cout == (rdd_cq *)SENTINEL);
    MUST(rdd_device_cq_depth_for(dev, &DEFAULT_INIT, 1, &need));
    MUST(rdd_cq_create(dev, need, &cq));
    /* rdd_qp_create: every init field; the CQ's account is untouched. */
    for (i = 0; i < ncases; i++) {
        rdd_status s = rdd_qp_create(pd, cq, cq, &cases[i].init, &qout);
        if (s != cases[i].want) {
            fprintf(stderr, "%s: init case '%s': got %s\n", g_dev_name ? g_dev_name : "soft",
                    cases[i].what, rdd_status_name(s));
        }
        CHECK_EQ(s, cases[i].want);
        CHECK(qout == (rdd_qp *)SENTINEL);
        MUST(rdd_cq_budget(cq, &depth, &committed));
        CHECK_EQ(committed, 0);
    }
    /* A CQ of another device. */
    target_open(&dev2);
    MUST(rdd_cq_create(dev2, need, &cq2));
    CHECK_EQ(rdd_qp_create(pd, cq2, cq2, NULL, &qout), RDD_STATUS_INVALID_ARGUMENT);
    CHECK_EQ(rdd_qp_create(pd, cq, cq2, NULL, &qout), RDD_STATUS_INVALID_ARGUMENT);
    CHECK(qout == (rdd_qp *)SENTINEL);
    MUST(rdd_cq_budget(cq, &depth, &committed));
    CHECK_EQ(committed, 0);
    /* A default QP on a 64-entry CQ: CQ_TOO_SMALL, nothing charged; the
     * depth rdd_device_cq_depth_for names then works. */
    MUST(rdd_cq_create(dev, 64, &small));
    CHECK_EQ(rdd_qp_create(pd, small, small, NULL, &qout), RDD_STATUS_CQ_TOO_SMALL);
    CHECK(qout == (rdd_qp *)SENTINEL);
    MUST(rdd_cq_budget(small, &depth, &committed));
    CHECK_EQ(committed, 0);
    CHECK(need > depth);
    MUST(rdd_qp_create(pd, cq, cq, NULL, &qp));
    MUST(rdd_cq_budget(cq, &depth, &committed));
    CHECK(committed > 0 && committed <= need);
    MUST(rdd_qp_destroy(qp));
    /* rdd_mr_reg: the length (0 and too large) and the access bits. */
    CHECK_EQ(rdd_mr_reg(pd, 0, RDD_ACCESS_LOCAL_WRITE, &mout), RDD_STATUS_INVALID_ARGUMENT);
    CHECK_EQ(rdd_mr_reg(pd, (size_t)RDD_MR_MAX_LEN + 1, RDD_ACCESS_LOCAL_WRITE, &mout),
             RDD_STATUS_INVALID_ARGUMENT);
    CHECK_EQ(rdd_mr_reg(pd, 64, 0x20, &mout), RDD_STATUS_INVALID_ARGUMENT);
    CHECK_EQ(rdd_mr_reg(pd, 64, RDD_ACCESS_REMOTE_WRITE, &mout), RDD_STATUS_INVALID_ATTRIBUTE);
    CHECK_EQ(rdd_mr_reg(pd, 64, RDD_ACCESS_REMOTE_ATOMIC, &mout), RDD_STATUS_INVALID_ATTRIBUTE);
    CHECK(mout == (rdd_mr *)SENTINEL);
    /* Nothing was left behind: the PD has no region (it frees), and the
     * valid calls succeed. */
    MUST(rdd_mr_reg(pd, 1, RDD_ACCESS_LOCAL_WRITE | RDD_ACCESS_REMOTE_WRITE, &mr));
    MUST(rdd_mr_free(mr));
    MUST(rdd_cq_destroy(small));
    MUST(rdd_cq_destroy(cq));
    MUST(rdd_pd_free(pd));
    MUST(rdd_device_close(dev));
    MUST(rdd_cq_destroy(cq2));
    MUST(rdd_device_close(dev2));
}

/* ---- rdd_device_cq_depth_for -------------------------------------------- */

static void test_cq_depth_for(void)
{
    rdd_device *dev, *dead;
    rdd_pd *pd;
    rdd_cq *cq;
    rdd_qp *qp[3];
    rdd_qp_init inits[3] = {{64, 64, 4, 4, 64, 0}, {16, 256, 1, 1, 0, 0}, {128, 0, 2, 1, 256, 1}};
    rdd_qp_init bad = {64, 64, 4, 4, 64, 4};
    uint64_t words[8];
    uint32_t d = 7, one = 0, all = 0;
    int i;
    MUST(rdd_device_open_soft(NULL, &dev));
    MUST(rdd_device_open_soft(NULL, &dead));
    MUST(rdd_device_close(dead));
    CHECK_EQ(rdd_device_cq_depth_for(dev, NULL, 0, &d), RDD_STATUS_NULL_PARAMETER);
    CHECK_EQ(rdd_device_cq_depth_for(dev, inits, 1, NULL), RDD_STATUS_NULL_PARAMETER);
    CHECK_EQ(rdd_device_cq_depth_for(dead, inits, 1, &d), RDD_STATUS_INVALID_HANDLE);
    CHECK_EQ(rdd_device_cq_depth_for(NULL, inits, 1, &d), RDD_STATUS_NULL_PARAMETER);
    CHECK_EQ(rdd_device_cq_depth_for(dev, &bad, 1, &d), RDD_STATUS_INVALID_ARGUMENT);
    CHECK_EQ(rdd_device_cq_depth_for(dev, (const rdd_qp_init *)((char *)words + 1), 1, &d),
             RDD_STATUS_INVALID_ARGUMENT);
    CHECK_EQ(rdd_device_cq_depth_for(dev, inits, SIZE_MAX, &d), RDD_STATUS_INVALID_ARGUMENT);
    CHECK_EQ(d, 7); /* outputs only on success */
    CHECK_EQ(rdd_device_cq_depth_for(dev, inits, 0, &d), RDD_STATUS_OK);
    CHECK_EQ(d, 1);
    MUST(rdd_device_cq_depth_for(dev, inits, 1, &one));
    CHECK(one > 64);
    MUST(rdd_device_cq_depth_for(dev, inits, 3, &all));
    CHECK(all > one);
    /* Three different QPs share one CQ of exactly that depth. */
    MUST(rdd_pd_alloc(dev, &pd));
    MUST(rdd_cq_create(dev, all, &cq));
    for (i = 0; i < 3; i++) {
        CHECK_EQ(rdd_qp_create(pd, cq, cq, &inits[i], &qp[i]), RDD_STATUS_OK);
    }
    for (i = 0; i < 3; i++) {
        MUST(rdd_qp_destroy(qp[i]));
    }
    MUST(rdd_cq_destroy(cq));
    MUST(rdd_pd_free(pd));
    MUST(rdd_device_close(dev));
}

/* ---- rdd_qp_query -------------------------------------------------------- */

static rdd_qp *g_recovering_qp;
static unsigned g_busy_seen;

static void during_recovery(void *ctx, const rdd_wc *wc)
{
    rdd_qp_attr a;
    (void)ctx;
    (void)wc;
    /* The QP is held by the recovery: RESOURCE_BUSY says it is under way. */
    if (rdd_qp_query(g_recovering_qp, &a) == RDD_STATUS_RESOURCE_BUSY) {
        g_busy_seen++;
    }
}

static void test_qp_query(void)
{
    struct pair p;
    rdd_qp_info i0, i1;
    rdd_qp_attr a, keep;
    rdd_sge rs, ss;
    rdd_recv_wr r[2];
    rdd_wr w;
    rdd_wc wc[8];
    rdd_recovery rec;
    size_t bad = 0, n = 0;
    pair_open(&p);
    /* Bad inputs. */
    memset(&keep, 0x33, sizeof keep);
    a = keep;
    CHECK_EQ(rdd_qp_query(p.qp[0], NULL), RDD_STATUS_NULL_PARAMETER);
    CHECK_EQ(rdd_qp_query(FORGED_QP, &a), RDD_STATUS_INVALID_HANDLE);
    CHECK_EQ(rdd_qp_query(NULL, &a), RDD_STATUS_NULL_PARAMETER);
    CHECK_BYTES(&a, &keep, sizeof a);
    /* Fresh: RESET, nothing connected, nothing outstanding. */
    a = query(p.qp[0]);
    CHECK_EQ(a.state, RDD_QP_STATE_RESET);
    CHECK_EQ(a.recovery, RDD_QP_RECOVERY_NONE);
    CHECK_EQ(a.connected, 0);
    CHECK_EQ(a.dest_qpn, 0);
    CHECK_EQ(a.send_outstanding, 0);
    CHECK_EQ(a.recv_outstanding, 0);
    MUST(rdd_qp_query_info(p.qp[0], &i0));
    MUST(rdd_qp_query_info(p.qp[1], &i1));
    MUST(rdd_qp_connect(p.qp[0], &i1, NULL));
    MUST(rdd_qp_connect(p.qp[1], &i0, NULL));
    /* Two receives and a send (with a bad local key: fails at this QP,
     * whatever the peer does) outstanding. */
    rs.addr = (uint64_t)(uintptr_t)p.buf;
    rs.length = 64;
    rs.lkey = p.lkey;
    memset(r, 0, sizeof r);
    r[0].wr_id = 1;
    r[0].sg_list = &rs;
    r[0].num_sge = 1;
    r[1] = r[0];
    r[1].wr_id = 2;
    MUST(rdd_qp_post_recv(p.qp[0], r, 2, &bad));
    ss = rs;
    ss.length = 8;
    ss.lkey = p.lkey ^ 0x5500;
    memset(&w, 0, sizeof w);
    w.wr_id = 3;
    w.opcode = RDD_WR_RDMA_WRITE;
    w.flags = RDD_SEND_SIGNALED;
    w.sg_list = &ss;
    w.num_sge = 1;
    w.remote_addr = (uint64_t)(uintptr_t)p.buf;
    w.rkey = p.lkey;
    MUST(rdd_qp_post_send(p.qp[0], &w, 1, &bad));
    a = query(p.qp[0]);
    CHECK_EQ(a.state, RDD_QP_STATE_RTS);
    CHECK_EQ(a.recv_outstanding, 2);
    CHECK_EQ(a.send_outstanding, 1); /* one 64-byte basic block */
    CHECK_EQ(a.recovery, RDD_QP_RECOVERY_NONE);
    /* The WRITE fails; its completion moves the QP to ERROR with the two
     * receives still outstanding: draining. */
    step_all(p.dev);
    CHECK_EQ(rdd_cq_poll(p.cq[0], &p.qp[0], 1, wc, 1, &n), RDD_STATUS_OK);
    CHECK_EQ(n, 1);
    CHECK_EQ(wc[0].status, RDD_WC_LOC_PROT_ERR);
    a = query(p.qp[0]);
    CHECK_EQ(a.state, RDD_QP_STATE_ERROR);
    CHECK_EQ(a.recovery, RDD_QP_RECOVERY_DRAINING);
    CHECK_EQ(a.send_outstanding, 0);
    CHECK_EQ(a.recv_outstanding, 2);
    CHECK_EQ(a.connected, 1); /* kept until RESET */
    /* rdd_qp_recover holds the QP: a query from its callback is busy. */
    g_recovering_qp = p.qp[0];
    g_busy_seen = 0;
    MUST(rdd_device_start(p.dev));
    CHECK_EQ(rdd_qp_recover(p.qp[0], &i1, NULL, 5000000000ull, during_recovery, NULL, &rec),
             RDD_STATUS_OK);
    MUST(rdd_device_stop(p.dev));
    CHECK_EQ(rec.reported, 2);
    CHECK_EQ(g_busy_seen, 2);
    a = query(p.qp[0]);
    CHECK_EQ(a.state, RDD_QP_STATE_RTS);
    CHECK_EQ(a.recovery, RDD_QP_RECOVERY_NONE);
    CHECK_EQ(a.recv_outstanding, 0);
    CHECK_EQ(a.connected, 1);
    /* Drained: in ERROR with nothing left. */
    MUST(rdd_qp_post_send(p.qp[0], &w, 1, &bad));
    step_all(p.dev);
    CHECK_EQ(rdd_cq_poll(p.cq[0], &p.qp[0], 1, wc, 8, &n), RDD_STATUS_OK);
    CHECK_EQ(n, 1);
    CHECK(wc[0].status != RDD_WC_SUCCESS);
    a = query(p.qp[0]);
    CHECK_EQ(a.state, RDD_QP_STATE_ERROR);
    CHECK_EQ(a.recovery, RDD_QP_RECOVERY_DRAINED);
    CHECK_EQ(a.send_outstanding + a.recv_outstanding, 0);
    /* Through RESET: the connection is forgotten. */
    CHECK_EQ(rdd_qp_recover(p.qp[0], NULL, NULL, 1000000000ull, NULL, NULL, NULL), RDD_STATUS_OK);
    a = query(p.qp[0]);
    CHECK_EQ(a.state, RDD_QP_STATE_RESET);
    CHECK_EQ(a.connected, 0);
    CHECK_EQ(a.dest_qpn, 0);
    pair_close(&p);
}

/* ---- names ---------------------------------------------------------------- */

static void test_names(void)
{
    uint32_t v;
    CHECK(strcmp(rdd_status_name(RDD_STATUS_OK), "RDD_STATUS_OK") == 0);
    CHECK(strcmp(rdd_status_name(RDD_STATUS_SQ_FULL), "RDD_STATUS_SQ_FULL") == 0);
    CHECK(strcmp(rdd_status_name(RDD_STATUS_INVALID_ARGUMENT), "RDD_STATUS_INVALID_ARGUMENT") == 0);
    CHECK(strcmp(rdd_status_name(RDD_STATUS_CQ_TOO_SMALL), "RDD_STATUS_CQ_TOO_SMALL") == 0);
    CHECK(strcmp(rdd_status_name(999), "unknown") == 0);
    CHECK(strcmp(rdd_status_name(UINT32_MAX), "unknown") == 0);
    CHECK(strcmp(rdd_wc_status_name(RDD_WC_SUCCESS), "RDD_WC_SUCCESS") == 0);
    CHECK(strcmp(rdd_wc_status_name(RDD_WC_REM_ACCESS_ERR), "RDD_WC_REM_ACCESS_ERR") == 0);
    CHECK(strcmp(rdd_wc_status_name(RDD_WC_FATAL_ERR), "RDD_WC_FATAL_ERR") == 0);
    CHECK(strcmp(rdd_wc_status_name(22), "unknown") == 0);
    CHECK(strcmp(rdd_wc_opcode_name(RDD_WC_OP_FETCH_ADD), "RDD_WC_OP_FETCH_ADD") == 0);
    CHECK(strcmp(rdd_wc_opcode_name(RDD_WC_OP_RECV_RDMA_WITH_IMM),
                 "RDD_WC_OP_RECV_RDMA_WITH_IMM") == 0);
    CHECK(strcmp(rdd_wc_opcode_name(7), "unknown") == 0);
    CHECK(strcmp(rdd_qp_state_name(RDD_QP_STATE_RTS), "RDD_QP_STATE_RTS") == 0);
    CHECK(strcmp(rdd_qp_state_name(RDD_QP_STATE_ERROR), "RDD_QP_STATE_ERROR") == 0);
    CHECK(strcmp(rdd_qp_state_name(5), "unknown") == 0);
    /* Never NULL, for any value; stable (static) pointers. */
    for (v = 0; v < 3000; v++) {
        CHECK(rdd_status_name(v) != NULL && rdd_wc_status_name(v) != NULL &&
              rdd_wc_opcode_name(v) != NULL && rdd_qp_state_name(v) != NULL);
    }
    CHECK(rdd_status_name(RDD_STATUS_SQ_FULL) == rdd_status_name(RDD_STATUS_SQ_FULL));
}

/* Everything, on the software device. */
static inline int run_refusal_tests(const char *name)
{
    g_kind = REFUSAL_SOFT;
    g_dev_name = NULL;
    test_connect_refusals();
    test_connect_twice();
    test_soft_config_refusal();
    test_create_refusals();
    test_cq_depth_for();
    test_qp_query();
    test_names();
    return h_finish(name);
}

/* The connect and create tables on kernel device `dev_name` (rxe or siw,
 * `kind`); the caller reports with h_finish. */
static inline void run_device_refusal_tests(enum refusal_kind kind, const char *dev_name)
{
    g_kind = kind;
    g_dev_name = dev_name;
    test_connect_refusals();
    if (kind != REFUSAL_SIW) {
        test_connect_twice();
    }
    test_create_refusals();
}

#endif
