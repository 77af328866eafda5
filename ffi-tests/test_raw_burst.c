/*
 * C11 tests of the bursts (rdd_mlx5_sq_write_burst, rdd_mlx5_sq_read_burst)
 * over fake device memory:
 *   - a burst writes exactly the bytes of the same operations posted one by
 *     one with rdd_mlx5_sq_write / rdd_mlx5_sq_read (all but the last
 *     deferred), on a twin queue, for n = 1 and n = 16, every flag
 *     combination and length 0, and the WQEs decode to what was asked;
 *   - one doorbell per burst (the doorbell record and which half of the
 *     register pair was written); n = 0 rings what is pending and posts
 *     nothing; RDD_SEND_DEFER_DOORBELL counts on the last descriptor only;
 *   - every bad-input status, *out_posted on each, and what a refusal
 *     leaves (the descriptors before the refused one written and rung).
 * (INVALID_QP_STATE cannot be produced through the raw C ABI: raw queues
 * start in RTS and stay in a sending state. The Rust unit tests in
 * src/ffi/mlx5/tests_ops.rs cover it.)
 */
#include "harness.h"

#define QPN 0x1c5u
#define RADDR 0x00007e0011220040ull
#define RKEY 0x0badcafeu
#define LADDR 0x00007f5a3c003000ull
#define LKEY 0x00a1b2c3u
#define SENTINEL 0xa5a5a5a5u

static const rdd_qp_caps CAPS = {4, 60, 4};

/* ---- queues ---------------------------------------------------------------- */

struct queues {
    struct fake_mlx5 f;
    rdd_mlx5_sq_storage *sq;
    rdd_mlx5_rq_storage *rq; /* only for the poll */
    rdd_mlx5_cq_storage *cq;
};

static void queues_init(struct queues *q, uint32_t sq_wqe_cnt, uint32_t sq_flags,
                        rdd_qp_caps caps)
{
    struct fake_geo geo = FAKE_DEFAULT_GEO;
    geo.sq_wqe_cnt = sq_wqe_cnt;
    fake_init(&q->f, geo);
    q->sq = (rdd_mlx5_sq_storage *)h_alloc(RDD_MLX5_SQ_STORAGE_ALIGN, sizeof(*q->sq));
    q->rq = (rdd_mlx5_rq_storage *)h_alloc(RDD_MLX5_RQ_STORAGE_ALIGN, sizeof(*q->rq));
    q->cq = (rdd_mlx5_cq_storage *)h_alloc(RDD_MLX5_CQ_STORAGE_ALIGN, sizeof(*q->cq));
    MUST(rdd_mlx5_sq_init(q->sq, &q->f.qp, geo.qpn, &caps, sq_flags, q->f.sq_wrid,
                          geo.sq_wqe_cnt));
    MUST(rdd_mlx5_rq_init(q->rq, &q->f.qp, &caps, q->f.rq_wrid, geo.rq_wqe_cnt));
    MUST(rdd_mlx5_cq_init(q->cq, &q->f.cq));
}

static void queues_fini(struct queues *q)
{
    /* The SQ may have been finalised by a test already. */
    (void)rdd_mlx5_sq_fini(q->sq);
    (void)rdd_mlx5_rq_fini(q->rq);
    (void)rdd_mlx5_cq_fini(q->cq);
    free(q->sq);
    free(q->rq);
    free(q->cq);
    fake_free(&q->f);
}

static size_t bf_half(const struct fake_mlx5 *f)
{
    return f->geo.bf_size > 64 ? f->geo.bf_size : 64;
}

/* True if two fakes of the same geometry hold the same bytes in everything
 * a send post or a doorbell may write: the SQ ring, its side table, the
 * doorbell records and the register pair. */
static int same_memory(const struct fake_mlx5 *x, const struct fake_mlx5 *y)
{
    return memcmp(x->sq, y->sq, (size_t)x->geo.sq_wqe_cnt * 64) == 0 &&
           memcmp(x->sq_wrid, y->sq_wrid, x->geo.sq_wqe_cnt * sizeof(rdd_mlx5_sq_slot)) == 0 &&
           memcmp(x->dbrec, y->dbrec, 128) == 0 && memcmp(x->bf, y->bf, 2 * bf_half(x)) == 0;
}

