/*
 * C11 tests of the poll-mode submission service (rdd_submit_*) on the
 * software device: the happy path (batches posted with one doorbell, data
 * checked at the target, completions routed to their submitters in
 * order), inline payloads, every bad-input status of every call, full
 * rings and exhausted credits, a send queue smaller than the batch, 64
 * submitters, tearing down with work outstanding (refused, or flushed
 * once the QP is gone), an unconnected QP and an error completion. The
 * real-threads test is test_submit_threads.c.
 */
#define _POSIX_C_SOURCE 200809L

#include <stddef.h>

#include "submit_env.h"

_Static_assert(sizeof(rdd_submit_desc) == 48, "rdd_submit_desc");
_Static_assert(sizeof(rdd_submit_completion) == 16, "rdd_submit_completion");
_Static_assert(sizeof(rdd_submit_config) == 16, "rdd_submit_config");
_Static_assert(sizeof(rdd_submit_counters) == 104, "rdd_submit_counters");
_Static_assert(offsetof(rdd_submit_desc, length) == 24 && offsetof(rdd_submit_desc, flags) == 40,
               "desc layout");
_Static_assert(RDD_SUBMIT_DESC_FLAGS == (RDD_SEND_FENCE | RDD_SEND_SIGNALED | RDD_SEND_INLINE),
               "descriptor flags");

#define FORGED_SVC ((rdd_submit_service *)(uintptr_t)0x7700004040ull)
#define FORGED_SUB ((rdd_submitter *)(uintptr_t)0x7700004141ull)

/* ---- happy path ---------------------------------------------------------- */

static void test_happy_path(void)
{
    struct env e;
    rdd_submit_service *svc;
    rdd_submitter *a, *b;
    rdd_submit_desc da[10], db[6];
    rdd_submit_completion ca[16], cb[16];
    rdd_submit_counters c;
    size_t bad = 77, posted = 0, done = 0, work = 0, n, i, in_flight = 9;
    uint32_t id = 99;
    uint64_t bells = 0;

    env_open(&e, 64, 1);
    svc = svc_create(&e, NULL);
    a = sub_register(svc);
    b = sub_register(svc);
    MUST(rdd_submit_query(a, &id, &in_flight));
    CHECK_EQ(id, 0);
    CHECK_EQ(in_flight, 0);
    MUST(rdd_submit_query(b, &id, &in_flight));
    CHECK_EQ(id, 1);
    for (i = 0; i < 10; i++) {
        da[i] = desc_at(&e, 1000 + i, i * 256, (uint32_t)(1 + i * 17));
    }
    for (i = 0; i < 6; i++) {
        db[i] = desc_at(&e, 2000 + i, 8192 + i * 4096, 4096);
    }
    CHECK_EQ(rdd_submit_post(a, da, 10, &bad), RDD_STATUS_OK);
    CHECK_EQ(bad, 77); /* written only when refused */
    CHECK_EQ(rdd_submit_post(b, db, 6, &bad), RDD_STATUS_OK);
    MUST(rdd_submit_query(a, &id, &in_flight));
    CHECK_EQ(in_flight, 10);
    c = counters(svc);
    CHECK_EQ(c.submitted, 16);
    CHECK_EQ(c.queued, 16);
    CHECK_EQ(c.drained, 0);

    /* One drain: all 16, one doorbell. */
    MUST(rdd_submit_drain(svc, &posted));
    CHECK_EQ(posted, 16);
    MUST(rdd_qp_doorbells(e.qp[0], &bells));
    CHECK_EQ(bells, 1);
    MUST(rdd_submit_drain(svc, &posted));
    CHECK_EQ(posted, 0);
    MUST(rdd_device_step(e.dev, &work));
    MUST(rdd_submit_complete(svc, &done));
    CHECK_EQ(done, 16);

    n = reap_all(a, ca, 16);
    CHECK_EQ(n, 10);
    for (i = 0; i < n; i++) {
        CHECK_EQ(ca[i].wr_id, 1000 + i);
        CHECK_EQ(ca[i].status, RDD_WC_SUCCESS);
    }
    n = reap_all(b, cb, 16);
    CHECK_EQ(n, 6);
    for (i = 0; i < n; i++) {
        CHECK_EQ(cb[i].wr_id, 2000 + i);
        CHECK_EQ(cb[i].status, RDD_WC_SUCCESS);
    }
    /* The bytes, and nothing past them. */
    for (i = 0; i < 10; i++) {
        size_t off = i * 256, len = 1 + i * 17;
        CHECK_BYTES(e.d + off, e.s + off, len);
        CHECK_EQ(e.d[off + len], 0);
    }
    CHECK_BYTES(e.d + 8192, e.s + 8192, 6 * 4096);

    c = counters(svc);
    CHECK_EQ(c.submitted, 16);
    CHECK_EQ(c.drained, 16);
    CHECK_EQ(c.posted, 16);
    CHECK_EQ(c.doorbells, 1);
    CHECK_EQ(c.completed, 16);
    CHECK_EQ(c.failed, 0);
    CHECK_EQ(c.reaped, 16);
    CHECK_EQ(c.queued, 0);
    CHECK_EQ(c.held, 0);
    CHECK_EQ(c.refused_ring_full + c.refused_no_credit + c.qp_full + c.flushed, 0);

    CHECK_EQ(rdd_submit_unregister(a), RDD_STATUS_OK);
    CHECK_EQ(rdd_submit_unregister(b), RDD_STATUS_OK);
    CHECK_EQ(rdd_submit_destroy(svc), RDD_STATUS_OK);
    env_close(&e);
}

