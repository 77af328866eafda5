/*
 * Included by test_verbs.c: the object-level SRQ and UD calls on a kernel
 * device. SRQs on both data paths (the verbs fallback,
 * RDMA_DIRECT_DATA_PATH=fallback, libibverbs' rxe and siw providers; and the
 * direct rxe/siw rings, the default, where the SRQ is our own CREATE_SRQ
 * ring), UD on rxe on both data paths (the direct ring's UD QPs and
 * address handles are our own CREATE_QP/CREATE_AH):
 *   - rxe: one SRQ feeding three RC QPs connected in loopback to three
 *     client QPs; every receive polled exactly once (rdd_cq_poll and
 *     rdd_cq_poll_n in turn) with the right bytes, wr_id and qp_num; the
 *     SRQ full (RQ_FULL), its limit armed and queried, the limit event
 *     (RDD_EVENT_SRQ_LIMIT_REACHED naming the SRQ) after an event-mode
 *     rdd_cq_wait; the refusals (a receive posted to an SRQ QP's own RQ,
 *     a list stopping at a bad receive, a limit above max_wr, destroying
 *     the SRQ with QPs attached). Then UD: a ping between two UD QPs
 *     through an address handle, the 40-byte GRH area at the head of each
 *     receive, src_qp, SEND_WITH_IMM, inline and the list form, a
 *     datagram with the wrong Q_Key never delivered, RC calls refused.
 *   - siw: the SRQ, its QPs, receives, the limit and the refusals (its RC
 *     QPs cannot connect from C: iWARP needs rdma_cm), rdd_srq_query
 *     UNSUPPORTED on the fallback (libsiw has none; the direct ring's
 *     QUERY_SRQ answers), UD UNSUPPORTED (iWARP has no datagrams).
 * On siw, on both data paths, rdd_ah_create and rdd_qp_create_ud are
 * RDD_STATUS_UNSUPPORTED, as in the Rust API. rdd_device_ud_drops is
 * UNSUPPORTED on every kernel device.
 */
#ifndef VERBS_SRQ_UD_H
#define VERBS_SRQ_UD_H

#include <time.h>

#define SU_CLIENTS 3
#define SU_MSGS 4
#define SU_SLOT 64u
#define SU_LAND (64u * 1024u)
#define SU_GRH 40u

static int su_fallback(void)
{
    const char *path = getenv("RDMA_DIRECT_DATA_PATH");
    return path && strcmp(path, "fallback") == 0;
}

static double su_now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static rdd_qp_init su_init(uint32_t recv_wr)
{
    rdd_qp_init init;
    memset(&init, 0, sizeof init);
    init.max_send_wr = 16;
    init.max_recv_wr = recv_wr;
    init.max_send_sge = 1;
    init.max_recv_sge = 1;
    init.max_inline_data = 64;
    return init;
}

/* siw's direct ring: no AH, no UD QP, nothing written. */
static void su_direct_refusals(rdd_device *dev, rdd_pd *pd)
{
    rdd_ah_attr aa;
    rdd_ah *ah = (rdd_ah *)(uintptr_t)0x1;
    rdd_cq *cq;
    rdd_qp *qp = (rdd_qp *)(uintptr_t)0x1;
    rdd_qp_init init = su_init(4);
    rdd_ud_drops d;
    memset(&aa, 0, sizeof aa);
    aa.is_global = 1;
    aa.hop_limit = 64;
    CHECK_EQ(rdd_ah_create(pd, &aa, &ah), RDD_STATUS_UNSUPPORTED);
    CHECK(ah == (rdd_ah *)(uintptr_t)0x1);
    MUST(rdd_cq_create(dev, 64, &cq));
    CHECK_EQ(rdd_qp_create_ud(pd, cq, cq, &init, &qp), RDD_STATUS_UNSUPPORTED);
    CHECK(qp == (rdd_qp *)(uintptr_t)0x1);
    CHECK_EQ(rdd_device_ud_drops(dev, &d), RDD_STATUS_UNSUPPORTED);
    CHECK_EQ(rdd_cq_destroy(cq), RDD_STATUS_OK);
}

