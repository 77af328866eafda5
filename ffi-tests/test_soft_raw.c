/*
 * C11 tests of the raw-queue level on software-device queues
 * (rdd_qp_mlx5_desc, rdd_cq_mlx5_desc): two QPs created and connected with
 * the object API, their descriptors taken, and then only rdd_mlx5_* calls
 * post (WRITE, SEND/RECV, READ, FETCH_ADD, a deferred batch) and poll
 * (the bound poll and the three-handle poll) while rdd_device_step runs
 * the device; the data is checked at the peer. Then every bad input of
 * both accessors: NULL pointers, forged and destroyed handles, a QP the
 * object level has posted to, a CQ it has polled, each refusal writing
 * nothing. (UNSUPPORTED needs a device without mlx5 queues: rxe or siw,
 * ffi-tests/test_verbs.c in the VM.)
 */
#include "harness.h"

#define BUF_LEN 4096u
#define ALL_REMOTE (RDD_ACCESS_REMOTE_WRITE | RDD_ACCESS_REMOTE_READ | RDD_ACCESS_REMOTE_ATOMIC)
#define SIG RDD_SEND_SIGNALED
#define DEFER RDD_SEND_DEFER_DOORBELL

/* ---- the object-level setup --------------------------------------------- */

struct side {
    rdd_cq *cq;
    rdd_qp *qp;
    rdd_mr *mr;
    uint8_t *buf;
    uint64_t addr;
    uint32_t lkey, rkey;
    /* The raw level over the same queues. */
    rdd_mlx5dv_qp dv_qp;
    rdd_mlx5dv_cq dv_cq;
    rdd_qp_caps caps;
    uint32_t qpn;
    rdd_mlx5_sq_storage *sq;
    rdd_mlx5_rq_storage *rq;
    rdd_mlx5_cq_storage *rcq;
    rdd_mlx5_sq_slot *sq_wrid;
    uint64_t *rq_wrid;
};

struct env {
    rdd_device *dev;
    rdd_pd *pd;
    struct side s[2];
};

static void env_open(struct env *e)
{
    rdd_connect_attr attr = {ALL_REMOTE, 7, 7, 0, 0};
    rdd_qp_info info[2];
    int i;
    memset(e, 0, sizeof(*e));
    MUST(rdd_device_open_soft(NULL, &e->dev));
    MUST(rdd_pd_alloc(e->dev, &e->pd));
    for (i = 0; i < 2; i++) {
        struct side *s = &e->s[i];
        void *a;
        MUST(rdd_cq_create(e->dev, 256, &s->cq));
        MUST(rdd_qp_create(e->pd, s->cq, s->cq, NULL, &s->qp));
        MUST(rdd_mr_reg(e->pd, BUF_LEN, RDD_ACCESS_LOCAL_WRITE | ALL_REMOTE, &s->mr));
        MUST(rdd_mr_addr(s->mr, &a));
        s->buf = (uint8_t *)a;
        s->addr = (uint64_t)(uintptr_t)a;
        MUST(rdd_mr_lkey(s->mr, &s->lkey));
        MUST(rdd_mr_rkey(s->mr, &s->rkey));
        MUST(rdd_qp_query_info(s->qp, &info[i]));
    }
    MUST(rdd_qp_connect(e->s[0].qp, &info[1], &attr));
    MUST(rdd_qp_connect(e->s[1].qp, &info[0], &attr));
}

/* Takes both sides' descriptors and builds the raw handles over them. */
static void env_go_raw(struct env *e)
{
    int i;
    for (i = 0; i < 2; i++) {
        struct side *s = &e->s[i];
        MUST(rdd_qp_mlx5_desc(s->qp, &s->dv_qp, &s->caps, &s->qpn));
        MUST(rdd_cq_mlx5_desc(s->cq, &s->dv_cq));
        s->sq = (rdd_mlx5_sq_storage *)h_alloc(RDD_MLX5_SQ_STORAGE_ALIGN, sizeof(*s->sq));
        s->rq = (rdd_mlx5_rq_storage *)h_alloc(RDD_MLX5_RQ_STORAGE_ALIGN, sizeof(*s->rq));
        s->rcq = (rdd_mlx5_cq_storage *)h_alloc(RDD_MLX5_CQ_STORAGE_ALIGN, sizeof(*s->rcq));
        s->sq_wrid = (rdd_mlx5_sq_slot *)h_alloc(64, s->dv_qp.sq_wqe_cnt * sizeof(rdd_mlx5_sq_slot));
        s->rq_wrid = (uint64_t *)h_alloc(64, s->dv_qp.rq_wqe_cnt * sizeof(uint64_t));
        MUST(rdd_mlx5_sq_init(s->sq, &s->dv_qp, s->qpn, &s->caps, 0, s->sq_wrid,
                              s->dv_qp.sq_wqe_cnt));
        MUST(rdd_mlx5_rq_init(s->rq, &s->dv_qp, &s->caps, s->rq_wrid, s->dv_qp.rq_wqe_cnt));
        MUST(rdd_mlx5_cq_init(s->rcq, &s->dv_cq));
        MUST(rdd_mlx5_cq_bind(s->rcq, s->sq, s->rq));
    }
}

