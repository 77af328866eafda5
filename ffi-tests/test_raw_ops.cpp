// C++17 test of the per-opcode raw posts and the bound poll through the
// header: every new function from C++, the bytes against rdd_mlx5_sq_post
// of the equivalent rdd_wr (twin queues), doorbell deferral, every
// bad-input status, and the bound poll's negative returns.
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <type_traits>
#include <vector>

#include "harness.h"
#include "raw_queues.hpp"

static_assert(std::is_same<decltype(rdd_mlx5_cq_poll_bound(nullptr, nullptr, 0)), int32_t>::value,
              "the bound poll returns int32_t");
static_assert((RDD_SEND_DEFER_DOORBELL &
               (RDD_SEND_FENCE | RDD_SEND_SIGNALED | RDD_SEND_SOLICITED | RDD_SEND_INLINE)) == 0,
              "the doorbell bit is not a work-request flag");

namespace {

using raw_queues::Queues;

constexpr uint32_t kQpn = 0x1c5;
constexpr uint64_t kLaddr = 0x7f5a3c003000ull;
constexpr uint32_t kLkey = 0xa1b2c3;
constexpr uint64_t kRaddr = 0x7e0011220040ull;
constexpr uint32_t kRkey = 0x0badcafe;
const rdd_qp_caps kCaps{4, 60, 4};
const std::array<uint8_t, 64> kPayload = [] {
    std::array<uint8_t, 64> p{};
    for (size_t i = 0; i < p.size(); i++) {
        p[i] = static_cast<uint8_t>(0x30 + i);
    }
    return p;
}();


// A per-opcode call (with its arguments bound) and the equivalent rdd_wr.
struct Case {
    const char *name;
    std::function<rdd_status(rdd_mlx5_sq_storage *, uint32_t length, uint32_t flags)> call;
    uint32_t opcode;
    bool inline_payload;
    bool atomic;
};

std::vector<Case> cases()
{
    const void *data = kPayload.data();
    return {
        {"write",
         [](rdd_mlx5_sq_storage *sq, uint32_t len, uint32_t fl) {
             return rdd_mlx5_sq_write(sq, 1, kLaddr, len, kLkey, kRaddr, kRkey, fl);
         },
         RDD_WR_RDMA_WRITE, false, false},
        {"write_imm",
         [](rdd_mlx5_sq_storage *sq, uint32_t len, uint32_t fl) {
             return rdd_mlx5_sq_write_imm(sq, 1, kLaddr, len, kLkey, kRaddr, kRkey, 0x1234, fl);
         },
         RDD_WR_RDMA_WRITE_WITH_IMM, false, false},
        {"read",
         [](rdd_mlx5_sq_storage *sq, uint32_t len, uint32_t fl) {
             return rdd_mlx5_sq_read(sq, 1, kLaddr, len, kLkey, kRaddr, kRkey, fl);
         },
         RDD_WR_RDMA_READ, false, false},
        {"send",
         [](rdd_mlx5_sq_storage *sq, uint32_t len, uint32_t fl) {
             return rdd_mlx5_sq_send(sq, 1, kLaddr, len, kLkey, fl);
         },
         RDD_WR_SEND, false, false},
        {"send_imm",
         [](rdd_mlx5_sq_storage *sq, uint32_t len, uint32_t fl) {
             return rdd_mlx5_sq_send_imm(sq, 1, kLaddr, len, kLkey, 0x1234, fl);
         },
         RDD_WR_SEND_WITH_IMM, false, false},
        {"write_inline",
         [data](rdd_mlx5_sq_storage *sq, uint32_t len, uint32_t fl) {
             return rdd_mlx5_sq_write_inline(sq, 1, data, len, kRaddr, kRkey, fl);
         },
         RDD_WR_RDMA_WRITE, true, false},
        {"send_inline",
         [data](rdd_mlx5_sq_storage *sq, uint32_t len, uint32_t fl) {
             return rdd_mlx5_sq_send_inline(sq, 1, data, len, fl);
         },
         RDD_WR_SEND, true, false},
        {"fetch_add",
         [](rdd_mlx5_sq_storage *sq, uint32_t, uint32_t fl) {
             return rdd_mlx5_sq_fetch_add(sq, 1, kLaddr, kLkey, kRaddr, kRkey, 5, fl);
         },
         RDD_WR_ATOMIC_FETCH_AND_ADD, false, true},
        {"cmp_swap",
         [](rdd_mlx5_sq_storage *sq, uint32_t, uint32_t fl) {
             return rdd_mlx5_sq_cmp_swap(sq, 1, kLaddr, kLkey, kRaddr, kRkey, 5, 6, fl);
         },
         RDD_WR_ATOMIC_CMP_AND_SWP, false, true},
    };
}

rdd_status post_equivalent(rdd_mlx5_sq_storage *sq, const Case &c, uint32_t len, uint32_t flags)
{
    rdd_sge sge{kLaddr, c.atomic ? 8u : len, kLkey};
    if (c.inline_payload) {
        sge = rdd_sge{static_cast<uint64_t>(reinterpret_cast<uintptr_t>(kPayload.data())), len, 0};
    }
    rdd_wr w{};
    w.wr_id = 1;
    w.sg_list = &sge;
    w.num_sge = 1;
    w.opcode = c.opcode;
    w.flags = (flags & ~uint32_t{RDD_SEND_DEFER_DOORBELL}) | (c.inline_payload ? RDD_SEND_INLINE : 0u);
    w.imm_data = (c.opcode == RDD_WR_RDMA_WRITE_WITH_IMM || c.opcode == RDD_WR_SEND_WITH_IMM) ? 0x1234 : 0;
    w.remote_addr = kRaddr;
    w.rkey = kRkey;
    w.compare_add = 5;
    w.swap = 6;
    size_t bad = 0;
    rdd_status s = rdd_mlx5_sq_post(sq, &w, 1, &bad);
    if (s == RDD_STATUS_OK && (flags & RDD_SEND_DEFER_DOORBELL) == 0) {
        s = rdd_mlx5_sq_ring(sq);
    }
    return s;
}

void same_bytes_and_deferral()
{
    for (const Case &c : cases()) {
        Queues a, b;
        for (uint32_t flags : {uint32_t{RDD_SEND_DEFER_DOORBELL}, uint32_t{RDD_SEND_SIGNALED},
                               uint32_t{RDD_SEND_FENCE | RDD_SEND_DEFER_DOORBELL}, 0u}) {
            for (uint32_t len : {8u, 0u, 33u}) {
                CHECK_EQ(c.call(a.sq.get(), len, flags), RDD_STATUS_OK);
                CHECK_EQ(post_equivalent(b.sq.get(), c, len, flags), RDD_STATUS_OK);
                CHECK(a.state() == b.state());
            }
            if (flags == RDD_SEND_DEFER_DOORBELL) {
                // Only deferred posts so far: no record, no register write.
                CHECK_EQ(fake_dbrec_sq(&a.f), 0u);
                const std::array<uint8_t, 512> zero{};
                CHECK_BYTES(a.f.bf, zero.data(), zero.size());
            }
        }
        CHECK(fake_dbrec_sq(&a.f) >= 12u); /* every WQE rung, one BB or more each */
    }
}

// `call` must return `want` and change nothing.
void refused(Queues &q, const std::function<rdd_status()> &call, rdd_status want)
{
    const std::vector<uint8_t> before = q.state();
    CHECK_EQ(call(), want);
    CHECK(q.state() == before);
}

void bad_inputs()
{
    Queues q(8);
    Queues no_sge(8, rdd_qp_caps{0, 60, 0});
    rdd_mlx5_sq_storage zero{};
    for (const Case &c : cases()) {
        auto with = [&](rdd_mlx5_sq_storage *sq, uint32_t len, uint32_t fl) {
            return [&c, sq, len, fl] { return c.call(sq, len, fl); };
        };
        CHECK_EQ(c.call(nullptr, 8, 0), RDD_STATUS_NULL_PARAMETER);
        refused(q, with(&zero, 8, 0), RDD_STATUS_INVALID_HANDLE);
        refused(q, with(q.sq.get(), 8, 0x10), RDD_STATUS_INVALID_FLAGS);
        if (!c.inline_payload) {
            refused(q, with(q.sq.get(), 8, RDD_SEND_INLINE), RDD_STATUS_INVALID_FLAGS);
            refused(no_sge, with(no_sge.sq.get(), 8, 0), RDD_STATUS_TOO_MANY_SGES);
        }
        if (!c.atomic) {
            refused(q, with(q.sq.get(), 0x80000001u, 0), RDD_STATUS_LENGTH_OVERFLOW);
        }
        if (c.inline_payload) {
            refused(q, with(q.sq.get(), 61, 0), RDD_STATUS_INLINE_TOO_LARGE);
        }
    }
    // Inline payload NULL, atomic misaligned.
    refused(q, [&] { return rdd_mlx5_sq_send_inline(q.sq.get(), 1, nullptr, 4, 0); },
            RDD_STATUS_NULL_POINTER);
    refused(q, [&] { return rdd_mlx5_sq_write_inline(q.sq.get(), 1, nullptr, 4, kRaddr, kRkey, 0); },
            RDD_STATUS_NULL_POINTER);
    refused(q, [&] { return rdd_mlx5_sq_fetch_add(q.sq.get(), 1, kLaddr, kLkey, kRaddr + 2, kRkey, 1, 0); },
            RDD_STATUS_ATOMIC_UNALIGNED);
    refused(q, [&] { return rdd_mlx5_sq_cmp_swap(q.sq.get(), 1, kLaddr, kLkey, kRaddr + 4, kRkey, 1, 2, 0); },
            RDD_STATUS_ATOMIC_UNALIGNED);
    // A full ring (8 BBs): every opcode is SQ_FULL.
    for (int i = 0; i < 8; i++) {
        CHECK_EQ(rdd_mlx5_sq_send(q.sq.get(), 1, kLaddr, 8, kLkey, RDD_SEND_DEFER_DOORBELL), RDD_STATUS_OK);
    }
    for (const Case &c : cases()) {
        refused(q, [&] { return c.call(q.sq.get(), 8, 0); }, RDD_STATUS_SQ_FULL);
    }
    CHECK_EQ(rdd_mlx5_sq_ring(q.sq.get()), RDD_STATUS_OK);
    CHECK_EQ(fake_dbrec_sq(&q.f), 8u);
    CHECK_EQ(rdd_mlx5_sq_ring(nullptr), RDD_STATUS_NULL_PARAMETER);

    // Receives.
    rdd_mlx5_rq_storage zero_rq{};
    CHECK_EQ(rdd_mlx5_rq_recv(nullptr, 1, 0x5000, 8, 1, 0), RDD_STATUS_NULL_PARAMETER);
    refused(q, [&] { return rdd_mlx5_rq_recv(&zero_rq, 1, 0x5000, 8, 1, 0); }, RDD_STATUS_INVALID_HANDLE);
    refused(q, [&] { return rdd_mlx5_rq_recv(q.rq.get(), 1, 0x5000, 8, 1, RDD_SEND_SIGNALED); },
            RDD_STATUS_INVALID_FLAGS);
    refused(q, [&] { return rdd_mlx5_rq_recv(q.rq.get(), 1, 0x5000, 0x80000000u, 1, 0); },
            RDD_STATUS_LENGTH_OVERFLOW);
    refused(no_sge, [&] { return rdd_mlx5_rq_recv(no_sge.rq.get(), 1, 0x5000, 8, 1, 0); },
            RDD_STATUS_TOO_MANY_SGES);
    for (uint64_t i = 0; i < 16; i++) {
        CHECK_EQ(rdd_mlx5_rq_recv(q.rq.get(), i, 0x5000, 8, 1, RDD_SEND_DEFER_DOORBELL), RDD_STATUS_OK);
    }
    CHECK_EQ(fake_dbrec_rq(&q.f), 0u); // all deferred: nothing published
    refused(q, [&] { return rdd_mlx5_rq_recv(q.rq.get(), 16, 0x5000, 8, 1, 0); }, RDD_STATUS_RQ_FULL);
    CHECK_EQ(rdd_mlx5_rq_ring(nullptr), RDD_STATUS_NULL_PARAMETER);
    CHECK_EQ(rdd_mlx5_rq_ring(&zero_rq), RDD_STATUS_INVALID_HANDLE);
    CHECK_EQ(rdd_mlx5_rq_ring(q.rq.get()), RDD_STATUS_OK);
    CHECK_EQ(fake_dbrec_rq(&q.f), 16u);
}

void bound_poll()
{
    Queues q;
    rdd_mlx5_cq_storage zero_cq{};
    std::array<rdd_wc, 4> wc{};
    auto neg = [](rdd_status s) { return -static_cast<int32_t>(s); };

    CHECK_EQ(rdd_mlx5_cq_poll_bound(q.cq.get(), wc.data(), 4), neg(RDD_STATUS_NO_SUCH_OBJECT));
    CHECK_EQ(rdd_mlx5_cq_bind(nullptr, q.sq.get(), q.rq.get()), RDD_STATUS_NULL_PARAMETER);
    CHECK_EQ(rdd_mlx5_cq_bind(q.cq.get(), nullptr, q.rq.get()), RDD_STATUS_NULL_PARAMETER);
    CHECK_EQ(rdd_mlx5_cq_bind(q.cq.get(), q.sq.get(), nullptr), RDD_STATUS_NULL_PARAMETER);
    CHECK_EQ(rdd_mlx5_cq_bind(&zero_cq, q.sq.get(), q.rq.get()), RDD_STATUS_INVALID_HANDLE);
    CHECK_EQ(rdd_mlx5_cq_bind(q.cq.get(), reinterpret_cast<rdd_mlx5_sq_storage *>(q.cq.get()), q.rq.get()),
             RDD_STATUS_INVALID_HANDLE);
    CHECK_EQ(rdd_mlx5_cq_bind(q.cq.get(), q.sq.get(), reinterpret_cast<rdd_mlx5_rq_storage *>(q.cq.get())),
             RDD_STATUS_INVALID_HANDLE);
    CHECK_EQ(rdd_mlx5_cq_bind(q.cq.get(), q.sq.get(), q.rq.get()), RDD_STATUS_OK);

    CHECK_EQ(rdd_mlx5_cq_poll_bound(nullptr, wc.data(), 4), neg(RDD_STATUS_NULL_PARAMETER));
    CHECK_EQ(rdd_mlx5_cq_poll_bound(&zero_cq, wc.data(), 4), neg(RDD_STATUS_INVALID_HANDLE));
    CHECK_EQ(rdd_mlx5_cq_poll_bound(q.cq.get(), nullptr, 0), neg(RDD_STATUS_NULL_PARAMETER));
    CHECK_EQ(rdd_mlx5_cq_poll_bound(q.cq.get(), wc.data(), 0x80000000u), neg(RDD_STATUS_INVALID_ARGUMENT));
    alignas(8) std::array<uint8_t, 2 * sizeof(rdd_wc)> raw{};
    CHECK_EQ(rdd_mlx5_cq_poll_bound(q.cq.get(), reinterpret_cast<rdd_wc *>(raw.data() + 4), 1),
             neg(RDD_STATUS_INVALID_ARGUMENT));

    CHECK_EQ(rdd_mlx5_sq_fetch_add(q.sq.get(), 42, kLaddr, kLkey, kRaddr, kRkey, 1, RDD_SEND_SIGNALED),
             RDD_STATUS_OK);
    uint8_t cqe[64];
    cqe_req(cqe, kQpn, 0x12, 0, 8);
    fake_write_cqe(&q.f, 0, cqe, 0);
    CHECK_EQ(rdd_mlx5_cq_poll_bound(q.cq.get(), wc.data(), 0), 0);
    CHECK_EQ(rdd_mlx5_cq_poll_bound(q.cq.get(), wc.data(), 4), 1);
    CHECK_EQ(wc[0].wr_id, 42u);
    CHECK_EQ(wc[0].opcode, RDD_WC_OP_FETCH_ADD);
    CHECK_EQ(wc[0].byte_len, 8u);
    // A corrupt CQE and a compressed one.
    cqe_req(cqe, kQpn, 0x08, 9, 0);
    fake_write_cqe(&q.f, 1, cqe, 0);
    CHECK_EQ(rdd_mlx5_cq_poll_bound(q.cq.get(), wc.data(), 1), neg(RDD_STATUS_CQE_CORRUPT));
    fake_write_cqe(&q.f, 2, cqe, 0);
    fake_cqe(&q.f, 2)[63] |= 3 << 2;
    CHECK_EQ(rdd_mlx5_cq_poll_bound(q.cq.get(), wc.data(), 1), neg(RDD_STATUS_CQE_COMPRESSED));

    // A finalised bound queue is an error; unbinding ends the binding.
    CHECK_EQ(rdd_mlx5_sq_fini(q.sq.get()), RDD_STATUS_OK);
    CHECK_EQ(rdd_mlx5_cq_poll_bound(q.cq.get(), wc.data(), 4), neg(RDD_STATUS_INVALID_HANDLE));
    CHECK_EQ(rdd_mlx5_cq_unbind(nullptr), RDD_STATUS_NULL_PARAMETER);
    CHECK_EQ(rdd_mlx5_cq_unbind(&zero_cq), RDD_STATUS_INVALID_HANDLE);
    CHECK_EQ(rdd_mlx5_cq_unbind(q.cq.get()), RDD_STATUS_OK);
    CHECK_EQ(rdd_mlx5_cq_poll_bound(q.cq.get(), wc.data(), 4), neg(RDD_STATUS_NO_SUCH_OBJECT));
}

} // namespace

int main()
{
    same_bytes_and_deferral();
    bad_inputs();
    bound_poll();
    return h_finish("test_raw_ops_cpp");
}
