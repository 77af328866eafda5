/*
 * C11 tests of the per-opcode raw posts (rdd_mlx5_sq_write and friends,
 * rdd_mlx5_rq_recv, rdd_mlx5_rq_ring) and the bound poll
 * (rdd_mlx5_cq_bind, _unbind, _poll_bound) over fake device memory:
 *   - every per-opcode call writes exactly the bytes rdd_mlx5_sq_post (or
 *     rdd_mlx5_rq_post) writes for the equivalent request, on a twin queue,
 *     and the control fields decode to what was asked;
 *   - RDD_SEND_DEFER_DOORBELL leaves the record and the register alone
 *     until a call without it (or rdd_mlx5_sq_ring / rdd_mlx5_rq_ring);
 *   - every bad input returns its status and changes nothing, and deferred
 *     WQEs stay pending across a refused call;
 *   - the bound poll: happy path, n = 0, NULL and misaligned output, an
 *     unbound CQ, a CQ bound to another QP, a finalised bound queue,
 *     corrupt and compressed CQEs.
 * (An INVALID_QP_STATE refusal cannot be produced through the raw C ABI:
 * raw queues start in RTS and stay in a sending state. The Rust unit tests
 * in src/ffi/mlx5/tests_ops.rs cover it.)
 */
#include "harness.h"

#define QPN 0x1c5u
#define RADDR 0x00007e0011220040ull
#define RKEY 0x0badcafeu
#define LADDR 0x00007f5a3c003000ull
#define LKEY 0x00a1b2c3u

static const rdd_qp_caps CAPS = {4, 60, 4};

static const uint8_t PAYLOAD[64] = {
    0x10, 0x11, 0x12, 0x13, 0x14, 0x15, 0x16, 0x17, 0x18, 0x19, 0x1a, 0x1b, 0x1c, 0x1d, 0x1e, 0x1f,
    0x20, 0x21, 0x22, 0x23, 0x24, 0x25, 0x26, 0x27, 0x28, 0x29, 0x2a, 0x2b, 0x2c, 0x2d, 0x2e, 0x2f,
    0x30, 0x31, 0x32, 0x33, 0x34, 0x35, 0x36, 0x37, 0x38, 0x39, 0x3a, 0x3b, 0x3c, 0x3d, 0x3e, 0x3f,
    0x40, 0x41, 0x42, 0x43, 0x44, 0x45, 0x46, 0x47, 0x48, 0x49, 0x4a, 0x4b, 0x4c, 0x4d, 0x4e, 0x4f,
};

/* ---- queues ---------------------------------------------------------------- */

struct queues {
    struct fake_mlx5 f;
    rdd_mlx5_sq_storage *sq;
    rdd_mlx5_rq_storage *rq;
    rdd_mlx5_cq_storage *cq;
};

static void queues_init(struct queues *q, struct fake_geo geo, uint32_t sq_flags, rdd_qp_caps caps)
{
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
    /* The handles may have been finalised by a test already. */
    (void)rdd_mlx5_sq_fini(q->sq);
    (void)rdd_mlx5_rq_fini(q->rq);
    (void)rdd_mlx5_cq_fini(q->cq);
    free(q->sq);
    free(q->rq);
    free(q->cq);
    fake_free(&q->f);
}

/* True if two fakes of the same geometry hold the same bytes in everything
 * a post or a doorbell may write: SQ and RQ rings, both side tables, the
 * doorbell records and the register pair. */
static int same_memory(const struct fake_mlx5 *x, const struct fake_mlx5 *y)
{
    size_t bf = 2 * (size_t)(x->geo.bf_size > 64 ? x->geo.bf_size : 64);
    return memcmp(x->sq, y->sq, (size_t)x->geo.sq_wqe_cnt * 64) == 0 &&
           memcmp(x->qp_buf, y->qp_buf, (size_t)x->geo.rq_wqe_cnt * x->geo.rq_stride) == 0 &&
           memcmp(x->sq_wrid, y->sq_wrid, x->geo.sq_wqe_cnt * sizeof(rdd_mlx5_sq_slot)) == 0 &&
           memcmp(x->rq_wrid, y->rq_wrid, x->geo.rq_wqe_cnt * sizeof(uint64_t)) == 0 &&
           memcmp(x->dbrec, y->dbrec, 128) == 0 && memcmp(x->bf, y->bf, bf) == 0;
}

/* A copy of everything same_memory compares, to check a refusal later. */
struct snapshot {
    struct fake_mlx5 copy;
};

static void snap_take(const struct fake_mlx5 *f, struct snapshot *s)
{
    size_t bf = 2 * (size_t)(f->geo.bf_size > 64 ? f->geo.bf_size : 64);
    fake_init(&s->copy, f->geo);
    memcpy(s->copy.sq, f->sq, (size_t)f->geo.sq_wqe_cnt * 64);
    memcpy(s->copy.qp_buf, f->qp_buf, (size_t)f->geo.rq_wqe_cnt * f->geo.rq_stride);
    memcpy(s->copy.sq_wrid, f->sq_wrid, f->geo.sq_wqe_cnt * sizeof(rdd_mlx5_sq_slot));
    memcpy(s->copy.rq_wrid, f->rq_wrid, f->geo.rq_wqe_cnt * sizeof(uint64_t));
    memcpy(s->copy.dbrec, f->dbrec, 128);
    memcpy(s->copy.bf, f->bf, bf);
}

static int snap_same(const struct fake_mlx5 *f, struct snapshot *s)
{
    int same = same_memory(f, &s->copy);
    fake_free(&s->copy);
    return same;
}

/* ---- the operations -------------------------------------------------------- */

enum op_kind {
    OP_WRITE,
    OP_WRITE_IMM,
    OP_READ,
    OP_SEND,
    OP_SEND_IMM,
    OP_WRITE_INLINE,
    OP_SEND_INLINE,
    OP_FETCH_ADD,
    OP_CMP_SWAP,
    OP_COUNT
};

/* Everything a per-opcode call takes. */
struct op {
    enum op_kind kind;
    uint64_t wr_id;
    uint64_t laddr;
    uint32_t length; /* the SGE's (ignored by the atomics) or the inline payload's */
    uint32_t lkey;
    uint64_t raddr;
    uint32_t rkey;
    uint32_t imm;
    uint64_t compare_add; /* addend, or compare value */
    uint64_t swap;
    const void *data; /* inline payload */
    uint32_t flags;
};