static void env_close(struct env *e)
{
    int i;
    for (i = 0; i < 2; i++) {
        struct side *s = &e->s[i];
        /* The raw handles go first: the object QP owns the queue memory. */
        if (s->sq != NULL) {
            CHECK_EQ(rdd_mlx5_cq_fini(s->rcq), RDD_STATUS_OK);
            CHECK_EQ(rdd_mlx5_sq_fini(s->sq), RDD_STATUS_OK);
            CHECK_EQ(rdd_mlx5_rq_fini(s->rq), RDD_STATUS_OK);
            free(s->sq);
            free(s->rq);
            free(s->rcq);
            free(s->sq_wrid);
            free(s->rq_wrid);
        }
        CHECK_EQ(rdd_qp_destroy(s->qp), RDD_STATUS_OK);
        CHECK_EQ(rdd_cq_destroy(s->cq), RDD_STATUS_OK);
        CHECK_EQ(rdd_mr_free(s->mr), RDD_STATUS_OK);
    }
    CHECK_EQ(rdd_pd_free(e->pd), RDD_STATUS_OK);
    CHECK_EQ(rdd_device_close(e->dev), RDD_STATUS_OK);
}

/* Steps the device until `want` completions came from side `i`'s raw CQ
 * (the bound poll), at most 100 passes; returns how many arrived. */
static int collect(struct env *e, int i, rdd_wc *wc, int want)
{
    int got = 0, rounds = 0;
    while (got < want && rounds++ < 100) {
        size_t work;
        int32_t n;
        MUST(rdd_device_step(e->dev, &work));
        n = rdd_mlx5_cq_poll_bound(e->s[i].rcq, wc + got, (size_t)(want - got));
        if (n < 0) {
            fprintf(stderr, "rdd_mlx5_cq_poll_bound failed with %d\n", (int)n);
            return got;
        }
        got += n;
    }
    return got;
}

/* ---- the raw level drives the software device --------------------------- */

