/*
 * C11 tests of the raw mlx5 queue API over fake device memory: WQE bytes
 * (hand-computed from the reference, sections A.3-A.5), doorbells, CQE
 * polling (requester, responder, error, corrupt, compressed), arming, and
 * the bad paths (NULL parameters, invalid handles, rejected work requests
 * that must leave the queue untouched).
 */
#include "harness.h"

#define QPN 0x1c5u
#define RADDR 0x00007e0011220000ull
#define RKEY 0x0badcafeu

static const rdd_qp_caps CAPS = {4, 60, 4};

static rdd_wr make_wr(uint32_t opcode, uint32_t flags, uint64_t wr_id, const rdd_sge *sg,
                      uint32_t num_sge)
{
    rdd_wr w;
    memset(&w, 0, sizeof(w));
    w.wr_id = wr_id;
    w.opcode = opcode;
    w.flags = flags;
    w.sg_list = sg;
    w.num_sge = num_sge;
    w.remote_addr = RADDR;
    w.rkey = RKEY;
    return w;
}

static rdd_recv_wr make_recv(uint64_t wr_id, const rdd_sge *sg, uint32_t num_sge)
{
    rdd_recv_wr r;
    memset(&r, 0, sizeof(r));
    r.wr_id = wr_id;
    r.sg_list = sg;
    r.num_sge = num_sge;
    return r;
}

/* Everything a rejected request must leave alone. */
struct snapshot {
    uint8_t *bytes;
    size_t len;
};

static size_t snap_len(const struct fake_mlx5 *f)
{
    return (size_t)f->geo.sq_wqe_cnt * 64 + (size_t)f->geo.rq_wqe_cnt * f->geo.rq_stride +
           (size_t)f->geo.sq_wqe_cnt * sizeof(rdd_mlx5_sq_slot) +
           (size_t)f->geo.rq_wqe_cnt * sizeof(uint64_t) + 128 + 2 * (size_t)f->geo.bf_size;
}

static void snap_fill(const struct fake_mlx5 *f, uint8_t *p)
{
    size_t n;
    n = (size_t)f->geo.sq_wqe_cnt * 64;
    memcpy(p, f->sq, n);
    p += n;
    n = (size_t)f->geo.rq_wqe_cnt * f->geo.rq_stride;
    memcpy(p, f->qp_buf, n);
    p += n;
    n = (size_t)f->geo.sq_wqe_cnt * sizeof(rdd_mlx5_sq_slot);
    memcpy(p, f->sq_wrid, n);
    p += n;
    n = (size_t)f->geo.rq_wqe_cnt * sizeof(uint64_t);
    memcpy(p, f->rq_wrid, n);
    p += n;
    memcpy(p, f->dbrec, 128);
    p += 128;
    memcpy(p, f->bf, 2 * (size_t)f->geo.bf_size);
}

static struct snapshot snap_take(const struct fake_mlx5 *f)
{
    struct snapshot s;
    s.len = snap_len(f);
    s.bytes = (uint8_t *)malloc(s.len);
    if (s.bytes == NULL) {
        abort();
    }
    snap_fill(f, s.bytes);
    return s;
}

/* True if the fake memory still equals the snapshot. */
static int snap_same(const struct fake_mlx5 *f, const struct snapshot *s)
{
    uint8_t *now = (uint8_t *)malloc(s->len);
    int same;
    if (now == NULL) {
        abort();
    }
    snap_fill(f, now);
    same = memcmp(now, s->bytes, s->len) == 0;
    free(now);
    return same;
}

/* ---- handles that are not live ------------------------------------------ */

static void test_not_live_handles(void)
{
    static rdd_mlx5_sq_storage sq;   /* zero-initialised */
    static rdd_mlx5_rq_storage rq;
    static rdd_mlx5_cq_storage cq;
    rdd_mlx5_sq_storage garbage;
    rdd_sge sge = {0x1000, 8, 1};
    rdd_wr w = make_wr(RDD_WR_SEND, 0, 1, &sge, 1);
    rdd_recv_wr r = make_recv(1, &sge, 1);
    rdd_wc wc[2];
    size_t bad = 77, count = 77;

    CHECK_EQ(rdd_mlx5_sq_post(&sq, &w, 1, &bad), RDD_STATUS_INVALID_HANDLE);
    CHECK_EQ(rdd_mlx5_sq_ring(&sq), RDD_STATUS_INVALID_HANDLE);
    CHECK_EQ(rdd_mlx5_sq_fini(&sq), RDD_STATUS_INVALID_HANDLE);
    CHECK_EQ(rdd_mlx5_rq_post(&rq, &r, 1, &bad), RDD_STATUS_INVALID_HANDLE);
    CHECK_EQ(rdd_mlx5_rq_fini(&rq), RDD_STATUS_INVALID_HANDLE);
    CHECK_EQ(rdd_mlx5_cq_poll(&cq, &sq, &rq, wc, 2, &count), RDD_STATUS_INVALID_HANDLE);
    CHECK_EQ(rdd_mlx5_cq_arm(&cq, 0), RDD_STATUS_INVALID_HANDLE);
    CHECK_EQ(rdd_mlx5_cq_event_consumed(&cq), RDD_STATUS_INVALID_HANDLE);
    CHECK_EQ(rdd_mlx5_cq_fini(&cq), RDD_STATUS_INVALID_HANDLE);
    CHECK_EQ(bad, 77);
    CHECK_EQ(count, 77);

    memset(&garbage, 0xa5, sizeof(garbage));
    CHECK_EQ(rdd_mlx5_sq_ring(&garbage), RDD_STATUS_INVALID_HANDLE);

    /* A storage of one kind is never accepted as another. */
    CHECK_EQ(rdd_mlx5_sq_ring((rdd_mlx5_sq_storage *)(void *)&cq), RDD_STATUS_INVALID_HANDLE);
}

/* ---- init ----------------------------------------------------------------- */

static int all_zero(const void *p, size_t n)
{
    const uint8_t *b = (const uint8_t *)p;
    size_t i;
    for (i = 0; i < n; i++) {
        if (b[i] != 0) {
            return 0;
        }
    }
    return 1;
}

