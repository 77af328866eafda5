/*
 * The object-level UD tests (rdd_ah_*, rdd_qp_create_ud, rdd_qp_ready_ud,
 * rdd_qp_send_ud*, rdd_qp_post_send_ud, rdd_device_ud_drops, UD
 * completions through rdd_cq_poll / rdd_cq_poll_n / rdd_cq_wait), written
 * once in the common subset of C11 and C++17 and run by test_ud.c and
 * test_ud.cpp. Everything runs on the software device in step mode
 * (docs/c-api.md, "Unreliable datagrams"; docs/spec/soft.md §3).
 */
#ifndef RDD_FFI_TESTS_UD_CASES_H
#define RDD_FFI_TESTS_UD_CASES_H

#include "ud_env.h"

/*
 * Ping-pong: a datagram a -> b through the plain AH, then b -> a through
 * the global one with the QP's own qkey, `rounds` times; every receive
 * has the payload at +40, byte_len n + 40, src_qp, slid, sl, and the GRH
 * flag and header exactly when the AH was global. Polls rotate through
 * rdd_cq_poll_n, rdd_cq_poll and rdd_cq_wait.
 */
static void ud_case_pingpong(void)
{
    struct ud_env e;
    unsigned r;
    rdd_qp *qps[3];
    ud_env_open(&e);
    qps[0] = e.a;
    qps[1] = e.b;
    qps[2] = e.rc;
    for (r = 0; r < 40; r++) {
        int back = (int)(r & 1);
        rdd_qp *from = back ? e.b : e.a;
        rdd_qp *to = back ? e.a : e.b;
        uint32_t to_qpn = back ? e.aqpn : e.bqpn;
        uint32_t from_qpn = back ? e.bqpn : e.aqpn;
        uint32_t len = 1 + (r * 37u) % 200u;
        size_t roff = (size_t)r * UD_SLOT;
        size_t soff = UD_SEND_OFF + (size_t)r * UD_SLOT;
        rdd_wc wc[8];
        size_t n = 0;
        const rdd_wc *rw;
        unsigned i;
        for (i = 0; i < len; i++) {
            e.buf[soff + i] = (uint8_t)(r * 7u + i);
        }
        memset(e.buf + roff, 0xee, UD_SLOT);
        MUST(rdd_qp_recv(to, 1000 + r, ud_addr(&e, roff), UD_GRH + len, e.lkey, 0));
        MUST(rdd_qp_send_ud(from, back ? e.ahg : e.ah, to_qpn, back ? RDD_OWN_QKEY : UD_QKEY,
                            r, ud_addr(&e, soff), len, e.lkey, RDD_SEND_SIGNALED));
        ud_step(&e);
        switch (r % 3) {
        case 0:
            n = ud_drain(&e, wc, 8);
            break;
        case 1:
            MUST(rdd_cq_poll(e.cq, qps, 3, wc, 8, &n));
            break;
        default:
            MUST(rdd_cq_wait(e.cq, qps, 3, wc, 8, RDD_WAIT_BUSY_POLL, 1000000000ull, &n));
            if (n < 2) {
                size_t m = 0;
                MUST(rdd_cq_poll(e.cq, qps, 3, wc + n, 8 - n, &m));
                n += m;
            }
            break;
        }
        CHECK_EQ(n, 2);
        rw = ud_find_recv(wc, (unsigned)n, 1000 + r);
        CHECK(rw != NULL);
        for (i = 0; i < n; i++) {
            CHECK_EQ(wc[i].status, RDD_WC_SUCCESS);
            if ((wc[i].opcode & RDD_WC_OP_RECV) == 0) {
                CHECK_EQ(wc[i].opcode, RDD_WC_OP_SEND);
                CHECK_EQ(wc[i].wr_id, r);
                CHECK_EQ(wc[i].qp_num, from_qpn);
            }
        }
        if (rw == NULL) {
            continue;
        }
        CHECK_EQ(rw->opcode, RDD_WC_OP_RECV);
        CHECK_EQ(rw->byte_len, len + UD_GRH);
        CHECK_EQ(rw->qp_num, to_qpn);
        CHECK_EQ(rw->src_qp, from_qpn);
        CHECK_EQ(rw->slid, 1);
        CHECK_EQ(rw->sl, 3);
        CHECK_BYTES(e.buf + roff + UD_GRH, e.buf + soff, len);
        CHECK_EQ(e.buf[roff + UD_GRH + len], 0xee);
        if (back) {
            /* The GRH: IP version 6, traffic class, flow label, payload
             * length, next header 0x1b, hop limit, SGID, DGID. */
            const uint8_t *g = e.buf + roff;
            CHECK_EQ(rw->wc_flags & RDD_WC_FLAG_GRH, RDD_WC_FLAG_GRH);
            CHECK_EQ(get_be32(g), (6u << 28) | (0x28u << 20) | 0x12345u);
            CHECK_EQ(g[7], 64);
            CHECK_BYTES(g + 8, e.gid, 16);
        } else {
            uint8_t ee[UD_GRH];
            memset(ee, 0xee, sizeof(ee));
            CHECK_EQ(rw->wc_flags & RDD_WC_FLAG_GRH, 0);
            CHECK_BYTES(e.buf + roff, ee, UD_GRH);
        }
    }
    ud_env_close(&e);
}