/* A copy of everything same_memory compares. */
struct snapshot {
    struct fake_mlx5 copy;
};

static void snap_take(const struct fake_mlx5 *f, struct snapshot *s)
{
    fake_init(&s->copy, f->geo);
    memcpy(s->copy.sq, f->sq, (size_t)f->geo.sq_wqe_cnt * 64);
    memcpy(s->copy.sq_wrid, f->sq_wrid, f->geo.sq_wqe_cnt * sizeof(rdd_mlx5_sq_slot));
    memcpy(s->copy.dbrec, f->dbrec, 128);
    memcpy(s->copy.bf, f->bf, 2 * bf_half(f));
}

static int snap_same(const struct fake_mlx5 *f, struct snapshot *s)
{
    int same = same_memory(f, &s->copy);
    fake_free(&s->copy);
    return same;
}

/* True if `n` bytes at `p` are all zero. */
static int all_zero(const uint8_t *p, size_t n)
{
    size_t i;
    for (i = 0; i < n; i++) {
        if (p[i] != 0) {
            return 0;
        }
    }
    return 1;
}

/* ---- the operations -------------------------------------------------------- */

enum kind { K_WRITE, K_READ };

static rdd_rdma_op make_op(uint64_t wr_id, uint32_t length, uint32_t flags)
{
    rdd_rdma_op o;
    memset(&o, 0, sizeof(o));
    o.wr_id = wr_id;
    o.laddr = LADDR + 64 * wr_id;
    o.raddr = RADDR + 128 * wr_id;
    o.length = length;
    o.lkey = LKEY + (uint32_t)wr_id;
    o.rkey = RKEY - (uint32_t)wr_id;
    o.flags = flags;
    return o;
}

static rdd_status burst(enum kind k, rdd_mlx5_sq_storage *sq, const rdd_rdma_op *ops, uint32_t n,
                        uint32_t *out_posted)
{
    return k == K_WRITE ? rdd_mlx5_sq_write_burst(sq, ops, n, out_posted)
                        : rdd_mlx5_sq_read_burst(sq, ops, n, out_posted);
}

/* The per-opcode call for one descriptor, with `flags` instead of its own. */
static rdd_status one(enum kind k, rdd_mlx5_sq_storage *sq, const rdd_rdma_op *o, uint32_t flags)
{
    return k == K_WRITE
               ? rdd_mlx5_sq_write(sq, o->wr_id, o->laddr, o->length, o->lkey, o->raddr, o->rkey,
                                   flags)
               : rdd_mlx5_sq_read(sq, o->wr_id, o->laddr, o->length, o->lkey, o->raddr, o->rkey,
                                  flags);
}

/* The burst's equivalent, one call at a time: every descriptor but the last
 * deferred (the burst ignores the bit on them), the last with its flags. */
static void one_by_one(enum kind k, rdd_mlx5_sq_storage *sq, const rdd_rdma_op *ops, uint32_t n)
{
    uint32_t i;
    for (i = 0; i < n; i++) {
        uint32_t fl = i + 1 < n ? ops[i].flags | RDD_SEND_DEFER_DOORBELL : ops[i].flags;
        CHECK_EQ(one(k, sq, &ops[i], fl), RDD_STATUS_OK);
    }
}