/* Polls `cq` until `n` completions arrived (10 s), alternating rdd_cq_poll
 * (with the CQ's QPs) and rdd_cq_poll_n. */
static void su_collect(rdd_cq *cq, rdd_qp *const *qps, size_t nqps, rdd_wc *out, size_t n)
{
    size_t got = 0;
    int turn = 0;
    double t0 = su_now();
    while (got < n) {
        size_t k = 0;
        if (turn++ & 1) {
            int32_t r = rdd_cq_poll_n(cq, out + got, (uint32_t)(n - got));
            CHECK(r >= 0);
            k = r > 0 ? (size_t)r : 0;
        } else {
            MUST(rdd_cq_poll(cq, qps, nqps, out + got, n - got, &k));
        }
        got += k;
        if (su_now() - t0 > 10.0) {
            fprintf(stderr, "su_collect: timed out with %zu of %zu\n", got, n);
            CHECK(0);
            return;
        }
    }
}

/* Nothing more on `cq` for a while (`n` polls 1 ms apart). */
static void su_quiet(rdd_cq *cq, int n)
{
    rdd_wc wc;
    struct timespec ms = {0, 1000000};
    int i;
    for (i = 0; i < n; i++) {
        CHECK_EQ(rdd_cq_poll_n(cq, &wc, 1), 0);
        nanosleep(&ms, NULL);
    }
}

/* Waits (10 s) for RDD_EVENT_SRQ_LIMIT_REACHED naming `srqn`. */
static void su_wait_limit_event(rdd_device *dev, uint32_t srqn)
{
    double t0 = su_now();
    struct timespec ms = {0, 5000000};
    for (;;) {
        rdd_async_event ev;
        int found = 0;
        MUST(rdd_device_poll_async_event(dev, &ev, &found));
        if (found && ev.kind == RDD_EVENT_SRQ_LIMIT_REACHED && ev.element == srqn) {
            return;
        }
        if (su_now() - t0 > 10.0) {
            fprintf(stderr, "no RDD_EVENT_SRQ_LIMIT_REACHED for SRQ %u\n", srqn);
            CHECK(0);
            return;
        }
        if (!found) {
            nanosleep(&ms, NULL);
        }
    }
}