static void test_init_errors(void)
{
    struct fake_mlx5 f;
    rdd_mlx5_sq_storage sq;
    rdd_mlx5_rq_storage rq;
    rdd_mlx5_cq_storage cq;
    rdd_mlx5dv_qp qp;
    rdd_mlx5dv_cq dv;
    rdd_qp_caps caps = CAPS;
    size_t n;

    fake_init(&f, FAKE_DEFAULT_GEO);
    n = f.geo.sq_wqe_cnt;
    memset(&sq, 0, sizeof(sq));
    memset(&rq, 0, sizeof(rq));
    memset(&cq, 0, sizeof(cq));

    CHECK_EQ(rdd_mlx5_sq_init(NULL, &f.qp, QPN, &caps, 0, f.sq_wrid, n),
             RDD_STATUS_NULL_PARAMETER);
    CHECK_EQ(rdd_mlx5_sq_init(&sq, NULL, QPN, &caps, 0, f.sq_wrid, n), RDD_STATUS_NULL_PARAMETER);
    CHECK_EQ(rdd_mlx5_sq_init(&sq, &f.qp, QPN, NULL, 0, f.sq_wrid, n), RDD_STATUS_NULL_PARAMETER);
    CHECK_EQ(rdd_mlx5_sq_init(&sq, &f.qp, QPN, &caps, 0, NULL, n), RDD_STATUS_NULL_PARAMETER);
    CHECK_EQ(rdd_mlx5_sq_init(&sq, &f.qp, QPN, &caps, 0, f.sq_wrid, n - 1),
             RDD_STATUS_STORAGE_TOO_SMALL);
    CHECK_EQ(rdd_mlx5_sq_init(&sq, &f.qp, 1u << 24, &caps, 0, f.sq_wrid, n),
             RDD_STATUS_INVALID_QPN);
    CHECK_EQ(rdd_mlx5_sq_init(&sq, &f.qp, QPN, &caps, 0x10, f.sq_wrid, n),
             RDD_STATUS_INVALID_ARGUMENT);
    CHECK_EQ(rdd_mlx5_sq_init(&sq, &f.qp, QPN, &caps,
                              RDD_MLX5_SQ_BF_NEVER | RDD_MLX5_SQ_BF_INLINE_ONLY, f.sq_wrid, n),
             RDD_STATUS_INVALID_ARGUMENT);
    qp = f.qp;
    qp.sq_wqe_cnt = 48; /* not a power of two */
    CHECK_EQ(rdd_mlx5_sq_init(&sq, &qp, QPN, &caps, 0, f.sq_wrid, n),
             RDD_STATUS_INVALID_GEOMETRY);
    qp = f.qp;
    qp.sq_buf = f.sq + 16; /* not 64-byte aligned */
    CHECK_EQ(rdd_mlx5_sq_init(&sq, &qp, QPN, &caps, 0, f.sq_wrid, n),
             RDD_STATUS_INVALID_GEOMETRY);
    /* Failed inits leave the storage untouched. */
    CHECK(all_zero(&sq, sizeof(sq)));

    CHECK_EQ(rdd_mlx5_rq_init(&rq, &f.qp, &caps, f.rq_wrid, f.geo.rq_wqe_cnt - 1),
             RDD_STATUS_STORAGE_TOO_SMALL);
    caps.max_recv_sge = 5; /* more than a 64-byte stride holds */
    CHECK_EQ(rdd_mlx5_rq_init(&rq, &f.qp, &caps, f.rq_wrid, f.geo.rq_wqe_cnt),
             RDD_STATUS_INVALID_GEOMETRY);
    CHECK_EQ(rdd_mlx5_rq_init(&rq, &f.qp, &caps, NULL, f.geo.rq_wqe_cnt),
             RDD_STATUS_NULL_PARAMETER);
    CHECK(all_zero(&rq, sizeof(rq)));

    dv = f.cq;
    dv.cqe_size = 96;
    CHECK_EQ(rdd_mlx5_cq_init(&cq, &dv), RDD_STATUS_INVALID_GEOMETRY);
    CHECK_EQ(rdd_mlx5_cq_init(&cq, NULL), RDD_STATUS_NULL_PARAMETER);
    CHECK_EQ(rdd_mlx5_cq_init(NULL, &f.cq), RDD_STATUS_NULL_PARAMETER);
    CHECK(all_zero(&cq, sizeof(cq)));

    /* A misaligned storage pointer is refused. */
    {
        uint8_t *raw = (uint8_t *)h_alloc(64, 2 * sizeof(rdd_mlx5_cq_storage));
        CHECK_EQ(rdd_mlx5_cq_init((rdd_mlx5_cq_storage *)(void *)(raw + 8), &f.cq),
                 RDD_STATUS_INVALID_ARGUMENT);
        CHECK(all_zero(raw, 2 * sizeof(rdd_mlx5_cq_storage)));
        free(raw);
    }
    fake_free(&f);
}

/* ---- the main flow --------------------------------------------------------- */

struct queues {
    struct fake_mlx5 f;
    rdd_mlx5_sq_storage *sq;
    rdd_mlx5_rq_storage *rq;
    rdd_mlx5_cq_storage *cq;
};

static void queues_init(struct queues *q, struct fake_geo geo)
{
    fake_init(&q->f, geo);
    q->sq = (rdd_mlx5_sq_storage *)h_alloc(RDD_MLX5_SQ_STORAGE_ALIGN, sizeof(*q->sq));
    q->rq = (rdd_mlx5_rq_storage *)h_alloc(RDD_MLX5_RQ_STORAGE_ALIGN, sizeof(*q->rq));
    q->cq = (rdd_mlx5_cq_storage *)h_alloc(RDD_MLX5_CQ_STORAGE_ALIGN, sizeof(*q->cq));
    CHECK_EQ(rdd_mlx5_sq_init(q->sq, &q->f.qp, geo.qpn, &CAPS, 0, q->f.sq_wrid, geo.sq_wqe_cnt),
             RDD_STATUS_OK);
    CHECK_EQ(rdd_mlx5_rq_init(q->rq, &q->f.qp, &CAPS, q->f.rq_wrid, geo.rq_wqe_cnt),
             RDD_STATUS_OK);
    CHECK_EQ(rdd_mlx5_cq_init(q->cq, &q->f.cq), RDD_STATUS_OK);
}

