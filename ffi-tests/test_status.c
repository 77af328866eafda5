/*
 * C11 tests of the status codes, rdd_status_str, rdd_version and the ABI
 * sizes the header promises.
 */
#include <stddef.h>

#include "harness.h"

/* ---- C-side layout assertions (cbindgen cannot emit these) -------------- */

_Static_assert(sizeof(rdd_status) == 4, "rdd_status is a uint32_t");
_Static_assert(sizeof(rdd_mlx5_sq_storage) == RDD_MLX5_SQ_STORAGE_SIZE, "SQ storage size");
_Static_assert(_Alignof(rdd_mlx5_sq_storage) == RDD_MLX5_SQ_STORAGE_ALIGN, "SQ storage align");
_Static_assert(sizeof(rdd_mlx5_rq_storage) == RDD_MLX5_RQ_STORAGE_SIZE, "RQ storage size");
_Static_assert(_Alignof(rdd_mlx5_rq_storage) == RDD_MLX5_RQ_STORAGE_ALIGN, "RQ storage align");
_Static_assert(sizeof(rdd_mlx5_cq_storage) == RDD_MLX5_CQ_STORAGE_SIZE, "CQ storage size");
_Static_assert(_Alignof(rdd_mlx5_cq_storage) == RDD_MLX5_CQ_STORAGE_ALIGN, "CQ storage align");
_Static_assert(sizeof(rdd_mlx5_sq_slot) == 16 && _Alignof(rdd_mlx5_sq_slot) == 8, "SQ slot");
_Static_assert(sizeof(rdd_sge) == 16, "rdd_sge mirrors struct ibv_sge");
_Static_assert(sizeof(rdd_wc) == 48, "rdd_wc is 48 bytes");
_Static_assert(offsetof(rdd_wc, status) == 8 && offsetof(rdd_wc, byte_len) == 20, "rdd_wc");
_Static_assert(offsetof(rdd_wc, wc_flags) == 36 && offsetof(rdd_wc, pkey_index) == 40, "rdd_wc");
_Static_assert(offsetof(rdd_wc, syndrome) == 46, "rdd_wc");
#if UINTPTR_MAX == 0xffffffffffffffffu
_Static_assert(sizeof(rdd_wr) == 64, "rdd_wr is 64 bytes on LP64");
_Static_assert(offsetof(rdd_wr, remote_addr) == 32 && offsetof(rdd_wr, swap) == 56, "rdd_wr");
_Static_assert(sizeof(rdd_recv_wr) == 24, "rdd_recv_wr");
_Static_assert(sizeof(rdd_mlx5dv_qp) == 96, "mirrors struct mlx5dv_qp");
_Static_assert(offsetof(rdd_mlx5dv_qp, bf_reg) == 40, "mlx5dv_qp.bf.reg");
_Static_assert(offsetof(rdd_mlx5dv_qp, tir_icm_addr) == 88, "mlx5dv_qp.tir_icm_addr");
_Static_assert(sizeof(rdd_mlx5dv_cq) == 48, "mirrors struct mlx5dv_cq");
_Static_assert(offsetof(rdd_mlx5dv_cq, cqn) == 32, "mlx5dv_cq.cqn");
#endif

/* Crate error codes keep their numbers; C-boundary codes are 2001.. */
_Static_assert(RDD_STATUS_OK == 0, "success is zero");
_Static_assert(RDD_STATUS_TOO_MANY_SGES == 1001, "stable code");
_Static_assert(RDD_STATUS_SQ_FULL == 1101, "stable code");
_Static_assert(RDD_STATUS_INVALID_GEOMETRY == 1201, "stable code");
_Static_assert(RDD_STATUS_CQE_CORRUPT == 1302, "stable code");
_Static_assert(RDD_STATUS_NULL_PARAMETER == 2001, "stable code");
_Static_assert(RDD_STATUS_INVALID_HANDLE == 2002, "stable code");
_Static_assert(RDD_STATUS_BUFFER_TOO_SMALL == 2003, "stable code");
_Static_assert(RDD_STATUS_PANIC == 2004, "stable code");
_Static_assert(RDD_STATUS_INVALID_ARGUMENT == 2005, "stable code");

/* ibv_wr_opcode / ibv_send_flags numbering. */
_Static_assert(RDD_WR_RDMA_WRITE == 0 && RDD_WR_SEND == 2 && RDD_WR_RDMA_READ == 4, "opcodes");
_Static_assert(RDD_WR_ATOMIC_FETCH_AND_ADD == 6 && RDD_WR_SEND_WITH_INV == 9, "opcodes");
_Static_assert(RDD_SEND_SIGNALED == 2 && RDD_SEND_INLINE == 8, "send flags");

