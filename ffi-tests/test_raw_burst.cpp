// C++17 test of the bursts (rdd_mlx5_sq_write_burst, rdd_mlx5_sq_read_burst)
// through the header: the layout of rdd_rdma_op, the bytes against the same
// operations posted one by one (twin queues), one doorbell per burst, n = 0,
// the doorbell bit on the last descriptor, and every bad-input status with
// *out_posted.
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <type_traits>
#include <vector>

#include "harness.h"
#include "raw_queues.hpp"

static_assert(sizeof(rdd_rdma_op) == 40, "rdd_rdma_op is 40 bytes");
static_assert(offsetof(rdd_rdma_op, length) == 24 && offsetof(rdd_rdma_op, flags) == 36,
              "rdd_rdma_op has no padding");
static_assert(std::is_standard_layout<rdd_rdma_op>::value, "a plain C struct");

namespace {

using raw_queues::Queues;

constexpr uint32_t kQpn = 0x1c5;
constexpr uint32_t kSentinel = 0x5a5a5a5a;
const rdd_qp_caps kCaps{4, 60, 4};

using BurstFn = rdd_status (*)(rdd_mlx5_sq_storage *, const rdd_rdma_op *, uint32_t, uint32_t *);
using OneFn = rdd_status (*)(rdd_mlx5_sq_storage *, uint64_t, uint64_t, uint32_t, uint32_t,
                             uint64_t, uint32_t, uint32_t);

struct Kind {
    const char *name;
    BurstFn burst;
    OneFn one;
};
const std::array<Kind, 2> kKinds{{{"write", rdd_mlx5_sq_write_burst, rdd_mlx5_sq_write},
                                  {"read", rdd_mlx5_sq_read_burst, rdd_mlx5_sq_read}}};


std::vector<rdd_rdma_op> make_ops(uint32_t n, uint32_t seed)
{
    static const uint32_t kFlags[] = {0, RDD_SEND_SIGNALED, RDD_SEND_FENCE | RDD_SEND_SOLICITED,
                                      RDD_SEND_DEFER_DOORBELL,
                                      RDD_SEND_SIGNALED | RDD_SEND_FENCE | RDD_SEND_SOLICITED};
    static const uint32_t kLengths[] = {8, 0, 4096, 0x7fffffff};
    std::vector<rdd_rdma_op> v(n);
    for (uint32_t i = 0; i < n; i++) {
        const uint32_t x = seed + i;
        v[i].wr_id = 0x100 + x;
        v[i].laddr = 0x7f5a3c003000ull + 64 * x;
        v[i].raddr = 0x7e0011220040ull + 128 * x;
        v[i].length = kLengths[x % 4];
        v[i].lkey = 0xa1b2c3 + x;
        v[i].rkey = 0x0badcafe - x;
        v[i].flags = kFlags[(3 * x) % 5];
    }
    return v;
}

// The same descriptors one per call: all but the last deferred.
void one_by_one(const Kind &k, Queues &q, const std::vector<rdd_rdma_op> &ops, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        const rdd_rdma_op &o = ops[i];
        const uint32_t fl = i + 1 < n ? (o.flags | RDD_SEND_DEFER_DOORBELL) : o.flags;
        CHECK_EQ(k.one(q.sq.get(), o.wr_id, o.laddr, o.length, o.lkey, o.raddr, o.rkey, fl),
                 RDD_STATUS_OK);
    }
}

void same_bytes(const Kind &k)
{
    for (uint32_t n : {1u, 16u, 3u}) {
        Queues a, b;
        uint32_t pi = 0;
        for (uint32_t round = 0; round < 3; round++) {
            std::vector<rdd_rdma_op> ops = make_ops(n, round * 7 + n);
            uint32_t posted = kSentinel;
            CHECK_EQ(k.burst(a.sq.get(), ops.data(), n, &posted), RDD_STATUS_OK);
            CHECK_EQ(posted, n);
            one_by_one(k, b, ops, n);
            CHECK(a.state() == b.state());
            pi += n;
            if (ops.back().flags & RDD_SEND_DEFER_DOORBELL) {
                CHECK_EQ(a.db(), pi - n);
                CHECK_EQ(rdd_mlx5_sq_ring(a.sq.get()), RDD_STATUS_OK);
                CHECK_EQ(rdd_mlx5_sq_ring(b.sq.get()), RDD_STATUS_OK);
                CHECK(a.state() == b.state());
            }
            CHECK_EQ(a.db(), pi);
        }
    }
}