static struct op make_op(enum op_kind kind, uint64_t wr_id, uint32_t length, uint32_t flags)
{
    struct op o;
    memset(&o, 0, sizeof(o));
    o.kind = kind;
    o.wr_id = wr_id;
    o.laddr = LADDR;
    o.length = length;
    o.lkey = LKEY;
    o.raddr = RADDR;
    o.rkey = RKEY;
    o.imm = kind == OP_WRITE_IMM || kind == OP_SEND_IMM ? 0xdeadbeefu : 0;
    o.compare_add = 0x0102030405060708ull;
    o.swap = 0x1112131415161718ull;
    o.data = PAYLOAD;
    o.flags = flags;
    return o;
}

static rdd_status call_op(rdd_mlx5_sq_storage *sq, const struct op *o)
{
    switch (o->kind) {
    case OP_WRITE:
        return rdd_mlx5_sq_write(sq, o->wr_id, o->laddr, o->length, o->lkey, o->raddr, o->rkey,
                                 o->flags);
    case OP_WRITE_IMM:
        return rdd_mlx5_sq_write_imm(sq, o->wr_id, o->laddr, o->length, o->lkey, o->raddr,
                                     o->rkey, o->imm, o->flags);
    case OP_READ:
        return rdd_mlx5_sq_read(sq, o->wr_id, o->laddr, o->length, o->lkey, o->raddr, o->rkey,
                                o->flags);
    case OP_SEND:
        return rdd_mlx5_sq_send(sq, o->wr_id, o->laddr, o->length, o->lkey, o->flags);
    case OP_SEND_IMM:
        return rdd_mlx5_sq_send_imm(sq, o->wr_id, o->laddr, o->length, o->lkey, o->imm,
                                    o->flags);
    case OP_WRITE_INLINE:
        return rdd_mlx5_sq_write_inline(sq, o->wr_id, o->data, o->length, o->raddr, o->rkey,
                                        o->flags);
    case OP_SEND_INLINE:
        return rdd_mlx5_sq_send_inline(sq, o->wr_id, o->data, o->length, o->flags);
    case OP_FETCH_ADD:
        return rdd_mlx5_sq_fetch_add(sq, o->wr_id, o->laddr, o->lkey, o->raddr, o->rkey,
                                     o->compare_add, o->flags);
    case OP_CMP_SWAP:
        return rdd_mlx5_sq_cmp_swap(sq, o->wr_id, o->laddr, o->lkey, o->raddr, o->rkey,
                                    o->compare_add, o->swap, o->flags);
    default:
        abort();
    }
}

/* The same request through rdd_mlx5_sq_post (plus rdd_mlx5_sq_ring unless
 * it is deferred and only if it was posted). */
static rdd_status post_equivalent(rdd_mlx5_sq_storage *sq, const struct op *o)
{
    static const uint32_t OPCODE[OP_COUNT] = {
        RDD_WR_RDMA_WRITE, RDD_WR_RDMA_WRITE_WITH_IMM, RDD_WR_RDMA_READ,
        RDD_WR_SEND,       RDD_WR_SEND_WITH_IMM,       RDD_WR_RDMA_WRITE,
        RDD_WR_SEND,       RDD_WR_ATOMIC_FETCH_AND_ADD, RDD_WR_ATOMIC_CMP_AND_SWP,
    };
    rdd_sge sge = {o->laddr, o->length, o->lkey};
    rdd_wr w;
    size_t bad = 0;
    rdd_status s;
    memset(&w, 0, sizeof(w));
    w.wr_id = o->wr_id;
    w.opcode = OPCODE[o->kind];
    w.flags = o->flags & ~(uint32_t)RDD_SEND_DEFER_DOORBELL;
    w.imm_data = o->imm;
    w.remote_addr = o->raddr;
    w.rkey = o->rkey;
    w.compare_add = o->compare_add;
    w.swap = o->swap;
    w.sg_list = &sge;
    w.num_sge = 1;
    if (o->kind == OP_WRITE_INLINE || o->kind == OP_SEND_INLINE) {
        w.flags |= RDD_SEND_INLINE;
        sge.addr = (uint64_t)(uintptr_t)o->data;
        sge.lkey = 0;
    }
    if (o->kind == OP_FETCH_ADD || o->kind == OP_CMP_SWAP) {
        sge.length = 8;
    }
    s = rdd_mlx5_sq_post(sq, &w, 1, &bad);
    if (s == RDD_STATUS_OK && (o->flags & RDD_SEND_DEFER_DOORBELL) == 0) {
        s = rdd_mlx5_sq_ring(sq);
    }
    return s;
}

/* ---- WQE bytes ------------------------------------------------------------- */

/* Decodes the WQE at BB `bb` of `f` against what `o` asked (A.3-A.5). */
static void check_wqe(const struct fake_mlx5 *f, uint32_t bb, const struct op *o, int sig_all)
{
    static const uint8_t MLX5_OP[OP_COUNT] = {0x08, 0x09, 0x10, 0x0a, 0x0b,
                                              0x08, 0x0a, 0x12, 0x11};
    const uint8_t *w = f->sq + (size_t)(bb % f->geo.sq_wqe_cnt) * 64;
    int remote = o->kind != OP_SEND && o->kind != OP_SEND_IMM && o->kind != OP_SEND_INLINE;
    int atomic = o->kind == OP_FETCH_ADD || o->kind == OP_CMP_SWAP;
    int inl = o->kind == OP_WRITE_INLINE || o->kind == OP_SEND_INLINE;
    uint32_t hdr = 1 + (uint32_t)remote + (uint32_t)atomic;
    uint32_t ds = hdr + (atomic ? 1 : inl ? (o->length ? (4 + o->length + 15) / 16 : 0)
                                           : (o->length ? 1 : 0));
    uint8_t fm = 0;
    const uint8_t *d = w + 16 * hdr;

    if (o->flags & RDD_SEND_FENCE) {
        fm |= 0x80;
    }
    if ((o->flags & RDD_SEND_SIGNALED) || sig_all) {
        fm |= 0x08;
    }
    if (o->flags & RDD_SEND_SOLICITED) {
        fm |= 0x02;
    }
    CHECK_EQ(get_be32(w), (bb & 0xffff) << 8 | MLX5_OP[o->kind]);
    CHECK_EQ(get_be32(w + 4), QPN << 8 | ds);
    CHECK_EQ(w[11], fm);
    CHECK_EQ(get_be32(w + 12), o->imm);
    if (remote) {
        CHECK_EQ(get_be64(w + 16), o->raddr);
        CHECK_EQ(get_be32(w + 24), o->rkey);
    }
    if (o->kind == OP_FETCH_ADD) {
        CHECK_EQ(get_be64(w + 32), o->compare_add); /* swap_add = addend */
    }
    if (o->kind == OP_CMP_SWAP) {
        CHECK_EQ(get_be64(w + 32), o->swap);
        CHECK_EQ(get_be64(w + 40), o->compare_add);
    }
    if (inl && o->length) {
        CHECK_EQ(get_be32(d), 0x80000000u | o->length);
        CHECK_BYTES(d + 4, o->data, o->length < 60 - 16 * hdr ? o->length : 60 - 16 * hdr);
    } else if (!inl && (o->length || atomic)) {
        CHECK_EQ(get_be32(d), atomic ? 8 : o->length);
        CHECK_EQ(get_be32(d + 4), o->lkey);
        CHECK_EQ(get_be64(d + 8), o->laddr);
    }
}

