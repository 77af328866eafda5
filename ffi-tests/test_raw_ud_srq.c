/*
 * C11 test of the raw-queue UD and SRQ calls (rdd_mlx5_av_make,
 * rdd_mlx5_sq_init_ud, rdd_mlx5_sq_send_ud*, rdd_mlx5_sq_post_ud,
 * rdd_mlx5_srq_*, rdd_mlx5_cq_poll_srq) on fake device memory. The
 * expected bytes are those of rdma-core's libmlx5 for the same requests:
 * cases ud_send_1sge_lid and srq_recv_1sge of
 * testdata/mlx5/ud-srq-golden.txt.
 */
#include "harness.h"

/* ud_send_1sge_lid: qpn 0xd21, 64 BBs, max_send_sge 4, max_inline 60. */
static const rdd_qp_caps UD_CAPS = {4, 60, 1};

/* bb.0 and bb.1 (first 16 bytes) of ud_send_1sge_lid. */
static const uint8_t UD_BB0[64] = {
    0x00, 0x00, 0x00, 0x0a, 0x00, 0x0d, 0x21, 0x05, 0x00, 0x00, 0x00, 0x08, 0x00, 0x00, 0x00, 0x00,
    0x11, 0x11, 0x11, 0x11, 0x00, 0x00, 0x00, 0x00, 0x80, 0x00, 0xab, 0xcd, 0x03, 0x05, 0x00, 0x17,
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
};
static const uint8_t UD_BB1[16] = {
    0x00, 0x00, 0x04, 0x00, 0x00, 0xc0, 0xff, 0xee, 0x00, 0x00, 0x7f, 0x5a, 0x3c, 0x10, 0x00, 0x00,
};

/* ah.0.av of ud_send_1sge_lid: IB, dlid 0x17, sl 3, src_path_bits 5. */
static const uint8_t AV_LID[48] = {
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x03, 0x05, 0x00, 0x17,
};

static rdd_mlx5_ah_attr lid_attr(void)
{
    rdd_mlx5_ah_attr a;
    memset(&a, 0, sizeof(a));
    a.link_layer = RDD_MLX5_LINK_IB;
    a.dlid = 0x17;
    a.sl = 3;
    a.src_path_bits = 5;
    return a;
}

static void test_av_make(void)
{
    rdd_mlx5_ah_attr a = lid_attr();
    rdd_mlx5_av av;
    memset(&av, 0xee, sizeof(av));
    CHECK_EQ(rdd_mlx5_av_make(&a, &av), RDD_STATUS_OK);
    CHECK_BYTES(av.bytes, AV_LID, 48);

    /* Refusals write nothing. */
    memset(&av, 0xee, sizeof(av));
    a.static_rate = 16;
    CHECK_EQ(rdd_mlx5_av_make(&a, &av), RDD_STATUS_INVALID_ATTRIBUTE);
    a = lid_attr();
    a.link_layer = RDD_MLX5_LINK_ROCE_V2; /* RoCE needs a global route */
    CHECK_EQ(rdd_mlx5_av_make(&a, &av), RDD_STATUS_INVALID_ATTRIBUTE);
    a.link_layer = 7;
    CHECK_EQ(rdd_mlx5_av_make(&a, &av), RDD_STATUS_INVALID_ARGUMENT);
    CHECK_EQ(rdd_mlx5_av_make(NULL, &av), RDD_STATUS_NULL_PARAMETER);
    CHECK_EQ(av.bytes[0], 0xee);
}

struct ud_queue {
    struct fake_mlx5 f;
    rdd_mlx5_sq_storage sq;
};

static void ud_init(struct ud_queue *q)
{
    struct fake_geo geo = FAKE_DEFAULT_GEO;
    geo.qpn = 0xd21;
    geo.sq_wqe_cnt = 64;
    geo.bf_size = 256;
    fake_init(&q->f, geo);
    memset(&q->sq, 0, sizeof(q->sq));
    MUST(rdd_mlx5_sq_init_ud(&q->sq, &q->f.qp, 0xd21, &UD_CAPS, 0, q->f.sq_wrid, 64));
}

static void ud_fini(struct ud_queue *q)
{
    CHECK_EQ(rdd_mlx5_sq_fini(&q->sq), RDD_STATUS_OK);
    fake_free(&q->f);
}

static void check_golden_wqe(const struct ud_queue *q)
{
    CHECK_BYTES(q->f.sq, UD_BB0, 64);
    CHECK_BYTES(q->f.sq + 64, UD_BB1, 16);
    CHECK_EQ(fake_dbrec_sq(&q->f), 2);
    /* BlueFlame: the whole two-BB WQE copied to the register. */
    CHECK_BYTES(q->f.bf, UD_BB0, 64);
    CHECK_BYTES(q->f.bf + 64, UD_BB1, 16);
}