/*
 * Sixteen destinations from one QP: sixteen UD QPs each with one receive,
 * one rdd_qp_post_send_ud of sixteen entries (one doorbell), each
 * datagram at its own QP with src_qp = the sender.
 */
static void ud_case_fanout(void)
{
    struct ud_env e;
    rdd_qp *d[UD_NDEST];
    uint32_t dqpn[UD_NDEST];
    rdd_ud_send ws[UD_NDEST];
    rdd_sge sg[UD_NDEST];
    rdd_wc wc[64];
    unsigned i, n, seen = 0;
    size_t bad = 99;
    uint64_t db;
    ud_env_open(&e);
    for (i = 0; i < UD_NDEST; i++) {
        rdd_qp_init qi;
        memset(&qi, 0, sizeof(qi));
        qi.max_send_wr = 4;
        qi.max_recv_wr = 4;
        qi.max_send_sge = 1;
        qi.max_recv_sge = 1;
        MUST(rdd_qp_create_ud(e.pd, e.cq, e.cq, &qi, &d[i]));
        MUST(rdd_qp_ready_ud(d[i], UD_QKEY + i));
        dqpn[i] = ud_qpn(d[i]);
        MUST(rdd_qp_recv(d[i], 500 + i, ud_addr(&e, i * UD_SLOT), UD_SLOT, e.lkey, 0));
        e.buf[UD_SEND_OFF + i * 64] = (uint8_t)(0x40 + i);
        memset(&ws[i], 0, sizeof(ws[i]));
        sg[i].addr = ud_addr(&e, UD_SEND_OFF + i * 64);
        sg[i].length = 1 + i;
        sg[i].lkey = e.lkey;
        ws[i].wr.wr_id = i;
        ws[i].wr.opcode = RDD_WR_SEND;
        ws[i].wr.flags = RDD_SEND_SIGNALED;
        ws[i].wr.sg_list = &sg[i];
        ws[i].wr.num_sge = 1;
        ws[i].ah = (i & 1) ? e.ahg : e.ah;
        ws[i].remote_qpn = dqpn[i];
        ws[i].qkey = UD_QKEY + i;
    }
    db = ud_doorbells(e.a);
    MUST(rdd_qp_post_send_ud(e.a, ws, UD_NDEST, &bad));
    CHECK_EQ(bad, 99);
    CHECK_EQ(ud_doorbells(e.a), db + 1);
    ud_step(&e);
    n = ud_drain(&e, wc, 64);
    CHECK_EQ(n, 2 * UD_NDEST);
    for (i = 0; i < n; i++) {
        CHECK_EQ(wc[i].status, RDD_WC_SUCCESS);
        if ((wc[i].opcode & RDD_WC_OP_RECV) != 0) {
            unsigned k = (unsigned)(wc[i].wr_id - 500);
            CHECK(k < UD_NDEST);
            if (k >= UD_NDEST) {
                continue;
            }
            seen |= 1u << k;
            CHECK_EQ(wc[i].qp_num, dqpn[k]);
            CHECK_EQ(wc[i].src_qp, e.aqpn);
            CHECK_EQ(wc[i].byte_len, UD_GRH + 1 + k);
            CHECK_EQ(wc[i].wc_flags & RDD_WC_FLAG_GRH, (k & 1) ? RDD_WC_FLAG_GRH : 0);
            CHECK_EQ(e.buf[k * UD_SLOT + UD_GRH], 0x40 + k);
        }
    }
    CHECK_EQ(seen, (1u << UD_NDEST) - 1);
    for (i = 0; i < UD_NDEST; i++) {
        CHECK_EQ(rdd_qp_destroy(d[i]), RDD_STATUS_OK);
    }
    ud_env_close(&e);
}

/*
 * SEND_WITH_IMM (per-opcode and list form) and the inline form; a
 * deferred datagram rung by rdd_qp_ring; an AH destroyed with its
 * datagram outstanding still delivers it.
 */