/* Every opcode, flag set, length and doorbell mode, one call at a time on
 * twin queues: the per-opcode call on `a`, the equivalent rdd_wr on `b`.
 * The ring (16 BBs) wraps several times; both are retired by CQEs. */
static void test_same_bytes_as_sq_post(uint32_t sq_flags)
{
    struct fake_geo geo = FAKE_DEFAULT_GEO;
    struct queues a, b;
    static const uint32_t FLAG_SETS[5] = {
        RDD_SEND_SIGNALED, 0, RDD_SEND_FENCE | RDD_SEND_SOLICITED,
        RDD_SEND_SIGNALED | RDD_SEND_DEFER_DOORBELL, RDD_SEND_DEFER_DOORBELL};
    static const uint32_t LENGTHS[4] = {8, 0, 60, 13};
    uint32_t pi = 0, ci = 0, round, k;
    uint64_t id = 0;

    geo.sq_wqe_cnt = 16;
    queues_init(&a, geo, sq_flags, CAPS);
    queues_init(&b, geo, sq_flags, CAPS);
    for (round = 0; round < 6; round++) {
        for (k = 0; k < OP_COUNT; k++) {
            struct op o = make_op((enum op_kind)k, id++, LENGTHS[(k + round) % 4],
                                  FLAG_SETS[(k + round) % 5]);
            uint32_t nbb;
            CHECK_EQ(call_op(a.sq, &o), RDD_STATUS_OK);
            CHECK_EQ(post_equivalent(b.sq, &o), RDD_STATUS_OK);
            CHECK(same_memory(&a.f, &b.f));
            check_wqe(&a.f, pi, &o, (sq_flags & RDD_MLX5_SQ_SIG_ALL) != 0);
            nbb = (get_be32(a.f.sq + (size_t)(pi % 16) * 64 + 4) & 0x3f) * 16;
            nbb = (nbb + 63) / 64;
            /* Retire it at once (a CQE for every WQE, signaled or not) so
             * the ring never fills. */
            if ((o.flags & RDD_SEND_DEFER_DOORBELL) == 0) {
                uint8_t cqe[64];
                rdd_wc wc[2];
                int32_t na, nb;
                cqe_req(cqe, QPN, 0, (uint16_t)pi, 0);
                fake_write_cqe(&a.f, ci, cqe, 0);
                fake_write_cqe(&b.f, ci, cqe, 0);
                ci++;
                MUST(rdd_mlx5_cq_bind(a.cq, a.sq, a.rq));
                na = rdd_mlx5_cq_poll_bound(a.cq, wc, 2);
                {
                    size_t n = 99;
                    MUST(rdd_mlx5_cq_poll(b.cq, b.sq, b.rq, wc, 2, &n));
                    nb = (int32_t)n;
                }
                CHECK_EQ(na, nb);
            }
            pi += nbb;
        }
    }
    /* What is still deferred is rung the same way on both. */
    CHECK_EQ(rdd_mlx5_sq_ring(a.sq), RDD_STATUS_OK);
    CHECK_EQ(rdd_mlx5_sq_ring(b.sq), RDD_STATUS_OK);
    CHECK(same_memory(&a.f, &b.f));
    queues_fini(&a);
    queues_fini(&b);
}

/* The first WRITE of a fresh queue, byte for byte (reference A.3, A.5). */
static void test_write_bytes(void)
{
    static const uint8_t WANT[48] = {
        0x00, 0x00, 0x00, 0x08, 0x00, 0x01, 0xc5, 0x03, 0x00, 0x00, 0x00, 0x08, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00, 0x7e, 0x00, 0x11, 0x22, 0x00, 0x40, 0x0b, 0xad, 0xca, 0xfe,
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x10, 0x00, 0x00, 0xa1, 0xb2, 0xc3, 0x00, 0x00,
        0x7f, 0x5a, 0x3c, 0x00, 0x30, 0x00,
    };
    struct queues q;
    queues_init(&q, FAKE_DEFAULT_GEO, RDD_MLX5_SQ_BF_NEVER, CAPS);
    CHECK_EQ(rdd_mlx5_sq_write(q.sq, 7, LADDR, 4096, LKEY, RADDR, RKEY, RDD_SEND_SIGNALED),
             RDD_STATUS_OK);
    CHECK_BYTES(q.f.sq, WANT, sizeof(WANT));
    CHECK_EQ(fake_dbrec_sq(&q.f), 1);
    CHECK_BYTES(q.f.bf, q.f.sq, 8); /* BF_NEVER: the 8-byte doorbell */
    queues_fini(&q);
}

/* ---- doorbell deferral ------------------------------------------------------ */

