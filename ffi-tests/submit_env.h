/*
 * The environment of the submission-service tests (test_submit.c,
 * test_submit_threads.c): a software device whose QP 0 is the service's
 * QP, connected to QP 1, which lets it write into a target region; a
 * source region filled with a pattern; and small helpers.
 */
#ifndef RDD_FFI_TESTS_SUBMIT_ENV_H
#define RDD_FFI_TESTS_SUBMIT_ENV_H

#include "harness.h"

#define REGION (1u << 20)

/* ---- environment: a service QP connected to a target QP ---------------- */

struct env {
    rdd_device *dev;
    rdd_pd *pd;
    rdd_cq *cq[2];
    rdd_qp *qp[2]; /* qp[0]: the service's; qp[1]: the target */
    rdd_mr *src, *dst;
    uint8_t *s, *d;
    uint32_t lkey, rkey;
};

static inline void env_open(struct env *e, uint32_t max_send_wr, int connect)
{
    rdd_qp_init init;
    rdd_qp_info info[2];
    rdd_connect_attr attr;
    void *a;
    size_t i;

    memset(e, 0, sizeof(*e));
    memset(&init, 0, sizeof(init));
    init.max_send_wr = max_send_wr;
    init.max_recv_wr = 16;
    init.max_send_sge = 1;
    init.max_recv_sge = 1;
    init.max_inline_data = 64;
    MUST(rdd_device_open_soft(NULL, &e->dev));
    MUST(rdd_pd_alloc(e->dev, &e->pd));
    for (i = 0; i < 2; i++) {
        MUST(rdd_cq_create(e->dev, 8192, &e->cq[i]));
        MUST(rdd_qp_create(e->pd, e->cq[i], e->cq[i], &init, &e->qp[i]));
    }
    MUST(rdd_mr_reg(e->pd, REGION, RDD_ACCESS_LOCAL_WRITE, &e->src));
    MUST(rdd_mr_reg(e->pd, REGION, RDD_ACCESS_LOCAL_WRITE | RDD_ACCESS_REMOTE_WRITE, &e->dst));
    MUST(rdd_mr_addr(e->src, &a));
    e->s = (uint8_t *)a;
    MUST(rdd_mr_addr(e->dst, &a));
    e->d = (uint8_t *)a;
    MUST(rdd_mr_lkey(e->src, &e->lkey));
    MUST(rdd_mr_rkey(e->dst, &e->rkey));
    for (i = 0; i < REGION; i++) {
        e->s[i] = (uint8_t)(i * 131u + (i >> 9) + 1u);
    }
    if (connect) {
        MUST(rdd_qp_query_info(e->qp[0], &info[0]));
        MUST(rdd_qp_query_info(e->qp[1], &info[1]));
        memset(&attr, 0, sizeof(attr));
        attr.access = RDD_ACCESS_REMOTE_WRITE;
        attr.rnr_retry = 7;
        attr.retry_cnt = 7;
        MUST(rdd_qp_connect(e->qp[0], &info[1], NULL));
        MUST(rdd_qp_connect(e->qp[1], &info[0], &attr));
    }
}

/* Tears down what is left, in the only valid order. */
static inline void env_close(struct env *e)
{
    size_t i;
    for (i = 0; i < 2; i++) {
        if (e->qp[i] != NULL) {
            CHECK_EQ(rdd_qp_destroy(e->qp[i]), RDD_STATUS_OK);
        }
        CHECK_EQ(rdd_cq_destroy(e->cq[i]), RDD_STATUS_OK);
    }
    CHECK_EQ(rdd_mr_free(e->src), RDD_STATUS_OK);
    CHECK_EQ(rdd_mr_free(e->dst), RDD_STATUS_OK);
    CHECK_EQ(rdd_pd_free(e->pd), RDD_STATUS_OK);
    CHECK_EQ(rdd_device_close(e->dev), RDD_STATUS_OK);
}

/* A WRITE of `len` bytes at offset `off` of the source to the same offset
 * of the target. */
static inline rdd_submit_desc desc_at(const struct env *e, uint64_t wr_id, size_t off, uint32_t len)
{
    rdd_submit_desc d;
    memset(&d, 0, sizeof(d));
    d.wr_id = wr_id;
    d.local_addr = (uint64_t)(uintptr_t)(e->s + off);
    d.remote_addr = (uint64_t)(uintptr_t)(e->d + off);
    d.length = len;
    d.lkey = e->lkey;
    d.rkey = e->rkey;
    d.opcode = RDD_WR_RDMA_WRITE;
    return d;
}

static inline rdd_submit_service *svc_create(struct env *e, const rdd_submit_config *cfg)
{
    rdd_submit_service *svc = NULL;
    MUST(rdd_submit_create(e->qp[0], e->cq[0], cfg, &svc));
    return svc;
}

static inline rdd_submitter *sub_register(rdd_submit_service *svc)
{
    rdd_submitter *sub = NULL;
    MUST(rdd_submit_register(svc, &sub));
    return sub;
}

static inline rdd_submit_counters counters(const rdd_submit_service *svc)
{
    rdd_submit_counters c;
    MUST(rdd_submit_stats(svc, &c));
    return c;
}

/* Step mode: drain, run the device, complete, until `want` descriptors
 * completed (or 10000 rounds). Returns how many did. */
static inline size_t pump(struct env *e, rdd_submit_service *svc, size_t want)
{
    size_t done = 0, rounds = 0;
    while (done < want && rounds++ < 10000) {
        size_t posted = 0, n = 0, work = 0;
        MUST(rdd_submit_drain(svc, &posted));
        MUST(rdd_device_step(e->dev, &work));
        MUST(rdd_submit_complete(svc, &n));
        done += n;
    }
    return done;
}

/* Reaps everything `sub` has, up to `cap`. */
static inline size_t reap_all(rdd_submitter *sub, rdd_submit_completion *out, size_t cap)
{
    size_t got = 0, n;
    do {
        n = 0;
        MUST(rdd_submit_reap(sub, out + got, cap - got < 16 ? cap - got : 16, &n));
        got += n;
    } while (n != 0 && got < cap);
    return got;
}

#endif