static void ud_case_imm_inline(void)
{
    struct ud_env e;
    rdd_wc wc[16];
    const rdd_wc *rw;
    unsigned n;
    rdd_ah *tmp;
    rdd_ah_attr at = ud_attr(0);
    rdd_ud_send w;
    rdd_sge s;
    size_t bad = 99;
    const char msg[] = "inline datagram";
    ud_env_open(&e);
    memset(e.buf + UD_SEND_OFF, 0x5a, 64);

    MUST(rdd_qp_recv(e.b, 1, ud_addr(&e, 0), UD_SLOT, e.lkey, 0));
    MUST(rdd_qp_send_ud_imm(e.a, e.ah, e.bqpn, UD_QKEY, 11, ud_addr(&e, UD_SEND_OFF), 32,
                            e.lkey, 0xdeadbeefu, RDD_SEND_SIGNALED));
    ud_step(&e);
    n = ud_drain(&e, wc, 16);
    CHECK_EQ(n, 2);
    rw = ud_find_recv(wc, n, 1);
    CHECK(rw != NULL);
    if (rw != NULL) {
        CHECK_EQ(rw->status, RDD_WC_SUCCESS);
        CHECK_EQ(rw->wc_flags & RDD_WC_FLAG_WITH_IMM, RDD_WC_FLAG_WITH_IMM);
        CHECK_EQ(rw->imm_data, 0xdeadbeefu);
        CHECK_EQ(rw->byte_len, UD_GRH + 32);
    }

    /* The list form's SEND_WITH_IMM. */
    MUST(rdd_qp_recv(e.b, 2, ud_addr(&e, UD_SLOT), UD_SLOT, e.lkey, 0));
    memset(&w, 0, sizeof(w));
    s.addr = ud_addr(&e, UD_SEND_OFF);
    s.length = 8;
    s.lkey = e.lkey;
    w.wr.wr_id = 12;
    w.wr.opcode = RDD_WR_SEND_WITH_IMM;
    w.wr.imm_data = 0x01020304u;
    w.wr.sg_list = &s;
    w.wr.num_sge = 1;
    w.ah = e.ah;
    w.remote_qpn = e.bqpn;
    w.qkey = UD_QKEY;
    MUST(rdd_qp_post_send_ud(e.a, &w, 1, &bad));
    ud_step(&e);
    n = ud_drain(&e, wc, 16);
    CHECK_EQ(n, 1); /* unsignaled send: only the receive */
    rw = ud_find_recv(wc, n, 2);
    CHECK(rw != NULL);
    if (rw != NULL) {
        CHECK_EQ(rw->imm_data, 0x01020304u);
        CHECK_EQ(rw->wc_flags & RDD_WC_FLAG_WITH_IMM, RDD_WC_FLAG_WITH_IMM);
    }

    /* Inline, deferred, through an AH destroyed before the doorbell. */
    MUST(rdd_ah_create(e.pd, &at, &tmp));
    MUST(rdd_qp_recv(e.b, 3, ud_addr(&e, 2 * UD_SLOT), UD_SLOT, e.lkey, 0));
    MUST(rdd_qp_send_ud_inline(e.a, tmp, e.bqpn, RDD_OWN_QKEY, 13, msg, sizeof(msg),
                               RDD_SEND_SIGNALED | RDD_SEND_DEFER_DOORBELL));
    CHECK_EQ(rdd_ah_destroy(tmp), RDD_STATUS_OK);
    CHECK_EQ(rdd_qp_send_ud(e.a, tmp, e.bqpn, UD_QKEY, 14, ud_addr(&e, UD_SEND_OFF), 8,
                            e.lkey, 0),
             RDD_STATUS_INVALID_HANDLE);
    MUST(rdd_qp_ring(e.a));
    ud_step(&e);
    n = ud_drain(&e, wc, 16);
    CHECK_EQ(n, 2);
    rw = ud_find_recv(wc, n, 3);
    CHECK(rw != NULL);
    if (rw != NULL) {
        CHECK_EQ(rw->byte_len, UD_GRH + sizeof(msg));
        CHECK_BYTES(e.buf + 2 * UD_SLOT + UD_GRH, msg, sizeof(msg));
    }
    ud_env_close(&e);
}

/*
 * Datagrams the destination does not take: a wrong qkey, no receive
 * posted, no such QP. Each completes successfully at the sender, nothing
 * arrives, and the drop counter of its reason goes up by one.
 */