static void test_deferral(void)
{
    struct queues q;
    struct snapshot s;
    uint8_t zero_bf[512];
    uint32_t k;

    memset(zero_bf, 0, sizeof(zero_bf));
    queues_init(&q, FAKE_DEFAULT_GEO, 0, CAPS);
    /* One deferred WQE of every opcode: nothing reaches the record or the
     * register. */
    for (k = 0; k < OP_COUNT; k++) {
        struct op o = make_op((enum op_kind)k, k, 8, RDD_SEND_DEFER_DOORBELL);
        CHECK_EQ(call_op(q.sq, &o), RDD_STATUS_OK);
        CHECK_EQ(fake_dbrec_sq(&q.f), 0);
        CHECK_BYTES(q.f.bf, zero_bf, 512);
    }
    /* A refused call in between rings nothing and writes nothing. */
    snap_take(&q.f, &s);
    CHECK_EQ(rdd_mlx5_sq_write(q.sq, 1, LADDR, 8, LKEY, RADDR, RKEY, 0x10),
             RDD_STATUS_INVALID_FLAGS);
    CHECK_EQ(rdd_mlx5_sq_fetch_add(q.sq, 1, LADDR, LKEY, RADDR + 4, RKEY, 1, 0),
             RDD_STATUS_ATOMIC_UNALIGNED);
    CHECK(snap_same(&q.f, &s));
    /* The closing call rings once for all ten WQEs (one BB each); a batch
     * gets the 8-byte doorbell, never BlueFlame. */
    CHECK_EQ(rdd_mlx5_sq_send(q.sq, 99, LADDR, 8, LKEY, RDD_SEND_SIGNALED), RDD_STATUS_OK);
    CHECK_EQ(fake_dbrec_sq(&q.f), 10);
    CHECK_BYTES(q.f.bf, q.f.sq + 9 * 64, 8);
    CHECK_BYTES(q.f.bf + 8, zero_bf, 56);
    /* rdd_mlx5_sq_ring also closes a deferred batch. */
    CHECK_EQ(rdd_mlx5_sq_read(q.sq, 5, LADDR, 64, LKEY, RADDR, RKEY, RDD_SEND_DEFER_DOORBELL),
             RDD_STATUS_OK);
    CHECK_EQ(fake_dbrec_sq(&q.f), 10);
    CHECK_EQ(rdd_mlx5_sq_ring(q.sq), RDD_STATUS_OK);
    CHECK_EQ(fake_dbrec_sq(&q.f), 11);
    /* A single non-deferred WQE with DS > 1 goes by BlueFlame (A.7). */
    CHECK_EQ(rdd_mlx5_sq_write(q.sq, 6, LADDR, 64, LKEY, RADDR, RKEY, 0), RDD_STATUS_OK);
    CHECK_EQ(fake_dbrec_sq(&q.f), 12);
    CHECK_BYTES(q.f.bf, q.f.sq + 11 * 64, 64);

    /* Receives: deferred ones wait for rdd_mlx5_rq_ring or a later call. */
    CHECK_EQ(rdd_mlx5_rq_recv(q.rq, 1, 0x5000, 64, 5, RDD_SEND_DEFER_DOORBELL), RDD_STATUS_OK);
    CHECK_EQ(rdd_mlx5_rq_recv(q.rq, 2, 0x6000, 64, 5, RDD_SEND_DEFER_DOORBELL), RDD_STATUS_OK);
    CHECK_EQ(fake_dbrec_rq(&q.f), 0);
    CHECK_EQ(rdd_mlx5_rq_recv(q.rq, 3, 0x7000, 64, 5, 0x1), RDD_STATUS_INVALID_FLAGS);
    CHECK_EQ(fake_dbrec_rq(&q.f), 0);
    CHECK_EQ(rdd_mlx5_rq_ring(q.rq), RDD_STATUS_OK);
    CHECK_EQ(fake_dbrec_rq(&q.f), 2);
    CHECK_EQ(rdd_mlx5_rq_ring(q.rq), RDD_STATUS_OK); /* nothing pending */
    CHECK_EQ(fake_dbrec_rq(&q.f), 2);
    CHECK_EQ(rdd_mlx5_rq_recv(q.rq, 3, 0x7000, 64, 5, 0), RDD_STATUS_OK);
    CHECK_EQ(fake_dbrec_rq(&q.f), 3);
    queues_fini(&q);
}

/* ---- receives ---------------------------------------------------------------- */

static void test_recv_bytes(void)
{
    struct queues a, b;
    static const uint32_t LENS[3] = {256, 0, 0x7fffffffu};
    uint32_t i;
    queues_init(&a, FAKE_DEFAULT_GEO, 0, CAPS);
    queues_init(&b, FAKE_DEFAULT_GEO, 0, CAPS);
    for (i = 0; i < 3; i++) {
        rdd_sge sge = {0x5000 + i, LENS[i], 0x55};
        rdd_recv_wr r;
        size_t bad = 999;
        memset(&r, 0, sizeof(r));
        r.wr_id = 0x77 + i;
        r.sg_list = &sge;
        r.num_sge = 1;
        CHECK_EQ(rdd_mlx5_rq_recv(a.rq, r.wr_id, sge.addr, sge.length, sge.lkey, 0),
                 RDD_STATUS_OK);
        CHECK_EQ(rdd_mlx5_rq_post(b.rq, &r, 1, &bad), RDD_STATUS_OK);
        CHECK(same_memory(&a.f, &b.f));
    }
    /* Entry 0: one data segment, then the invalid-lkey terminator (A.6);
     * entry 1 (length 0): the terminator alone. */
    CHECK_EQ(get_be32(a.f.qp_buf), 256);
    CHECK_EQ(get_be32(a.f.qp_buf + 4), 0x55);
    CHECK_EQ(get_be64(a.f.qp_buf + 8), 0x5000);
    CHECK_EQ(get_be32(a.f.qp_buf + 20), 0x100);
    CHECK_EQ(get_be32(a.f.qp_buf + 64), 0);
    CHECK_EQ(get_be32(a.f.qp_buf + 68), 0x100);
    CHECK_EQ(fake_dbrec_rq(&a.f), 3);
    queues_fini(&a);
    queues_fini(&b);
}

/* ---- bad inputs --------------------------------------------------------------- */

/* `o` must be refused with `want` and change nothing; a WQE deferred
 * before it stays pending and is rung by the next ring. */
static void expect_refused(struct queues *q, const struct op *o, rdd_status want)
{
    struct snapshot s;
    uint32_t before;
    /* Inline, so that it is accepted by a queue without SGEs too. */
    struct op pending = make_op(OP_SEND_INLINE, 1000, 8, RDD_SEND_DEFER_DOORBELL);
    CHECK_EQ(call_op(q->sq, &pending), RDD_STATUS_OK);
    before = fake_dbrec_sq(&q->f);
    snap_take(&q->f, &s);
    CHECK_EQ(call_op(q->sq, o), want);
    CHECK(snap_same(&q->f, &s));
    CHECK_EQ(rdd_mlx5_sq_ring(q->sq), RDD_STATUS_OK);
    CHECK_EQ(fake_dbrec_sq(&q->f), before + 1);
}