static void test_ud_send_golden(void)
{
    struct ud_queue q;
    rdd_mlx5_ah_attr a = lid_attr();
    rdd_mlx5_av av;
    rdd_sge sge = {0x00007f5a3c100000ull, 1024, 0x00c0ffee};
    rdd_ud_wr w;
    size_t bad = 99;

    MUST(rdd_mlx5_av_make(&a, &av));

    /* The per-opcode call. */
    ud_init(&q);
    CHECK_EQ(rdd_mlx5_sq_send_ud(&q.sq, &av, 0xabcd, 0x11111111, 0x7001, sge.addr, sge.length,
                                 sge.lkey, RDD_SEND_SIGNALED),
             RDD_STATUS_OK);
    check_golden_wqe(&q);
    ud_fini(&q);

    /* The generic call, then the doorbell. */
    ud_init(&q);
    memset(&w, 0, sizeof(w));
    w.wr.wr_id = 0x7001;
    w.wr.sg_list = &sge;
    w.wr.num_sge = 1;
    w.wr.opcode = RDD_WR_SEND;
    w.wr.flags = RDD_SEND_SIGNALED;
    w.av = &av;
    w.remote_qpn = 0xabcd;
    w.qkey = 0x11111111;
    CHECK_EQ(rdd_mlx5_sq_post_ud(&q.sq, &w, 1, &bad), RDD_STATUS_OK);
    CHECK_EQ(bad, 99);
    CHECK_EQ(fake_dbrec_sq(&q.f), 0); /* not rung yet */
    CHECK_EQ(rdd_mlx5_sq_ring(&q.sq), RDD_STATUS_OK);
    check_golden_wqe(&q);
    ud_fini(&q);
}

static void test_ud_refusals(void)
{
    struct ud_queue q;
    struct fake_mlx5 rc;
    rdd_mlx5_sq_storage rcsq;
    rdd_mlx5_av av;
    rdd_mlx5_ah_attr a = lid_attr();
    rdd_sge sge = {0x1000, 8, 1};
    rdd_ud_wr w;
    size_t bad = 99;
    uint8_t *before;
    size_t ring = 64 * 64;

    MUST(rdd_mlx5_av_make(&a, &av));
    ud_init(&q);
    before = (uint8_t *)malloc(ring);
    memcpy(before, q.f.sq, ring);

    /* RC operations on a UD queue; a UD send without an address vector or
     * to a QPN wider than 24 bits; unknown flags; RDMA through the
     * generic UD call. */
    CHECK_EQ(rdd_mlx5_sq_write(&q.sq, 1, 0x1000, 8, 1, 0x2000, 2, 0),
             RDD_STATUS_INVALID_ATTRIBUTE);
    CHECK_EQ(rdd_mlx5_sq_send_ud(&q.sq, NULL, 1, 1, 1, 0x1000, 8, 1, 0), RDD_STATUS_NULL_POINTER);
    CHECK_EQ(rdd_mlx5_sq_send_ud(&q.sq, &av, 1u << 24, 1, 1, 0x1000, 8, 1, 0),
             RDD_STATUS_INVALID_QPN);
    CHECK_EQ(rdd_mlx5_sq_send_ud(&q.sq, &av, 1, 1, 1, 0x1000, 8, 1, 0x10), RDD_STATUS_INVALID_FLAGS);
    CHECK_EQ(rdd_mlx5_sq_send_ud_inline(&q.sq, &av, 1, 1, 1, NULL, 4, 0), RDD_STATUS_NULL_POINTER);
    memset(&w, 0, sizeof(w));
    w.wr.wr_id = 1;
    w.wr.sg_list = &sge;
    w.wr.num_sge = 1;
    w.wr.opcode = RDD_WR_RDMA_WRITE;
    w.wr.remote_addr = 0x2000;
    w.wr.rkey = 2;
    w.av = &av;
    CHECK_EQ(rdd_mlx5_sq_post_ud(&q.sq, &w, 1, &bad), RDD_STATUS_UNSUPPORTED);
    CHECK_EQ(bad, 0);
    CHECK_BYTES(q.f.sq, before, ring);
    CHECK_EQ(fake_dbrec_sq(&q.f), 0);
    free(before);
    ud_fini(&q);

    /* A UD send on an RC queue: an RC work request cannot carry an AH. */
    fake_init(&rc, FAKE_DEFAULT_GEO);
    memset(&rcsq, 0, sizeof(rcsq));
    MUST(rdd_mlx5_sq_init(&rcsq, &rc.qp, rc.geo.qpn, &UD_CAPS, 0, rc.sq_wrid, rc.geo.sq_wqe_cnt));
    CHECK_EQ(rdd_mlx5_sq_send_ud(&rcsq, &av, 1, 1, 1, 0x1000, 8, 1, 0),
             RDD_STATUS_INVALID_ATTRIBUTE);
    CHECK_EQ(fake_dbrec_sq(&rc), 0);
    CHECK_EQ(rdd_mlx5_sq_fini(&rcsq), RDD_STATUS_OK);
    fake_free(&rc);
}