static void queues_fini(struct queues *q)
{
    CHECK_EQ(rdd_mlx5_sq_fini(q->sq), RDD_STATUS_OK);
    CHECK_EQ(rdd_mlx5_rq_fini(q->rq), RDD_STATUS_OK);
    CHECK_EQ(rdd_mlx5_cq_fini(q->cq), RDD_STATUS_OK);
    /* Finalised storage is zeroed, so later use is detected. */
    CHECK(all_zero(q->sq, sizeof(*q->sq)));
    CHECK(all_zero(q->rq, sizeof(*q->rq)));
    CHECK(all_zero(q->cq, sizeof(*q->cq)));
    CHECK_EQ(rdd_mlx5_sq_ring(q->sq), RDD_STATUS_INVALID_HANDLE);
    CHECK_EQ(rdd_mlx5_sq_fini(q->sq), RDD_STATUS_INVALID_HANDLE);
    CHECK_EQ(rdd_mlx5_rq_fini(q->rq), RDD_STATUS_INVALID_HANDLE);
    CHECK_EQ(rdd_mlx5_cq_fini(q->cq), RDD_STATUS_INVALID_HANDLE);
    free(q->sq);
    free(q->rq);
    free(q->cq);
    fake_free(&q->f);
}

/* WQE 0: RDMA WRITE, signaled, one SGE (reference A.3, A.5: DS 3, 1 BB). */
static const uint8_t WQE0_WRITE[64] = {
    0x00, 0x00, 0x00, 0x08, /* opmod 0, wqe index 0, opcode RDMA_WRITE */
    0x00, 0x01, 0xc5, 0x03, /* qpn 0x1c5, ds 3 */
    0x00, 0x00, 0x00, 0x08, /* signature, dci stream id, fm_ce_se = CQ_UPDATE */
    0x00, 0x00, 0x00, 0x00, /* imm */
    0x00, 0x00, 0x7e, 0x00, 0x11, 0x22, 0x00, 0x00, /* raddr */
    0x0b, 0xad, 0xca, 0xfe, 0x00, 0x00, 0x00, 0x00, /* rkey, reserved */
    0x00, 0x00, 0x10, 0x00, 0x00, 0xa1, 0xb2, 0xc3, /* byte_count 4096, lkey */
    0x00, 0x00, 0x7f, 0x5a, 0x3c, 0x00, 0x30, 0x00, /* addr */
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0  /* rest of the BB untouched */
};

/* WQE 1: inline SEND of "hello, " + "rdma" (11 bytes), unsignaled: DS 2. */
static const uint8_t WQE1_INLINE[32] = {
    0x00, 0x00, 0x01, 0x0a, 0x00, 0x01, 0xc5, 0x02, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x80, 0x00, 0x00, 0x0b, /* MLX5_INLINE_SEG | 11 */
    'h', 'e', 'l', 'l', 'o', ',', ' ', 'r', 'd', 'm', 'a',
    0x00 /* padding, not written */
};

/* WQE 2: SEND_WITH_IMM 0xdeadbeef, one SGE, unsignaled: DS 2. */
static const uint8_t WQE2_SEND_IMM[32] = {
    0x00, 0x00, 0x02, 0x0b, 0x00, 0x01, 0xc5, 0x02, 0x00, 0x00, 0x00, 0x00, 0xde, 0xad, 0xbe, 0xef,
    0x00, 0x00, 0x00, 0x40, 0x00, 0x00, 0x00, 0x11, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x10, 0x00,
};

/* WQE 4: ATOMIC_CMP_AND_SWP (compare 1, swap 2), signaled: DS 4, a full BB. */
static const uint8_t WQE4_CAS[64] = {
    0x00, 0x00, 0x04, 0x11, 0x00, 0x01, 0xc5, 0x04, 0x00, 0x00, 0x00, 0x08, 0x00, 0x00, 0x00, 0x00,
    0x00, 0x00, 0x7e, 0x00, 0x11, 0x22, 0x00, 0x40, 0x0b, 0xad, 0xca, 0xfe, 0x00, 0x00, 0x00, 0x00,
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x02, /* swap_add = swap */
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01, /* compare */
    0x00, 0x00, 0x00, 0x08, 0x00, 0x00, 0x00, 0x33, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x30, 0x00,
};

/* Receive 0: one data segment, then the invalid-lkey terminator (A.6). */
static const uint8_t RECV0[32] = {
    0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x00, 0x55, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x50, 0x00,
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
};