static void test_refusals(void)
{
    struct fake_geo geo = FAKE_DEFAULT_GEO;
    struct queues q, zero_sge;
    rdd_qp_caps no_sge = {0, 60, 0};
    uint32_t k;

    geo.sq_wqe_cnt = 256; /* room for every accepted post below */
    queues_init(&q, geo, 0, CAPS);
    for (k = 0; k < OP_COUNT; k++) {
        enum op_kind kind = (enum op_kind)k;
        int inl = kind == OP_WRITE_INLINE || kind == OP_SEND_INLINE;
        int atomic = kind == OP_FETCH_ADD || kind == OP_CMP_SWAP;
        struct op o = make_op(kind, 1, 8, 0);
        o.flags = 0x10; /* IBV_SEND_IP_CSUM: not supported */
        expect_refused(&q, &o, RDD_STATUS_INVALID_FLAGS);
        o.flags = 0x80000000u;
        expect_refused(&q, &o, RDD_STATUS_INVALID_FLAGS);
        o.flags = RDD_SEND_INLINE; /* payload kind chosen by the function */
        if (inl) {
            CHECK_EQ(call_op(q.sq, &o), RDD_STATUS_OK); /* implied, allowed */
        } else {
            expect_refused(&q, &o, RDD_STATUS_INVALID_FLAGS);
        }
        o = make_op(kind, 1, 0x80000000u, 0);
        if (inl) {
            o.length = 0x80000001u; /* above 2^31 */
        }
        if (!atomic) { /* the atomics' length is always 8 */
            expect_refused(&q, &o, RDD_STATUS_LENGTH_OVERFLOW);
        }
        if (inl) {
            o = make_op(kind, 1, 61, 0); /* max_inline_data is 60 */
            expect_refused(&q, &o, RDD_STATUS_INLINE_TOO_LARGE);
            o = make_op(kind, 1, 4, 0);
            o.data = NULL;
            expect_refused(&q, &o, RDD_STATUS_NULL_POINTER);
            o.length = 0; /* NULL with length 0: an empty payload */
            CHECK_EQ(call_op(q.sq, &o), RDD_STATUS_OK);
        }
        if (atomic) {
            o = make_op(kind, 1, 8, 0);
            o.raddr = RADDR + 4;
            expect_refused(&q, &o, RDD_STATUS_ATOMIC_UNALIGNED);
            o.raddr = RADDR + 1;
            expect_refused(&q, &o, RDD_STATUS_ATOMIC_UNALIGNED);
        }
        if (!inl && !atomic) { /* zero-length SGE: accepted, no data segment */
            o = make_op(kind, 1, 0, 0);
            CHECK_EQ(call_op(q.sq, &o), RDD_STATUS_OK);
        }
        o = make_op(kind, 1, 8, 0);
        CHECK_EQ(call_op(NULL, &o), RDD_STATUS_NULL_PARAMETER);
    }
    queues_fini(&q);

    /* A queue that allows no SGE refuses every SGE post. */
    queues_init(&zero_sge, FAKE_DEFAULT_GEO, 0, no_sge);
    for (k = 0; k < OP_COUNT; k++) {
        struct op o = make_op((enum op_kind)k, 1, 8, 0);
        if (k == OP_WRITE_INLINE || k == OP_SEND_INLINE) {
            continue;
        }
        expect_refused(&zero_sge, &o, RDD_STATUS_TOO_MANY_SGES);
    }
    {
        struct snapshot s;
        snap_take(&zero_sge.f, &s);
        CHECK_EQ(rdd_mlx5_rq_recv(zero_sge.rq, 1, 0x5000, 8, 1, 0), RDD_STATUS_TOO_MANY_SGES);
        CHECK(snap_same(&zero_sge.f, &s));
    }
    queues_fini(&zero_sge);
}

static void test_sq_full(void)
{
    struct fake_geo geo = FAKE_DEFAULT_GEO;
    struct queues q;
    uint32_t k, i;

    geo.sq_wqe_cnt = 8;
    for (k = 0; k < OP_COUNT; k++) {
        struct op o = make_op((enum op_kind)k, 1, 8, 0);
        struct snapshot s;
        queues_init(&q, geo, 0, CAPS);
        /* Eight 1-BB SENDs fill the ring (the last one rings). */
        for (i = 0; i < 8; i++) {
            CHECK_EQ(rdd_mlx5_sq_send(q.sq, i, LADDR, 8, LKEY, i < 7 ? RDD_SEND_DEFER_DOORBELL : 0),
                     RDD_STATUS_OK);
        }
        snap_take(&q.f, &s);
        CHECK_EQ(call_op(q.sq, &o), RDD_STATUS_SQ_FULL);
        o.flags = RDD_SEND_DEFER_DOORBELL;
        CHECK_EQ(call_op(q.sq, &o), RDD_STATUS_SQ_FULL);
        CHECK(snap_same(&q.f, &s));
        queues_fini(&q);
    }
    /* The RQ: 16 entries, the 17th is RQ_FULL. */
    queues_init(&q, FAKE_DEFAULT_GEO, 0, CAPS);
    for (i = 0; i < 16; i++) {
        CHECK_EQ(rdd_mlx5_rq_recv(q.rq, i, 0x5000, 8, 1, RDD_SEND_DEFER_DOORBELL), RDD_STATUS_OK);
    }
    {
        struct snapshot s;
        snap_take(&q.f, &s);
        CHECK_EQ(rdd_mlx5_rq_recv(q.rq, 16, 0x5000, 8, 1, 0), RDD_STATUS_RQ_FULL);
        CHECK(snap_same(&q.f, &s)); /* nothing published either */
    }
    CHECK_EQ(rdd_mlx5_rq_recv(q.rq, 16, 0x5000, 0x80000000u, 1, 0),
             RDD_STATUS_LENGTH_OVERFLOW);
    CHECK_EQ(rdd_mlx5_rq_ring(q.rq), RDD_STATUS_OK);
    CHECK_EQ(fake_dbrec_rq(&q.f), 16);
    queues_fini(&q);
}

