/*
 * Shared helpers for the C ABI tests (C11 and C++17): a tiny check
 * framework, big-endian byte helpers, and "fake device" memory standing in
 * for one mlx5 QP and CQ (the memory mlx5dv_init_obj would describe).
 */
#ifndef RDD_FFI_TESTS_HARNESS_H
#define RDD_FFI_TESTS_HARNESS_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rdma_direct.h"

/* ---- checks ------------------------------------------------------------ */

static unsigned h_passed;
static unsigned h_failed;

#define CHECK(cond)                                                                      \
    do {                                                                                 \
        if (cond) {                                                                      \
            h_passed++;                                                                  \
        } else {                                                                         \
            h_failed++;                                                                  \
            fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond);     \
        }                                                                                \
    } while (0)

/* Compares two integers and prints both on mismatch. */
#define CHECK_EQ(a, b)                                                                   \
    do {                                                                                 \
        unsigned long long h_a_ = (unsigned long long)(a);                               \
        unsigned long long h_b_ = (unsigned long long)(b);                               \
        if (h_a_ == h_b_) {                                                              \
            h_passed++;                                                                  \
        } else {                                                                         \
            h_failed++;                                                                  \
            fprintf(stderr, "%s:%d: CHECK_EQ failed: %s == %s (0x%llx != 0x%llx)\n",     \
                    __FILE__, __LINE__, #a, #b, h_a_, h_b_);                             \
        }                                                                                \
    } while (0)

/* Compares byte ranges and hex-dumps both on mismatch. */
#define CHECK_BYTES(got, want, n) h_check_bytes(__FILE__, __LINE__, #got, (got), (want), (n))

static inline void h_dump(const char *label, const uint8_t *p, size_t n)
{
    size_t i;
    fprintf(stderr, "  %s:", label);
    for (i = 0; i < n; i++) {
        fprintf(stderr, "%s%02x", (i % 16) ? " " : "\n    ", p[i]);
    }
    fprintf(stderr, "\n");
}

static inline void h_check_bytes(const char *file, int line, const char *what, const void *got,
                                 const void *want, size_t n)
{
    if (memcmp(got, want, n) == 0) {
        h_passed++;
        return;
    }
    h_failed++;
    fprintf(stderr, "%s:%d: CHECK_BYTES failed: %s\n", file, line, what);
    h_dump("got", (const uint8_t *)got, n);
    h_dump("want", (const uint8_t *)want, n);
}

/* Prints the closing line CI reads and returns the exit status. */
/* Setup steps that must succeed for the rest of a test to make sense:
 * stops the test at once, with the status, when one fails. */
#define MUST(x)                                                                          \
    do {                                                                                 \
        rdd_status must_s_ = (x);                                                        \
        if (must_s_ != RDD_STATUS_OK) {                                                  \
            fprintf(stderr, "%s:%d: %s failed with %u\n", __FILE__, __LINE__, #x,       \
                    (unsigned)must_s_);                                                  \
            abort();                                                                     \
        }                                                                                \
    } while (0)

static inline int h_finish(const char *name)
{
    printf("%s: %u passed, %u failed\n", name, h_passed, h_failed);
    return h_failed == 0 ? 0 : 1;
}

/* ---- big-endian helpers ------------------------------------------------ */

static inline void put_be16(uint8_t *p, uint16_t v)
{
    p[0] = (uint8_t)(v >> 8);
    p[1] = (uint8_t)v;
}

static inline void put_be32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)(v >> 24);
    p[1] = (uint8_t)(v >> 16);
    p[2] = (uint8_t)(v >> 8);
    p[3] = (uint8_t)v;
}

static inline uint32_t get_be32(const void *src)
{
    const uint8_t *p = (const uint8_t *)src;
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | (uint32_t)p[3];
}

static inline uint64_t get_be64(const void *src)
{
    const uint8_t *p = (const uint8_t *)src;
    return (uint64_t)get_be32(p) << 32 | get_be32(p + 4);
}

/* ---- fake device memory ------------------------------------------------ */

struct fake_geo {
    uint32_t sq_wqe_cnt; /* basic blocks */
    uint32_t rq_wqe_cnt;
    uint32_t rq_stride;
    uint32_t bf_size;
    uint32_t cqe_cnt;
    uint32_t cqe_size;
    uint32_t qpn;
    uint32_t cqn;
};

static const struct fake_geo FAKE_DEFAULT_GEO = {64, 16, 64, 256, 64, 64, 0x1c5, 0x80};

struct fake_mlx5 {
    struct fake_geo geo;
    uint8_t *qp_buf;  /* RQ at 0, SQ right after (as rdma-core lays it out) */
    uint8_t *sq;      /* SQ ring inside qp_buf */
    uint8_t *dbrec;   /* QP record at +0, CQ record at +64 */
    uint8_t *bf;      /* doorbell / BlueFlame register pair (2 x bf_size, >= 2 x 64) */
    uint8_t *cq_buf;
    uint8_t *uar;     /* UAR page; the CQ arm register is at +0x20 */
    rdd_mlx5_sq_slot *sq_wrid;
    uint64_t *rq_wrid;
    rdd_mlx5dv_qp qp;
    rdd_mlx5dv_cq cq;
};