/* An inline payload is copied when the batch is posted: the buffer may
 * change afterwards (here, once the completion is reaped). */
static void test_inline(void)
{
    struct env e;
    rdd_submit_service *svc;
    rdd_submitter *sub;
    rdd_submit_desc d;
    rdd_submit_completion c[2];
    uint8_t payload[48];
    size_t bad, i;

    env_open(&e, 64, 1);
    svc = svc_create(&e, NULL);
    sub = sub_register(svc);
    for (i = 0; i < sizeof(payload); i++) {
        payload[i] = (uint8_t)(0xa0 + i);
    }
    d = desc_at(&e, 5, 0, sizeof(payload));
    d.local_addr = (uint64_t)(uintptr_t)payload;
    d.lkey = 0; /* ignored */
    d.flags = RDD_SEND_INLINE | RDD_SEND_FENCE;
    MUST(rdd_submit_post(sub, &d, 1, &bad));
    CHECK_EQ(pump(&e, svc, 1), 1);
    CHECK_EQ(reap_all(sub, c, 2), 1);
    CHECK_EQ(c[0].status, RDD_WC_SUCCESS);
    CHECK_BYTES(e.d, payload, sizeof(payload));
    memset(payload, 0, sizeof(payload));
    CHECK_EQ(e.d[0], 0xa0);
    MUST(rdd_submit_unregister(sub));
    MUST(rdd_submit_destroy(svc));
    env_close(&e);
}

/* ---- bad inputs ---------------------------------------------------------- */

static void test_create_errors(void)
{
    struct env e;
    rdd_submit_service *svc = NULL;
    rdd_submit_config cfg;
    rdd_qp *gone;

    env_open(&e, 64, 1);
    CHECK_EQ(rdd_submit_create(e.qp[0], e.cq[0], NULL, NULL), RDD_STATUS_NULL_PARAMETER);
    CHECK_EQ(rdd_submit_create(NULL, e.cq[0], NULL, &svc), RDD_STATUS_NULL_PARAMETER);
    CHECK_EQ(rdd_submit_create(e.qp[0], NULL, NULL, &svc), RDD_STATUS_NULL_PARAMETER);
    CHECK_EQ(rdd_submit_create((rdd_qp *)(uintptr_t)0x12345605ull, e.cq[0], NULL, &svc),
             RDD_STATUS_INVALID_HANDLE);
    CHECK_EQ(rdd_submit_create((rdd_qp *)e.cq[0], e.cq[0], NULL, &svc),
             RDD_STATUS_INVALID_HANDLE);
    CHECK_EQ(rdd_submit_create(e.qp[0], (rdd_cq *)e.qp[0], NULL, &svc),
             RDD_STATUS_INVALID_HANDLE);
    /* The CQ of another QP. */
    CHECK_EQ(rdd_submit_create(e.qp[0], e.cq[1], NULL, &svc), RDD_STATUS_INVALID_ARGUMENT);
    /* Out-of-range and reserved configuration fields. */
    memset(&cfg, 0, sizeof(cfg));
    cfg.max_batch = RDD_SUBMIT_MAX_BATCH + 1;
    CHECK_EQ(rdd_submit_create(e.qp[0], e.cq[0], &cfg, &svc), RDD_STATUS_INVALID_ARGUMENT);
    memset(&cfg, 0, sizeof(cfg));
    cfg.max_outstanding = RDD_SUBMIT_MAX_OUTSTANDING + 1;
    CHECK_EQ(rdd_submit_create(e.qp[0], e.cq[0], &cfg, &svc), RDD_STATUS_INVALID_ARGUMENT);
    memset(&cfg, 0, sizeof(cfg));
    cfg.flags = 1;
    CHECK_EQ(rdd_submit_create(e.qp[0], e.cq[0], &cfg, &svc), RDD_STATUS_INVALID_ARGUMENT);
    memset(&cfg, 0, sizeof(cfg));
    cfg.reserved = 1;
    CHECK_EQ(rdd_submit_create(e.qp[0], e.cq[0], &cfg, &svc), RDD_STATUS_INVALID_ARGUMENT);
    CHECK(svc == NULL); /* refused calls write nothing */
    /* A destroyed QP (a third one, on a CQ of its own). */
    {
        rdd_cq *cq3;
        MUST(rdd_cq_create(e.dev, 256, &cq3));
        MUST(rdd_qp_create(e.pd, cq3, cq3, NULL, &gone));
        MUST(rdd_qp_destroy(gone));
        CHECK_EQ(rdd_submit_create(gone, cq3, NULL, &svc), RDD_STATUS_INVALID_HANDLE);
        MUST(rdd_cq_destroy(cq3));
    }
    /* The largest configuration is accepted. */
    memset(&cfg, 0, sizeof(cfg));
    cfg.max_batch = RDD_SUBMIT_MAX_BATCH;
    cfg.max_outstanding = RDD_SUBMIT_MAX_OUTSTANDING;
    MUST(rdd_submit_create(e.qp[0], e.cq[0], &cfg, &svc));
    /* One service per QP: a second one is refused and writes nothing;
     * after the first is destroyed, a new one is accepted. */
    {
        rdd_submit_service *second = NULL;
        CHECK_EQ(rdd_submit_create(e.qp[0], e.cq[0], NULL, &second), RDD_STATUS_RESOURCE_BUSY);
        CHECK(second == NULL);
        CHECK_EQ(rdd_submit_destroy(svc), RDD_STATUS_OK);
        MUST(rdd_submit_create(e.qp[0], e.cq[0], NULL, &svc));
    }
    CHECK_EQ(rdd_submit_destroy(svc), RDD_STATUS_OK);
    env_close(&e);
}