static void ud_case_drops(void)
{
    struct ud_env e;
    rdd_wc wc[8];
    rdd_ud_drops d0, d1;
    unsigned n;
    ud_env_open(&e);
    d0 = ud_drops(&e);
    MUST(rdd_qp_recv(e.b, 1, ud_addr(&e, 0), UD_SLOT, e.lkey, 0));
    MUST(rdd_qp_send_ud(e.a, e.ah, e.bqpn, UD_QKEY + 1, 21, ud_addr(&e, UD_SEND_OFF), 16,
                        e.lkey, RDD_SEND_SIGNALED));
    ud_step(&e);
    n = ud_drain(&e, wc, 8);
    CHECK_EQ(n, 1);
    CHECK_EQ(wc[0].wr_id, 21);
    CHECK_EQ(wc[0].status, RDD_WC_SUCCESS);
    d1 = ud_drops(&e);
    CHECK_EQ(d1.bad_qkey, d0.bad_qkey + 1);
    CHECK_EQ(d1.no_receive, d0.no_receive);

    /* The receive posted above is still there: the right qkey uses it. */
    MUST(rdd_qp_send_ud(e.a, e.ah, e.bqpn, UD_QKEY, 22, ud_addr(&e, UD_SEND_OFF), 16, e.lkey,
                        RDD_SEND_SIGNALED));
    ud_step(&e);
    n = ud_drain(&e, wc, 8);
    CHECK_EQ(n, 2);
    CHECK(ud_find_recv(wc, n, 1) != NULL);

    /* No receive posted now; then a QP number nobody has. */
    MUST(rdd_qp_send_ud(e.a, e.ah, e.bqpn, UD_QKEY, 23, ud_addr(&e, UD_SEND_OFF), 16, e.lkey,
                        RDD_SEND_SIGNALED));
    MUST(rdd_qp_send_ud(e.a, e.ah, 0xfffff0u, UD_QKEY, 24, ud_addr(&e, UD_SEND_OFF), 16,
                        e.lkey, RDD_SEND_SIGNALED));
    ud_step(&e);
    n = ud_drain(&e, wc, 8);
    CHECK_EQ(n, 2);
    d0 = ud_drops(&e);
    CHECK_EQ(d0.no_receive, d1.no_receive + 1);
    CHECK_EQ(d0.no_qp, d1.no_qp + 1);
    CHECK_EQ(d0.bad_qkey, d1.bad_qkey);

    CHECK_EQ(rdd_device_ud_drops(e.dev, NULL), RDD_STATUS_NULL_PARAMETER);
    CHECK_EQ(rdd_device_ud_drops(NULL, &d1), RDD_STATUS_NULL_PARAMETER);
    CHECK_EQ(rdd_device_ud_drops((rdd_device *)(void *)e.pd, &d1), RDD_STATUS_INVALID_HANDLE);
    ud_env_close(&e);
}

/*
 * Thread mode: the device runs by itself; 200 datagrams a -> b and back,
 * each receive waited for with rdd_cq_wait (event and adaptive modes).
 */
static void ud_case_thread(void)
{
    struct ud_env e;
    rdd_qp *qps[3];
    unsigned r, got = 0;
    ud_env_open(&e);
    qps[0] = e.a;
    qps[1] = e.b;
    qps[2] = e.rc;
    MUST(rdd_device_start(e.dev));
    for (r = 0; r < 200; r++) {
        int back = (int)(r & 1);
        rdd_qp *from = back ? e.b : e.a;
        rdd_qp *to = back ? e.a : e.b;
        uint32_t to_qpn = back ? e.aqpn : e.bqpn;
        size_t roff = (size_t)(r % 64) * UD_SLOT;
        unsigned seen = 0, tries;
        e.buf[UD_SEND_OFF + r % 64] = (uint8_t)r;
        MUST(rdd_qp_recv(to, 2000 + r, ud_addr(&e, roff), UD_SLOT, e.lkey, 0));
        MUST(rdd_qp_send_ud(from, back ? e.ahg : e.ah, to_qpn, UD_QKEY, r,
                            ud_addr(&e, UD_SEND_OFF + r % 64), 1, e.lkey, RDD_SEND_SIGNALED));
        for (tries = 0; tries < 100 && seen < 2; tries++) {
            rdd_wc wc[4];
            size_t n = 0, i;
            rdd_status s = rdd_cq_wait(e.cq, qps, 3, wc, 4,
                                       back ? RDD_WAIT_EVENT : RDD_WAIT_ADAPTIVE,
                                       100000000ull, &n);
            if (s == RDD_STATUS_TIMEOUT) {
                continue;
            }
            CHECK_EQ(s, RDD_STATUS_OK);
            for (i = 0; i < n; i++) {
                CHECK_EQ(wc[i].status, RDD_WC_SUCCESS);
                if (wc[i].wr_id == 2000 + r) {
                    CHECK_EQ(wc[i].byte_len, UD_GRH + 1);
                    CHECK_EQ(e.buf[roff + UD_GRH], (uint8_t)r);
                    got++;
                }
            }
            seen += (unsigned)n;
        }
        CHECK_EQ(seen, 2);
    }
    CHECK_EQ(got, 200);
    MUST(rdd_device_stop(e.dev));
    ud_env_close(&e);
}