/* Decodes the one-BB WQE at BB `bb` against descriptor `o` (A.3, A.5). */
static void check_wqe(const struct fake_mlx5 *f, uint32_t bb, enum kind k, const rdd_rdma_op *o,
                      int sig_all)
{
    const uint8_t *w = f->sq + (size_t)(bb % f->geo.sq_wqe_cnt) * 64;
    uint8_t fm = 0;
    if (o->flags & RDD_SEND_FENCE) {
        fm |= 0x80;
    }
    if (o->flags & RDD_SEND_SOLICITED) {
        fm |= 0x02;
    }
    if ((o->flags & RDD_SEND_SIGNALED) || sig_all) {
        fm |= 0x08;
    }
    CHECK_EQ(get_be32(w), (bb & 0xffff) << 8 | (k == K_WRITE ? 0x08u : 0x10u));
    CHECK_EQ(get_be32(w + 4), QPN << 8 | (o->length ? 3u : 2u));
    /* The signalling guard may add a CQE request to a burst's last WQE. */
    CHECK_EQ(w[11] & 0x82, fm & 0x82);
    if (fm & 0x08) {
        CHECK(w[11] & 0x08);
    }
    CHECK_EQ(get_be64(w + 16), o->raddr);
    CHECK_EQ(get_be32(w + 24), o->rkey);
    if (o->length) {
        CHECK_EQ(get_be32(w + 32), o->length);
        CHECK_EQ(get_be32(w + 36), o->lkey);
        CHECK_EQ(get_be64(w + 40), o->laddr);
    }
}

/* Retires everything up to BB `last` on both twins with one CQE each and
 * polls it the same way on both. */
static void retire(struct queues *a, struct queues *b, uint32_t *ci, uint32_t last)
{
    uint8_t cqe[64];
    rdd_wc wc[4];
    size_t na = 99, nb = 99;
    cqe_req(cqe, QPN, 0, (uint16_t)last, 0);
    fake_write_cqe(&a->f, *ci, cqe, 0);
    fake_write_cqe(&b->f, *ci, cqe, 0);
    (*ci)++;
    MUST(rdd_mlx5_cq_poll(a->cq, a->sq, a->rq, wc, 4, &na));
    MUST(rdd_mlx5_cq_poll(b->cq, b->sq, b->rq, wc, 4, &nb));
    CHECK_EQ(na, nb);
}

/* ---- WQE bytes ------------------------------------------------------------- */

/* Bursts of `n` on `a`, the same descriptors one by one on `b`: the same
 * bytes after every burst, over rounds that wrap the 16-BB ring. */
static void test_same_bytes(enum kind k, uint32_t n, uint32_t sq_flags)
{
    static const uint32_t FLAG_SETS[7] = {
        RDD_SEND_SIGNALED,
        0,
        RDD_SEND_FENCE | RDD_SEND_SOLICITED,
        RDD_SEND_FENCE | RDD_SEND_SIGNALED | RDD_SEND_SOLICITED,
        RDD_SEND_DEFER_DOORBELL,
        RDD_SEND_SIGNALED | RDD_SEND_DEFER_DOORBELL,
        RDD_SEND_SOLICITED,
    };
    static const uint32_t LENGTHS[5] = {8, 0, 4096, 0x7fffffffu, 1};
    struct queues a, b;
    rdd_rdma_op ops[16];
    uint32_t pi = 0, ci = 0, round, i;
    uint64_t id = 1;

    queues_init(&a, 16, sq_flags, CAPS);
    queues_init(&b, 16, sq_flags, CAPS);
    for (round = 0; round < 9; round++) {
        uint32_t posted = SENTINEL;
        for (i = 0; i < n; i++) {
            ops[i] = make_op(id++, LENGTHS[(i + round) % 5], FLAG_SETS[(i * 3 + round) % 7]);
        }
        CHECK_EQ(burst(k, a.sq, ops, n, &posted), RDD_STATUS_OK);
        CHECK_EQ(posted, n);
        one_by_one(k, b.sq, ops, n);
        CHECK(same_memory(&a.f, &b.f));
        for (i = 0; i < n; i++) {
            check_wqe(&a.f, pi + i, k, &ops[i], (sq_flags & RDD_MLX5_SQ_SIG_ALL) != 0);
        }
        if (ops[n - 1].flags & RDD_SEND_DEFER_DOORBELL) {
            CHECK_EQ(fake_dbrec_sq(&a.f), pi);
            CHECK_EQ(rdd_mlx5_sq_ring(a.sq), RDD_STATUS_OK);
            CHECK_EQ(rdd_mlx5_sq_ring(b.sq), RDD_STATUS_OK);
            CHECK(same_memory(&a.f, &b.f));
        }
        pi += n;
        CHECK_EQ(fake_dbrec_sq(&a.f), pi);
        retire(&a, &b, &ci, pi - 1);
    }
    queues_fini(&a);
    queues_fini(&b);
}