/* Never initialised, finalised, moved, wrong kind: INVALID_HANDLE. */
static void test_not_live_handles(void)
{
    static rdd_mlx5_sq_storage zero_sq; /* zero-initialised */
    static rdd_mlx5_rq_storage zero_rq;
    struct queues q;
    rdd_mlx5_sq_storage *moved_sq;
    rdd_mlx5_rq_storage *moved_rq;
    uint32_t k;

    queues_init(&q, FAKE_DEFAULT_GEO, 0, CAPS);
    moved_sq = (rdd_mlx5_sq_storage *)h_alloc(RDD_MLX5_SQ_STORAGE_ALIGN, sizeof(*moved_sq));
    moved_rq = (rdd_mlx5_rq_storage *)h_alloc(RDD_MLX5_RQ_STORAGE_ALIGN, sizeof(*moved_rq));
    memcpy(moved_sq, q.sq, sizeof(*moved_sq));
    memcpy(moved_rq, q.rq, sizeof(*moved_rq));
    for (k = 0; k < OP_COUNT; k++) {
        struct op o = make_op((enum op_kind)k, 1, 8, 0);
        CHECK_EQ(call_op(&zero_sq, &o), RDD_STATUS_INVALID_HANDLE);
        CHECK_EQ(call_op(moved_sq, &o), RDD_STATUS_INVALID_HANDLE);
        CHECK_EQ(call_op((rdd_mlx5_sq_storage *)(void *)q.cq, &o), RDD_STATUS_INVALID_HANDLE);
        /* Flags are checked after the handle. */
        o.flags = 0x10;
        CHECK_EQ(call_op(&zero_sq, &o), RDD_STATUS_INVALID_HANDLE);
    }
    CHECK_EQ(rdd_mlx5_rq_recv(&zero_rq, 1, 0x5000, 8, 1, 0), RDD_STATUS_INVALID_HANDLE);
    CHECK_EQ(rdd_mlx5_rq_recv(moved_rq, 1, 0x5000, 8, 1, 0), RDD_STATUS_INVALID_HANDLE);
    CHECK_EQ(rdd_mlx5_rq_recv((rdd_mlx5_rq_storage *)(void *)q.sq, 1, 0x5000, 8, 1, 0),
             RDD_STATUS_INVALID_HANDLE);
    CHECK_EQ(rdd_mlx5_rq_recv(NULL, 1, 0x5000, 8, 1, 0), RDD_STATUS_NULL_PARAMETER);
    CHECK_EQ(rdd_mlx5_rq_ring(&zero_rq), RDD_STATUS_INVALID_HANDLE);
    CHECK_EQ(rdd_mlx5_rq_ring(moved_rq), RDD_STATUS_INVALID_HANDLE);
    CHECK_EQ(rdd_mlx5_rq_ring(NULL), RDD_STATUS_NULL_PARAMETER);
    CHECK_EQ(fake_dbrec_sq(&q.f), 0);
    CHECK_EQ(fake_dbrec_rq(&q.f), 0);

    MUST(rdd_mlx5_sq_fini(q.sq));
    MUST(rdd_mlx5_rq_fini(q.rq));
    for (k = 0; k < OP_COUNT; k++) {
        struct op o = make_op((enum op_kind)k, 1, 8, 0);
        CHECK_EQ(call_op(q.sq, &o), RDD_STATUS_INVALID_HANDLE);
    }
    CHECK_EQ(rdd_mlx5_rq_recv(q.rq, 1, 0x5000, 8, 1, 0), RDD_STATUS_INVALID_HANDLE);
    CHECK_EQ(rdd_mlx5_rq_ring(q.rq), RDD_STATUS_INVALID_HANDLE);
    free(moved_sq);
    free(moved_rq);
    queues_fini(&q);
}

/* ---- the bound poll ------------------------------------------------------------ */

static void write_req_cqe(struct fake_mlx5 *f, uint32_t ci, uint32_t qpn, uint16_t counter)
{
    uint8_t cqe[64];
    cqe_req(cqe, qpn, 0x08, counter, 0);
    fake_write_cqe(f, ci, cqe, 0);
}

static void test_bind_errors(void)
{
    static rdd_mlx5_sq_storage zero_sq;
    static rdd_mlx5_rq_storage zero_rq;
    static rdd_mlx5_cq_storage zero_cq;
    struct queues q;
    rdd_wc wc[2];

    queues_init(&q, FAKE_DEFAULT_GEO, 0, CAPS);
    CHECK_EQ(rdd_mlx5_cq_bind(NULL, q.sq, q.rq), RDD_STATUS_NULL_PARAMETER);
    CHECK_EQ(rdd_mlx5_cq_bind(q.cq, NULL, q.rq), RDD_STATUS_NULL_PARAMETER);
    CHECK_EQ(rdd_mlx5_cq_bind(q.cq, q.sq, NULL), RDD_STATUS_NULL_PARAMETER);
    CHECK_EQ(rdd_mlx5_cq_bind(&zero_cq, q.sq, q.rq), RDD_STATUS_INVALID_HANDLE);
    CHECK_EQ(rdd_mlx5_cq_bind(q.cq, &zero_sq, q.rq), RDD_STATUS_INVALID_HANDLE);
    CHECK_EQ(rdd_mlx5_cq_bind(q.cq, q.sq, &zero_rq), RDD_STATUS_INVALID_HANDLE);
    /* Kinds are not interchangeable. */
    CHECK_EQ(rdd_mlx5_cq_bind(q.cq, (rdd_mlx5_sq_storage *)(void *)q.rq, q.rq),
             RDD_STATUS_INVALID_HANDLE);
    CHECK_EQ(rdd_mlx5_cq_bind(q.cq, q.sq, (rdd_mlx5_rq_storage *)(void *)q.sq),
             RDD_STATUS_INVALID_HANDLE);
    /* None of the refused binds took effect. */
    CHECK_EQ(rdd_mlx5_cq_poll_bound(q.cq, wc, 2), -(int32_t)RDD_STATUS_NO_SUCH_OBJECT);
    CHECK_EQ(rdd_mlx5_cq_unbind(NULL), RDD_STATUS_NULL_PARAMETER);
    CHECK_EQ(rdd_mlx5_cq_unbind(&zero_cq), RDD_STATUS_INVALID_HANDLE);
    CHECK_EQ(rdd_mlx5_cq_unbind(q.cq), RDD_STATUS_OK); /* nothing bound: fine */
    queues_fini(&q);
}