static void test_raw_level_drives_soft_qps(void)
{
    struct env e;
    struct side *a, *b;
    rdd_wc wc[8];
    size_t count = 0, work = 0;
    uint64_t old;
    int i;

    env_open(&e);
    env_go_raw(&e);
    a = &e.s[0];
    b = &e.s[1];
    /* The descriptors are the object QP's: same number, same caps. */
    {
        rdd_qp_info info;
        rdd_qp_caps caps;
        MUST(rdd_qp_query_info(a->qp, &info));
        MUST(rdd_qp_query_caps(a->qp, &caps));
        CHECK_EQ(a->qpn, info.qpn);
        CHECK_EQ(a->caps.max_send_sge, caps.max_send_sge);
        CHECK_EQ(a->caps.max_inline_data, caps.max_inline_data);
        CHECK_EQ(a->caps.max_recv_sge, caps.max_recv_sge);
        CHECK(a->dv_qp.sq_wqe_cnt > 0 && a->dv_cq.cqe_cnt > 0);
    }

    /* RDMA WRITE: A's buffer [0, 64) to B's [1024, 1088). */
    for (i = 0; i < 64; i++) {
        a->buf[i] = (uint8_t)(0x40 + i);
    }
    CHECK_EQ(rdd_mlx5_sq_write(a->sq, 1, a->addr, 64, a->lkey, b->addr + 1024, b->rkey, SIG),
             RDD_STATUS_OK);
    CHECK_EQ(collect(&e, 0, wc, 1), 1);
    CHECK_EQ(wc[0].wr_id, 1);
    CHECK_EQ(wc[0].status, RDD_WC_SUCCESS);
    CHECK_EQ(wc[0].opcode, RDD_WC_OP_RDMA_WRITE);
    CHECK_BYTES(b->buf + 1024, a->buf, 64);

    /* SEND into a receive posted on B's raw RQ. */
    CHECK_EQ(rdd_mlx5_rq_recv(b->rq, 70, b->addr + 2048, 128, b->lkey, 0), RDD_STATUS_OK);
    CHECK_EQ(rdd_mlx5_sq_send(a->sq, 2, a->addr + 8, 32, a->lkey, SIG), RDD_STATUS_OK);
    CHECK_EQ(collect(&e, 0, wc, 1), 1);
    CHECK_EQ(wc[0].wr_id, 2);
    CHECK_EQ(wc[0].status, RDD_WC_SUCCESS);
    CHECK_EQ(collect(&e, 1, wc, 1), 1);
    CHECK_EQ(wc[0].wr_id, 70);
    CHECK_EQ(wc[0].status, RDD_WC_SUCCESS);
    CHECK_EQ(wc[0].opcode, RDD_WC_OP_RECV);
    CHECK_EQ(wc[0].byte_len, 32);
    CHECK_EQ(wc[0].qp_num, b->qpn);
    CHECK_BYTES(b->buf + 2048, a->buf + 8, 32);

    /* RDMA READ back from B, then FETCH_ADD on a counter in B. */
    memset(b->buf + 3072, 0x7e, 16);
    CHECK_EQ(rdd_mlx5_sq_read(a->sq, 3, a->addr + 512, 16, a->lkey, b->addr + 3072, b->rkey, SIG),
             RDD_STATUS_OK);
    CHECK_EQ(collect(&e, 0, wc, 1), 1);
    CHECK_EQ(wc[0].status, RDD_WC_SUCCESS);
    CHECK_BYTES(a->buf + 512, b->buf + 3072, 16);
    old = 41;
    memcpy(b->buf + 3584, &old, 8);
    CHECK_EQ(rdd_mlx5_sq_fetch_add(a->sq, 4, a->addr + 768, a->lkey, b->addr + 3584, b->rkey, 1,
                                   SIG),
             RDD_STATUS_OK);
    CHECK_EQ(collect(&e, 0, wc, 1), 1);
    CHECK_EQ(wc[0].status, RDD_WC_SUCCESS);
    memcpy(&old, a->buf + 768, 8);
    CHECK_EQ(old, 41);
    memcpy(&old, b->buf + 3584, 8);
    CHECK_EQ(old, 42);

    /* A deferred batch: nothing runs before the doorbell. */
    CHECK_EQ(rdd_mlx5_sq_write(a->sq, 5, a->addr, 8, a->lkey, b->addr + 100, b->rkey, DEFER),
             RDD_STATUS_OK);
    CHECK_EQ(rdd_mlx5_sq_write(a->sq, 6, a->addr + 8, 8, a->lkey, b->addr + 108, b->rkey,
                               SIG | DEFER),
             RDD_STATUS_OK);
    MUST(rdd_device_step(e.dev, &work));
    CHECK_EQ(work, 0);
    CHECK_EQ(rdd_mlx5_sq_ring(a->sq), RDD_STATUS_OK);
    CHECK_EQ(collect(&e, 0, wc, 1), 1);
    CHECK_EQ(wc[0].wr_id, 6);
    CHECK_BYTES(b->buf + 100, a->buf, 16);

    /* The three-handle poll works on the same queues. */
    CHECK_EQ(rdd_mlx5_sq_write(a->sq, 7, a->addr, 8, a->lkey, b->addr + 200, b->rkey, SIG),
             RDD_STATUS_OK);
    MUST(rdd_device_step(e.dev, &work));
    CHECK_EQ(rdd_mlx5_cq_poll(a->rcq, a->sq, a->rq, wc, 8, &count), RDD_STATUS_OK);
    CHECK_EQ(count, 1);
    CHECK_EQ(wc[0].wr_id, 7);

    /* A remote error comes back as the device reports it. */
    CHECK_EQ(rdd_mlx5_sq_write(a->sq, 8, a->addr, 8, a->lkey, b->addr, b->rkey ^ 0x00ffff00u, SIG),
             RDD_STATUS_OK);
    CHECK_EQ(collect(&e, 0, wc, 1), 1);
    CHECK_EQ(wc[0].wr_id, 8);
    CHECK_EQ(wc[0].status, RDD_WC_REM_ACCESS_ERR);
    env_close(&e);
}

/* ---- bad inputs ---------------------------------------------------------- */