static void test_srq(rdd_device *dev, rdd_pd *pd, int rxe)
{
    rdd_srq_init si = {32, 2, 0};
    rdd_srq *srq;
    rdd_srq_attr sa;
    rdd_cq *cq_s, *cq_c;
    rdd_qp *srv[SU_CLIENTS], *cli[SU_CLIENTS];
    rdd_qp_info si_[SU_CLIENTS], ci_[SU_CLIENTS];
    rdd_qp_init on_srq = su_init(1), plain = su_init(4);
    rdd_mr *land_mr;
    void *p;
    uint8_t *land;
    uint32_t lkey, cap;
    rdd_sge g[33], one[64];
    rdd_recv_wr r[64];
    rdd_wc wc[64];
    size_t bad = 77, i, total = SU_CLIENTS * SU_MSGS;
    uint32_t srqn = 0;
    int seen_ids[64], seen_vals[256];

    MUST(rdd_srq_create(pd, &si, &srq));
    if (rdd_srq_query(srq, &sa) == RDD_STATUS_OK) {
        CHECK(rxe || !su_fallback());
        CHECK(sa.max_wr >= 32 && sa.max_sge >= 2);
        CHECK_EQ(sa.limit, 0);
        CHECK(sa.srqn != 0);
        srqn = sa.srqn;
        cap = sa.max_wr;
    } else {
        /* libsiw (rdma-core 44) has no query_srq: said, not faked. */
        CHECK(!rxe && su_fallback());
        CHECK_EQ(rdd_srq_query(srq, &sa), RDD_STATUS_UNSUPPORTED);
        cap = 32;
    }
    MUST(rdd_cq_create(dev, 1024, &cq_s));
    MUST(rdd_cq_create(dev, 512, &cq_c));
    for (i = 0; i < SU_CLIENTS; i++) {
        MUST(rdd_qp_create_on_srq(pd, cq_s, cq_s, srq, &on_srq, &srv[i]));
        MUST(rdd_qp_create(pd, cq_c, cq_c, &plain, &cli[i]));
        MUST(rdd_qp_query_info(srv[i], &si_[i]));
        MUST(rdd_qp_query_info(cli[i], &ci_[i]));
    }
    MUST(rdd_mr_reg(pd, SU_LAND, RDD_ACCESS_LOCAL_WRITE, &land_mr));
    MUST(rdd_mr_addr(land_mr, &p));
    land = (uint8_t *)p;
    MUST(rdd_mr_lkey(land_mr, &lkey));
    memset(land, 0, SU_LAND);

    /* A receive on a QP attached to the SRQ is refused, nothing posted. */
    g[0].addr = (uint64_t)(uintptr_t)land;
    g[0].length = SU_SLOT;
    g[0].lkey = lkey;
    memset(r, 0, sizeof r);
    r[0].wr_id = 1;
    r[0].sg_list = g;
    r[0].num_sge = 1;
    CHECK_EQ(rdd_qp_post_recv(srv[0], r, 1, &bad), RDD_STATUS_INVALID_ATTRIBUTE);
    CHECK_EQ(bad, 77);
    CHECK_EQ(rdd_qp_recv(srv[0], 1, g[0].addr, SU_SLOT, lkey, 0), RDD_STATUS_INVALID_ATTRIBUTE);
    /* Destroying the SRQ while QPs are attached: refused. */
    CHECK_EQ(rdd_srq_destroy(srq), RDD_STATUS_RESOURCE_BUSY);
    /* A limit above max_wr: refused. */
    CHECK_EQ(rdd_srq_arm_limit(srq, 0x7fffffffu), RDD_STATUS_INVALID_ATTRIBUTE);

    /* A list stops at the first bad receive (more SGEs than any grant:
     * rxe and siw allow fewer than 33 per SRQ receive): the one before it
     * is posted. */
    for (i = 0; i < 33; i++) {
        g[i].addr = (uint64_t)(uintptr_t)(land + i * 8);
        g[i].length = 8;
        g[i].lkey = lkey;
    }
    one[0].addr = (uint64_t)(uintptr_t)land;
    one[0].length = SU_SLOT;
    one[0].lkey = lkey;
    r[0].wr_id = 1000;
    r[0].sg_list = &one[0];
    r[0].num_sge = 1;
    r[1].wr_id = 1;
    r[1].sg_list = g;
    r[1].num_sge = 33;
    CHECK_EQ(rdd_srq_post_recv(srq, r, 2, &bad), RDD_STATUS_TOO_MANY_SGES);
    CHECK_EQ(bad, 1);
    /* The rest: the list form, then the per-receive call. */
    for (i = 1; i < total; i++) {
        one[i].addr = (uint64_t)(uintptr_t)(land + i * SU_SLOT);
        one[i].length = SU_SLOT;
        one[i].lkey = lkey;
        r[i].wr_id = 1000 + i;
        r[i].sg_list = &one[i];
        r[i].num_sge = 1;
    }
    MUST(rdd_srq_post_recv(srq, &r[1], total / 2 - 1, &bad));
    for (i = total / 2; i < total; i++) {
        MUST(rdd_srq_recv(srq, 1000 + i, one[i].addr, SU_SLOT, lkey,
                          i + 1 < total ? RDD_SEND_DEFER_DOORBELL : 0));
    }
    MUST(rdd_srq_ring(srq));

    if (rxe) {
        rdd_connect_attr attr = {0, 7, 7, 0, 0};
        for (i = 0; i < SU_CLIENTS; i++) {
            MUST(rdd_qp_connect(cli[i], &si_[i], &attr));
            MUST(rdd_qp_connect(srv[i], &ci_[i], &attr));
        }
        /* Every client sends SU_MSGS messages, each 32 bytes of one value
         * that names the client. */
        for (i = 0; i < SU_CLIENTS; i++) {
            int m;
            for (m = 0; m < SU_MSGS; m++) {
                uint8_t msg[32];
                memset(msg, (int)(i * 16 + (size_t)m + 1), sizeof msg);
                MUST(rdd_qp_send_inline(cli[i], 10 + (uint64_t)m, msg, sizeof msg,
                                        RDD_SEND_SIGNALED));
            }
        }
        su_collect(cq_c, cli, SU_CLIENTS, wc, total);
        for (i = 0; i < total; i++) {
            CHECK_EQ(wc[i].status, RDD_WC_SUCCESS);
        }
        su_collect(cq_s, srv, SU_CLIENTS, wc, total);
        memset(seen_ids, 0, sizeof seen_ids);
        memset(seen_vals, 0, sizeof seen_vals);
        for (i = 0; i < total; i++) {
            size_t off, ci, k;
            uint8_t v;
            CHECK_EQ(wc[i].status, RDD_WC_SUCCESS);
            CHECK_EQ(wc[i].opcode, RDD_WC_OP_RECV);
            CHECK_EQ(wc[i].byte_len, 32);
            CHECK(wc[i].wr_id >= 1000 && wc[i].wr_id < 1000 + total);
            if (wc[i].wr_id < 1000 || wc[i].wr_id >= 1000 + total) {
                continue;
            }
            CHECK_EQ(seen_ids[wc[i].wr_id - 1000]++, 0);
            off = (size_t)(wc[i].wr_id - 1000) * SU_SLOT;
            v = land[off];
            for (k = 0; k < 32; k++) {
                CHECK_EQ(land[off + k], v);
            }
            CHECK(v >= 1);
            ci = ((size_t)v - 1) / 16;
            CHECK(ci < SU_CLIENTS);
            if (ci < SU_CLIENTS) {
                CHECK_EQ(wc[i].qp_num, si_[ci].qpn);
            }
            CHECK_EQ(seen_vals[v]++, 0);
        }
        su_quiet(cq_s, 20);
    }

    if (rxe) {
        /* Every slot is free again: exactly cap receives fit, one more is
         * RQ_FULL. */
        size_t posted = 0;
        CHECK(cap <= SU_LAND / SU_SLOT);
        while (posted < cap) {
            size_t k = cap - posted > 64 ? 64 : cap - posted;
            for (i = 0; i < k; i++) {
                one[i].addr = (uint64_t)(uintptr_t)(land + ((posted + i) % 1024) * SU_SLOT);
                one[i].length = SU_SLOT;
                one[i].lkey = lkey;
                r[i].wr_id = 2000 + posted + i;
                r[i].sg_list = &one[i];
                r[i].num_sge = 1;
            }
            MUST(rdd_srq_post_recv(srq, r, k, &bad));
            posted += k;
        }
        bad = 77;
        CHECK_EQ(rdd_srq_post_recv(srq, r, 1, &bad), RDD_STATUS_RQ_FULL);
        CHECK_EQ(bad, 0);
        CHECK_EQ(rdd_srq_recv(srq, 1, one[0].addr, SU_SLOT, lkey, 0), RDD_STATUS_RQ_FULL);

        /* The limit: cap posted, armed at cap - 2; 3 taken leaves fewer:
         * one event. */
        MUST(rdd_srq_arm_limit(srq, cap - 2));
        MUST(rdd_srq_query(srq, &sa));
        CHECK_EQ(sa.limit, cap - 2);
        for (i = 0; i < 3; i++) {
            uint8_t msg[8];
            memset(msg, 0x70 + (int)i, sizeof msg);
            MUST(rdd_qp_send_inline(cli[0], 50 + i, msg, sizeof msg, RDD_SEND_SIGNALED));
        }
        su_collect(cq_c, cli, SU_CLIENTS, wc, 3);
        {
            size_t got = 0;
            double t0 = su_now();
            while (got < 3 && su_now() - t0 < 10.0) {
                size_t k = 0;
                MUST(rdd_cq_wait(cq_s, srv, SU_CLIENTS, wc + got, 3 - got, RDD_WAIT_EVENT,
                                 10000000000ull, &k));
                got += k;
            }
            CHECK_EQ(got, 3);
        }
        for (i = 0; i < 3; i++) {
            CHECK_EQ(wc[i].status, RDD_WC_SUCCESS);
            CHECK_EQ(wc[i].byte_len, 8);
            CHECK_EQ(wc[i].qp_num, si_[0].qpn);
            CHECK(wc[i].wr_id >= 2000 && wc[i].wr_id < 2000 + cap);
        }
        su_wait_limit_event(dev, srqn);
        MUST(rdd_srq_query(srq, &sa));
        CHECK_EQ(sa.limit, 0);
    } else {
        /* siw: arming works (the event needs traffic, which needs
         * rdma_cm); 0 disarms. */
        MUST(rdd_srq_arm_limit(srq, 4));
        MUST(rdd_srq_arm_limit(srq, 0));
    }

    for (i = 0; i < SU_CLIENTS; i++) {
        CHECK_EQ(rdd_qp_destroy(srv[i]), RDD_STATUS_OK);
        if (i == 0) {
            /* Still attached: the other two. */
            CHECK_EQ(rdd_srq_destroy(srq), RDD_STATUS_RESOURCE_BUSY);
        }
        CHECK_EQ(rdd_qp_destroy(cli[i]), RDD_STATUS_OK);
    }
    CHECK_EQ(rdd_srq_destroy(srq), RDD_STATUS_OK);
    CHECK_EQ(rdd_srq_recv(srq, 1, one[0].addr, SU_SLOT, lkey, 0), RDD_STATUS_INVALID_HANDLE);
    CHECK_EQ(rdd_cq_destroy(cq_s), RDD_STATUS_OK);
    CHECK_EQ(rdd_cq_destroy(cq_c), RDD_STATUS_OK);
    CHECK_EQ(rdd_mr_free(land_mr), RDD_STATUS_OK);
}