/* Every call with NULL, forged, destroyed and wrong-kind handles and
 * NULL outputs. */
static void test_handles(void)
{
    struct env e;
    rdd_submit_service *svc, *dead_svc;
    rdd_submitter *sub, *dead_sub = NULL, *out_sub = NULL;
    rdd_submit_desc d;
    rdd_submit_completion c[2];
    rdd_submit_counters k;
    size_t n = 55, bad = 66;
    uint32_t id = 44;

    env_open(&e, 64, 1);
    dead_svc = svc_create(&e, NULL);
    MUST(rdd_submit_destroy(dead_svc));
    svc = svc_create(&e, NULL);
    sub = sub_register(svc);
    dead_sub = sub_register(svc);
    MUST(rdd_submit_unregister(dead_sub));
    d = desc_at(&e, 1, 0, 8);

    /* destroy / unregister: the handle only. */
    CHECK_EQ(rdd_submit_destroy(NULL), RDD_STATUS_NULL_PARAMETER);
    CHECK_EQ(rdd_submit_destroy(FORGED_SVC), RDD_STATUS_INVALID_HANDLE);
    CHECK_EQ(rdd_submit_destroy(dead_svc), RDD_STATUS_INVALID_HANDLE);
    CHECK_EQ(rdd_submit_destroy((rdd_submit_service *)sub), RDD_STATUS_INVALID_HANDLE);
    CHECK_EQ(rdd_submit_destroy((rdd_submit_service *)e.qp[0]), RDD_STATUS_INVALID_HANDLE);
    CHECK_EQ(rdd_submit_unregister(NULL), RDD_STATUS_NULL_PARAMETER);
    CHECK_EQ(rdd_submit_unregister(FORGED_SUB), RDD_STATUS_INVALID_HANDLE);
    CHECK_EQ(rdd_submit_unregister(dead_sub), RDD_STATUS_INVALID_HANDLE);
    CHECK_EQ(rdd_submit_unregister((rdd_submitter *)svc), RDD_STATUS_INVALID_HANDLE);

    /* register */
    CHECK_EQ(rdd_submit_register(svc, NULL), RDD_STATUS_NULL_PARAMETER);
    CHECK_EQ(rdd_submit_register(NULL, &out_sub), RDD_STATUS_NULL_PARAMETER);
    CHECK_EQ(rdd_submit_register(FORGED_SVC, &out_sub), RDD_STATUS_INVALID_HANDLE);
    CHECK_EQ(rdd_submit_register(dead_svc, &out_sub), RDD_STATUS_INVALID_HANDLE);
    CHECK_EQ(rdd_submit_register((rdd_submit_service *)sub, &out_sub),
             RDD_STATUS_INVALID_HANDLE);
    CHECK(out_sub == NULL);

    /* post */
    CHECK_EQ(rdd_submit_post(sub, &d, 1, NULL), RDD_STATUS_NULL_PARAMETER);
    CHECK_EQ(rdd_submit_post(NULL, &d, 1, &bad), RDD_STATUS_NULL_PARAMETER);
    CHECK_EQ(rdd_submit_post(sub, NULL, 1, &bad), RDD_STATUS_NULL_PARAMETER);
    CHECK_EQ(rdd_submit_post(FORGED_SUB, &d, 1, &bad), RDD_STATUS_INVALID_HANDLE);
    CHECK_EQ(rdd_submit_post(dead_sub, &d, 1, &bad), RDD_STATUS_INVALID_HANDLE);
    CHECK_EQ(rdd_submit_post((rdd_submitter *)svc, &d, 1, &bad), RDD_STATUS_INVALID_HANDLE);
    CHECK_EQ(bad, 66);

    /* reap */
    CHECK_EQ(rdd_submit_reap(sub, c, 2, NULL), RDD_STATUS_NULL_PARAMETER);
    CHECK_EQ(rdd_submit_reap(sub, NULL, 2, &n), RDD_STATUS_NULL_PARAMETER);
    CHECK_EQ(rdd_submit_reap(NULL, c, 2, &n), RDD_STATUS_NULL_PARAMETER);
    CHECK_EQ(rdd_submit_reap(FORGED_SUB, c, 2, &n), RDD_STATUS_INVALID_HANDLE);
    CHECK_EQ(rdd_submit_reap(dead_sub, c, 2, &n), RDD_STATUS_INVALID_HANDLE);
    {
        /* A misaligned completion array. */
        _Alignas(8) uint8_t raw[64];
        CHECK_EQ(rdd_submit_reap(sub, (rdd_submit_completion *)(void *)(raw + 4), 2, &n),
                 RDD_STATUS_INVALID_ARGUMENT);
    }
    CHECK_EQ(n, 55);

    /* query */
    CHECK_EQ(rdd_submit_query(sub, NULL, &n), RDD_STATUS_NULL_PARAMETER);
    CHECK_EQ(rdd_submit_query(sub, &id, NULL), RDD_STATUS_NULL_PARAMETER);
    CHECK_EQ(rdd_submit_query(NULL, &id, &n), RDD_STATUS_NULL_PARAMETER);
    CHECK_EQ(rdd_submit_query(FORGED_SUB, &id, &n), RDD_STATUS_INVALID_HANDLE);
    CHECK_EQ(rdd_submit_query(dead_sub, &id, &n), RDD_STATUS_INVALID_HANDLE);
    CHECK_EQ(id, 44);

    /* drain / complete / flush / stats */
    CHECK_EQ(rdd_submit_drain(svc, NULL), RDD_STATUS_NULL_PARAMETER);
    CHECK_EQ(rdd_submit_drain(NULL, &n), RDD_STATUS_NULL_PARAMETER);
    CHECK_EQ(rdd_submit_drain(FORGED_SVC, &n), RDD_STATUS_INVALID_HANDLE);
    CHECK_EQ(rdd_submit_drain(dead_svc, &n), RDD_STATUS_INVALID_HANDLE);
    CHECK_EQ(rdd_submit_drain((rdd_submit_service *)sub, &n), RDD_STATUS_INVALID_HANDLE);
    CHECK_EQ(rdd_submit_complete(svc, NULL), RDD_STATUS_NULL_PARAMETER);
    CHECK_EQ(rdd_submit_complete(NULL, &n), RDD_STATUS_NULL_PARAMETER);
    CHECK_EQ(rdd_submit_complete(FORGED_SVC, &n), RDD_STATUS_INVALID_HANDLE);
    CHECK_EQ(rdd_submit_complete(dead_svc, &n), RDD_STATUS_INVALID_HANDLE);
    CHECK_EQ(rdd_submit_flush(svc, NULL), RDD_STATUS_NULL_PARAMETER);
    CHECK_EQ(rdd_submit_flush(NULL, &n), RDD_STATUS_NULL_PARAMETER);
    CHECK_EQ(rdd_submit_flush(FORGED_SVC, &n), RDD_STATUS_INVALID_HANDLE);
    CHECK_EQ(rdd_submit_flush(dead_svc, &n), RDD_STATUS_INVALID_HANDLE);
    CHECK_EQ(rdd_submit_stats(svc, NULL), RDD_STATUS_NULL_PARAMETER);
    CHECK_EQ(rdd_submit_stats(NULL, &k), RDD_STATUS_NULL_PARAMETER);
    CHECK_EQ(rdd_submit_stats(FORGED_SVC, &k), RDD_STATUS_INVALID_HANDLE);
    CHECK_EQ(rdd_submit_stats(dead_svc, &k), RDD_STATUS_INVALID_HANDLE);
    CHECK_EQ(n, 55);

    /* The live handles still work. */
    MUST(rdd_submit_post(sub, &d, 1, &bad));
    CHECK_EQ(pump(&e, svc, 1), 1);
    CHECK_EQ(reap_all(sub, c, 2), 1);
    MUST(rdd_submit_unregister(sub));
    MUST(rdd_submit_destroy(svc));
    env_close(&e);
}

