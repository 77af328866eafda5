/*
 * C11 tests of rdd_qp_recover's drain marker (issue 17, item 1) on the
 * software device: an unsignaled WRITE the device executed has no
 * completion of its own, so recovery posts an internal signaled marker
 * whose flush retires it, and never reports the marker. Without it every
 * test below returns RDD_STATUS_TIMEOUT.
 *
 * Covered: one executed unsignaled WRITE in thread mode and in step mode
 * (a call that times out leaves the marker posted; after the device ran,
 * the next call finishes), "signal every 16th" failing between two
 * signaled WRs, a mix with posted receives (each WR reported exactly once),
 * and a send queue completely full of executed work.
 */
#define _POSIX_C_SOURCE 200809L

#include <stddef.h>
#include <time.h>

#include "harness.h"

#define BUF_LEN 8192u
#define WAIT_NS 5000000000ull

struct env {
    rdd_device *dev;
    rdd_pd *pd;
    rdd_cq *cq[2];
    rdd_qp *qp[2];
    rdd_mr *mr[2];
    uint8_t *buf[2];
    uint32_t lkey[2];
    uint32_t rkey[2];
    rdd_connect_attr attr;
};

/* What the recovery callback saw, by wr_id (ids below 64 only). */
struct seen {
    unsigned count[64];
    uint32_t status[64];
    unsigned calls;
};

