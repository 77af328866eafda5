/*
 * rdd_wr_check cases shared by test_wr_check.c and test_wr_check.cpp: one
 * work request per case with the status a post must give it, every status
 * of rdd_wr_check among them. Each case is judged by rdd_wr_check and by a
 * real rdd_mlx5_sq_post on a fresh queue with the same capabilities (fake
 * device memory): both must give the expected status, and the check must
 * write nothing but out_bad_index.
 */
#ifndef RDD_FFI_TESTS_WR_CHECK_CASES_H
#define RDD_FFI_TESTS_WR_CHECK_CASES_H

#include "harness.h"

#define WC_QPN 0x2a
#define WC_UNTOUCHED ((size_t)0x5a5a5a5a)

/* Capabilities of the queue the cases are judged for. */
static const rdd_qp_caps WC_CAPS = {2, 32, 1};

static uint8_t wc_payload[64];
static rdd_sge wc_sges[20];
static uint64_t wc_words[8]; /* for a misaligned SGE array */

static rdd_wr wc_wr(uint32_t opcode, uint32_t flags, const rdd_sge *list, uint32_t n)
{
    rdd_wr w;
    memset(&w, 0, sizeof(w));
    w.wr_id = 0x77;
    w.sg_list = list;
    w.num_sge = n;
    w.opcode = opcode;
    w.flags = flags;
    w.remote_addr = 0x10000;
    w.rkey = 5;
    return w;
}

static void wc_set_sge(unsigned i, uint64_t addr, uint32_t len)
{
    wc_sges[i].addr = addr;
    wc_sges[i].length = len;
    wc_sges[i].lkey = 9;
}

/* The status `post` and `check` give `w` on a queue with `caps`, checked
 * against `want`; returns the check's status. */
static rdd_status wc_judge(const rdd_qp_caps *caps, const rdd_wr *w, rdd_status want, int line)
{
    struct fake_mlx5 f;
    rdd_mlx5_sq_storage sq;
    size_t bad = WC_UNTOUCHED, pbad = WC_UNTOUCHED;
    rdd_wr copy = *w;
    rdd_sge sges_copy[20];
    rdd_status got, posted;

    memcpy(sges_copy, wc_sges, sizeof(wc_sges));
    got = rdd_wr_check(caps, w, 1, &bad);
    if (got != want) {
        fprintf(stderr, "line %d: ", line);
    }
    CHECK_EQ(got, want);
    CHECK_EQ(bad, got == RDD_STATUS_OK ? WC_UNTOUCHED : 0);
    CHECK_BYTES(&copy, w, sizeof(copy));
    CHECK_BYTES(sges_copy, wc_sges, sizeof(wc_sges));

    fake_init(&f, FAKE_DEFAULT_GEO);
    memset(&sq, 0, sizeof(sq));
    MUST(rdd_mlx5_sq_init(&sq, &f.qp, WC_QPN, caps, 0, f.sq_wrid, f.geo.sq_wqe_cnt));
    posted = rdd_mlx5_sq_post(&sq, w, 1, &pbad);
    if (posted != got) {
        fprintf(stderr, "line %d: post and check disagree\n", line);
    }
    CHECK_EQ(posted, got);
    CHECK_EQ(pbad, bad);
    (void)rdd_mlx5_sq_fini(&sq);
    fake_free(&f);
    return got;
}

#define JUDGE(w, want) wc_judge(&WC_CAPS, &(w), (want), __LINE__)