/* Every descriptor status, with the index of the first one not queued;
 * the ones before it are queued and complete. */
static void test_post_errors(void)
{
    struct env e;
    rdd_submit_service *svc;
    rdd_submitter *sub;
    rdd_submit_desc good, bad_d, batch[3];
    rdd_submit_completion c[64];
    rdd_qp_caps caps;
    size_t bad, i, queued = 0;
    struct {
        uint32_t opcode, flags, length, reserved;
        int null_inline;
        rdd_status want;
    } cases[7];

    env_open(&e, 64, 1);
    MUST(rdd_qp_query_caps(e.qp[0], &caps));
    svc = svc_create(&e, NULL);
    sub = sub_register(svc);
    good = desc_at(&e, 1, 0, 8);
    memset(cases, 0, sizeof(cases));
    cases[0].opcode = RDD_WR_SEND;
    cases[0].want = RDD_STATUS_INVALID_OPCODE;
    cases[1].flags = RDD_SEND_SOLICITED;
    cases[1].want = RDD_STATUS_INVALID_FLAGS;
    cases[2].flags = 0x100;
    cases[2].want = RDD_STATUS_INVALID_FLAGS;
    cases[3].reserved = 1;
    cases[3].want = RDD_STATUS_INVALID_ARGUMENT;
    cases[4].length = 0x80000000u;
    cases[4].want = RDD_STATUS_LENGTH_OVERFLOW;
    cases[5].flags = RDD_SEND_INLINE;
    cases[5].length = caps.max_inline_data + 1;
    cases[5].want = RDD_STATUS_INLINE_TOO_LARGE;
    cases[6].flags = RDD_SEND_INLINE;
    cases[6].null_inline = 1;
    cases[6].want = RDD_STATUS_NULL_POINTER;
    for (i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        bad_d = good;
        bad_d.opcode = cases[i].opcode;
        bad_d.flags = cases[i].flags;
        bad_d.reserved = cases[i].reserved;
        if (cases[i].length != 0) {
            bad_d.length = cases[i].length;
        }
        if (cases[i].null_inline) {
            bad_d.local_addr = 0;
        }
        batch[0] = good;
        batch[1] = bad_d;
        batch[2] = good;
        bad = 99;
        CHECK_EQ(rdd_submit_post(sub, batch, 3, &bad), cases[i].want);
        CHECK_EQ(bad, 1);
        queued++;
        /* Alone, at index 0. */
        bad = 99;
        CHECK_EQ(rdd_submit_post(sub, &bad_d, 1, &bad), cases[i].want);
        CHECK_EQ(bad, 0);
    }
    /* A misaligned array: INVALID_ARGUMENT, index 0, nothing queued. */
    {
        _Alignas(8) uint8_t raw[sizeof(rdd_submit_desc) + 8];
        memcpy(raw + 4, &good, sizeof(good));
        bad = 99;
        CHECK_EQ(rdd_submit_post(sub, (const rdd_submit_desc *)(const void *)(raw + 4), 1, &bad),
                 RDD_STATUS_INVALID_ARGUMENT);
        CHECK_EQ(bad, 0);
    }
    /* An empty array is fine. */
    bad = 99;
    CHECK_EQ(rdd_submit_post(sub, &good, 0, &bad), RDD_STATUS_OK);
    CHECK_EQ(bad, 99);
    CHECK_EQ(counters(svc).submitted, queued);
    CHECK_EQ(pump(&e, svc, queued), queued);
    CHECK_EQ(reap_all(sub, c, 64), queued);
    MUST(rdd_submit_unregister(sub));
    MUST(rdd_submit_destroy(svc));
    env_close(&e);
}