/* ---- SRQ ---------------------------------------------------------------- */

/* srq_recv_1sge: srqn 0x51, 8 WQEs + 8 wait-queue WQEs, stride 64. */
#define SRQN 0x51u

struct srq {
    uint8_t *buf;
    uint8_t *db;
    rdd_mlx5_srq_slot slots[8];
    rdd_mlx5_srq_storage h;
};

static void srq_init(struct srq *s)
{
    rdd_mlx5_srq_geometry g;
    s->buf = (uint8_t *)h_alloc(64, 16 * 64);
    s->db = (uint8_t *)h_alloc(64, 64);
    memset(&s->h, 0, sizeof(s->h));
    g.buf = s->buf;
    g.dbrec = (uint32_t *)(void *)s->db;
    g.stride = 64;
    g.nwqes = 8;
    g.max = 16;
    g.srqn = SRQN;
    MUST(rdd_mlx5_srq_init(&s->h, &g, s->slots, 8));
}

static void srq_fini(struct srq *s)
{
    CHECK_EQ(rdd_mlx5_srq_fini(&s->h), RDD_STATUS_OK);
    CHECK_EQ(rdd_mlx5_srq_ring(&s->h), RDD_STATUS_INVALID_HANDLE);
    free(s->buf);
    free(s->db);
}

/* swqe.0 of srq_recv_1sge from +0x10: the data segment and terminator. */
static const uint8_t SWQE0_DATA[32] = {
    0x00, 0x00, 0x08, 0x00, 0x00, 0xd0, 0x0d, 0x01, 0x00, 0x00, 0x7f, 0x5a, 0x3c, 0x20, 0x00, 0x00,
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
};

static void test_srq_golden(void)
{
    struct srq s;
    rdd_sge sge = {0x00007f5a3c200000ull, 2048, 0x00d00d01};
    rdd_recv_wr w = {0x9001, &sge, 1, 0};
    size_t bad = 99;
    uint32_t i;

    /* Per-receive call and list call write the same bytes. */
    srq_init(&s);
    /* The fresh list: next_wqe_index i + 1, the list's and the wait
     * queue's last entries 0. */
    for (i = 0; i < 16; i++) {
        uint32_t want = (i == 7 || i == 15) ? 0 : i + 1;
        CHECK_EQ(s.buf[i * 64 + 2] << 8 | s.buf[i * 64 + 3], want);
    }
    CHECK_EQ(rdd_mlx5_srq_recv(&s.h, 0x9001, sge.addr, sge.length, sge.lkey, 0), RDD_STATUS_OK);
    CHECK_BYTES(s.buf + 16, SWQE0_DATA, 32);
    CHECK_EQ(get_be32(s.db), 1);
    srq_fini(&s);

    srq_init(&s);
    CHECK_EQ(rdd_mlx5_srq_post(&s.h, &w, 1, &bad), RDD_STATUS_OK);
    CHECK_EQ(bad, 99);
    CHECK_BYTES(s.buf + 16, SWQE0_DATA, 32);
    CHECK_EQ(get_be32(s.db), 1);
    srq_fini(&s);

    /* Deferred: the record moves only with the ring. */
    srq_init(&s);
    CHECK_EQ(rdd_mlx5_srq_recv(&s.h, 1, sge.addr, 8, sge.lkey, RDD_SEND_DEFER_DOORBELL),
             RDD_STATUS_OK);
    CHECK_EQ(rdd_mlx5_srq_recv(&s.h, 2, sge.addr, 8, sge.lkey, RDD_SEND_DEFER_DOORBELL),
             RDD_STATUS_OK);
    CHECK_EQ(get_be32(s.db), 0);
    CHECK_EQ(rdd_mlx5_srq_ring(&s.h), RDD_STATUS_OK);
    CHECK_EQ(get_be32(s.db), 2);
    CHECK_EQ(rdd_mlx5_srq_recv(&s.h, 3, sge.addr, 8, sge.lkey, 1), RDD_STATUS_INVALID_FLAGS);
    srq_fini(&s);
}

/* A RESP_SEND CQE of QP `qpn` for SRQ WQE `counter`. */
static void cqe_srq(uint8_t cqe[64], uint32_t qpn, uint16_t counter, uint32_t srqn, uint32_t len)
{
    memset(cqe, 0, 64);
    put_be32(cqe + 32, srqn);
    put_be32(cqe + 44, len);
    put_be32(cqe + 56, qpn);
    put_be16(cqe + 60, counter);
}