/* The first WRITE burst of a fresh queue, byte for byte (A.3, A.5), and
 * n = 1 against rdd_mlx5_sq_write with BlueFlame (a single 3-DS WQE). */
static void test_first_burst_bytes(void)
{
    static const uint8_t WANT[48] = {
        0x00, 0x00, 0x00, 0x08, 0x00, 0x01, 0xc5, 0x03, 0x00, 0x00, 0x00, 0x08, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00, 0x7e, 0x00, 0x11, 0x22, 0x00, 0x40, 0x0b, 0xad, 0xca, 0xfe,
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x10, 0x00, 0x00, 0xa1, 0xb2, 0xc3, 0x00, 0x00,
        0x7f, 0x5a, 0x3c, 0x00, 0x30, 0x00,
    };
    struct queues q;
    rdd_rdma_op o;
    uint32_t posted = SENTINEL;

    memset(&o, 0, sizeof(o));
    o.wr_id = 7;
    o.laddr = LADDR;
    o.raddr = RADDR;
    o.length = 4096;
    o.lkey = LKEY;
    o.rkey = RKEY;
    o.flags = RDD_SEND_SIGNALED;
    queues_init(&q, 64, 0, CAPS);
    CHECK_EQ(rdd_mlx5_sq_write_burst(q.sq, &o, 1, &posted), RDD_STATUS_OK);
    CHECK_EQ(posted, 1);
    CHECK_BYTES(q.f.sq, WANT, sizeof(WANT));
    CHECK_EQ(fake_dbrec_sq(&q.f), 1);
    CHECK_BYTES(q.f.bf, q.f.sq, 64); /* one WQE: BlueFlame */
    queues_fini(&q);
}

/* ---- doorbells --------------------------------------------------------------- */

/* One doorbell per burst: the record moves once, and one half of the
 * register pair is written per doorbell (the halves alternate, A.7). */
static void test_one_doorbell(enum kind k)
{
    struct queues q;
    rdd_rdma_op ops[16];
    uint32_t i, posted = SENTINEL;
    size_t half;

    queues_init(&q, 64, 0, CAPS);
    half = bf_half(&q.f);
    for (i = 0; i < 16; i++) {
        ops[i] = make_op(i, 8, i == 5 ? RDD_SEND_SIGNALED : 0);
    }
    CHECK_EQ(burst(k, q.sq, ops, 16, &posted), RDD_STATUS_OK);
    CHECK_EQ(posted, 16);
    CHECK_EQ(fake_dbrec_sq(&q.f), 16);
    /* An 8-byte doorbell with the last WQE's control bytes; the other half
     * of the pair untouched. */
    CHECK_BYTES(q.f.bf, q.f.sq + 15 * 64, 8);
    CHECK(all_zero(q.f.bf + 8, 2 * half - 8));
    /* The next burst writes the other half, and only its first 8 bytes. */
    CHECK_EQ(burst(k, q.sq, ops, 16, &posted), RDD_STATUS_OK);
    CHECK_EQ(fake_dbrec_sq(&q.f), 32);
    CHECK_BYTES(q.f.bf + half, q.f.sq + 31 * 64, 8);
    CHECK(all_zero(q.f.bf + half + 8, half - 8));
    CHECK_BYTES(q.f.bf, q.f.sq + 15 * 64, 8);
    queues_fini(&q);
}

/* n = 0 rings what per-opcode calls deferred, posts nothing, and is a no-op
 * with nothing pending. */