/* ---- back-pressure -------------------------------------------------------- */

static void test_full(void)
{
    struct env e;
    rdd_submit_service *svc;
    rdd_submitter *sub[5];
    rdd_submit_desc *d;
    rdd_submit_completion *c;
    rdd_submit_counters k;
    rdd_submit_config cfg;
    size_t bad, i, j, n, done;

    d = (rdd_submit_desc *)calloc(RDD_SUBMIT_COMPLETION_RING_SIZE, sizeof(*d));
    c = (rdd_submit_completion *)calloc(RDD_SUBMIT_COMPLETION_RING_SIZE, sizeof(*c));
    CHECK(d != NULL && c != NULL);
    if (d == NULL || c == NULL) {
        free(d);
        free(c);
        return;
    }
    env_open(&e, 256, 1);
    memset(&cfg, 0, sizeof(cfg));
    cfg.max_outstanding = 256;
    cfg.max_batch = 64;
    svc = svc_create(&e, &cfg);
    for (i = 0; i < 5; i++) {
        sub[i] = sub_register(svc);
    }
    for (i = 0; i < RDD_SUBMIT_COMPLETION_RING_SIZE; i++) {
        d[i] = desc_at(&e, i, (i % 512) * 64, 64);
    }
    /* Credits: RDD_SUBMIT_COMPLETION_RING_SIZE in flight per submitter. */
    CHECK_EQ(rdd_submit_post(sub[0], d, RDD_SUBMIT_COMPLETION_RING_SIZE, &bad), RDD_STATUS_OK);
    bad = 99;
    CHECK_EQ(rdd_submit_post(sub[0], d, 1, &bad), RDD_STATUS_SQ_FULL);
    CHECK_EQ(bad, 0);
    /* The ring: four submitters fill its RDD_SUBMIT_RING_SIZE slots. */
    CHECK_EQ(RDD_SUBMIT_RING_SIZE, 4 * RDD_SUBMIT_COMPLETION_RING_SIZE);
    for (i = 1; i < 4; i++) {
        CHECK_EQ(rdd_submit_post(sub[i], d, RDD_SUBMIT_COMPLETION_RING_SIZE, &bad),
                 RDD_STATUS_OK);
    }
    bad = 99;
    CHECK_EQ(rdd_submit_post(sub[4], d, 3, &bad), RDD_STATUS_SQ_FULL);
    CHECK_EQ(bad, 0);
    k = counters(svc);
    CHECK_EQ(k.submitted, RDD_SUBMIT_RING_SIZE);
    CHECK_EQ(k.queued, RDD_SUBMIT_RING_SIZE);
    CHECK_EQ(k.refused_no_credit, 1);
    CHECK_EQ(k.refused_ring_full, 1);
    /* One drain makes room: the refused submitter gets in. */
    MUST(rdd_submit_drain(svc, &n));
    CHECK_EQ(n, 64);
    CHECK_EQ(rdd_submit_post(sub[4], d, 3, &bad), RDD_STATUS_OK);
    /* Everything completes, to the right submitter, in order. */
    done = pump(&e, svc, RDD_SUBMIT_RING_SIZE + 3);
    CHECK_EQ(done, RDD_SUBMIT_RING_SIZE + 3);
    for (i = 0; i < 5; i++) {
        size_t want = i < 4 ? RDD_SUBMIT_COMPLETION_RING_SIZE : 3;
        n = reap_all(sub[i], c, RDD_SUBMIT_COMPLETION_RING_SIZE);
        CHECK_EQ(n, want);
        for (j = 0; j < n; j++) {
            if (c[j].wr_id != j || c[j].status != RDD_WC_SUCCESS) {
                CHECK_EQ(c[j].wr_id, j);
                CHECK_EQ(c[j].status, RDD_WC_SUCCESS);
                break;
            }
        }
    }
    k = counters(svc);
    CHECK_EQ(k.completed, RDD_SUBMIT_RING_SIZE + 3);
    CHECK_EQ(k.reaped, RDD_SUBMIT_RING_SIZE + 3);
    CHECK(k.doorbells >= (RDD_SUBMIT_RING_SIZE + 3) / 64);
    CHECK(k.doorbells <= k.posted);
    for (i = 0; i < 5; i++) {
        MUST(rdd_submit_unregister(sub[i]));
    }
    MUST(rdd_submit_destroy(svc));
    env_close(&e);
    free(d);
    free(c);
}