static void test_srq_poll(void)
{
    struct srq s;
    struct fake_mlx5 f;
    rdd_mlx5_sq_storage sq;
    rdd_mlx5_cq_storage cq;
    uint8_t cqe[64];
    rdd_wc wc[4];
    size_t n = 99;
    uint32_t i;

    srq_init(&s);
    fake_init(&f, FAKE_DEFAULT_GEO);
    memset(&sq, 0, sizeof(sq));
    memset(&cq, 0, sizeof(cq));
    MUST(rdd_mlx5_sq_init(&sq, &f.qp, f.geo.qpn, &UD_CAPS, 0, f.sq_wrid, f.geo.sq_wqe_cnt));
    MUST(rdd_mlx5_cq_init(&cq, &f.cq));
    for (i = 0; i < 4; i++) {
        MUST(rdd_mlx5_srq_recv(&s.h, 0x100 + i, 0x9000 + 0x100 * i, 256, 7, 0));
    }
    /* Completions in any order: WQEs 2, 0, 3. */
    cqe_srq(cqe, f.geo.qpn, 2, SRQN, 20);
    fake_write_cqe(&f, 0, cqe, 2);
    cqe_srq(cqe, f.geo.qpn, 0, SRQN, 30);
    fake_write_cqe(&f, 1, cqe, 2);
    cqe_srq(cqe, f.geo.qpn, 3, SRQN, 40);
    fake_write_cqe(&f, 2, cqe, 2);
    CHECK_EQ(rdd_mlx5_cq_poll_srq(&cq, &sq, NULL, &s.h, SRQN, wc, 4, &n), RDD_STATUS_OK);
    CHECK_EQ(n, 3);
    CHECK_EQ(wc[0].wr_id, 0x102);
    CHECK_EQ(wc[0].byte_len, 20);
    CHECK_EQ(wc[0].opcode, RDD_WC_OP_RECV);
    CHECK_EQ(wc[0].qp_num, f.geo.qpn);
    CHECK_EQ(wc[1].wr_id, 0x100);
    CHECK_EQ(wc[2].wr_id, 0x103);

    /* WQE 0 again (completed already): corrupt; the entry is consumed,
     * nothing is written, the SRQ is unchanged (WQE 1 is still posted). */
    n = 99;
    cqe_srq(cqe, f.geo.qpn, 0, SRQN, 8);
    fake_write_cqe(&f, 3, cqe, 2);
    CHECK_EQ(rdd_mlx5_cq_poll_srq(&cq, &sq, NULL, &s.h, SRQN, wc, 4, &n), RDD_STATUS_CQE_CORRUPT);
    CHECK_EQ(n, 99);
    CHECK_EQ(rdd_mlx5_cq_poll_srq(&cq, &sq, NULL, &s.h, SRQN, wc, 4, &n), RDD_STATUS_OK);
    CHECK_EQ(n, 0);
    /* A receive of the QP not for this SRQ: the QP has no RQ, corrupt. */
    cqe_srq(cqe, f.geo.qpn, 1, SRQN + 1, 8);
    fake_write_cqe(&f, 4, cqe, 2);
    CHECK_EQ(rdd_mlx5_cq_poll_srq(&cq, &sq, NULL, &s.h, SRQN, wc, 4, &n), RDD_STATUS_CQE_CORRUPT);
    /* WQE 1 is still the SRQ's. */
    cqe_srq(cqe, f.geo.qpn, 1, SRQN, 8);
    fake_write_cqe(&f, 5, cqe, 2);
    CHECK_EQ(rdd_mlx5_cq_poll_srq(&cq, &sq, NULL, &s.h, SRQN, wc, 4, &n), RDD_STATUS_OK);
    CHECK_EQ(n, 1);
    CHECK_EQ(wc[0].wr_id, 0x101);

    /* Bad handles. */
    CHECK_EQ(rdd_mlx5_cq_poll_srq(&cq, &sq, NULL, NULL, SRQN, wc, 4, &n),
             RDD_STATUS_NULL_PARAMETER);
    CHECK_EQ(rdd_mlx5_cq_poll_srq(&cq, &sq, NULL, &s.h, SRQN, wc, 4, NULL),
             RDD_STATUS_NULL_PARAMETER);

    CHECK_EQ(rdd_mlx5_cq_fini(&cq), RDD_STATUS_OK);
    CHECK_EQ(rdd_mlx5_sq_fini(&sq), RDD_STATUS_OK);
    fake_free(&f);
    srq_fini(&s);
}

int main(void)
{
    test_av_make();
    test_ud_send_golden();
    test_ud_refusals();
    test_srq_golden();
    test_srq_poll();
    return h_finish("test_raw_ud_srq");
}