/* aligned_alloc needs a size that is a multiple of the alignment. */
static inline void *h_alloc(size_t align, size_t len)
{
    size_t n = (len + align - 1) / align * align;
    void *p = aligned_alloc(align, n ? n : align);
    if (p == NULL) {
        fprintf(stderr, "aligned_alloc(%zu, %zu) failed\n", align, n);
        abort();
    }
    memset(p, 0, n ? n : align);
    return p;
}

static inline void fake_init(struct fake_mlx5 *f, struct fake_geo geo)
{
    size_t rq_bytes = (size_t)geo.rq_wqe_cnt * geo.rq_stride;
    size_t sq_off = (rq_bytes + 63) / 64 * 64;
    size_t bf_half = geo.bf_size > 64 ? geo.bf_size : 64;
    uint32_t i;

    memset(f, 0, sizeof(*f));
    f->geo = geo;
    f->qp_buf = (uint8_t *)h_alloc(4096, sq_off + (size_t)geo.sq_wqe_cnt * 64);
    f->sq = f->qp_buf + sq_off;
    f->dbrec = (uint8_t *)h_alloc(64, 128);
    f->bf = (uint8_t *)h_alloc(64, 2 * bf_half);
    f->cq_buf = (uint8_t *)h_alloc(4096, (size_t)geo.cqe_cnt * geo.cqe_size);
    f->uar = (uint8_t *)h_alloc(4096, 4096);
    f->sq_wrid = (rdd_mlx5_sq_slot *)h_alloc(64, geo.sq_wqe_cnt * sizeof(rdd_mlx5_sq_slot));
    f->rq_wrid = (uint64_t *)h_alloc(64, geo.rq_wqe_cnt * sizeof(uint64_t));

    /* Every CQE starts hardware-owned: opcode INVALID, owner 0. */
    for (i = 0; i < geo.cqe_cnt; i++) {
        f->cq_buf[(size_t)i * geo.cqe_size + geo.cqe_size - 1] = 0xf0;
    }

    f->qp.dbrec = (uint32_t *)(void *)f->dbrec;
    f->qp.sq_buf = f->sq;
    f->qp.sq_wqe_cnt = geo.sq_wqe_cnt;
    f->qp.sq_stride = 64;
    f->qp.rq_buf = f->qp_buf;
    f->qp.rq_wqe_cnt = geo.rq_wqe_cnt;
    f->qp.rq_stride = geo.rq_stride;
    f->qp.bf_reg = f->bf;
    f->qp.bf_size = geo.bf_size;

    f->cq.buf = f->cq_buf;
    f->cq.dbrec = (uint32_t *)(void *)(f->dbrec + 64);
    f->cq.cqe_cnt = geo.cqe_cnt;
    f->cq.cqe_size = geo.cqe_size;
    f->cq.cq_uar = f->uar;
    f->cq.cqn = geo.cqn;
}

static inline void fake_free(struct fake_mlx5 *f)
{
    free(f->qp_buf);
    free(f->dbrec);
    free(f->bf);
    free(f->cq_buf);
    free(f->uar);
    free(f->sq_wrid);
    free(f->rq_wrid);
    memset(f, 0, sizeof(*f));
}

/* Host-order doorbell-record words. */
static inline uint32_t fake_dbrec_rq(const struct fake_mlx5 *f) { return get_be32(f->dbrec); }
static inline uint32_t fake_dbrec_sq(const struct fake_mlx5 *f) { return get_be32(f->dbrec + 4); }
static inline uint32_t fake_dbrec_cq_ci(const struct fake_mlx5 *f) { return get_be32(f->dbrec + 64); }
static inline uint32_t fake_dbrec_cq_arm(const struct fake_mlx5 *f) { return get_be32(f->dbrec + 68); }

/* The 64-byte CQE of consumer index `ci` (second half of a 128-byte slot). */
static inline uint8_t *fake_cqe(struct fake_mlx5 *f, uint32_t ci)
{
    size_t slot = ci & (f->geo.cqe_cnt - 1);
    return f->cq_buf + slot * f->geo.cqe_size + f->geo.cqe_size - 64;
}

/*
 * Writes a CQE as the device would (reference A.8): bytes 0..62 first, then
 * op_own = opcode << 4 with the owner bit of pass `ci` (flips every lap).
 */
static inline void fake_write_cqe(struct fake_mlx5 *f, uint32_t ci, const uint8_t cqe[64],
                                  uint8_t opcode)
{
    uint8_t *dst = fake_cqe(f, ci);
    uint8_t owner = (ci & f->geo.cqe_cnt) ? 1 : 0;
    memcpy(dst, cqe, 63);
    dst[63] = (uint8_t)(opcode << 4 | owner);
}

/* A requester CQE image for WQE `wqe_counter` with mlx5 opcode `wqe_op`. */
static inline void cqe_req(uint8_t cqe[64], uint32_t qpn, uint8_t wqe_op, uint16_t wqe_counter,
                           uint32_t byte_cnt)
{
    memset(cqe, 0, 64);
    put_be32(cqe + 44, byte_cnt);
    put_be32(cqe + 56, (uint32_t)wqe_op << 24 | qpn);
    put_be16(cqe + 60, wqe_counter);
}

#endif /* RDD_FFI_TESTS_HARNESS_H */