/* A receive shorter than 40 + the datagram completes in error. */
static void ud_case_short_recv(void)
{
    struct ud_env e;
    rdd_wc wc[8];
    const rdd_wc *rw;
    unsigned n, i;
    ud_env_open(&e);
    MUST(rdd_qp_recv(e.b, 9, ud_addr(&e, 0), UD_GRH + 15, e.lkey, 0));
    MUST(rdd_qp_send_ud(e.a, e.ah, e.bqpn, UD_QKEY, 41, ud_addr(&e, UD_SEND_OFF), 16, e.lkey,
                        RDD_SEND_SIGNALED));
    ud_step(&e);
    n = ud_drain(&e, wc, 8);
    CHECK_EQ(n, 2);
    /* An error completion's opcode is not defined: find it by wr_id. */
    rw = NULL;
    for (i = 0; i < n; i++) {
        if (wc[i].wr_id == 9) {
            rw = &wc[i];
        }
    }
    CHECK(rw != NULL);
    if (rw != NULL) {
        CHECK_EQ(rw->status, RDD_WC_LOC_LEN_ERR);
        CHECK_EQ(rw->qp_num, e.bqpn);
    }
    ud_env_close(&e);
}

/* A UD QP on an SRQ: the SRQ's receive takes the datagram. */
static void ud_case_srq(void)
{
    struct ud_env e;
    rdd_srq *srq;
    rdd_srq_init si;
    rdd_qp *q;
    rdd_wc wc[8];
    const rdd_wc *rw;
    uint32_t qpn;
    unsigned n;
    ud_env_open(&e);
    si.max_wr = 16;
    si.max_sge = 1;
    si.reserved = 0;
    MUST(rdd_srq_create(e.pd, &si, &srq));
    MUST(rdd_qp_create_ud_on_srq(e.pd, e.cq, e.cq, srq, NULL, &q));
    MUST(rdd_qp_ready_ud(q, UD_QKEY));
    qpn = ud_qpn(q);
    CHECK_EQ(rdd_qp_recv(q, 1, ud_addr(&e, 0), UD_SLOT, e.lkey, 0),
             RDD_STATUS_INVALID_ATTRIBUTE);
    MUST(rdd_srq_recv(srq, 77, ud_addr(&e, 0), UD_SLOT, e.lkey, 0));
    MUST(rdd_qp_send_ud(e.a, e.ahg, qpn, UD_QKEY, 31, ud_addr(&e, UD_SEND_OFF), 100, e.lkey,
                        RDD_SEND_SIGNALED));
    ud_step(&e);
    n = ud_drain(&e, wc, 8);
    CHECK_EQ(n, 2);
    rw = ud_find_recv(wc, n, 77);
    CHECK(rw != NULL);
    if (rw != NULL) {
        CHECK_EQ(rw->status, RDD_WC_SUCCESS);
        CHECK_EQ(rw->qp_num, qpn);
        CHECK_EQ(rw->src_qp, e.aqpn);
        CHECK_EQ(rw->byte_len, UD_GRH + 100);
        CHECK_EQ(rw->wc_flags & RDD_WC_FLAG_GRH, RDD_WC_FLAG_GRH);
    }
    CHECK_EQ(rdd_srq_destroy(srq), RDD_STATUS_RESOURCE_BUSY);
    CHECK_EQ(rdd_qp_destroy(q), RDD_STATUS_OK);
    CHECK_EQ(rdd_srq_destroy(srq), RDD_STATUS_OK);
    ud_env_close(&e);
}