static void test_bad_inputs(void)
{
    struct env e;
    rdd_mlx5dv_qp dq, dq_before;
    rdd_mlx5dv_cq dc, dc_before;
    rdd_qp_caps caps, caps_before;
    uint32_t qpn = 0xdeadbeefu;
    rdd_qp *forged_qp = (rdd_qp *)(uintptr_t)0x5a5a5a00u;
    rdd_cq *forged_cq = (rdd_cq *)(uintptr_t)0x5a5a5a00u;
    rdd_qp *gone_qp;
    rdd_cq *gone_cq;
    rdd_wc wc[4];
    size_t work;
    int got = 0, rounds = 0;

    env_open(&e);
    memset(&dq, 0xa5, sizeof(dq));
    memset(&dc, 0xa5, sizeof(dc));
    memset(&caps, 0xa5, sizeof(caps));
    dq_before = dq;
    dc_before = dc;
    caps_before = caps;

    /* NULL for every pointer. */
    CHECK_EQ(rdd_qp_mlx5_desc(NULL, &dq, &caps, &qpn), RDD_STATUS_NULL_PARAMETER);
    CHECK_EQ(rdd_qp_mlx5_desc(e.s[0].qp, NULL, &caps, &qpn), RDD_STATUS_NULL_PARAMETER);
    CHECK_EQ(rdd_qp_mlx5_desc(e.s[0].qp, &dq, NULL, &qpn), RDD_STATUS_NULL_PARAMETER);
    CHECK_EQ(rdd_qp_mlx5_desc(e.s[0].qp, &dq, &caps, NULL), RDD_STATUS_NULL_PARAMETER);
    CHECK_EQ(rdd_cq_mlx5_desc(NULL, &dc), RDD_STATUS_NULL_PARAMETER);
    CHECK_EQ(rdd_cq_mlx5_desc(e.s[0].cq, NULL), RDD_STATUS_NULL_PARAMETER);

    /* Forged, wrong-kind and destroyed handles. */
    CHECK_EQ(rdd_qp_mlx5_desc(forged_qp, &dq, &caps, &qpn), RDD_STATUS_INVALID_HANDLE);
    CHECK_EQ(rdd_cq_mlx5_desc(forged_cq, &dc), RDD_STATUS_INVALID_HANDLE);
    CHECK_EQ(rdd_qp_mlx5_desc((rdd_qp *)(void *)e.s[0].cq, &dq, &caps, &qpn),
             RDD_STATUS_INVALID_HANDLE);
    CHECK_EQ(rdd_cq_mlx5_desc((rdd_cq *)(void *)e.s[0].qp, &dc), RDD_STATUS_INVALID_HANDLE);
    MUST(rdd_cq_create(e.dev, 4096, &gone_cq));
    MUST(rdd_qp_create(e.pd, gone_cq, gone_cq, NULL, &gone_qp));
    MUST(rdd_qp_destroy(gone_qp));
    MUST(rdd_cq_destroy(gone_cq));
    CHECK_EQ(rdd_qp_mlx5_desc(gone_qp, &dq, &caps, &qpn), RDD_STATUS_INVALID_HANDLE);
    CHECK_EQ(rdd_cq_mlx5_desc(gone_cq, &dc), RDD_STATUS_INVALID_HANDLE);

    /* A QP the object level has posted to (and whose CQ it has polled):
     * the raw handles would start from counters the device has passed. */
    CHECK_EQ(rdd_qp_write(e.s[0].qp, 1, e.s[0].addr, 8, e.s[0].lkey, e.s[1].addr, e.s[1].rkey,
                          SIG),
             RDD_STATUS_OK);
    CHECK_EQ(rdd_qp_mlx5_desc(e.s[0].qp, &dq, &caps, &qpn), RDD_STATUS_INVALID_QP_STATE);
    while (got < 1 && rounds++ < 100) {
        int32_t n;
        MUST(rdd_device_step(e.dev, &work));
        n = rdd_cq_poll_n(e.s[0].cq, wc, 4);
        CHECK(n >= 0);
        got += n > 0 ? n : 0;
    }
    CHECK_EQ(got, 1);
    CHECK_EQ(rdd_cq_mlx5_desc(e.s[0].cq, &dc), RDD_STATUS_RESOURCE_BUSY);
    /* A receive posted through the object level counts too. */
    CHECK_EQ(rdd_qp_recv(e.s[1].qp, 9, e.s[1].addr, 64, e.s[1].lkey, 0), RDD_STATUS_OK);
    CHECK_EQ(rdd_qp_mlx5_desc(e.s[1].qp, &dq, &caps, &qpn), RDD_STATUS_INVALID_QP_STATE);

    /* Nothing was written by any refusal. */
    CHECK_BYTES(&dq, &dq_before, sizeof(dq));
    CHECK_BYTES(&dc, &dc_before, sizeof(dc));
    CHECK_BYTES(&caps, &caps_before, sizeof(caps));
    CHECK_EQ(qpn, 0xdeadbeefu);

    /* Untouched queues of the same device still hand over. */
    CHECK_EQ(rdd_cq_mlx5_desc(e.s[1].cq, &dc), RDD_STATUS_OK);
    CHECK_EQ(dc.cqe_cnt >= 256, 1);
    env_close(&e);
}

int main(void)
{
    test_raw_level_drives_soft_qps();
    test_bad_inputs();
    return h_finish("test_soft_raw");
}