/* UD on rxe, on either data path. */
static void test_ud_rxe(rdd_device *dev, rdd_pd *pd)
{
    const char *gi = getenv("RXE_GID_INDEX");
    rdd_cq *cq_a, *cq_b;
    rdd_qp *a, *b;
    rdd_qp_init init = su_init(16);
    rdd_qp_info ia, ib;
    rdd_ah_attr aa;
    rdd_ah *ah;
    rdd_mr *mr;
    void *p;
    uint8_t *buf, *la, *lb, *src;
    uint32_t lkey, qkey = 0x11112222u;
    rdd_wc wc;
    rdd_ud_drops drops;
    rdd_ud_send us;
    rdd_sge g;
    size_t bad = 0, i;
    int diff = 0;

    MUST(rdd_cq_create(dev, 64, &cq_a));
    MUST(rdd_cq_create(dev, 64, &cq_b));
    MUST(rdd_qp_create_ud(pd, cq_a, cq_a, &init, &a));
    MUST(rdd_qp_create_ud(pd, cq_b, cq_b, &init, &b));
    MUST(rdd_qp_query_info(a, &ia));
    MUST(rdd_qp_query_info(b, &ib));
    /* A UD QP connects to nothing. */
    CHECK_EQ(rdd_qp_connect(a, &ib, NULL), RDD_STATUS_INVALID_ATTRIBUTE);
    CHECK_EQ(rdd_qp_ready_ud(a, RDD_OWN_QKEY), RDD_STATUS_INVALID_ATTRIBUTE);
    MUST(rdd_qp_ready_ud(a, qkey));
    MUST(rdd_qp_ready_ud(b, qkey));
    CHECK_EQ(rdd_qp_ready_ud(a, qkey), RDD_STATUS_INVALID_QP_STATE);

    memset(&aa, 0, sizeof aa);
    memcpy(aa.dgid, ib.gid, 16);
    aa.is_global = 1;
    aa.sgid_index = (uint8_t)(gi ? atoi(gi) : 1);
    aa.hop_limit = 64;
    MUST(rdd_ah_create(pd, &aa, &ah));

    MUST(rdd_mr_reg(pd, 4 * 4096, RDD_ACCESS_LOCAL_WRITE, &mr));
    MUST(rdd_mr_addr(mr, &p));
    MUST(rdd_mr_lkey(mr, &lkey));
    buf = (uint8_t *)p;
    la = buf;
    lb = buf + 4096;
    src = buf + 8192;
    memset(la, 0xee, 4096);
    memset(lb, 0xee, 4096);
    for (i = 0; i < 4096; i++) {
        src[i] = (uint8_t)(i * 13 + 3);
    }

    /* a -> b: 100 bytes, landing after the 40-byte GRH area. */
    MUST(rdd_qp_recv(b, 10, (uint64_t)(uintptr_t)lb, 1024, lkey, 0));
    MUST(rdd_qp_recv(a, 20, (uint64_t)(uintptr_t)la, 1024, lkey, 0));
    MUST(rdd_qp_send_ud(a, ah, ib.qpn, qkey, 1, (uint64_t)(uintptr_t)src, 100, lkey,
                        RDD_SEND_SIGNALED));
    su_collect(cq_a, &a, 1, &wc, 1);
    CHECK_EQ(wc.wr_id, 1);
    CHECK_EQ(wc.status, RDD_WC_SUCCESS);
    su_collect(cq_b, &b, 1, &wc, 1);
    CHECK_EQ(wc.wr_id, 10);
    CHECK_EQ(wc.status, RDD_WC_SUCCESS);
    CHECK_EQ(wc.opcode, RDD_WC_OP_RECV);
    CHECK_EQ(wc.byte_len, 100 + SU_GRH);
    CHECK_EQ(wc.src_qp, ia.qpn);
    CHECK_EQ(wc.qp_num, ib.qpn);
    CHECK(wc.wc_flags & RDD_WC_FLAG_GRH);
    CHECK_BYTES(lb + SU_GRH, src, 100);
    CHECK_EQ(lb[SU_GRH + 100], 0xee);

    /* b -> a: SEND_WITH_IMM with b's own Q_Key. */
    MUST(rdd_qp_send_ud_imm(b, ah, ia.qpn, RDD_OWN_QKEY, 2, (uint64_t)(uintptr_t)(src + 200), 64,
                            lkey, 0xabcd1234u, RDD_SEND_SIGNALED));
    su_collect(cq_b, &b, 1, &wc, 1);
    CHECK_EQ(wc.wr_id, 2);
    CHECK_EQ(wc.status, RDD_WC_SUCCESS);
    su_collect(cq_a, &a, 1, &wc, 1);
    CHECK_EQ(wc.wr_id, 20);
    CHECK_EQ(wc.status, RDD_WC_SUCCESS);
    CHECK_EQ(wc.byte_len, 64 + SU_GRH);
    CHECK_EQ(wc.src_qp, ib.qpn);
    CHECK(wc.wc_flags & RDD_WC_FLAG_WITH_IMM);
    CHECK_EQ(wc.imm_data, 0xabcd1234u);
    CHECK_BYTES(la + SU_GRH, src + 200, 64);

    /* The wrong Q_Key: the send completes, nothing is delivered. */
    MUST(rdd_qp_recv(b, 11, (uint64_t)(uintptr_t)(lb + 2048), 1024, lkey, 0));
    MUST(rdd_qp_send_ud_inline(a, ah, ib.qpn, qkey ^ 1u, 3, src + 500, 32, RDD_SEND_SIGNALED));
    su_collect(cq_a, &a, 1, &wc, 1);
    CHECK_EQ(wc.wr_id, 3);
    CHECK_EQ(wc.status, RDD_WC_SUCCESS);
    su_quiet(cq_b, 200);
    /* The right key through the list form: that one lands in receive 11. */
    g.addr = (uint64_t)(uintptr_t)(src + 700);
    g.length = 48;
    g.lkey = lkey;
    memset(&us, 0, sizeof us);
    us.wr.wr_id = 4;
    us.wr.opcode = RDD_WR_SEND;
    us.wr.flags = RDD_SEND_SIGNALED;
    us.wr.sg_list = &g;
    us.wr.num_sge = 1;
    us.ah = ah;
    us.remote_qpn = ib.qpn;
    us.qkey = qkey;
    MUST(rdd_qp_post_send_ud(a, &us, 1, &bad));
    su_collect(cq_a, &a, 1, &wc, 1);
    CHECK_EQ(wc.wr_id, 4);
    CHECK_EQ(wc.status, RDD_WC_SUCCESS);
    su_collect(cq_b, &b, 1, &wc, 1);
    CHECK_EQ(wc.wr_id, 11);
    CHECK_EQ(wc.byte_len, 48 + SU_GRH);
    CHECK_BYTES(lb + 2048 + SU_GRH, src + 700, 48);
    for (i = 0; i < 32; i++) {
        diff |= lb[2048 + SU_GRH + i] != src[500 + i];
    }
    CHECK(diff);

    /* RC calls on a UD QP and RDMA on UD: refused, nothing written. */
    CHECK_EQ(rdd_qp_send(a, 5, (uint64_t)(uintptr_t)src, 8, lkey, RDD_SEND_SIGNALED),
             RDD_STATUS_INVALID_ATTRIBUTE);
    us.wr.opcode = RDD_WR_RDMA_WRITE;
    bad = 77;
    CHECK_EQ(rdd_qp_post_send_ud(a, &us, 1, &bad), RDD_STATUS_UNSUPPORTED);
    CHECK_EQ(bad, 0);
    CHECK_EQ(rdd_qp_recover(a, NULL, NULL, 1000000000ull, NULL, NULL, NULL),
             RDD_STATUS_UNSUPPORTED);
    /* The kernel keeps no per-reason drop count. */
    CHECK_EQ(rdd_device_ud_drops(dev, &drops), RDD_STATUS_UNSUPPORTED);
    su_quiet(cq_a, 5);

    CHECK_EQ(rdd_ah_destroy(ah), RDD_STATUS_OK);
    CHECK_EQ(rdd_qp_send_ud(a, ah, ib.qpn, qkey, 6, (uint64_t)(uintptr_t)src, 8, lkey, 0),
             RDD_STATUS_INVALID_HANDLE);
    CHECK_EQ(rdd_qp_destroy(a), RDD_STATUS_OK);
    CHECK_EQ(rdd_qp_destroy(b), RDD_STATUS_OK);
    CHECK_EQ(rdd_cq_destroy(cq_a), RDD_STATUS_OK);
    CHECK_EQ(rdd_cq_destroy(cq_b), RDD_STATUS_OK);
    CHECK_EQ(rdd_mr_free(mr), RDD_STATUS_OK);
}