/* Address handles: every bad input, `*out` untouched. */
static void ud_case_ah_refusals(void)
{
    struct ud_env e;
    rdd_ah_attr at;
    rdd_ah *out = UD_FORGED_AH;
    rdd_pd *pd2, *dead;
    ud_env_open(&e);

    at = ud_attr(1);
    CHECK_EQ(rdd_ah_create(NULL, &at, &out), RDD_STATUS_NULL_PARAMETER);
    CHECK_EQ(rdd_ah_create(e.pd, NULL, &out), RDD_STATUS_NULL_PARAMETER);
    CHECK_EQ(rdd_ah_create(e.pd, &at, NULL), RDD_STATUS_NULL_PARAMETER);
    CHECK_EQ(rdd_ah_create((rdd_pd *)(void *)e.cq, &at, &out), RDD_STATUS_INVALID_HANDLE);
    MUST(rdd_pd_alloc(e.dev, &dead));
    MUST(rdd_pd_free(dead));
    CHECK_EQ(rdd_ah_create(dead, &at, &out), RDD_STATUS_INVALID_HANDLE);
    at = ud_attr(1);
    at.is_global = 2;
    CHECK_EQ(rdd_ah_create(e.pd, &at, &out), RDD_STATUS_INVALID_ARGUMENT);
    at = ud_attr(1);
    at.reserved = 1;
    CHECK_EQ(rdd_ah_create(e.pd, &at, &out), RDD_STATUS_INVALID_ARGUMENT);
    at = ud_attr(1);
    at.sl = 16;
    CHECK_EQ(rdd_ah_create(e.pd, &at, &out), RDD_STATUS_INVALID_ATTRIBUTE);
    at = ud_attr(1);
    at.flow_label = 1u << 20;
    CHECK_EQ(rdd_ah_create(e.pd, &at, &out), RDD_STATUS_INVALID_ATTRIBUTE);
    at = ud_attr(1);
    at.port_num = 2;
    CHECK_EQ(rdd_ah_create(e.pd, &at, &out), RDD_STATUS_INVALID_ATTRIBUTE);
    at = ud_attr(1);
    at.sgid_index = 1;
    CHECK_EQ(rdd_ah_create(e.pd, &at, &out), RDD_STATUS_INVALID_ATTRIBUTE);
    CHECK(out == UD_FORGED_AH);
    at = ud_attr(0);
    at.port_num = 1;
    MUST(rdd_ah_create(e.pd, &at, &out));
    CHECK(out != UD_FORGED_AH);

    CHECK_EQ(rdd_ah_destroy(NULL), RDD_STATUS_NULL_PARAMETER);
    CHECK_EQ(rdd_ah_destroy(UD_FORGED_AH), RDD_STATUS_INVALID_HANDLE);
    CHECK_EQ(rdd_ah_destroy((rdd_ah *)(void *)e.a), RDD_STATUS_INVALID_HANDLE);
    CHECK_EQ(rdd_ah_destroy(out), RDD_STATUS_OK);
    CHECK_EQ(rdd_ah_destroy(out), RDD_STATUS_INVALID_HANDLE);

    /* A PD with an address handle is busy; an AH keeps to its PD. */
    MUST(rdd_pd_alloc(e.dev, &pd2));
    at = ud_attr(0);
    MUST(rdd_ah_create(pd2, &at, &out));
    CHECK_EQ(rdd_pd_free(pd2), RDD_STATUS_RESOURCE_BUSY);
    CHECK_EQ(rdd_qp_send_ud(e.a, out, e.bqpn, UD_QKEY, 1, ud_addr(&e, UD_SEND_OFF), 8, e.lkey,
                            0),
             RDD_STATUS_INVALID_ATTRIBUTE);
    CHECK_EQ(rdd_ah_destroy(out), RDD_STATUS_OK);
    CHECK_EQ(rdd_pd_free(pd2), RDD_STATUS_OK);
    ud_env_close(&e);
}

/*
 * UD QPs and sends: every bad input is typed and writes nothing (no
 * doorbell, no completion, no delivery).
 */