static const uint32_t ALL_CODES[] = {
    RDD_STATUS_OK,
    RDD_STATUS_TOO_MANY_SGES,
    RDD_STATUS_INLINE_TOO_LARGE,
    RDD_STATUS_INLINE_NOT_ALLOWED,
    RDD_STATUS_ATOMIC_SGE_LENGTH,
    RDD_STATUS_ATOMIC_UNALIGNED,
    RDD_STATUS_LENGTH_OVERFLOW,
    RDD_STATUS_INVALID_OPCODE,
    RDD_STATUS_INVALID_FLAGS,
    RDD_STATUS_NULL_POINTER,
    RDD_STATUS_INVALID_IMMEDIATE,
    RDD_STATUS_EXCEEDS_MTU,
    RDD_STATUS_SQ_FULL,
    RDD_STATUS_RQ_FULL,
    RDD_STATUS_INVALID_QP_STATE,
    RDD_STATUS_INVALID_GEOMETRY,
    RDD_STATUS_STORAGE_TOO_SMALL,
    RDD_STATUS_INVALID_QPN,
    RDD_STATUS_CQE_COMPRESSED,
    RDD_STATUS_CQE_CORRUPT,
    RDD_STATUS_NULL_PARAMETER,
    RDD_STATUS_INVALID_HANDLE,
    RDD_STATUS_BUFFER_TOO_SMALL,
    RDD_STATUS_PANIC,
    RDD_STATUS_INVALID_ARGUMENT,
};

static void test_version(void)
{
    char want[64];
    const char *v = rdd_version();
    CHECK(v != NULL);
    snprintf(want, sizeof(want), "%u.%u.%u", (unsigned)RDD_VERSION_MAJOR,
             (unsigned)RDD_VERSION_MINOR, (unsigned)RDD_VERSION_PATCH);
    /* The string may carry a pre-release suffix after the numbers. */
    CHECK(v != NULL && strncmp(v, want, strlen(want)) == 0);
    CHECK(rdd_version() == v); /* static, same pointer every time */
}

static void test_every_code_has_a_message(void)
{
    size_t i;
    char buf[256];
    char other[256];
    for (i = 0; i < sizeof(ALL_CODES) / sizeof(ALL_CODES[0]); i++) {
        size_t n = 0;
        rdd_status s = rdd_status_str(ALL_CODES[i], buf, sizeof(buf), &n);
        CHECK_EQ(s, RDD_STATUS_OK);
        CHECK(n > 1 && n <= sizeof(buf));
        CHECK_EQ(strlen(buf) + 1, n);
        /* Known codes never get the fallback text. */
        CHECK(strcmp(buf, "unknown rdd_status value") != 0);
        /* Distinct codes, distinct messages (compare with the next one). */
        if (i + 1 < sizeof(ALL_CODES) / sizeof(ALL_CODES[0])) {
            size_t m = 0;
            CHECK_EQ(rdd_status_str(ALL_CODES[i + 1], other, sizeof(other), &m), RDD_STATUS_OK);
            CHECK(strcmp(buf, other) != 0);
        }
    }
    {
        size_t n = 0;
        CHECK_EQ(rdd_status_str(RDD_STATUS_OK, buf, sizeof(buf), &n), RDD_STATUS_OK);
        CHECK(strcmp(buf, "success") == 0);
        CHECK_EQ(n, 8);
    }
}

static void test_unknown_values(void)
{
    static const uint32_t unknown[] = {1, 999, 1000, 1012, 1999, 2000, 2006, 7001, 0xffffffffu};
    size_t i;
    char buf[64];
    for (i = 0; i < sizeof(unknown) / sizeof(unknown[0]); i++) {
        size_t n = 0;
        CHECK_EQ(rdd_status_str(unknown[i], buf, sizeof(buf), &n), RDD_STATUS_OK);
        CHECK(strcmp(buf, "unknown rdd_status value") == 0);
        CHECK_EQ(n, strlen("unknown rdd_status value") + 1);
    }
}

static void test_truncation(void)
{
    char full[256];
    char small[256];
    size_t need = 0;
    size_t n;

    CHECK_EQ(rdd_status_str(RDD_STATUS_SQ_FULL, full, sizeof(full), &need), RDD_STATUS_OK);
    CHECK(need > 1);

    /* One byte short: BUFFER_TOO_SMALL, the buffer is left alone, *out_n is
     * the size needed. */
    memset(small, 'X', sizeof(small));
    n = 0;
    CHECK_EQ(rdd_status_str(RDD_STATUS_SQ_FULL, small, need - 1, &n), RDD_STATUS_BUFFER_TOO_SMALL);
    CHECK_EQ(n, need);
    CHECK(small[0] == 'X' && small[need - 2] == 'X' && small[need - 1] == 'X');

    /* Size query with no buffer. */
    n = 0;
    CHECK_EQ(rdd_status_str(RDD_STATUS_SQ_FULL, NULL, 0, &n), RDD_STATUS_BUFFER_TOO_SMALL);
    CHECK_EQ(n, need);

    /* Exactly enough. */
    n = 0;
    CHECK_EQ(rdd_status_str(RDD_STATUS_SQ_FULL, small, need, &n), RDD_STATUS_OK);
    CHECK_EQ(n, need);
    CHECK(strcmp(small, full) == 0);
    CHECK(small[need] == 'X'); /* nothing past the NUL */
}

static void test_null_parameters(void)
{
    char buf[32];
    size_t n = 12345;
    memset(buf, 'Y', sizeof(buf));
    CHECK_EQ(rdd_status_str(RDD_STATUS_OK, buf, sizeof(buf), NULL), RDD_STATUS_NULL_PARAMETER);
    CHECK(buf[0] == 'Y');
    CHECK_EQ(rdd_status_str(RDD_STATUS_OK, NULL, sizeof(buf), &n), RDD_STATUS_NULL_PARAMETER);
    CHECK_EQ(n, 12345);
}

int main(void)
{
    test_version();
    test_every_code_has_a_message();
    test_unknown_values();
    test_truncation();
    test_null_parameters();
    return h_finish("test_status");
}