static void record_wc(void *ctx, const rdd_wc *wc)
{
    struct seen *s = (struct seen *)ctx;
    s->calls++;
    if (wc->wr_id < 64) {
        s->count[wc->wr_id]++;
        s->status[wc->wr_id] = wc->status;
    }
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void env_open(struct env *e, uint32_t max_send_wr)
{
    rdd_qp_info info[2];
    rdd_qp_init init;
    void *addr;
    size_t k;
    int i;

    memset(e, 0, sizeof(*e));
    memset(&init, 0, sizeof init);
    init.max_send_wr = max_send_wr;
    init.max_recv_wr = 16;
    init.max_send_sge = 1;
    init.max_recv_sge = 1;
    e->attr.access = RDD_ACCESS_LOCAL_WRITE | RDD_ACCESS_REMOTE_WRITE;
    e->attr.rnr_retry = 7;
    e->attr.retry_cnt = 7;
    MUST(rdd_device_open_soft(NULL, &e->dev));
    MUST(rdd_pd_alloc(e->dev, &e->pd));
    for (i = 0; i < 2; i++) {
        MUST(rdd_cq_create(e->dev, 1024, &e->cq[i]));
        MUST(rdd_qp_create(e->pd, e->cq[i], e->cq[i], &init, &e->qp[i]));
        MUST(rdd_mr_reg(e->pd, BUF_LEN, RDD_ACCESS_LOCAL_WRITE | RDD_ACCESS_REMOTE_WRITE,
                        &e->mr[i]));
        MUST(rdd_mr_addr(e->mr[i], &addr));
        e->buf[i] = (uint8_t *)addr;
        MUST(rdd_mr_lkey(e->mr[i], &e->lkey[i]));
        MUST(rdd_mr_rkey(e->mr[i], &e->rkey[i]));
        MUST(rdd_qp_query_info(e->qp[i], &info[i]));
    }
    for (k = 0; k < BUF_LEN; k++) {
        e->buf[0][k] = (uint8_t)(k % 251 + 1);
    }
    MUST(rdd_qp_connect(e->qp[0], &info[1], &e->attr));
    MUST(rdd_qp_connect(e->qp[1], &info[0], &e->attr));
}

static void env_close(struct env *e)
{
    int i;
    (void)rdd_device_stop(e->dev);
    for (i = 0; i < 2; i++) {
        CHECK_EQ(rdd_qp_destroy(e->qp[i]), RDD_STATUS_OK);
        CHECK_EQ(rdd_cq_destroy(e->cq[i]), RDD_STATUS_OK);
        CHECK_EQ(rdd_mr_free(e->mr[i]), RDD_STATUS_OK);
    }
    CHECK_EQ(rdd_pd_free(e->pd), RDD_STATUS_OK);
    CHECK_EQ(rdd_device_close(e->dev), RDD_STATUS_OK);
}

/* An 8-byte WRITE of slot `slot` (source and target at slot * 8); `sg`
 * must outlive the post. */
static rdd_wr write_wr(const struct env *e, rdd_sge *sg, uint64_t wr_id, size_t slot,
                       int signaled)
{
    rdd_wr w;
    sg->addr = (uint64_t)(uintptr_t)(e->buf[0] + slot * 8);
    sg->length = 8;
    sg->lkey = e->lkey[0];
    memset(&w, 0, sizeof w);
    w.wr_id = wr_id;
    w.opcode = RDD_WR_RDMA_WRITE;
    w.flags = signaled ? RDD_SEND_SIGNALED : 0;
    w.sg_list = sg;
    w.num_sge = 1;
    w.remote_addr = (uint64_t)(uintptr_t)(e->buf[1] + slot * 8);
    w.rkey = e->rkey[1];
    return w;
}

static int landed(const struct env *e, size_t from, size_t to)
{
    return memcmp(e->buf[1] + from * 8, e->buf[0] + from * 8, (to - from) * 8) == 0;
}

/* Thread mode: waits until slots [from, to) have landed. */
static void wait_landed(const struct env *e, size_t from, size_t to)
{
    double deadline = now_s() + 5.0;
    while (!landed(e, from, to) && now_s() < deadline) {
    }
    CHECK(landed(e, from, to));
}

/* Thread mode: polls QP 0's CQ until `want` completions arrived. */
static size_t wait_wcs(struct env *e, rdd_wc *wc, size_t want)
{
    size_t got = 0;
    double deadline = now_s() + 5.0;
    while (got < want && now_s() < deadline) {
        size_t n = 0;
        MUST(rdd_cq_poll(e->cq[0], &e->qp[0], 1, wc + got, want - got, &n));
        got += n;
    }
    return got;
}

/* Recovers QP 0 towards QP 1 (still connected to it) in thread mode, and
 * shows that it works: a signaled WRITE of slot `slot` lands. */
static void reconnect_and_write(struct env *e, size_t slot)
{
    rdd_qp_info peer;
    rdd_wc wc[1];
    rdd_sge sg;
    rdd_wr w;
    size_t bad = 0;
    MUST(rdd_qp_query_info(e->qp[1], &peer));
    MUST(rdd_qp_connect(e->qp[0], &peer, &e->attr));
    w = write_wr(e, &sg, 777, slot, 1);
    MUST(rdd_qp_post_send(e->qp[0], &w, 1, &bad));
    CHECK_EQ(wait_wcs(e, wc, 1), 1);
    CHECK_EQ(wc[0].wr_id, 777);
    CHECK_EQ(wc[0].status, RDD_WC_SUCCESS);
    CHECK(landed(e, slot, slot + 1));
}

/* (a) one executed unsignaled WRITE, thread mode: recover finishes,
 * reports nothing, and (with a peer) reconnects; the QP works after. */
static void test_one_executed_unsignaled_thread(void)
{
    struct env e;
    struct seen s;
    rdd_recovery rec;
    rdd_qp_info peer;
    rdd_sge sg;
    rdd_wr w;
    size_t bad = 0;

    memset(&s, 0, sizeof s);
    memset(&rec, 0xff, sizeof rec);
    env_open(&e, 64);
    MUST(rdd_device_start(e.dev));
    w = write_wr(&e, &sg, 1, 0, 0);
    MUST(rdd_qp_post_send(e.qp[0], &w, 1, &bad));
    wait_landed(&e, 0, 1);
    memset(&rec, 0xff, sizeof rec);
    CHECK_EQ(rdd_qp_recover(e.qp[0], NULL, NULL, WAIT_NS, record_wc, &s, &rec), RDD_STATUS_OK);
    CHECK_EQ(rec.reported, 0);
    CHECK_EQ(rec.has_failure, 0);
    CHECK_EQ(s.calls, 0u);
    reconnect_and_write(&e, 1);
    /* The one-call form with a peer: drain, reset, reconnect. */
    w = write_wr(&e, &sg, 2, 2, 0);
    MUST(rdd_qp_post_send(e.qp[0], &w, 1, &bad));
    wait_landed(&e, 2, 3);
    MUST(rdd_qp_query_info(e.qp[1], &peer));
    CHECK_EQ(rdd_qp_recover(e.qp[0], &peer, &e.attr, WAIT_NS, record_wc, &s, &rec),
             RDD_STATUS_OK);
    CHECK_EQ(rec.reported, 0);
    CHECK_EQ(s.calls, 0u);
    w = write_wr(&e, &sg, 3, 3, 1);
    MUST(rdd_qp_post_send(e.qp[0], &w, 1, &bad));
    {
        rdd_wc wc[1];
        CHECK_EQ(wait_wcs(&e, wc, 1), 1);
        CHECK_EQ(wc[0].wr_id, 3);
        CHECK_EQ(wc[0].status, RDD_WC_SUCCESS);
    }
    env_close(&e);
}

/* (a), step mode: nobody steps during the first call, so it times out
 * with the marker posted; a second call before the device ran adds no
 * second marker; after stepping, the next call finishes. */
static void test_one_executed_unsignaled_step(void)
{
    struct env e;
    struct seen s;
    rdd_recovery rec;
    rdd_sge sg;
    rdd_wr w;
    size_t bad = 0, work = 0;
    int i;

    memset(&s, 0, sizeof s);
    memset(&rec, 0xff, sizeof rec);
    env_open(&e, 64);
    w = write_wr(&e, &sg, 1, 0, 0);
    MUST(rdd_qp_post_send(e.qp[0], &w, 1, &bad));
    for (i = 0; i < 4; i++) {
        MUST(rdd_device_step(e.dev, &work));
    }
    CHECK(landed(&e, 0, 1));
    CHECK_EQ(rdd_qp_recover(e.qp[0], NULL, NULL, 20000000ull, record_wc, &s, NULL),
             RDD_STATUS_TIMEOUT);
    CHECK_EQ(rdd_qp_recover(e.qp[0], NULL, NULL, 1000000ull, record_wc, &s, NULL),
             RDD_STATUS_TIMEOUT);
    for (i = 0; i < 4; i++) {
        MUST(rdd_device_step(e.dev, &work));
    }
    memset(&rec, 0xff, sizeof rec);
    CHECK_EQ(rdd_qp_recover(e.qp[0], NULL, NULL, WAIT_NS, record_wc, &s, &rec), RDD_STATUS_OK);
    CHECK_EQ(rec.reported, 0);
    CHECK_EQ(s.calls, 0u);
    MUST(rdd_device_start(e.dev));
    reconnect_and_write(&e, 1);
    env_close(&e);
}

/* (b) "signal every 16th": 40 WRITEs, 15 and 31 signaled, all executed;
 * then the QP fails between two signaled WRs (the application recovers). */
static void test_signal_every_16th(void)
{
    struct env e;
    struct seen s;
    rdd_recovery rec;
    rdd_wc wc[4];
    rdd_sge sg[40];
    rdd_wr w[40];
    size_t bad = 0;
    size_t i;

    memset(&s, 0, sizeof s);
    memset(&rec, 0xff, sizeof rec);
    env_open(&e, 64);
    MUST(rdd_device_start(e.dev));
    for (i = 0; i < 40; i++) {
        w[i] = write_wr(&e, &sg[i], (uint64_t)i, i, i % 16 == 15);
    }
    MUST(rdd_qp_post_send(e.qp[0], w, 40, &bad));
    CHECK_EQ(wait_wcs(&e, wc, 2), 2);
    CHECK_EQ(wc[0].wr_id, 15);
    CHECK_EQ(wc[1].wr_id, 31);
    wait_landed(&e, 0, 40);
    CHECK_EQ(rdd_qp_recover(e.qp[0], NULL, NULL, WAIT_NS, record_wc, &s, &rec), RDD_STATUS_OK);
    CHECK_EQ(rec.reported, 0);
    CHECK_EQ(s.calls, 0u);
    reconnect_and_write(&e, 50);
    env_close(&e);
}

/* (c) a mix: executed unsignaled WRITEs around an executed signaled one
 * whose completion is still in the CQ, and posted receives. Each WR is
 * reported exactly once (the receives flushed); the executed unsignaled
 * ones never; the marker never. */
static void test_mix_with_receives(void)
{
    struct env e;
    struct seen s;
    rdd_recovery rec;
    rdd_sge sg[5], rs;
    rdd_wr w[5];
    rdd_recv_wr r[4];
    size_t bad = 0, work = 0;
    int i;

    memset(&s, 0, sizeof s);
    memset(&rec, 0xff, sizeof rec);
    env_open(&e, 64);
    for (i = 0; i < 5; i++) {
        w[i] = write_wr(&e, &sg[i], (uint64_t)(10 + i), (size_t)(10 + i), i == 1);
    }
    rs.addr = (uint64_t)(uintptr_t)(e.buf[0] + 4096);
    rs.length = 64;
    rs.lkey = e.lkey[0];
    for (i = 0; i < 4; i++) {
        memset(&r[i], 0, sizeof r[i]);
        r[i].wr_id = (uint64_t)(40 + i);
        r[i].sg_list = &rs;
        r[i].num_sge = 1;
    }
    MUST(rdd_qp_post_send(e.qp[0], w, 5, &bad));
    MUST(rdd_qp_post_recv(e.qp[0], r, 4, &bad));
    for (i = 0; i < 4; i++) {
        MUST(rdd_device_step(e.dev, &work));
    }
    CHECK(landed(&e, 10, 15));
    MUST(rdd_device_start(e.dev));
    CHECK_EQ(rdd_qp_recover(e.qp[0], NULL, NULL, WAIT_NS, record_wc, &s, &rec), RDD_STATUS_OK);
    CHECK_EQ(rec.reported, 5);
    CHECK_EQ(s.calls, 5u);
    for (i = 0; i < 64; i++) {
        unsigned want = (i == 11 || (i >= 40 && i < 44)) ? 1u : 0u;
        CHECK_EQ(s.count[i], want);
    }
    CHECK_EQ(s.status[11], RDD_WC_SUCCESS);
    for (i = 40; i < 44; i++) {
        CHECK_EQ(s.status[i], RDD_WC_WR_FLUSH_ERR);
    }
    reconnect_and_write(&e, 20);
    env_close(&e);
}

/* (e) the send queue completely full of executed work: one signaled WRITE,
 * then unsignaled ones until SQ_FULL (the signalling guard's forced
 * completions leave an unsignaled tail). The marker fits once polling has
 * retired the completed part. */
static void test_full_send_queue(void)
{
    struct env e;
    struct seen s;
    rdd_recovery rec;
    rdd_sge sg;
    rdd_wr w;
    rdd_status st;
    size_t bad = 0, work = 0, posted = 0;
    int i;

    memset(&s, 0, sizeof s);
    memset(&rec, 0xff, sizeof rec);
    env_open(&e, 16);
    for (;;) {
        w = write_wr(&e, &sg, (uint64_t)posted, posted, posted == 0);
        st = rdd_qp_post_send(e.qp[0], &w, 1, &bad);
        if (st != RDD_STATUS_OK) {
            break;
        }
        posted++;
    }
    CHECK_EQ(st, RDD_STATUS_SQ_FULL);
    CHECK(posted >= 16);
    for (i = 0; i < 8; i++) {
        MUST(rdd_device_step(e.dev, &work));
    }
    CHECK(landed(&e, 0, posted));
    MUST(rdd_device_start(e.dev));
    CHECK_EQ(rdd_qp_recover(e.qp[0], NULL, NULL, WAIT_NS, record_wc, &s, &rec), RDD_STATUS_OK);
    CHECK_EQ(rec.reported, 1);
    CHECK_EQ(s.count[0], 1u);
    CHECK_EQ(s.status[0], RDD_WC_SUCCESS);
    CHECK_EQ(s.calls, 1u);
    reconnect_and_write(&e, 600);
    env_close(&e);
}

/* rdd_qp_recover with a reconnect input it would refuse (retry_cnt 8, a
 * non-zero reserved field, a 25-bit QPN): refused before anything is
 * drained, the QP exactly as it was (rdd_qp_query byte for byte); a valid
 * call then finishes and reconnects. */
static void test_refused_recover_drains_nothing(void)
{
    struct env e;
    struct seen s;
    rdd_recovery rec, rec_sentinel;
    rdd_qp_attr before, after;
    rdd_qp_info peer, bad_peer;
    rdd_connect_attr bad_attr;
    rdd_sge sg;
    rdd_wr w;
    size_t bad = 0;
    int i;

    memset(&s, 0, sizeof s);
    env_open(&e, 64);
    MUST(rdd_device_start(e.dev));
    w = write_wr(&e, &sg, 1, 0, 0);
    MUST(rdd_qp_post_send(e.qp[0], &w, 1, &bad));
    wait_landed(&e, 0, 1);
    MUST(rdd_qp_query_info(e.qp[1], &peer));
    memset(&before, 0, sizeof before);
    MUST(rdd_qp_query(e.qp[0], &before));
    CHECK_EQ(before.state, RDD_QP_STATE_RTS);
    CHECK_EQ(before.send_outstanding, 1);
    for (i = 0; i < 3; i++) {
        bad_attr = e.attr;
        bad_peer = peer;
        if (i == 0) {
            bad_attr.retry_cnt = 8;
        } else if (i == 1) {
            bad_peer.reserved = 1;
        } else {
            bad_peer.qpn = 1u << 24;
        }
        memset(&rec, 0xab, sizeof rec);
        rec_sentinel = rec;
        CHECK_EQ(rdd_qp_recover(e.qp[0], &bad_peer, &bad_attr, WAIT_NS, record_wc, &s, &rec),
                 i == 1 ? RDD_STATUS_INVALID_ARGUMENT : RDD_STATUS_INVALID_ATTRIBUTE);
        CHECK_BYTES(&rec, &rec_sentinel, sizeof rec);
        memset(&after, 0, sizeof after);
        MUST(rdd_qp_query(e.qp[0], &after));
        CHECK_BYTES(&after, &before, sizeof after);
    }
    CHECK_EQ(s.calls, 0u);
    CHECK_EQ(rdd_qp_recover(e.qp[0], &peer, &e.attr, WAIT_NS, record_wc, &s, &rec),
             RDD_STATUS_OK);
    CHECK_EQ(rec.reported, 0);
    MUST(rdd_qp_query(e.qp[0], &after));
    CHECK_EQ(after.state, RDD_QP_STATE_RTS);
    CHECK_EQ(after.send_outstanding, 0);
    env_close(&e);
}

/* With an argument, runs only the test of that name (to show each one
 * failing on its own when the marker is broken on purpose). */
int main(int argc, char **argv)
{
    static const struct {
        const char *name;
        void (*run)(void);
    } tests[] = {
        {"thread", test_one_executed_unsignaled_thread},
        {"step", test_one_executed_unsignaled_step},
        {"every16", test_signal_every_16th},
        {"mix", test_mix_with_receives},
        {"full", test_full_send_queue},
        {"refused", test_refused_recover_drains_nothing},
    };
    size_t i;
    for (i = 0; i < sizeof tests / sizeof tests[0]; i++) {
        if (argc < 2 || strcmp(argv[1], tests[i].name) == 0) {
            tests[i].run();
        }
    }
    return h_finish("test_recover_drain");
}