/* A send queue smaller than max_outstanding: the QP refuses part of a
 * batch, the rest stays held and goes out later, in order. */
static void test_qp_full(void)
{
    struct env e;
    rdd_submit_service *svc;
    rdd_submitter *sub;
    rdd_submit_desc d[40];
    rdd_submit_completion c[40];
    rdd_submit_config cfg;
    rdd_submit_counters k;
    size_t bad, i, n, posted = 0;

    env_open(&e, 16, 1);
    memset(&cfg, 0, sizeof(cfg));
    cfg.max_outstanding = 1024;
    cfg.max_batch = 64;
    svc = svc_create(&e, &cfg);
    sub = sub_register(svc);
    for (i = 0; i < 40; i++) {
        d[i] = desc_at(&e, i, i * 64, 64);
    }
    MUST(rdd_submit_post(sub, d, 40, &bad));
    MUST(rdd_submit_drain(svc, &posted));
    CHECK(posted < 40);
    k = counters(svc);
    CHECK_EQ(k.qp_full, 1);
    CHECK_EQ(k.held, 40 - posted);
    CHECK_EQ(pump(&e, svc, 40), 40);
    n = reap_all(sub, c, 40);
    CHECK_EQ(n, 40);
    for (i = 0; i < n; i++) {
        CHECK_EQ(c[i].wr_id, i);
        CHECK_EQ(c[i].status, RDD_WC_SUCCESS);
    }
    CHECK_BYTES(e.d, e.s, 40 * 64);
    MUST(rdd_submit_unregister(sub));
    MUST(rdd_submit_destroy(svc));
    env_close(&e);
}