static void test_n_zero(enum kind k)
{
    struct queues q;
    struct snapshot s;
    rdd_rdma_op o = make_op(1, 8, 0);
    uint32_t posted = SENTINEL;
    uint8_t ring_before[64 * 64];

    queues_init(&q, 64, 0, CAPS);
    snap_take(&q.f, &s);
    CHECK_EQ(burst(k, q.sq, &o, 0, &posted), RDD_STATUS_OK);
    CHECK_EQ(posted, 0);
    CHECK(snap_same(&q.f, &s));
    CHECK_EQ(rdd_mlx5_sq_write(q.sq, 1, LADDR, 8, LKEY, RADDR, RKEY, RDD_SEND_DEFER_DOORBELL),
             RDD_STATUS_OK);
    CHECK_EQ(rdd_mlx5_sq_read(q.sq, 2, LADDR, 8, LKEY, RADDR, RKEY, RDD_SEND_DEFER_DOORBELL),
             RDD_STATUS_OK);
    CHECK_EQ(rdd_mlx5_sq_send(q.sq, 3, LADDR, 8, LKEY, RDD_SEND_DEFER_DOORBELL), RDD_STATUS_OK);
    CHECK_EQ(fake_dbrec_sq(&q.f), 0);
    CHECK(all_zero(q.f.bf, 2 * bf_half(&q.f)));
    memcpy(ring_before, q.f.sq, sizeof(ring_before));
    posted = SENTINEL;
    CHECK_EQ(burst(k, q.sq, &o, 0, &posted), RDD_STATUS_OK);
    CHECK_EQ(posted, 0);
    CHECK_EQ(fake_dbrec_sq(&q.f), 3);
    CHECK_BYTES(q.f.bf, q.f.sq + 2 * 64, 8);
    CHECK_BYTES(q.f.sq, ring_before, sizeof(ring_before)); /* nothing posted */
    /* Nothing pending any more: a second n = 0 changes nothing; out_posted
     * may be NULL. */
    snap_take(&q.f, &s);
    CHECK_EQ(burst(k, q.sq, &o, 0, NULL), RDD_STATUS_OK);
    CHECK(snap_same(&q.f, &s));
    queues_fini(&q);
}

/* RDD_SEND_DEFER_DOORBELL on the last descriptor leaves the burst pending;
 * on another one it is ignored. */
static void test_defer(enum kind k)
{
    struct queues q;
    rdd_rdma_op ops[4];
    uint32_t i, posted = SENTINEL;

    queues_init(&q, 64, 0, CAPS);
    for (i = 0; i < 4; i++) {
        ops[i] = make_op(i, 8, i == 3 ? RDD_SEND_DEFER_DOORBELL : 0);
    }
    CHECK_EQ(burst(k, q.sq, ops, 4, &posted), RDD_STATUS_OK);
    CHECK_EQ(posted, 4);
    CHECK_EQ(fake_dbrec_sq(&q.f), 0);
    CHECK(all_zero(q.f.bf, 2 * bf_half(&q.f)));
    CHECK_EQ(get_be32(q.f.sq + 3 * 64) & 0xff, k == K_WRITE ? 0x08u : 0x10u);
    /* n = 1 with the bit: deferred too. */
    CHECK_EQ(burst(k, q.sq, ops + 3, 1, &posted), RDD_STATUS_OK);
    CHECK_EQ(posted, 1);
    CHECK_EQ(fake_dbrec_sq(&q.f), 0);
    CHECK_EQ(rdd_mlx5_sq_ring(q.sq), RDD_STATUS_OK);
    CHECK_EQ(fake_dbrec_sq(&q.f), 5);
    CHECK_BYTES(q.f.bf, q.f.sq + 4 * 64, 8);
    /* The bit on a middle descriptor: ignored, the burst rings. */
    ops[3].flags = 0;
    ops[1].flags = RDD_SEND_DEFER_DOORBELL;
    CHECK_EQ(burst(k, q.sq, ops, 4, NULL), RDD_STATUS_OK);
    CHECK_EQ(fake_dbrec_sq(&q.f), 9);
    CHECK_BYTES(q.f.bf + bf_half(&q.f), q.f.sq + 8 * 64, 8);
    /* A later burst without the bit rings deferred WQEs of an earlier one. */
    ops[1].flags = 0;
    ops[3].flags = RDD_SEND_DEFER_DOORBELL;
    CHECK_EQ(burst(k, q.sq, ops, 4, NULL), RDD_STATUS_OK);
    CHECK_EQ(fake_dbrec_sq(&q.f), 9);
    ops[3].flags = 0;
    CHECK_EQ(burst(k, q.sq, ops, 2, NULL), RDD_STATUS_OK);
    CHECK_EQ(fake_dbrec_sq(&q.f), 15);
    CHECK_BYTES(q.f.bf, q.f.sq + 14 * 64, 8);
    queues_fini(&q);
}