static void wc_run_cases(void)
{
    rdd_wr w;
    rdd_wr list[3];
    rdd_qp_caps bad_caps = {62, 0, 1};
    size_t bad;
    uint64_t payload_addr = (uint64_t)(uintptr_t)wc_payload;
    unsigned i;

    for (i = 0; i < 20; i++) {
        wc_set_sge(i, 0x3000 + 64 * i, 16);
    }

    /* OK: every opcode in a shape it accepts. */
    w = wc_wr(RDD_WR_RDMA_WRITE, RDD_SEND_SIGNALED, wc_sges, 2);
    JUDGE(w, RDD_STATUS_OK);
    w = wc_wr(RDD_WR_SEND_WITH_IMM, 0, wc_sges, 1);
    w.imm_data = 0x1234;
    JUDGE(w, RDD_STATUS_OK);
    w = wc_wr(RDD_WR_RDMA_READ, RDD_SEND_FENCE, wc_sges, 1);
    JUDGE(w, RDD_STATUS_OK);
    w = wc_wr(RDD_WR_NOP, RDD_SEND_SIGNALED, NULL, 0);
    JUDGE(w, RDD_STATUS_OK);
    wc_set_sge(0, payload_addr, 8);
    w = wc_wr(RDD_WR_ATOMIC_FETCH_AND_ADD, 0, wc_sges, 1);
    JUDGE(w, RDD_STATUS_OK);
    w = wc_wr(RDD_WR_SEND, RDD_SEND_INLINE | RDD_SEND_SOLICITED, wc_sges, 1);
    JUDGE(w, RDD_STATUS_OK);

    /* The translation's statuses. */
    w = wc_wr(RDD_WR_SEND, 0x10, wc_sges, 1);
    JUDGE(w, RDD_STATUS_INVALID_FLAGS);
    w = wc_wr(RDD_WR_SEND, RDD_SEND_DEFER_DOORBELL, wc_sges, 1);
    JUDGE(w, RDD_STATUS_INVALID_FLAGS);
    w = wc_wr(7, 0, wc_sges, 1);
    JUDGE(w, RDD_STATUS_INVALID_OPCODE);
    w = wc_wr(RDD_WR_SEND, 0, wc_sges, 1);
    w.imm_data = 1;
    JUDGE(w, RDD_STATUS_INVALID_IMMEDIATE);
    w = wc_wr(RDD_WR_SEND, 0, NULL, 1);
    JUDGE(w, RDD_STATUS_NULL_POINTER);
    wc_set_sge(1, 0, 4);
    w = wc_wr(RDD_WR_SEND, RDD_SEND_INLINE, wc_sges, 2);
    JUDGE(w, RDD_STATUS_NULL_POINTER);
    wc_set_sge(1, 0x3040, 16);
    w = wc_wr(RDD_WR_SEND, 0, (const rdd_sge *)(const void *)((const uint8_t *)wc_words + 4), 1);
    JUDGE(w, RDD_STATUS_INVALID_ARGUMENT);
    w = wc_wr(RDD_WR_SEND, 0, wc_sges, 64);
    JUDGE(w, RDD_STATUS_TOO_MANY_SGES);

    /* The queue's rules. */
    w = wc_wr(RDD_WR_SEND, 0, wc_sges, 3);
    JUDGE(w, RDD_STATUS_TOO_MANY_SGES);
    wc_set_sge(0, payload_addr, 4);
    w = wc_wr(RDD_WR_ATOMIC_CMP_AND_SWP, 0, wc_sges, 1);
    JUDGE(w, RDD_STATUS_ATOMIC_SGE_LENGTH);
    wc_set_sge(0, payload_addr, 8);
    w = wc_wr(RDD_WR_ATOMIC_CMP_AND_SWP, 0, wc_sges, 1);
    w.remote_addr = 0x10004;
    JUDGE(w, RDD_STATUS_ATOMIC_UNALIGNED);
    wc_set_sge(0, 0x3000, 0x80000000u);
    w = wc_wr(RDD_WR_RDMA_WRITE, 0, wc_sges, 1);
    JUDGE(w, RDD_STATUS_LENGTH_OVERFLOW);
    wc_set_sge(0, payload_addr, 8);
    w = wc_wr(RDD_WR_RDMA_READ, RDD_SEND_INLINE, wc_sges, 1);
    JUDGE(w, RDD_STATUS_INLINE_NOT_ALLOWED);
    wc_set_sge(0, payload_addr, 33);
    w = wc_wr(RDD_WR_SEND, RDD_SEND_INLINE, wc_sges, 1);
    JUDGE(w, RDD_STATUS_INLINE_TOO_LARGE);
    wc_set_sge(0, 0x3000, 16);

    /* A list: the first refused request decides, its index is reported. */
    list[0] = wc_wr(RDD_WR_SEND, 0, wc_sges, 1);
    list[1] = wc_wr(RDD_WR_RDMA_WRITE, 0, wc_sges, 2);
    list[2] = wc_wr(RDD_WR_SEND, 0x20, wc_sges, 1);
    bad = WC_UNTOUCHED;
    CHECK_EQ(rdd_wr_check(&WC_CAPS, list, 3, &bad), RDD_STATUS_INVALID_FLAGS);
    CHECK_EQ(bad, 2);
    bad = WC_UNTOUCHED;
    CHECK_EQ(rdd_wr_check(&WC_CAPS, list, 2, &bad), RDD_STATUS_OK);
    CHECK_EQ(bad, WC_UNTOUCHED);
    CHECK_EQ(rdd_wr_check(&WC_CAPS, list, 0, &bad), RDD_STATUS_OK);

    /* Arguments: NULL pointers write nothing; a misaligned array is index 0. */
    bad = WC_UNTOUCHED;
    CHECK_EQ(rdd_wr_check(NULL, list, 1, &bad), RDD_STATUS_NULL_PARAMETER);
    CHECK_EQ(rdd_wr_check(&WC_CAPS, NULL, 1, &bad), RDD_STATUS_NULL_PARAMETER);
    CHECK_EQ(bad, WC_UNTOUCHED);
    CHECK_EQ(rdd_wr_check(&WC_CAPS, list, 1, NULL), RDD_STATUS_NULL_PARAMETER);
    CHECK_EQ(rdd_wr_check(&WC_CAPS, (const rdd_wr *)(const void *)((const uint8_t *)list + 4), 1,
                          &bad),
             RDD_STATUS_INVALID_ARGUMENT);
    CHECK_EQ(bad, 0);

    /* Capabilities no queue can have: INVALID_GEOMETRY, as the queue's init. */
    bad = WC_UNTOUCHED;
    CHECK_EQ(rdd_wr_check(&bad_caps, list, 1, &bad), RDD_STATUS_INVALID_GEOMETRY);
    CHECK_EQ(bad, WC_UNTOUCHED);
    {
        struct fake_mlx5 f;
        rdd_mlx5_sq_storage sq;
        fake_init(&f, FAKE_DEFAULT_GEO);
        memset(&sq, 0, sizeof(sq));
        CHECK_EQ(rdd_mlx5_sq_init(&sq, &f.qp, WC_QPN, &bad_caps, 0, f.sq_wrid, f.geo.sq_wqe_cnt),
                 RDD_STATUS_INVALID_GEOMETRY);
        fake_free(&f);
    }
}

#endif