static void post_main_flow(struct queues *q)
{
    struct fake_mlx5 *f = &q->f;
    size_t bad = 999;
    rdd_sge sge0 = {0x00007f5a3c003000ull, 4096, 0x00a1b2c3};
    static const char hello[] = "hello, ";
    static const char rdma[] = "rdma";
    rdd_sge pieces[2];
    rdd_sge sge1 = {0x1000, 64, 0x11};
    rdd_sge sge2 = {0x2000, 64, 0x22};
    rdd_sge sge3 = {0x3000, 8, 0x33};
    rdd_wr batch2[2];
    rdd_wr batch3[4];
    static const uint8_t nop_ctrl8[8] = {0x00, 0x00, 0x06, 0x00, 0x00, 0x01, 0xc5, 0x01};

    /* Batch 1: one signaled WRITE. Posting does not ring. */
    rdd_wr w = make_wr(RDD_WR_RDMA_WRITE, RDD_SEND_SIGNALED, 0x1004, &sge0, 1);
    CHECK_EQ(rdd_mlx5_sq_post(q->sq, &w, 1, &bad), RDD_STATUS_OK);
    CHECK_EQ(bad, 999); /* not written on success */
    CHECK_EQ(fake_dbrec_sq(f), 0);
    CHECK_BYTES(f->sq, WQE0_WRITE, 64);
    CHECK_EQ(rdd_mlx5_sq_ring(q->sq), RDD_STATUS_OK);
    CHECK_EQ(fake_dbrec_sq(f), 1);
    /* One WQE with DS > 1 that fits: a BlueFlame copy of the whole BB to
     * the first buffer of the register pair (A.7). */
    CHECK_BYTES(f->bf, f->sq, 64);
    /* Nothing pending: ringing again changes nothing. */
    CHECK_EQ(rdd_mlx5_sq_ring(q->sq), RDD_STATUS_OK);
    CHECK_EQ(fake_dbrec_sq(f), 1);

    /* Batch 2: inline SEND (two pieces) + SEND_WITH_IMM. */
    pieces[0].addr = (uint64_t)(uintptr_t)hello;
    pieces[0].length = 7;
    pieces[0].lkey = 0;
    pieces[1].addr = (uint64_t)(uintptr_t)rdma;
    pieces[1].length = 4;
    pieces[1].lkey = 0;
    batch2[0] = make_wr(RDD_WR_SEND, RDD_SEND_INLINE, 2, pieces, 2);
    batch2[1] = make_wr(RDD_WR_SEND_WITH_IMM, 0, 3, &sge1, 1);
    batch2[1].imm_data = 0xdeadbeefu;
    CHECK_EQ(rdd_mlx5_sq_post(q->sq, batch2, 2, &bad), RDD_STATUS_OK);
    CHECK_EQ(rdd_mlx5_sq_ring(q->sq), RDD_STATUS_OK);
    CHECK_EQ(fake_dbrec_sq(f), 3);
    CHECK_BYTES(f->sq + 64, WQE1_INLINE, 31);
    CHECK_BYTES(f->sq + 128, WQE2_SEND_IMM, 32);
    /* Two WQEs: the 8-byte doorbell (last WQE's first 8 bytes) to the second
     * buffer, since the offset toggled after the first doorbell. */
    CHECK_BYTES(f->bf + 256, f->sq + 128, 8);

    /* Batch 3: READ (signaled), CAS (signaled), FETCH_ADD, NOP (signaled). */
    batch3[0] = make_wr(RDD_WR_RDMA_READ, RDD_SEND_SIGNALED, 4, &sge2, 1);
    batch3[0].remote_addr = RADDR + 0x100;
    batch3[1] = make_wr(RDD_WR_ATOMIC_CMP_AND_SWP, RDD_SEND_SIGNALED, 5, &sge3, 1);
    batch3[1].remote_addr = RADDR + 0x40;
    batch3[1].compare_add = 1;
    batch3[1].swap = 2;
    batch3[2] = make_wr(RDD_WR_ATOMIC_FETCH_AND_ADD, 0, 6, &sge3, 1);
    batch3[2].remote_addr = RADDR + 0x48;
    batch3[2].compare_add = 7;
    batch3[3] = make_wr(RDD_WR_NOP, RDD_SEND_SIGNALED, 7, NULL, 0);
    CHECK_EQ(rdd_mlx5_sq_post(q->sq, batch3, 4, &bad), RDD_STATUS_OK);
    CHECK_EQ(rdd_mlx5_sq_ring(q->sq), RDD_STATUS_OK);
    CHECK_EQ(fake_dbrec_sq(f), 7);
    CHECK_EQ(get_be32(f->sq + 192), 0x00000310u); /* READ at BB 3 */
    CHECK_EQ(get_be32(f->sq + 196), QPN << 8 | 3);
    CHECK_EQ(get_be64(f->sq + 192 + 16), RADDR + 0x100);
    CHECK_BYTES(f->sq + 256, WQE4_CAS, 64);
    CHECK_EQ(get_be32(f->sq + 320), 0x00000512u); /* FETCH_ADD at BB 5 */
    CHECK_EQ(f->sq[320 + 11], 0);                  /* unsignaled */
    CHECK_EQ(get_be64(f->sq + 320 + 32), 7);       /* swap_add = addend */
    CHECK_BYTES(f->sq + 384, nop_ctrl8, 8);        /* NOP at BB 6, DS 1 */
    CHECK_BYTES(f->bf, nop_ctrl8, 8);              /* doorbell back in buffer 0 */
}

static void post_receive(struct queues *q)
{
    size_t bad = 999;
    rdd_sge sge = {0x5000, 256, 0x55};
    rdd_recv_wr r = make_recv(0x77, &sge, 1);
    CHECK_EQ(rdd_mlx5_rq_post(q->rq, &r, 1, &bad), RDD_STATUS_OK);
    CHECK_EQ(bad, 999);
    CHECK_EQ(fake_dbrec_rq(&q->f), 1); /* published before returning */
    CHECK_BYTES(q->f.qp_buf, RECV0, 32);
}

/* Posts one request that must be rejected with `want`, and checks that
 * nothing at all changed. */
static void expect_send_rejected(struct queues *q, const rdd_wr *w, rdd_status want)
{
    struct snapshot s = snap_take(&q->f);
    size_t bad = 999;
    CHECK_EQ(rdd_mlx5_sq_post(q->sq, w, 1, &bad), want);
    CHECK_EQ(bad, 0);
    CHECK_EQ(rdd_mlx5_sq_ring(q->sq), RDD_STATUS_OK); /* nothing pending */
    CHECK(snap_same(&q->f, &s));
    free(s.bytes);
}