/* ---- bad inputs --------------------------------------------------------------- */

/* A call refused before any descriptor is looked at: the status, the
 * sentinel untouched, nothing written, and a WQE deferred before it still
 * pending. */
static void expect_untouched(enum kind k, struct queues *q, rdd_mlx5_sq_storage *sq,
                             const rdd_rdma_op *ops, uint32_t n, rdd_status want)
{
    struct snapshot s;
    uint32_t posted = SENTINEL, before;
    CHECK_EQ(rdd_mlx5_sq_send(q->sq, 1000, LADDR, 8, LKEY, RDD_SEND_DEFER_DOORBELL),
             RDD_STATUS_OK);
    before = fake_dbrec_sq(&q->f);
    snap_take(&q->f, &s);
    CHECK_EQ(burst(k, sq, ops, n, &posted), want);
    CHECK_EQ(posted, SENTINEL);
    CHECK_EQ(burst(k, sq, ops, n, NULL), want);
    CHECK(snap_same(&q->f, &s));
    CHECK_EQ(rdd_mlx5_sq_ring(q->sq), RDD_STATUS_OK);
    CHECK_EQ(fake_dbrec_sq(&q->f), before + 1);
}

static void test_call_refusals(enum kind k)
{
    static rdd_mlx5_sq_storage zero_sq; /* zero-initialised */
    static const uint32_t NS[3] = {0, 1, 16};
    struct queues q;
    rdd_rdma_op ops[17];
    rdd_mlx5_sq_storage *moved;
    const rdd_rdma_op *misaligned;
    uint32_t i;

    for (i = 0; i < 17; i++) {
        ops[i] = make_op(i, 8, 0);
    }
    /* 4 bytes into the array: readable, but not 8-aligned. */
    misaligned = (const rdd_rdma_op *)(const void *)((const char *)ops + 4);
    queues_init(&q, 256, 0, CAPS);
    moved = (rdd_mlx5_sq_storage *)h_alloc(RDD_MLX5_SQ_STORAGE_ALIGN, sizeof(*moved));
    memcpy(moved, q.sq, sizeof(*moved));
    for (i = 0; i < 3; i++) {
        uint32_t n = NS[i];
        expect_untouched(k, &q, NULL, ops, n, RDD_STATUS_NULL_PARAMETER);
        expect_untouched(k, &q, NULL, NULL, n, RDD_STATUS_NULL_PARAMETER);
        expect_untouched(k, &q, q.sq, NULL, n, RDD_STATUS_NULL_PARAMETER);
        expect_untouched(k, &q, &zero_sq, ops, n, RDD_STATUS_INVALID_HANDLE);
        expect_untouched(k, &q, moved, ops, n, RDD_STATUS_INVALID_HANDLE);
        expect_untouched(k, &q, (rdd_mlx5_sq_storage *)(void *)q.cq, ops, n,
                         RDD_STATUS_INVALID_HANDLE);
        /* The handle is checked before the array. */
        expect_untouched(k, &q, &zero_sq, NULL, n, RDD_STATUS_INVALID_HANDLE);
        expect_untouched(k, &q, q.sq, misaligned, n, RDD_STATUS_INVALID_ARGUMENT);
    }
    /* A finalised handle. */
    MUST(rdd_mlx5_sq_fini(q.sq));
    for (i = 0; i < 3; i++) {
        uint32_t posted = SENTINEL;
        CHECK_EQ(burst(k, q.sq, ops, NS[i], &posted), RDD_STATUS_INVALID_HANDLE);
        CHECK_EQ(posted, SENTINEL);
    }
    free(moved);
    queues_fini(&q);
}

/* A burst of `n` whose descriptor `bad` is refused with `want`: *out_posted
 * is `bad`, the ones before it are written (as by one-by-one calls on a
 * twin) and rung together with a WQE deferred before the call, nothing of
 * `bad` or after is written. `qa` and `qb` are fresh twins. */