/* ---- many submitters ------------------------------------------------------ */

static void test_many_submitters(void)
{
    struct env e;
    rdd_submit_service *svc;
    rdd_submitter *sub[RDD_SUBMIT_MAX_SUBMITTERS], *extra = NULL;
    rdd_submit_desc d[8];
    rdd_submit_completion c[16];
    size_t bad, i, j, n, in_flight;
    uint32_t id;

    env_open(&e, 1024, 1);
    svc = svc_create(&e, NULL);
    for (i = 0; i < RDD_SUBMIT_MAX_SUBMITTERS; i++) {
        sub[i] = sub_register(svc);
        MUST(rdd_submit_query(sub[i], &id, &in_flight));
        CHECK_EQ(id, i);
    }
    CHECK_EQ(rdd_submit_register(svc, &extra), RDD_STATUS_RESOURCE_EXHAUSTED);
    CHECK(extra == NULL);
    for (i = 0; i < RDD_SUBMIT_MAX_SUBMITTERS; i++) {
        for (j = 0; j < 8; j++) {
            d[j] = desc_at(&e, i << 8 | j, (i * 8 + j) * 128, (uint32_t)(8 + i + j));
        }
        MUST(rdd_submit_post(sub[i], d, 8, &bad));
    }
    CHECK_EQ(pump(&e, svc, RDD_SUBMIT_MAX_SUBMITTERS * 8), RDD_SUBMIT_MAX_SUBMITTERS * 8);
    for (i = 0; i < RDD_SUBMIT_MAX_SUBMITTERS; i++) {
        n = reap_all(sub[i], c, 16);
        CHECK_EQ(n, 8);
        for (j = 0; j < n; j++) {
            CHECK_EQ(c[j].wr_id, i << 8 | j);
        }
        for (j = 0; j < 8; j++) {
            size_t off = (i * 8 + j) * 128;
            CHECK_BYTES(e.d + off, e.s + off, 8 + i + j);
        }
    }
    /* A freed id goes to the next registration. */
    MUST(rdd_submit_unregister(sub[17]));
    sub[17] = sub_register(svc);
    MUST(rdd_submit_query(sub[17], &id, &in_flight));
    CHECK_EQ(id, 17);
    for (i = 0; i < RDD_SUBMIT_MAX_SUBMITTERS; i++) {
        MUST(rdd_submit_unregister(sub[i]));
    }
    MUST(rdd_submit_destroy(svc));
    env_close(&e);
}

/* ---- teardown with work outstanding -------------------------------------- */

static void test_outstanding(void)
{
    struct env e;
    rdd_submit_service *svc;
    rdd_submitter *sub;
    rdd_submit_desc d[10];
    rdd_submit_completion c[16];
    rdd_submit_config cfg;
    rdd_submit_counters k;
    size_t bad, i, n, posted;

    env_open(&e, 64, 1);
    memset(&cfg, 0, sizeof(cfg));
    cfg.max_outstanding = 4;
    cfg.max_batch = 2;
    svc = svc_create(&e, &cfg);
    sub = sub_register(svc);
    for (i = 0; i < 10; i++) {
        d[i] = desc_at(&e, i, 0, 8);
    }
    MUST(rdd_submit_post(sub, d, 10, &bad));
    /* Queued work: both refused, nothing changes. */
    CHECK_EQ(rdd_submit_unregister(sub), RDD_STATUS_RESOURCE_BUSY);
    CHECK_EQ(rdd_submit_destroy(svc), RDD_STATUS_RESOURCE_BUSY);
    /* Four posted, two held, four queued. */
    for (i = 0; i < 3; i++) {
        MUST(rdd_submit_drain(svc, &posted));
    }
    k = counters(svc);
    CHECK_EQ(k.posted, 4);
    CHECK_EQ(k.held, 2);
    CHECK_EQ(k.queued, 4);
    /* The QP is alive: no flush. */
    n = 77;
    CHECK_EQ(rdd_submit_flush(svc, &n), RDD_STATUS_RESOURCE_BUSY);
    CHECK_EQ(n, 77);
    /* The QP goes first: completions can no longer come from it. */
    MUST(rdd_qp_destroy(e.qp[0]));
    e.qp[0] = NULL;
    CHECK_EQ(rdd_submit_complete(svc, &n), RDD_STATUS_NO_SUCH_OBJECT);
    CHECK_EQ(rdd_submit_unregister(sub), RDD_STATUS_RESOURCE_BUSY);
    MUST(rdd_submit_flush(svc, &n));
    CHECK_EQ(n, 10);
    n = reap_all(sub, c, 16);
    CHECK_EQ(n, 10);
    for (i = 0; i < n; i++) {
        CHECK_EQ(c[i].wr_id, i);
        CHECK_EQ(c[i].status, RDD_WC_WR_FLUSH_ERR);
    }
    k = counters(svc);
    CHECK_EQ(k.flushed, 10);
    CHECK_EQ(k.failed, 10);
    CHECK_EQ(k.queued + k.held, 0);
    /* Submissions after the QP is gone: drain reports it, flush completes
     * them. */
    MUST(rdd_submit_post(sub, d, 2, &bad));
    CHECK_EQ(rdd_submit_drain(svc, &posted), RDD_STATUS_NO_SUCH_OBJECT);
    MUST(rdd_submit_flush(svc, &n));
    CHECK_EQ(n, 2);
    CHECK_EQ(reap_all(sub, c, 16), 2);
    CHECK_EQ(rdd_submit_unregister(sub), RDD_STATUS_OK);
    CHECK_EQ(rdd_submit_destroy(svc), RDD_STATUS_OK);
    env_close(&e);
}