static void test_bad_send_requests(struct queues *q)
{
    rdd_sge sge = {0x1000, 64, 0x11};
    rdd_sge atomic_sge = {0x3000, 8, 0x33};
    rdd_sge short_sge = {0x3000, 4, 0x33};
    rdd_sge five[5] = {{0x1000, 8, 1}, {0x2000, 8, 1}, {0x3000, 8, 1}, {0x4000, 8, 1},
                       {0x5000, 8, 1}};
    static const uint8_t big[61] = {0};
    rdd_sge big_sge = {(uint64_t)(uintptr_t)big, 61, 0};
    rdd_sge null_piece = {0, 4, 0};
    rdd_sge seventeen[17];
    rdd_wr w;
    rdd_wr batch[3];
    size_t bad;
    int i;
    struct snapshot s;

    for (i = 0; i < 17; i++) {
        seventeen[i].addr = (uint64_t)(uintptr_t)big;
        seventeen[i].length = 1;
        seventeen[i].lkey = 0;
    }

    w = make_wr(7 /* IBV_WR_LOCAL_INV: not supported */, 0, 1, &sge, 1);
    expect_send_rejected(q, &w, RDD_STATUS_INVALID_OPCODE);
    w = make_wr(0x1234, 0, 1, &sge, 1);
    expect_send_rejected(q, &w, RDD_STATUS_INVALID_OPCODE);
    w = make_wr(RDD_WR_SEND, 0x10, 1, &sge, 1);
    expect_send_rejected(q, &w, RDD_STATUS_INVALID_FLAGS);
    w = make_wr(RDD_WR_SEND, 0, 1, five, 5); /* max_send_sge is 4 */
    expect_send_rejected(q, &w, RDD_STATUS_TOO_MANY_SGES);
    w = make_wr(RDD_WR_SEND, 0, 1, NULL, 1);
    expect_send_rejected(q, &w, RDD_STATUS_NULL_POINTER);
    w = make_wr(RDD_WR_SEND, 0, 1, &sge, 1);
    w.imm_data = 5; /* SEND has no immediate */
    expect_send_rejected(q, &w, RDD_STATUS_INVALID_IMMEDIATE);
    w = make_wr(RDD_WR_SEND, RDD_SEND_INLINE, 1, &big_sge, 1); /* 61 > 60 */
    expect_send_rejected(q, &w, RDD_STATUS_INLINE_TOO_LARGE);
    w = make_wr(RDD_WR_SEND, RDD_SEND_INLINE, 1, seventeen, 17);
    expect_send_rejected(q, &w, RDD_STATUS_TOO_MANY_SGES);
    w = make_wr(RDD_WR_SEND, RDD_SEND_INLINE, 1, &null_piece, 1);
    expect_send_rejected(q, &w, RDD_STATUS_NULL_POINTER);
    w = make_wr(RDD_WR_RDMA_READ, RDD_SEND_INLINE, 1, &big_sge, 1);
    expect_send_rejected(q, &w, RDD_STATUS_INLINE_NOT_ALLOWED);
    w = make_wr(RDD_WR_ATOMIC_FETCH_AND_ADD, 0, 1, &atomic_sge, 1);
    w.remote_addr = RADDR + 4; /* misaligned */
    expect_send_rejected(q, &w, RDD_STATUS_ATOMIC_UNALIGNED);
    w = make_wr(RDD_WR_ATOMIC_CMP_AND_SWP, 0, 1, &short_sge, 1);
    expect_send_rejected(q, &w, RDD_STATUS_ATOMIC_SGE_LENGTH);

    /* NULL parameters: nothing posted, *out_bad_index untouched. */
    s = snap_take(&q->f);
    w = make_wr(RDD_WR_SEND, 0, 1, &sge, 1);
    bad = 999;
    CHECK_EQ(rdd_mlx5_sq_post(NULL, &w, 1, &bad), RDD_STATUS_NULL_PARAMETER);
    CHECK_EQ(rdd_mlx5_sq_post(q->sq, NULL, 1, &bad), RDD_STATUS_NULL_PARAMETER);
    CHECK_EQ(rdd_mlx5_sq_post(q->sq, &w, 1, NULL), RDD_STATUS_NULL_PARAMETER);
    CHECK_EQ(rdd_mlx5_sq_ring(NULL), RDD_STATUS_NULL_PARAMETER);
    CHECK_EQ(bad, 999);
    /* A misaligned request array: nothing posted, index 0 reported. */
    {
        uint64_t raw[2 * sizeof(rdd_wr) / 8];
        memset(raw, 0, sizeof(raw));
        CHECK_EQ(rdd_mlx5_sq_post(q->sq, (const rdd_wr *)(const void *)((uint8_t *)raw + 4), 1,
                                  &bad),
                 RDD_STATUS_INVALID_ARGUMENT);
        CHECK_EQ(bad, 0);
    }
    CHECK(snap_same(&q->f, &s));
    free(s.bytes);

    /* A batch stops at the bad request: the one before it is posted, the
     * ones after it are not. */
    batch[0] = make_wr(RDD_WR_NOP, 0, 8, NULL, 0);
    batch[1] = make_wr(99, 0, 9, NULL, 0);
    batch[2] = make_wr(RDD_WR_NOP, 0, 10, NULL, 0);
    bad = 999;
    CHECK_EQ(rdd_mlx5_sq_post(q->sq, batch, 3, &bad), RDD_STATUS_INVALID_OPCODE);
    CHECK_EQ(bad, 1);
    CHECK_EQ(fake_dbrec_sq(&q->f), 7);
    CHECK_EQ(rdd_mlx5_sq_ring(q->sq), RDD_STATUS_OK);
    CHECK_EQ(fake_dbrec_sq(&q->f), 8);
    CHECK_EQ(get_be32(q->f.sq + 448), 0x00000700u); /* NOP at BB 7 */
    CHECK(all_zero(q->f.sq + 512, 64));              /* BB 8 untouched */
}

static void test_bad_recv_requests(struct queues *q)
{
    rdd_sge sge = {0x6000, 64, 0x66};
    rdd_sge five[5] = {{0x1000, 8, 1}, {0x2000, 8, 1}, {0x3000, 8, 1}, {0x4000, 8, 1},
                       {0x5000, 8, 1}};
    rdd_recv_wr r;
    rdd_recv_wr many[16];
    size_t bad;
    int i;
    struct snapshot s = snap_take(&q->f);

    r = make_recv(1, NULL, 1);
    bad = 999;
    CHECK_EQ(rdd_mlx5_rq_post(q->rq, &r, 1, &bad), RDD_STATUS_NULL_POINTER);
    CHECK_EQ(bad, 0);
    r = make_recv(1, five, 5);
    CHECK_EQ(rdd_mlx5_rq_post(q->rq, &r, 1, &bad), RDD_STATUS_TOO_MANY_SGES);
    r = make_recv(1, &sge, 1);
    r.reserved = 1;
    CHECK_EQ(rdd_mlx5_rq_post(q->rq, &r, 1, &bad), RDD_STATUS_INVALID_ARGUMENT);
    bad = 999;
    CHECK_EQ(rdd_mlx5_rq_post(NULL, &r, 1, &bad), RDD_STATUS_NULL_PARAMETER);
    CHECK_EQ(rdd_mlx5_rq_post(q->rq, NULL, 1, &bad), RDD_STATUS_NULL_PARAMETER);
    CHECK_EQ(rdd_mlx5_rq_post(q->rq, &r, 1, NULL), RDD_STATUS_NULL_PARAMETER);
    CHECK_EQ(bad, 999);
    CHECK(snap_same(&q->f, &s));
    free(s.bytes);

    /* 16 entries, one in use: 15 fit, the 16th request is RQ_FULL; the
     * ones before it are posted and published. */
    for (i = 0; i < 16; i++) {
        many[i] = make_recv(100 + (uint64_t)i, &sge, 1);
    }
    CHECK_EQ(rdd_mlx5_rq_post(q->rq, many, 16, &bad), RDD_STATUS_RQ_FULL);
    CHECK_EQ(bad, 15);
    CHECK_EQ(fake_dbrec_rq(&q->f), 16);
}