void doorbells(const Kind &k)
{
    Queues q;
    const size_t half = q.f.geo.bf_size;
    std::vector<rdd_rdma_op> ops = make_ops(16, 0);
    for (rdd_rdma_op &o : ops) {
        o.flags = 0;
    }
    // One doorbell for 16: the record moves once, one half of the register
    // pair gets the last WQE's 8 control bytes, the other stays zero.
    CHECK_EQ(k.burst(q.sq.get(), ops.data(), 16, nullptr), RDD_STATUS_OK);
    CHECK_EQ(q.db(), 16u);
    CHECK_BYTES(q.f.bf, q.f.sq + 15 * 64, 8);
    const std::vector<uint8_t> zero(2 * half, 0);
    CHECK_BYTES(q.f.bf + 8, zero.data(), 2 * half - 8);
    // n = 0 rings what deferred per-opcode calls left, posts nothing.
    const rdd_rdma_op &o = ops[0];
    CHECK_EQ(k.one(q.sq.get(), 1, o.laddr, 8, o.lkey, o.raddr, o.rkey, RDD_SEND_DEFER_DOORBELL),
             RDD_STATUS_OK);
    CHECK_EQ(k.one(q.sq.get(), 2, o.laddr, 8, o.lkey, o.raddr, o.rkey, RDD_SEND_DEFER_DOORBELL),
             RDD_STATUS_OK);
    CHECK_EQ(q.db(), 16u);
    uint32_t posted = kSentinel;
    CHECK_EQ(k.burst(q.sq.get(), ops.data(), 0, &posted), RDD_STATUS_OK);
    CHECK_EQ(posted, 0u);
    CHECK_EQ(q.db(), 18u);
    CHECK_BYTES(q.f.bf + half, q.f.sq + 17 * 64, 8);
    // Nothing pending: n = 0 changes nothing.
    const std::vector<uint8_t> before = q.state();
    CHECK_EQ(k.burst(q.sq.get(), ops.data(), 0, nullptr), RDD_STATUS_OK);
    CHECK(q.state() == before);
    // The doorbell bit on the last descriptor defers; on another, ignored.
    ops[3].flags = RDD_SEND_DEFER_DOORBELL;
    CHECK_EQ(k.burst(q.sq.get(), ops.data(), 4, nullptr), RDD_STATUS_OK);
    CHECK_EQ(q.db(), 18u);
    CHECK_EQ(k.burst(q.sq.get(), ops.data(), 3, nullptr), RDD_STATUS_OK);
    CHECK_EQ(q.db(), 25u);
    ops[3].flags = 0;
    ops[1].flags = RDD_SEND_DEFER_DOORBELL;
    CHECK_EQ(k.burst(q.sq.get(), ops.data(), 4, nullptr), RDD_STATUS_OK);
    CHECK_EQ(q.db(), 29u);
}

// Refused before any descriptor: the status, *out_posted untouched,
// nothing written, and a WQE deferred before still pending.
void untouched(const Kind &k, Queues &q, rdd_mlx5_sq_storage *sq, const rdd_rdma_op *ops,
               uint32_t n, rdd_status want)
{
    CHECK_EQ(rdd_mlx5_sq_send(q.sq.get(), 9, 0x1000, 8, 1, RDD_SEND_DEFER_DOORBELL), RDD_STATUS_OK);
    const uint32_t db = q.db();
    const std::vector<uint8_t> before = q.state();
    uint32_t posted = kSentinel;
    CHECK_EQ(k.burst(sq, ops, n, &posted), want);
    CHECK_EQ(posted, kSentinel);
    CHECK_EQ(k.burst(sq, ops, n, nullptr), want);
    CHECK(q.state() == before);
    CHECK_EQ(rdd_mlx5_sq_ring(q.sq.get()), RDD_STATUS_OK);
    CHECK_EQ(q.db(), db + 1);
}