static void expect_stops_at(enum kind k, struct queues *qa, struct queues *qb,
                            const rdd_rdma_op *ops, uint32_t n, uint32_t bad, rdd_status want)
{
    uint32_t posted = SENTINEL, i, pi = fake_dbrec_sq(&qa->f);
    rdd_rdma_op good[32];
    CHECK_EQ(rdd_mlx5_sq_send(qa->sq, 1000, LADDR, 8, LKEY, RDD_SEND_DEFER_DOORBELL),
             RDD_STATUS_OK);
    CHECK_EQ(rdd_mlx5_sq_send(qb->sq, 1000, LADDR, 8, LKEY, RDD_SEND_DEFER_DOORBELL),
             RDD_STATUS_OK);
    CHECK_EQ(burst(k, qa->sq, ops, n, &posted), want);
    CHECK_EQ(posted, bad);
    /* The twin: the good ones one by one, the last of them (or, with none,
     * a ring) closing the doorbell as the burst does. */
    for (i = 0; i < bad; i++) {
        good[i] = ops[i];
        good[i].flags &= ~(uint32_t)RDD_SEND_DEFER_DOORBELL;
    }
    if (bad != 0) {
        one_by_one(k, qb->sq, good, bad);
    } else {
        CHECK_EQ(rdd_mlx5_sq_ring(qb->sq), RDD_STATUS_OK);
    }
    CHECK(same_memory(&qa->f, &qb->f));
    CHECK_EQ(fake_dbrec_sq(&qa->f), pi + 1 + bad);
    /* The BB after the last good WQE was never written. */
    CHECK(all_zero(qa->f.sq + (size_t)((pi + 1 + bad) % qa->f.geo.sq_wqe_cnt) * 64, 64));
}

static void test_descriptor_refusals(enum kind k)
{
    static const uint32_t BAD_FLAGS[4] = {0x10, RDD_SEND_INLINE, 0x80000000u, 0x20000000u};
    static const uint32_t NS[2] = {2, 16};
    rdd_qp_caps no_sge = {0, 60, 0};
    rdd_rdma_op ops[16];
    uint32_t i, j, f;

    for (f = 0; f < 4; f++) {
        for (j = 0; j < 2; j++) {
            uint32_t n = NS[j];
            uint32_t bads[3] = {0, 1, n - 1};
            for (i = 0; i < 3; i++) {
                struct queues a, b;
                uint32_t x;
                queues_init(&a, 64, 0, CAPS);
                queues_init(&b, 64, 0, CAPS);
                for (x = 0; x < n; x++) {
                    ops[x] = make_op(x, 8, x % 2 ? RDD_SEND_SIGNALED : 0);
                }
                ops[bads[i]].flags |= BAD_FLAGS[f];
                expect_stops_at(k, &a, &b, ops, n, bads[i], RDD_STATUS_INVALID_FLAGS);
                /* Lengths of 2^31 and more. */
                ops[bads[i]].flags &= ~BAD_FLAGS[f];
                ops[bads[i]].length = f % 2 ? 0x80000000u : 0xffffffffu;
                expect_stops_at(k, &a, &b, ops, n, bads[i], RDD_STATUS_LENGTH_OVERFLOW);
                queues_fini(&a);
                queues_fini(&b);
            }
        }
    }
    /* n = 1 refused: nothing posted or written, and (as a refusal in a
     * longer burst) what was pending is rung: the deferred WQE goes. */
    {
        struct queues q;
        struct snapshot s;
        uint32_t posted = SENTINEL;
        queues_init(&q, 64, 0, CAPS);
        CHECK_EQ(rdd_mlx5_sq_send(q.sq, 1000, LADDR, 8, LKEY, RDD_SEND_DEFER_DOORBELL),
                 RDD_STATUS_OK);
        ops[0] = make_op(0, 8, 0x10 | RDD_SEND_DEFER_DOORBELL);
        CHECK_EQ(fake_dbrec_sq(&q.f), 0);
        CHECK_EQ(burst(k, q.sq, ops, 1, &posted), RDD_STATUS_INVALID_FLAGS);
        CHECK_EQ(posted, 0);
        CHECK_EQ(fake_dbrec_sq(&q.f), 1); /* the pending SEND rung */
        snap_take(&q.f, &s);
        ops[0] = make_op(0, 0x80000000u, RDD_SEND_SIGNALED);
        posted = SENTINEL;
        CHECK_EQ(burst(k, q.sq, ops, 1, &posted), RDD_STATUS_LENGTH_OVERFLOW);
        CHECK_EQ(posted, 0);
        CHECK(snap_same(&q.f, &s)); /* nothing pending: nothing changes */
        queues_fini(&q);
    }
    /* A queue that allows no SGE: TOO_MANY_SGES at index 0 (length 0
     * included: the SGE is still one). */
    for (j = 0; j < 2; j++) {
        uint32_t n = j ? 16 : 1;
        uint32_t posted = SENTINEL;
        struct queues q;
        struct snapshot s;
        queues_init(&q, 64, 0, no_sge);
        for (i = 0; i < n; i++) {
            ops[i] = make_op(i, i % 2 ? 0 : 8, 0);
        }
        snap_take(&q.f, &s);
        CHECK_EQ(burst(k, q.sq, ops, n, &posted), RDD_STATUS_TOO_MANY_SGES);
        CHECK_EQ(posted, 0);
        CHECK(snap_same(&q.f, &s));
        queues_fini(&q);
    }
}