static void test_poll(struct queues *q)
{
    struct fake_mlx5 *f = &q->f;
    uint8_t cqe[64];
    rdd_wc wc[8];
    rdd_wc sentinel;
    size_t count;

    /* ci 0: requester CQE for WQE 0 (the WRITE). */
    cqe_req(cqe, QPN, 0x08, 0, 0);
    fake_write_cqe(f, 0, cqe, 0 /* REQ */);
    /* ci 1: responder SEND_WITH_IMM into receive 0. */
    memset(cqe, 0, sizeof(cqe));
    put_be16(cqe + 22, 7);                    /* slid */
    put_be32(cqe + 24, 3u << 24 | 0xabc);     /* sl 3, source QPN */
    put_be32(cqe + 36, 0xcafef00du);          /* immediate, wire order */
    put_be32(cqe + 44, 11);                   /* byte_cnt */
    put_be32(cqe + 56, QPN);
    put_be16(cqe + 60, 0);
    fake_write_cqe(f, 1, cqe, 3 /* RESP_SEND_IMM */);

    memset(wc, 0xee, sizeof(wc));
    count = 999;
    CHECK_EQ(rdd_mlx5_cq_poll(q->cq, q->sq, q->rq, wc, 8, &count), RDD_STATUS_OK);
    CHECK_EQ(count, 2);
    CHECK_EQ(wc[0].wr_id, 0x1004);
    CHECK_EQ(wc[0].status, RDD_WC_SUCCESS);
    CHECK_EQ(wc[0].opcode, RDD_WC_OP_RDMA_WRITE);
    CHECK_EQ(wc[0].qp_num, QPN);
    CHECK_EQ(wc[0].byte_len, 0);
    CHECK_EQ(wc[0].wc_flags, 0);
    CHECK_EQ(wc[1].wr_id, 0x77);
    CHECK_EQ(wc[1].status, RDD_WC_SUCCESS);
    CHECK_EQ(wc[1].opcode, RDD_WC_OP_RECV);
    CHECK_EQ(wc[1].wc_flags, RDD_WC_FLAG_WITH_IMM);
    CHECK_EQ(wc[1].imm_data, 0xcafef00du);
    CHECK_EQ(wc[1].byte_len, 11);
    CHECK_EQ(wc[1].src_qp, 0xabc);
    CHECK_EQ(wc[1].sl, 3);
    CHECK_EQ(wc[1].slid, 7);
    CHECK_EQ(wc[1].qp_num, QPN);
    CHECK_EQ(wc[2].wr_id, 0xeeeeeeeeeeeeeeeeull); /* only `count` entries written */
    CHECK_EQ(fake_dbrec_cq_ci(f), 2);

    /* Nothing new: OK with 0, nothing written. */
    memset(&sentinel, 0xee, sizeof(sentinel));
    wc[0] = sentinel;
    CHECK_EQ(rdd_mlx5_cq_poll(q->cq, q->sq, q->rq, wc, 8, &count), RDD_STATUS_OK);
    CHECK_EQ(count, 0);
    CHECK_BYTES(&wc[0], &sentinel, sizeof(sentinel));

    /* ci 2: READ (WQE 3, 64 bytes; retires the unsignaled WQEs 1-2 too);
     * ci 3: CAS (WQE 4); ci 4: error CQE for the NOP (WQE 6, flushed;
     * retires the unsignaled FETCH_ADD, WQE 5). */
    cqe_req(cqe, QPN, 0x10, 3, 64);
    fake_write_cqe(f, 2, cqe, 0);
    cqe_req(cqe, QPN, 0x11, 4, 8);
    fake_write_cqe(f, 3, cqe, 0);
    cqe_req(cqe, QPN, 0x00, 6, 0);
    cqe[54] = 0x32; /* vendor syndrome */
    cqe[55] = 0x05; /* WR flushed */
    fake_write_cqe(f, 4, cqe, 13 /* REQ_ERR */);

    /* At most n entries per call. */
    CHECK_EQ(rdd_mlx5_cq_poll(q->cq, q->sq, q->rq, wc, 2, &count), RDD_STATUS_OK);
    CHECK_EQ(count, 2);
    CHECK_EQ(wc[0].wr_id, 4);
    CHECK_EQ(wc[0].opcode, RDD_WC_OP_RDMA_READ);
    CHECK_EQ(wc[0].byte_len, 64);
    CHECK_EQ(wc[1].wr_id, 5);
    CHECK_EQ(wc[1].opcode, RDD_WC_OP_COMP_SWAP);
    CHECK_EQ(wc[1].byte_len, 8);
    CHECK_EQ(rdd_mlx5_cq_poll(q->cq, q->sq, q->rq, wc, 8, &count), RDD_STATUS_OK);
    CHECK_EQ(count, 1);
    CHECK_EQ(wc[0].wr_id, 7);
    CHECK_EQ(wc[0].status, RDD_WC_WR_FLUSH_ERR);
    CHECK_EQ(wc[0].syndrome, 0x05);
    CHECK_EQ(wc[0].vendor_err, 0x32);
    CHECK_EQ(fake_dbrec_cq_ci(f), 5);

    /* ci 5: a CQE naming a WQE that is not outstanding: consumed, reported,
     * and neither output written. */
    cqe_req(cqe, QPN, 0x08, 40, 0);
    fake_write_cqe(f, 5, cqe, 0);
    wc[0] = sentinel;
    count = 999;
    CHECK_EQ(rdd_mlx5_cq_poll(q->cq, q->sq, q->rq, wc, 8, &count), RDD_STATUS_CQE_CORRUPT);
    CHECK_EQ(count, 999);
    CHECK_BYTES(&wc[0], &sentinel, sizeof(sentinel));
    CHECK_EQ(fake_dbrec_cq_ci(f), 6);
    CHECK_EQ(rdd_mlx5_cq_poll(q->cq, q->sq, q->rq, wc, 8, &count), RDD_STATUS_OK);
    CHECK_EQ(count, 0);

    /* ci 6: a CQE of another QP (stale): consumed silently. */
    cqe_req(cqe, 0x1c6, 0x08, 7, 0);
    fake_write_cqe(f, 6, cqe, 0);
    CHECK_EQ(rdd_mlx5_cq_poll(q->cq, q->sq, q->rq, wc, 8, &count), RDD_STATUS_OK);
    CHECK_EQ(count, 0);
    CHECK_EQ(fake_dbrec_cq_ci(f), 7);

    /* NULL parameters and misuse. */
    count = 999;
    CHECK_EQ(rdd_mlx5_cq_poll(NULL, q->sq, q->rq, wc, 8, &count), RDD_STATUS_NULL_PARAMETER);
    CHECK_EQ(rdd_mlx5_cq_poll(q->cq, NULL, q->rq, wc, 8, &count), RDD_STATUS_NULL_PARAMETER);
    CHECK_EQ(rdd_mlx5_cq_poll(q->cq, q->sq, NULL, wc, 8, &count), RDD_STATUS_NULL_PARAMETER);
    CHECK_EQ(rdd_mlx5_cq_poll(q->cq, q->sq, q->rq, NULL, 8, &count), RDD_STATUS_NULL_PARAMETER);
    CHECK_EQ(rdd_mlx5_cq_poll(q->cq, q->sq, q->rq, wc, 8, NULL), RDD_STATUS_NULL_PARAMETER);
    CHECK_EQ(rdd_mlx5_cq_poll(q->cq, q->sq, (rdd_mlx5_rq_storage *)(void *)q->sq, wc, 8, &count),
             RDD_STATUS_INVALID_HANDLE);
    CHECK_EQ(count, 999);
}