static void ud_case_send_refusals(void)
{
    struct ud_env e;
    rdd_qp *fresh, *out = NULL;
    rdd_qp_init qi;
    rdd_qp_info peer;
    rdd_ud_send ws[3];
    rdd_sge s;
    rdd_wc wc[8];
    size_t bad = 99;
    uint64_t da, drc;
    ud_env_open(&e);
    s.addr = ud_addr(&e, UD_SEND_OFF);
    s.length = 16;
    s.lkey = e.lkey;
    MUST(rdd_qp_recv(e.b, 1, ud_addr(&e, 0), UD_SLOT, e.lkey, 0));
    da = ud_doorbells(e.a);
    drc = ud_doorbells(e.rc);

    /* Creation and readiness. */
    CHECK_EQ(rdd_qp_create_ud(e.pd, e.cq, e.cq, NULL, NULL), RDD_STATUS_NULL_PARAMETER);
    CHECK_EQ(rdd_qp_create_ud(NULL, e.cq, e.cq, NULL, &out), RDD_STATUS_NULL_PARAMETER);
    CHECK_EQ(rdd_qp_create_ud_on_srq(e.pd, e.cq, e.cq, NULL, NULL, &out),
             RDD_STATUS_NULL_PARAMETER);
    memset(&qi, 0, sizeof(qi));
    qi.max_send_wr = 4;
    qi.max_recv_wr = 4;
    qi.max_send_sge = 1;
    qi.max_recv_sge = 1;
    qi.flags = 0x80;
    CHECK_EQ(rdd_qp_create_ud(e.pd, e.cq, e.cq, &qi, &out), RDD_STATUS_INVALID_ARGUMENT);
    CHECK(out == NULL);
    MUST(rdd_qp_create_ud(e.pd, e.cq, e.cq, NULL, &fresh));
    CHECK_EQ(rdd_qp_send_ud(fresh, e.ah, e.bqpn, UD_QKEY, 1, s.addr, 16, e.lkey, 0),
             RDD_STATUS_INVALID_QP_STATE);
    CHECK_EQ(rdd_qp_ready_ud(NULL, UD_QKEY), RDD_STATUS_NULL_PARAMETER);
    CHECK_EQ(rdd_qp_ready_ud(fresh, RDD_OWN_QKEY | 5), RDD_STATUS_INVALID_ATTRIBUTE);
    CHECK_EQ(rdd_qp_ready_ud(e.rc, UD_QKEY), RDD_STATUS_INVALID_ATTRIBUTE);
    CHECK_EQ(rdd_qp_ready_ud(e.a, UD_QKEY), RDD_STATUS_INVALID_QP_STATE);
    MUST(rdd_qp_query_info(e.b, &peer));
    CHECK_EQ(rdd_qp_connect(fresh, &peer, NULL), RDD_STATUS_INVALID_ATTRIBUTE);
    CHECK_EQ(rdd_qp_recover(fresh, NULL, NULL, 1000, NULL, NULL, NULL), RDD_STATUS_UNSUPPORTED);
    CHECK_EQ(rdd_qp_destroy(fresh), RDD_STATUS_OK);
    CHECK_EQ(rdd_qp_ready_ud(fresh, UD_QKEY), RDD_STATUS_INVALID_HANDLE);
    CHECK_EQ(rdd_qp_send_ud(fresh, e.ah, e.bqpn, UD_QKEY, 1, s.addr, 16, e.lkey, 0),
             RDD_STATUS_INVALID_HANDLE);

    /* Per-opcode UD sends. */
    CHECK_EQ(rdd_qp_send_ud(NULL, e.ah, e.bqpn, UD_QKEY, 1, s.addr, 16, e.lkey, 0),
             RDD_STATUS_NULL_PARAMETER);
    CHECK_EQ(rdd_qp_send_ud(e.a, NULL, e.bqpn, UD_QKEY, 1, s.addr, 16, e.lkey, 0),
             RDD_STATUS_NULL_PARAMETER);
    CHECK_EQ(rdd_qp_send_ud(e.a, UD_FORGED_AH, e.bqpn, UD_QKEY, 1, s.addr, 16, e.lkey, 0),
             RDD_STATUS_INVALID_HANDLE);
    CHECK_EQ(rdd_qp_send_ud(e.a, (rdd_ah *)(void *)e.b, e.bqpn, UD_QKEY, 1, s.addr, 16, e.lkey,
                            0),
             RDD_STATUS_INVALID_HANDLE);
    CHECK_EQ(rdd_qp_send_ud(e.a, e.ah, e.bqpn, UD_QKEY, 1, s.addr, 16, e.lkey, RDD_SEND_INLINE),
             RDD_STATUS_INVALID_FLAGS);
    CHECK_EQ(rdd_qp_send_ud(e.a, e.ah, e.bqpn, UD_QKEY, 1, s.addr, e.mtu + 1, e.lkey, 0),
             RDD_STATUS_EXCEEDS_MTU);
    CHECK_EQ(rdd_qp_send_ud_imm(e.a, e.ah, e.bqpn, UD_QKEY, 1, s.addr, e.mtu + 1, e.lkey, 7,
                                0),
             RDD_STATUS_EXCEEDS_MTU);
    CHECK_EQ(rdd_qp_send_ud(e.a, e.ah, 1u << 24, UD_QKEY, 1, s.addr, 16, e.lkey, 0),
             RDD_STATUS_INVALID_QPN);
    CHECK_EQ(rdd_qp_send_ud_inline(e.a, e.ah, e.bqpn, UD_QKEY, 1, NULL, 4, 0),
             RDD_STATUS_NULL_POINTER);
    CHECK_EQ(rdd_qp_send_ud_inline(e.a, e.ah, e.bqpn, UD_QKEY, 1, e.buf, 1024, 0),
             RDD_STATUS_INLINE_TOO_LARGE);
    /* UD on RC, RC on UD. */
    CHECK_EQ(rdd_qp_send_ud(e.rc, e.ah, e.bqpn, UD_QKEY, 1, s.addr, 16, e.lkey, 0),
             RDD_STATUS_INVALID_ATTRIBUTE);
    CHECK_EQ(rdd_qp_send(e.a, 1, s.addr, 16, e.lkey, 0), RDD_STATUS_INVALID_ATTRIBUTE);
    CHECK_EQ(rdd_qp_write(e.a, 1, s.addr, 16, e.lkey, s.addr, e.lkey, 0),
             RDD_STATUS_INVALID_ATTRIBUTE);
    CHECK_EQ(rdd_qp_fetch_add(e.a, 1, s.addr, e.lkey, s.addr, e.lkey, 1, 0),
             RDD_STATUS_INVALID_ATTRIBUTE);

    /* The list form: bad arrays, then a bad entry after good ones. */
    memset(ws, 0, sizeof(ws));
    ws[0].wr.opcode = RDD_WR_SEND;
    ws[0].wr.sg_list = &s;
    ws[0].wr.num_sge = 1;
    ws[0].ah = e.ah;
    ws[0].remote_qpn = e.bqpn;
    ws[0].qkey = UD_QKEY;
    ws[1] = ws[0];
    ws[2] = ws[0];
    CHECK_EQ(rdd_qp_post_send_ud(e.a, ws, 1, NULL), RDD_STATUS_NULL_PARAMETER);
    CHECK_EQ(rdd_qp_post_send_ud(NULL, ws, 1, &bad), RDD_STATUS_NULL_PARAMETER);
    CHECK_EQ(bad, 99);
    CHECK_EQ(rdd_qp_post_send_ud(e.a, NULL, 1, &bad), RDD_STATUS_NULL_PARAMETER);
    CHECK_EQ(rdd_qp_post_send_ud(e.a, (const rdd_ud_send *)(const void *)(e.buf + 1), 1, &bad),
             RDD_STATUS_INVALID_ARGUMENT);
    CHECK_EQ(bad, 0);
    ws[0].wr.opcode = RDD_WR_RDMA_WRITE;
    CHECK_EQ(rdd_qp_post_send_ud(e.a, ws, 3, &bad), RDD_STATUS_UNSUPPORTED);
    CHECK_EQ(bad, 0);
    ws[0].wr.opcode = RDD_WR_ATOMIC_FETCH_AND_ADD;
    CHECK_EQ(rdd_qp_post_send_ud(e.a, ws, 3, &bad), RDD_STATUS_UNSUPPORTED);
    ws[0].wr.opcode = RDD_WR_SEND;
    ws[0].ah = NULL;
    CHECK_EQ(rdd_qp_post_send_ud(e.a, ws, 3, &bad), RDD_STATUS_NULL_PARAMETER);
    CHECK_EQ(bad, 0);
    ws[0].ah = e.ah;
    ws[0].wr.flags = 0x100;
    CHECK_EQ(rdd_qp_post_send_ud(e.a, ws, 3, &bad), RDD_STATUS_INVALID_FLAGS);
    ws[0].wr.flags = 0;
    ws[0].qkey = 0;
    ws[0].wr.num_sge = 0;
    CHECK_EQ(rdd_qp_post_send_ud(e.rc, ws, 3, &bad), RDD_STATUS_INVALID_ATTRIBUTE);
    CHECK_EQ(bad, 0);
    CHECK_EQ(ud_doorbells(e.a), da);
    CHECK_EQ(ud_doorbells(e.rc), drc);
    /* Nothing reached the device: no completion, the receive unused. */
    ud_step(&e);
    CHECK_EQ(ud_drain(&e, wc, 8), 0);

    /* Entries 0 and 1 (zero-byte datagrams, wrong qkey) go; 2 is too big. */
    s.length = e.mtu + 1;
    ws[2].wr.sg_list = &s;
    ws[1].qkey = 0;
    ws[0].wr.flags = RDD_SEND_SIGNALED;
    ws[1].wr.flags = RDD_SEND_SIGNALED;
    ws[1].wr.num_sge = 0;
    bad = 99;
    CHECK_EQ(rdd_qp_post_send_ud(e.a, ws, 3, &bad), RDD_STATUS_EXCEEDS_MTU);
    CHECK_EQ(bad, 2);
    CHECK_EQ(ud_doorbells(e.a), da + 1);
    ud_step(&e);
    CHECK_EQ(ud_drain(&e, wc, 8), 2);

    /* The submission service posts RC work: a UD QP is refused. */
    {
        rdd_cq *cq2;
        rdd_submit_service *svc = NULL;
        MUST(rdd_cq_create(e.dev, 256, &cq2));
        MUST(rdd_qp_create_ud(e.pd, cq2, cq2, NULL, &fresh));
        MUST(rdd_qp_ready_ud(fresh, UD_QKEY));
        CHECK_EQ(rdd_submit_create(fresh, cq2, NULL, &svc), RDD_STATUS_UNSUPPORTED);
        CHECK(svc == NULL);
        CHECK_EQ(rdd_qp_destroy(fresh), RDD_STATUS_OK);
        CHECK_EQ(rdd_cq_destroy(cq2), RDD_STATUS_OK);
    }
    ud_env_close(&e);
}

static int run_ud_tests(const char *name)
{
    ud_case_pingpong();
    ud_case_fanout();
    ud_case_imm_inline();
    ud_case_drops();
    ud_case_short_recv();
    ud_case_thread();
    ud_case_srq();
    ud_case_ah_refusals();
    ud_case_send_refusals();
    return h_finish(name);
}

#endif