/* A QP that is not connected: drains keep the work, which goes out once
 * it is. */
static void test_not_connected(void)
{
    struct env e;
    rdd_submit_service *svc;
    rdd_submitter *sub;
    rdd_submit_desc d;
    rdd_submit_completion c[2];
    rdd_qp_info info[2];
    rdd_connect_attr attr;
    size_t bad, posted = 5;

    env_open(&e, 64, 0);
    svc = svc_create(&e, NULL);
    sub = sub_register(svc);
    d = desc_at(&e, 3, 64, 32);
    MUST(rdd_submit_post(sub, &d, 1, &bad));
    CHECK_EQ(rdd_submit_drain(svc, &posted), RDD_STATUS_INVALID_QP_STATE);
    CHECK_EQ(posted, 5);
    CHECK_EQ(counters(svc).held, 1);
    MUST(rdd_qp_query_info(e.qp[0], &info[0]));
    MUST(rdd_qp_query_info(e.qp[1], &info[1]));
    memset(&attr, 0, sizeof(attr));
    attr.access = RDD_ACCESS_REMOTE_WRITE;
    attr.rnr_retry = 7;
    attr.retry_cnt = 7;
    MUST(rdd_qp_connect(e.qp[0], &info[1], NULL));
    MUST(rdd_qp_connect(e.qp[1], &info[0], &attr));
    CHECK_EQ(pump(&e, svc, 1), 1);
    CHECK_EQ(reap_all(sub, c, 2), 1);
    CHECK_EQ(c[0].status, RDD_WC_SUCCESS);
    CHECK_BYTES(e.d + 64, e.s + 64, 32);
    MUST(rdd_submit_unregister(sub));
    MUST(rdd_submit_destroy(svc));
    env_close(&e);
}

/* A WRITE with a wrong rkey: the ones before it succeed, it fails, and
 * what follows (in the same batch and later ones) is flushed. */
static void test_error_completion(void)
{
    struct env e;
    rdd_submit_service *svc;
    rdd_submitter *sub;
    rdd_submit_desc d[6];
    rdd_submit_completion c[8];
    rdd_submit_counters k;
    size_t bad, i, n;

    env_open(&e, 64, 1);
    svc = svc_create(&e, NULL);
    sub = sub_register(svc);
    for (i = 0; i < 6; i++) {
        d[i] = desc_at(&e, i, i * 64, 16);
    }
    d[2].rkey ^= 0x5a5au;
    MUST(rdd_submit_post(sub, d, 4, &bad));
    CHECK_EQ(pump(&e, svc, 4), 4);
    MUST(rdd_submit_post(sub, d + 4, 2, &bad));
    CHECK_EQ(pump(&e, svc, 2), 2);
    n = reap_all(sub, c, 8);
    CHECK_EQ(n, 6);
    CHECK_EQ(c[0].status, RDD_WC_SUCCESS);
    CHECK_EQ(c[1].status, RDD_WC_SUCCESS);
    CHECK_EQ(c[2].status, RDD_WC_REM_ACCESS_ERR);
    for (i = 3; i < n; i++) {
        CHECK_EQ(c[i].status, RDD_WC_WR_FLUSH_ERR);
    }
    for (i = 0; i < n; i++) {
        CHECK_EQ(c[i].wr_id, i);
    }
    CHECK_BYTES(e.d + 64, e.s + 64, 16);
    CHECK_EQ(e.d[2 * 64], 0);
    k = counters(svc);
    CHECK_EQ(k.completed, 6);
    CHECK_EQ(k.failed, 4);
    MUST(rdd_submit_unregister(sub));
    MUST(rdd_submit_destroy(svc));
    env_close(&e);
}

int main(void)
{
    test_happy_path();
    test_inline();
    test_create_errors();
    test_handles();
    test_post_errors();
    test_full();
    test_qp_full();
    test_many_submitters();
    test_outstanding();
    test_not_connected();
    test_error_completion();
    return h_finish("test_submit");
}