static void test_arm(struct queues *q)
{
    struct fake_mlx5 *f = &q->f;
    rdd_mlx5_cq_storage no_uar;
    rdd_mlx5dv_cq dv = f->cq;

    /* ci is 7: word = sn 0 << 28 | cmd 0 | ci; the register gets
     * be64(word << 32 | cqn) (A.8). */
    CHECK_EQ(rdd_mlx5_cq_arm(q->cq, 0), RDD_STATUS_OK);
    CHECK_EQ(fake_dbrec_cq_arm(f), 7);
    CHECK_EQ(get_be64(f->uar + 0x20), (uint64_t)7 << 32 | 0x80);
    CHECK_EQ(rdd_mlx5_cq_event_consumed(q->cq), RDD_STATUS_OK);
    CHECK_EQ(rdd_mlx5_cq_arm(q->cq, RDD_MLX5_CQ_ARM_SOLICITED), RDD_STATUS_OK);
    CHECK_EQ(fake_dbrec_cq_arm(f), 1u << 28 | 1u << 24 | 7);
    CHECK_EQ(get_be64(f->uar + 0x20), (uint64_t)(1u << 28 | 1u << 24 | 7) << 32 | 0x80);
    CHECK_EQ(rdd_mlx5_cq_arm(q->cq, 2), RDD_STATUS_INVALID_ARGUMENT);
    CHECK_EQ(rdd_mlx5_cq_arm(NULL, 0), RDD_STATUS_NULL_PARAMETER);
    CHECK_EQ(rdd_mlx5_cq_event_consumed(NULL), RDD_STATUS_NULL_PARAMETER);

    /* A CQ without a UAR page cannot be armed. */
    memset(&no_uar, 0, sizeof(no_uar));
    dv.cq_uar = NULL;
    CHECK_EQ(rdd_mlx5_cq_init(&no_uar, &dv), RDD_STATUS_OK);
    CHECK_EQ(rdd_mlx5_cq_arm(&no_uar, 0), RDD_STATUS_INVALID_GEOMETRY);
    CHECK_EQ(rdd_mlx5_cq_fini(&no_uar), RDD_STATUS_OK);
}

static void test_compressed_cqe(struct queues *q)
{
    uint8_t cqe[64];
    rdd_wc wc[2];
    size_t count = 999;
    uint8_t *slot = fake_cqe(&q->f, 7);

    cqe_req(cqe, QPN, 0x08, 7, 0);
    fake_write_cqe(&q->f, 7, cqe, 0);
    slot[63] |= 3 << 2; /* format 3: compressed */
    CHECK_EQ(rdd_mlx5_cq_poll(q->cq, q->sq, q->rq, wc, 2, &count), RDD_STATUS_CQE_COMPRESSED);
    /* Never consumed: the next poll sees it again. */
    CHECK_EQ(rdd_mlx5_cq_poll(q->cq, q->sq, q->rq, wc, 2, &count), RDD_STATUS_CQE_COMPRESSED);
    CHECK_EQ(count, 999);
    CHECK_EQ(fake_dbrec_cq_ci(&q->f), 7);
}

static void test_moved_handle(struct queues *q)
{
    rdd_mlx5_sq_storage *copy =
        (rdd_mlx5_sq_storage *)h_alloc(RDD_MLX5_SQ_STORAGE_ALIGN, sizeof(*copy));
    memcpy(copy, q->sq, sizeof(*copy));
    CHECK_EQ(rdd_mlx5_sq_ring(copy), RDD_STATUS_INVALID_HANDLE);
    CHECK_EQ(rdd_mlx5_sq_fini(copy), RDD_STATUS_INVALID_HANDLE);
    CHECK_EQ(rdd_mlx5_sq_ring(q->sq), RDD_STATUS_OK); /* the original still works */
    free(copy);
}

/* ---- a full send queue ------------------------------------------------------ */