/* SQ_FULL mid-burst: the ones that fit are posted and rung. */
static void test_sq_full(enum kind k)
{
    struct queues q;
    rdd_rdma_op ops[16];
    uint32_t i, posted = SENTINEL;

    queues_init(&q, 8, 0, CAPS);
    for (i = 0; i < 16; i++) {
        ops[i] = make_op(i, 8, 0);
    }
    CHECK_EQ(rdd_mlx5_sq_send(q.sq, 99, LADDR, 8, LKEY, RDD_SEND_DEFER_DOORBELL), RDD_STATUS_OK);
    CHECK_EQ(burst(k, q.sq, ops, 16, &posted), RDD_STATUS_SQ_FULL);
    CHECK_EQ(posted, 7);
    CHECK_EQ(fake_dbrec_sq(&q.f), 8);
    CHECK_BYTES(q.f.bf, q.f.sq + 7 * 64, 8);
    for (i = 0; i < 7; i++) {
        check_wqe(&q.f, 1 + i, k, &ops[i], 0);
    }
    /* Full: refused at index 0, n = 1 and n = 16, nothing changes. */
    {
        struct snapshot s;
        snap_take(&q.f, &s);
        posted = SENTINEL;
        CHECK_EQ(burst(k, q.sq, ops, 16, &posted), RDD_STATUS_SQ_FULL);
        CHECK_EQ(posted, 0);
        posted = SENTINEL;
        CHECK_EQ(burst(k, q.sq, ops, 1, &posted), RDD_STATUS_SQ_FULL);
        CHECK_EQ(posted, 0);
        CHECK_EQ(burst(k, q.sq, ops, 1, NULL), RDD_STATUS_SQ_FULL);
        CHECK(snap_same(&q.f, &s));
    }
    queues_fini(&q);
}

int main(void)
{
    static const uint32_t SQ_FLAGS[3] = {RDD_MLX5_SQ_BF_NEVER, 0,
                                         RDD_MLX5_SQ_SIG_ALL | RDD_MLX5_SQ_BF_INLINE_ONLY};
    uint32_t k, f;
    test_first_burst_bytes();
    for (k = 0; k < 2; k++) {
        for (f = 0; f < 3; f++) {
            test_same_bytes((enum kind)k, 1, SQ_FLAGS[f]);
            test_same_bytes((enum kind)k, 16, SQ_FLAGS[f]);
            test_same_bytes((enum kind)k, 5, SQ_FLAGS[f]);
        }
        test_one_doorbell((enum kind)k);
        test_n_zero((enum kind)k);
        test_defer((enum kind)k);
        test_call_refusals((enum kind)k);
        test_descriptor_refusals((enum kind)k);
        test_sq_full((enum kind)k);
    }
    return h_finish("test_raw_burst");
}