void bad_inputs(const Kind &k)
{
    static rdd_mlx5_sq_storage zero_sq; // zero-initialised: never a live handle
    std::vector<rdd_rdma_op> ops = make_ops(17, 0);
    for (rdd_rdma_op &o : ops) {
        o.flags = 0;
        o.length = 8;
    }
    const auto *misaligned = reinterpret_cast<const rdd_rdma_op *>(
        reinterpret_cast<const unsigned char *>(ops.data()) + 4);
    {
        Queues q(256);
        for (uint32_t n : {0u, 1u, 16u}) {
            untouched(k, q, nullptr, ops.data(), n, RDD_STATUS_NULL_PARAMETER);
            untouched(k, q, q.sq.get(), nullptr, n, RDD_STATUS_NULL_PARAMETER);
            untouched(k, q, q.sq.get(), misaligned, n, RDD_STATUS_INVALID_ARGUMENT);
            untouched(k, q, &zero_sq, ops.data(), n, RDD_STATUS_INVALID_HANDLE);
        }
        MUST(rdd_mlx5_sq_fini(q.sq.get()));
        for (uint32_t n : {0u, 1u, 16u}) {
            uint32_t posted = kSentinel;
            CHECK_EQ(k.burst(q.sq.get(), ops.data(), n, &posted), RDD_STATUS_INVALID_HANDLE);
            CHECK_EQ(posted, kSentinel);
        }
    }
    // Per descriptor, at index 0 and at index 5 of 16: *out_posted is the
    // index, the ones before it are written and rung, nothing of it.
    for (uint32_t bad : {0u, 5u}) {
        for (int what = 0; what < 2; what++) {
            Queues q;
            std::vector<rdd_rdma_op> v = ops;
            rdd_status want = RDD_STATUS_INVALID_FLAGS;
            if (what == 0) {
                v[bad].flags = 0x20000000; // bit 29: no such flag
            } else {
                v[bad].length = 0x80000000u;
                want = RDD_STATUS_LENGTH_OVERFLOW;
            }
            uint32_t posted = kSentinel;
            CHECK_EQ(k.burst(q.sq.get(), v.data(), 16, &posted), want);
            CHECK_EQ(posted, bad);
            CHECK_EQ(q.db(), bad);
            const std::vector<uint8_t> zero(64, 0);
            CHECK_BYTES(q.f.sq + size_t{bad} * 64, zero.data(), 64);
        }
    }
    // SQ_FULL after 8 of 16 on an 8-BB ring; all rung.
    {
        Queues q(8);
        uint32_t posted = kSentinel;
        CHECK_EQ(k.burst(q.sq.get(), ops.data(), 16, &posted), RDD_STATUS_SQ_FULL);
        CHECK_EQ(posted, 8u);
        CHECK_EQ(q.db(), 8u);
        posted = kSentinel;
        CHECK_EQ(k.burst(q.sq.get(), ops.data(), 1, &posted), RDD_STATUS_SQ_FULL);
        CHECK_EQ(posted, 0u);
    }
    // A queue without SGEs.
    {
        const rdd_qp_caps no_sge{0, 60, 0};
        Queues q(64, no_sge);
        const std::vector<uint8_t> before = q.state();
        for (uint32_t n : {1u, 16u}) {
            uint32_t posted = kSentinel;
            CHECK_EQ(k.burst(q.sq.get(), ops.data(), n, &posted), RDD_STATUS_TOO_MANY_SGES);
            CHECK_EQ(posted, 0u);
        }
        CHECK(q.state() == before);
    }
}

} // namespace

int main()
{
    for (const Kind &k : kKinds) {
        same_bytes(k);
        doorbells(k);
        bad_inputs(k);
    }
    return h_finish("test_raw_burst_cpp");
}