static void test_sq_full(void)
{
    struct fake_geo geo = FAKE_DEFAULT_GEO;
    struct queues q;
    rdd_wr nops[9];
    rdd_wc wc[4];
    uint8_t cqe[64];
    size_t bad = 999, count = 999;
    int i;

    geo.sq_wqe_cnt = 8;
    queues_init(&q, geo);
    for (i = 0; i < 9; i++) {
        nops[i] = make_wr(RDD_WR_NOP, 0, 200 + (uint64_t)i, NULL, 0);
    }
    /* Eight 1-BB WQEs fill the ring; the ninth is SQ_FULL and not written. */
    CHECK_EQ(rdd_mlx5_sq_post(q.sq, nops, 9, &bad), RDD_STATUS_SQ_FULL);
    CHECK_EQ(bad, 8);
    CHECK_EQ(rdd_mlx5_sq_ring(q.sq), RDD_STATUS_OK);
    CHECK_EQ(fake_dbrec_sq(&q.f), 8);
    /* No request asked for a completion, so the queue made the last WQE
     * request one, keeping a full queue from stalling (A.9). */
    CHECK_EQ(q.f.sq[0 * 64 + 11], 0);
    CHECK_EQ(q.f.sq[7 * 64 + 11], 0x08);
    bad = 999;
    CHECK_EQ(rdd_mlx5_sq_post(q.sq, nops, 1, &bad), RDD_STATUS_SQ_FULL);
    CHECK_EQ(bad, 0);

    /* The forced CQE for WQE 7 frees the ring but produces no completion:
     * none was requested. */
    cqe_req(cqe, geo.qpn, 0x00, 7, 0);
    fake_write_cqe(&q.f, 0, cqe, 0);
    CHECK_EQ(rdd_mlx5_cq_poll(q.cq, q.sq, q.rq, wc, 4, &count), RDD_STATUS_OK);
    CHECK_EQ(count, 0);
    CHECK_EQ(fake_dbrec_cq_ci(&q.f), 1);
    CHECK_EQ(rdd_mlx5_sq_post(q.sq, nops, 8, &bad), RDD_STATUS_OK);
    CHECK_EQ(rdd_mlx5_sq_ring(q.sq), RDD_STATUS_OK);
    CHECK_EQ(fake_dbrec_sq(&q.f), 16);
    queues_fini(&q);
}

/* rdd_mlx5_sq_post_ring: post and ring in one call. The doorbell covers
 * WQEs left pending by rdd_mlx5_sq_post, and on a rejected request the
 * ones before it are posted and rung. */
static void test_post_ring(void)
{
    struct fake_geo geo = FAKE_DEFAULT_GEO;
    struct queues q;
    rdd_sge sge = {0x1000, 64, 0x11};
    rdd_wr w[3];
    rdd_wr nops[9];
    size_t bad = 999;
    int i;

    geo.sq_wqe_cnt = 8;
    queues_init(&q, geo);
    /* One WRITE: written and rung by the one call. */
    w[0] = make_wr(RDD_WR_RDMA_WRITE, RDD_SEND_SIGNALED, 1, &sge, 1);
    CHECK_EQ(rdd_mlx5_sq_post_ring(q.sq, w, 1, &bad), RDD_STATUS_OK);
    CHECK_EQ(bad, 999);
    CHECK_EQ(fake_dbrec_sq(&q.f), 1);
    CHECK_EQ(get_be32(q.f.sq), 0x00000008u); /* index 0, RDMA_WRITE */

    /* One pending WQE, then a list whose second request is rejected: the
     * pending one and the first of the list are rung. */
    CHECK_EQ(rdd_mlx5_sq_post(q.sq, w, 1, &bad), RDD_STATUS_OK);
    CHECK_EQ(fake_dbrec_sq(&q.f), 1);
    w[1] = make_wr(RDD_WR_RDMA_WRITE, 0, 2, &sge, 1);
    w[2] = make_wr(RDD_WR_RDMA_WRITE, 0, 3, &sge, 1);
    w[2].opcode = 77;
    CHECK_EQ(rdd_mlx5_sq_post_ring(q.sq, w + 1, 2, &bad), RDD_STATUS_INVALID_OPCODE);
    CHECK_EQ(bad, 1);
    CHECK_EQ(fake_dbrec_sq(&q.f), 3);

    /* A pending WQE and one rejected request: the pending one is rung. */
    CHECK_EQ(rdd_mlx5_sq_post(q.sq, w, 1, &bad), RDD_STATUS_OK);
    bad = 999;
    CHECK_EQ(rdd_mlx5_sq_post_ring(q.sq, w + 2, 1, &bad), RDD_STATUS_INVALID_OPCODE);
    CHECK_EQ(bad, 0);
    CHECK_EQ(fake_dbrec_sq(&q.f), 4);

    /* Parameters. */
    CHECK_EQ(rdd_mlx5_sq_post_ring(NULL, w, 1, &bad), RDD_STATUS_NULL_PARAMETER);
    CHECK_EQ(rdd_mlx5_sq_post_ring(q.sq, NULL, 1, &bad), RDD_STATUS_NULL_PARAMETER);
    CHECK_EQ(rdd_mlx5_sq_post_ring(q.sq, w, 1, NULL), RDD_STATUS_NULL_PARAMETER);
    CHECK_EQ(fake_dbrec_sq(&q.f), 4);
    queues_fini(&q);

    /* A full ring: what fits is posted and rung, the rest is SQ_FULL. */
    queues_init(&q, geo);
    for (i = 0; i < 9; i++) {
        nops[i] = make_wr(RDD_WR_NOP, 0, 300 + (uint64_t)i, NULL, 0);
    }
    CHECK_EQ(rdd_mlx5_sq_post_ring(q.sq, nops, 9, &bad), RDD_STATUS_SQ_FULL);
    CHECK_EQ(bad, 8);
    CHECK_EQ(fake_dbrec_sq(&q.f), 8);
    queues_fini(&q);
}

int main(void)
{
    struct queues q;

    test_not_live_handles();
    test_init_errors();

    queues_init(&q, FAKE_DEFAULT_GEO);
    post_main_flow(&q);
    post_receive(&q);
    test_bad_send_requests(&q);
    test_bad_recv_requests(&q);
    test_poll(&q);
    test_arm(&q);
    test_compressed_cqe(&q);
    test_moved_handle(&q);
    queues_fini(&q);

    test_sq_full();
    test_post_ring();
    return h_finish("test_raw_queue");
}