static void test_poll_bound(void)
{
    static rdd_mlx5_cq_storage zero_cq;
    struct queues q, other;
    rdd_wc wc[8];
    rdd_wc sentinel;
    uint64_t raw[8];
    int i;

    memset(&sentinel, 0xee, sizeof(sentinel));
    queues_init(&q, FAKE_DEFAULT_GEO, 0, CAPS);
    CHECK_EQ(rdd_mlx5_cq_poll_bound(q.cq, wc, 8), -(int32_t)RDD_STATUS_NO_SUCH_OBJECT);
    MUST(rdd_mlx5_cq_bind(q.cq, q.sq, q.rq));

    /* Parameters. */
    CHECK_EQ(rdd_mlx5_cq_poll_bound(NULL, wc, 8), -(int32_t)RDD_STATUS_NULL_PARAMETER);
    CHECK_EQ(rdd_mlx5_cq_poll_bound(&zero_cq, wc, 8), -(int32_t)RDD_STATUS_INVALID_HANDLE);
    CHECK_EQ(rdd_mlx5_cq_poll_bound(q.cq, NULL, 8), -(int32_t)RDD_STATUS_NULL_PARAMETER);
    CHECK_EQ(rdd_mlx5_cq_poll_bound(q.cq, NULL, 0), -(int32_t)RDD_STATUS_NULL_PARAMETER);
    CHECK_EQ(rdd_mlx5_cq_poll_bound(q.cq, (rdd_wc *)(void *)((uint8_t *)raw + 4), 1),
             -(int32_t)RDD_STATUS_INVALID_ARGUMENT);
    CHECK_EQ(rdd_mlx5_cq_poll_bound(q.cq, wc, 0x80000000u), -(int32_t)RDD_STATUS_INVALID_ARGUMENT);
    CHECK_EQ(rdd_mlx5_cq_poll_bound(q.cq, wc, 8), 0); /* empty */

    /* Happy path: three signaled WRITEs, one CQE each; poll 1, then 0 (n
     * = 0 consumes nothing), then the rest. */
    for (i = 0; i < 3; i++) {
        CHECK_EQ(rdd_mlx5_sq_write(q.sq, 10 + (uint64_t)i, LADDR, 8, LKEY, RADDR, RKEY,
                                   RDD_SEND_SIGNALED),
                 RDD_STATUS_OK);
        write_req_cqe(&q.f, (uint32_t)i, QPN, (uint16_t)i);
    }
    wc[1] = sentinel;
    CHECK_EQ(rdd_mlx5_cq_poll_bound(q.cq, wc, 1), 1);
    CHECK_EQ(wc[0].wr_id, 10);
    CHECK_EQ(wc[0].status, RDD_WC_SUCCESS);
    CHECK_EQ(wc[0].opcode, RDD_WC_OP_RDMA_WRITE);
    CHECK_EQ(wc[0].qp_num, QPN);
    CHECK_BYTES(&wc[1], &sentinel, sizeof(sentinel));
    CHECK_EQ(fake_dbrec_cq_ci(&q.f), 1);
    CHECK_EQ(rdd_mlx5_cq_poll_bound(q.cq, wc, 0), 0);
    CHECK_EQ(fake_dbrec_cq_ci(&q.f), 1);
    CHECK_EQ(rdd_mlx5_cq_poll_bound(q.cq, wc, 8), 2);
    CHECK_EQ(wc[0].wr_id, 11);
    CHECK_EQ(wc[1].wr_id, 12);
    CHECK_EQ(fake_dbrec_cq_ci(&q.f), 3);

    /* A receive completion through the bound RQ. */
    CHECK_EQ(rdd_mlx5_rq_recv(q.rq, 0x77, 0x5000, 256, 0x55, 0), RDD_STATUS_OK);
    {
        uint8_t cqe[64];
        memset(cqe, 0, sizeof(cqe));
        put_be32(cqe + 44, 11);
        put_be32(cqe + 56, QPN);
        fake_write_cqe(&q.f, 3, cqe, 2 /* RESP_SEND */);
    }
    CHECK_EQ(rdd_mlx5_cq_poll_bound(q.cq, wc, 8), 1);
    CHECK_EQ(wc[0].wr_id, 0x77);
    CHECK_EQ(wc[0].opcode, RDD_WC_OP_RECV);
    CHECK_EQ(wc[0].byte_len, 11);

    /* A corrupt CQE (a WQE that is not outstanding): consumed, reported,
     * nothing written. */
    write_req_cqe(&q.f, 4, QPN, 40);
    wc[0] = sentinel;
    CHECK_EQ(rdd_mlx5_cq_poll_bound(q.cq, wc, 8), -(int32_t)RDD_STATUS_CQE_CORRUPT);
    CHECK_BYTES(&wc[0], &sentinel, sizeof(sentinel));
    CHECK_EQ(fake_dbrec_cq_ci(&q.f), 5);

    /* A CQ bound to another QP: this QP's CQEs are stale to it (consumed,
     * not reported), and its own QP's work is untouched. */
    queues_init(&other, FAKE_DEFAULT_GEO, 0, CAPS);
    other.f.geo.qpn = 0x2aa;
    MUST(rdd_mlx5_sq_fini(other.sq));
    MUST(rdd_mlx5_sq_init(other.sq, &other.f.qp, 0x2aa, &CAPS, 0, other.f.sq_wrid,
                          other.f.geo.sq_wqe_cnt));
    MUST(rdd_mlx5_cq_bind(other.cq, other.sq, other.rq));
    CHECK_EQ(rdd_mlx5_sq_write(other.sq, 5, LADDR, 8, LKEY, RADDR, RKEY, RDD_SEND_SIGNALED),
             RDD_STATUS_OK);
    write_req_cqe(&other.f, 0, QPN, 0);
    CHECK_EQ(rdd_mlx5_cq_poll_bound(other.cq, wc, 8), 0);
    CHECK_EQ(fake_dbrec_cq_ci(&other.f), 1);
    write_req_cqe(&other.f, 1, 0x2aa, 0);
    CHECK_EQ(rdd_mlx5_cq_poll_bound(other.cq, wc, 8), 1);
    CHECK_EQ(wc[0].wr_id, 5);
    queues_fini(&other);

    /* A compressed CQE: never consumed. */
    write_req_cqe(&q.f, 5, QPN, 2);
    fake_cqe(&q.f, 5)[63] |= 3 << 2;
    CHECK_EQ(rdd_mlx5_cq_poll_bound(q.cq, wc, 8), -(int32_t)RDD_STATUS_CQE_COMPRESSED);
    CHECK_EQ(rdd_mlx5_cq_poll_bound(q.cq, wc, 8), -(int32_t)RDD_STATUS_CQE_COMPRESSED);
    CHECK_EQ(fake_dbrec_cq_ci(&q.f), 5);
    queues_fini(&q);
}

/* Finalising a bound queue: later bound polls are INVALID_HANDLE (never a
 * use of the dead queue); re-initialising it, or binding again, recovers.
 * Finalising the CQ releases the binding. */