/* UD on siw's fallback path: iWARP has no datagrams. */
static void test_ud_siw_refused(rdd_device *dev, rdd_pd *pd)
{
    rdd_ah_attr aa;
    rdd_ah *ah = (rdd_ah *)(uintptr_t)0x1;
    rdd_cq *cq;
    rdd_qp *qp = (rdd_qp *)(uintptr_t)0x1;
    rdd_qp_init init = su_init(4);
    memset(&aa, 0, sizeof aa);
    aa.is_global = 1;
    aa.hop_limit = 64;
    CHECK_EQ(rdd_ah_create(pd, &aa, &ah), RDD_STATUS_UNSUPPORTED);
    CHECK(ah == (rdd_ah *)(uintptr_t)0x1);
    MUST(rdd_cq_create(dev, 64, &cq));
    CHECK_EQ(rdd_qp_create_ud(pd, cq, cq, &init, &qp), RDD_STATUS_UNSUPPORTED);
    CHECK(qp == (rdd_qp *)(uintptr_t)0x1);
    CHECK_EQ(rdd_cq_destroy(cq), RDD_STATUS_OK);
}

/* The SRQ and UD cases on device `name` (rxe: `rxe` 1, siw: 0). */
static void test_srq_ud(const char *name, int rxe)
{
    rdd_device *dev;
    rdd_pd *pd;
    MUST(rdd_device_open_verbs(name, &dev));
    MUST(rdd_pd_alloc(dev, &pd));
    test_srq(dev, pd, rxe);
    if (rxe) {
        test_ud_rxe(dev, pd);
    } else if (!su_fallback()) {
        su_direct_refusals(dev, pd);
    } else {
        test_ud_siw_refused(dev, pd);
    }
    printf("test_verbs: %s: %s: SRQ checked, UD %s\n", name,
           su_fallback() ? "fallback" : "direct rings",
           rxe ? "checked" : "UNSUPPORTED (as documented)");
    CHECK_EQ(rdd_pd_free(pd), RDD_STATUS_OK);
    CHECK_EQ(rdd_device_close(dev), RDD_STATUS_OK);
}

#endif