static void test_bound_queue_finalised(void)
{
    struct queues q;
    rdd_wc wc[4];

    queues_init(&q, FAKE_DEFAULT_GEO, 0, CAPS);
    MUST(rdd_mlx5_cq_bind(q.cq, q.sq, q.rq));
    MUST(rdd_mlx5_sq_fini(q.sq));
    CHECK_EQ(rdd_mlx5_cq_poll_bound(q.cq, wc, 4), -(int32_t)RDD_STATUS_INVALID_HANDLE);
    /* The one-entry path checks both bound handles too, empty CQ or not. */
    CHECK_EQ(rdd_mlx5_cq_poll_bound(q.cq, wc, 1), -(int32_t)RDD_STATUS_INVALID_HANDLE);
    MUST(rdd_mlx5_sq_init(q.sq, &q.f.qp, QPN, &CAPS, 0, q.f.sq_wrid, q.f.geo.sq_wqe_cnt));
    CHECK_EQ(rdd_mlx5_cq_poll_bound(q.cq, wc, 4), 0);
    CHECK_EQ(rdd_mlx5_cq_poll_bound(q.cq, wc, 1), 0);
    MUST(rdd_mlx5_rq_fini(q.rq));
    CHECK_EQ(rdd_mlx5_cq_poll_bound(q.cq, wc, 4), -(int32_t)RDD_STATUS_INVALID_HANDLE);
    CHECK_EQ(rdd_mlx5_cq_poll_bound(q.cq, wc, 1), -(int32_t)RDD_STATUS_INVALID_HANDLE);
    MUST(rdd_mlx5_rq_init(q.rq, &q.f.qp, &CAPS, q.f.rq_wrid, q.f.geo.rq_wqe_cnt));
    CHECK_EQ(rdd_mlx5_cq_poll_bound(q.cq, wc, 4), 0);
    /* An SQ storage re-used for another kind of handle is not an SQ. */
    MUST(rdd_mlx5_sq_fini(q.sq));
    MUST(rdd_mlx5_cq_init((rdd_mlx5_cq_storage *)(void *)q.sq, &q.f.cq));
    CHECK_EQ(rdd_mlx5_cq_poll_bound(q.cq, wc, 4), -(int32_t)RDD_STATUS_INVALID_HANDLE);
    MUST(rdd_mlx5_cq_fini((rdd_mlx5_cq_storage *)(void *)q.sq));
    MUST(rdd_mlx5_sq_init(q.sq, &q.f.qp, QPN, &CAPS, 0, q.f.sq_wrid, q.f.geo.sq_wqe_cnt));
    CHECK_EQ(rdd_mlx5_cq_poll_bound(q.cq, wc, 4), 0);
    /* Unbinding, then freeing would be fine; here: fini and re-init the
     * CQ, which starts unbound. */
    MUST(rdd_mlx5_cq_fini(q.cq));
    CHECK_EQ(rdd_mlx5_cq_poll_bound(q.cq, wc, 4), -(int32_t)RDD_STATUS_INVALID_HANDLE);
    MUST(rdd_mlx5_cq_init(q.cq, &q.f.cq));
    CHECK_EQ(rdd_mlx5_cq_poll_bound(q.cq, wc, 4), -(int32_t)RDD_STATUS_NO_SUCH_OBJECT);
    /* rdd_mlx5_cq_init over a live, bound handle also starts unbound. */
    MUST(rdd_mlx5_cq_bind(q.cq, q.sq, q.rq));
    CHECK_EQ(rdd_mlx5_cq_poll_bound(q.cq, wc, 4), 0);
    MUST(rdd_mlx5_cq_init(q.cq, &q.f.cq));
    CHECK_EQ(rdd_mlx5_cq_poll_bound(q.cq, wc, 4), -(int32_t)RDD_STATUS_NO_SUCH_OBJECT);
    /* A moved CQ storage is not a handle. */
    MUST(rdd_mlx5_cq_bind(q.cq, q.sq, q.rq));
    {
        rdd_mlx5_cq_storage *moved =
            (rdd_mlx5_cq_storage *)h_alloc(RDD_MLX5_CQ_STORAGE_ALIGN, sizeof(*moved));
        memcpy(moved, q.cq, sizeof(*moved));
        CHECK_EQ(rdd_mlx5_cq_poll_bound(moved, wc, 4), -(int32_t)RDD_STATUS_INVALID_HANDLE);
        CHECK_EQ(rdd_mlx5_cq_bind(moved, q.sq, q.rq), RDD_STATUS_INVALID_HANDLE);
        free(moved);
    }
    CHECK_EQ(rdd_mlx5_cq_poll_bound(q.cq, wc, 4), 0);
    queues_fini(&q);
}

/* The one-entry bound poll (its inline fast path) with a completion
 * waiting and a finalised bound queue: refused, nothing consumed; the
 * completion is delivered once the queue is live again. */
static void test_bound_one_entry_finalised(void)
{
    struct queues q;
    rdd_wc wc[1];

    queues_init(&q, FAKE_DEFAULT_GEO, 0, CAPS);
    MUST(rdd_mlx5_cq_bind(q.cq, q.sq, q.rq));
    CHECK_EQ(rdd_mlx5_sq_write(q.sq, 9, LADDR, 8, LKEY, RADDR, RKEY, RDD_SEND_SIGNALED),
             RDD_STATUS_OK);
    write_req_cqe(&q.f, 0, QPN, 0);
    MUST(rdd_mlx5_rq_fini(q.rq));
    CHECK_EQ(rdd_mlx5_cq_poll_bound(q.cq, wc, 1), -(int32_t)RDD_STATUS_INVALID_HANDLE);
    CHECK_EQ(fake_dbrec_cq_ci(&q.f), 0);
    MUST(rdd_mlx5_rq_init(q.rq, &q.f.qp, &CAPS, q.f.rq_wrid, q.f.geo.rq_wqe_cnt));
    CHECK_EQ(rdd_mlx5_cq_poll_bound(q.cq, wc, 1), 1);
    CHECK_EQ(wc[0].wr_id, 9);
    CHECK_EQ(fake_dbrec_cq_ci(&q.f), 1);
    CHECK_EQ(rdd_mlx5_cq_poll_bound(q.cq, wc, 1), 0);

    /* The same with the send queue, whose handle the one-entry path uses:
     * its live storage re-initialised as a CQ handle (the bytes past the
     * CQ storage still hold the old queue's QPN and counters), then that
     * handle finalised (all zeroes). Each refusal leaves the completion,
     * the record and the output alone. */
    CHECK_EQ(rdd_mlx5_sq_write(q.sq, 10, LADDR, 8, LKEY, RADDR, RKEY, RDD_SEND_SIGNALED),
             RDD_STATUS_OK);
    write_req_cqe(&q.f, 1, QPN, 1);
    MUST(rdd_mlx5_cq_init((rdd_mlx5_cq_storage *)(void *)q.sq, &q.f.cq));
    wc[0].wr_id = 77;
    CHECK_EQ(rdd_mlx5_cq_poll_bound(q.cq, wc, 1), -(int32_t)RDD_STATUS_INVALID_HANDLE);
    CHECK_EQ(wc[0].wr_id, 77);
    CHECK_EQ(fake_dbrec_cq_ci(&q.f), 1);
    MUST(rdd_mlx5_cq_fini((rdd_mlx5_cq_storage *)(void *)q.sq));
    CHECK_EQ(rdd_mlx5_cq_poll_bound(q.cq, wc, 1), -(int32_t)RDD_STATUS_INVALID_HANDLE);
    CHECK_EQ(wc[0].wr_id, 77);
    CHECK_EQ(fake_dbrec_cq_ci(&q.f), 1);
    queues_fini(&q);
}

int main(void)
{
    test_write_bytes();
    test_same_bytes_as_sq_post(RDD_MLX5_SQ_BF_NEVER);
    test_same_bytes_as_sq_post(0);
    test_same_bytes_as_sq_post(RDD_MLX5_SQ_SIG_ALL | RDD_MLX5_SQ_BF_INLINE_ONLY);
    test_deferral();
    test_recv_bytes();
    test_refusals();
    test_sq_full();
    test_not_live_handles();
    test_bind_errors();
    test_poll_bound();
    test_bound_queue_finalised();
    test_bound_one_entry_finalised();
    return h_finish("test_raw_ops");
}
