// C++17 test of the raw-queue UD and SRQ calls: the signatures and layouts
// checked at compile time, RAII-owned handles, a UD fan-out to several
// destinations in one doorbell, and an SRQ shared by the receives of a
// QP, completed out of order and reposted.
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <type_traits>
#include <vector>

#include "harness.h"

static_assert(sizeof(rdd_mlx5_av) == 48 && alignof(rdd_mlx5_av) == 8,
              "rdd_mlx5_av is struct mlx5_wqe_av");
static_assert(sizeof(rdd_mlx5_ah_attr) == 40, "rdd_mlx5_ah_attr");
static_assert(sizeof(rdd_ud_wr) == 80, "rdd_ud_wr: rdd_wr + av + qpn + qkey");
static_assert(sizeof(rdd_mlx5_srq_slot) == 16, "one SRQ side-table entry");
static_assert(std::is_same<decltype(&rdd_mlx5_sq_send_ud),
                           rdd_status (*)(rdd_mlx5_sq_storage *, const rdd_mlx5_av *, uint32_t,
                                          uint32_t, uint64_t, uint64_t, uint32_t, uint32_t,
                                          uint32_t)>::value,
              "rdd_mlx5_sq_send_ud: queue, AV, QPN, qkey, wr_id, buffer, flags");
static_assert(std::is_same<decltype(&rdd_mlx5_srq_recv),
                           rdd_status (*)(rdd_mlx5_srq_storage *, uint64_t, uint64_t, uint32_t,
                                          uint32_t, uint32_t)>::value,
              "rdd_mlx5_srq_recv: SRQ, wr_id, buffer, flags");

namespace {

constexpr uint32_t kQpn = 0x1c5;
constexpr uint32_t kSrqn = 0x77;
constexpr rdd_qp_caps kCaps = {2, 60, 1};

// A fake QP with a UD send-queue handle and a CQ handle, finalised on
// scope exit.
struct UdQueues {
    fake_mlx5 f{};
    rdd_mlx5_sq_storage sq{};
    rdd_mlx5_cq_storage cq{};

    UdQueues()
    {
        fake_init(&f, FAKE_DEFAULT_GEO);
        MUST(rdd_mlx5_sq_init_ud(&sq, &f.qp, kQpn, &kCaps, RDD_MLX5_SQ_BF_NEVER, f.sq_wrid,
                                 f.geo.sq_wqe_cnt));
        MUST(rdd_mlx5_cq_init(&cq, &f.cq));
    }
    ~UdQueues()
    {
        CHECK_EQ(rdd_mlx5_cq_fini(&cq), RDD_STATUS_OK);
        CHECK_EQ(rdd_mlx5_sq_fini(&sq), RDD_STATUS_OK);
        fake_free(&f);
    }
    UdQueues(const UdQueues &) = delete;
    UdQueues &operator=(const UdQueues &) = delete;
};

// An SRQ over heap memory, finalised on scope exit.
struct SharedRq {
    std::vector<uint8_t> mem = std::vector<uint8_t>(16 * 64 + 64 + 64);
    std::array<rdd_mlx5_srq_slot, 8> slots{};
    rdd_mlx5_srq_storage h{};
    uint8_t *buf = nullptr;
    uint8_t *db = nullptr;

    SharedRq()
    {
        auto base = reinterpret_cast<uintptr_t>(mem.data());
        buf = mem.data() + ((64 - base % 64) % 64);
        db = buf + 16 * 64;
        rdd_mlx5_srq_geometry g{};
        g.buf = buf;
        g.dbrec = reinterpret_cast<uint32_t *>(db);
        g.stride = 64;
        g.nwqes = 8;
        g.max = 16;
        g.srqn = kSrqn;
        MUST(rdd_mlx5_srq_init(&h, &g, slots.data(), slots.size()));
    }
    ~SharedRq() { CHECK_EQ(rdd_mlx5_srq_fini(&h), RDD_STATUS_OK); }
    SharedRq(const SharedRq &) = delete;
    SharedRq &operator=(const SharedRq &) = delete;
};

rdd_mlx5_av lid_av(uint16_t dlid)
{
    rdd_mlx5_ah_attr a{};
    a.link_layer = RDD_MLX5_LINK_IB;
    a.dlid = dlid;
    a.sl = 1;
    rdd_mlx5_av av{};
    MUST(rdd_mlx5_av_make(&a, &av));
    return av;
}

void test_fan_out()
{
    UdQueues q;
    std::array<rdd_mlx5_av, 4> avs{};
    for (size_t i = 0; i < avs.size(); i++) {
        avs[i] = lid_av(static_cast<uint16_t>(0x10 + i));
    }
    // Four destinations, one doorbell: three deferred sends, then one that
    // rings.
    for (uint32_t i = 0; i < 4; i++) {
        uint32_t flags = RDD_SEND_SIGNALED | (i < 3 ? RDD_SEND_DEFER_DOORBELL : 0u);
        CHECK_EQ(rdd_mlx5_sq_send_ud(&q.sq, &avs[i], 0x100 + i, 0x1234, 0xa0 + i,
                                     0x10000 + 64 * i, 64, 0x55, flags),
                 RDD_STATUS_OK);
        if (i < 3) {
            CHECK_EQ(fake_dbrec_sq(&q.f), 0u);
        }
    }
    // Each UD WQE with one SGE is 2 BBs: control, datagram, data.
    CHECK_EQ(fake_dbrec_sq(&q.f), 8u);
    for (uint32_t i = 0; i < 4; i++) {
        const uint8_t *w = q.f.sq + 128 * i;
        CHECK_EQ(get_be32(w) & 0xff, 0x0au);                     // SEND
        CHECK_EQ(get_be32(w + 4), kQpn << 8 | 5u);               // qpn, ds 5
        CHECK_EQ(get_be32(w + 16), 0x1234u);                     // qkey
        CHECK_EQ(get_be32(w + 24), 0x80000000u | (0x100 + i));   // dqp | ext
        CHECK_EQ(get_be32(w + 28) & 0xffff, 0x10 + i);           // rlid
        CHECK_EQ(get_be64(w + 64 + 8), 0x10000u + 64 * i);       // data addr
    }
    // Their completions, one per destination.
    for (uint16_t i = 0; i < 4; i++) {
        uint8_t cqe[64];
        cqe_req(cqe, kQpn, 0x0a, static_cast<uint16_t>(2 * i), 0);
        fake_write_cqe(&q.f, i, cqe, 0);
    }
    // A UD queue routes through the generic poll with a receive queue; use
    // the SRQ poll with no RQ, which needs no receive queue at all.
    SharedRq s;
    std::array<rdd_wc, 8> wc{};
    size_t n = 0;
    CHECK_EQ(rdd_mlx5_cq_poll_srq(&q.cq, &q.sq, nullptr, &s.h, kSrqn, wc.data(), wc.size(), &n),
             RDD_STATUS_OK);
    CHECK_EQ(n, 4u);
    for (size_t i = 0; i < n; i++) {
        CHECK_EQ(wc[i].wr_id, 0xa0 + i);
        CHECK_EQ(wc[i].opcode, RDD_WC_OP_SEND);
        CHECK_EQ(wc[i].status, RDD_WC_SUCCESS);
    }
}

void test_srq_reuse()
{
    UdQueues q;
    SharedRq s;
    // Three rounds: fill the list (7 usable WQEs of 8), then complete every
    // receive out of order. Each receive's buffer address encodes its id,
    // so which WQE holds which receive is read back from the SRQ's own
    // data segments; a completed WQE is relinked and reused by the next
    // round (else its posts would be RQ_FULL).
    uint32_t ci = 0;
    uint64_t next_id = 1;
    uint32_t posted_total = 0;
    for (int round = 0; round < 3; round++) {
        for (int i = 0; i < 7; i++) {
            uint64_t id = next_id++;
            CHECK_EQ(rdd_mlx5_srq_recv(&s.h, id, 0x200000 + 0x100 * id, 128, 9, 0),
                     RDD_STATUS_OK);
            posted_total++;
            CHECK_EQ(get_be32(s.db), posted_total);
        }
        CHECK_EQ(rdd_mlx5_srq_recv(&s.h, 999, 0x1000, 128, 9, 0), RDD_STATUS_RQ_FULL);
        // The WQEs holding this round's receives, in completion order
        // 3, 0, 6, 1, 5, 2, 4 of the round's ids.
        std::array<int, 7> wqe_of{};
        wqe_of.fill(-1);
        for (int w = 0; w < 8; w++) {
            uint64_t addr = get_be64(s.buf + 64 * w + 16 + 8);
            uint64_t id = (addr - 0x200000) / 0x100;
            if (addr >= 0x200000 && id + 7 >= next_id && id < next_id) {
                wqe_of[id - (next_id - 7)] = w;
            }
        }
        const int order[7] = {3, 0, 6, 1, 5, 2, 4};
        for (int k : order) {
            CHECK(wqe_of[k] >= 0);
            uint8_t cqe[64];
            std::memset(cqe, 0, sizeof cqe);
            put_be32(cqe + 32, kSrqn);
            put_be32(cqe + 44, 16);
            put_be32(cqe + 56, kQpn);
            put_be16(cqe + 60, static_cast<uint16_t>(wqe_of[k]));
            fake_write_cqe(&q.f, ci++, cqe, 2);
        }
        std::array<rdd_wc, 8> wc{};
        size_t n = 0;
        CHECK_EQ(rdd_mlx5_cq_poll_srq(&q.cq, &q.sq, nullptr, &s.h, kSrqn, wc.data(), wc.size(),
                                      &n),
                 RDD_STATUS_OK);
        CHECK_EQ(n, 7u);
        for (size_t i = 0; i < n && i < 7; i++) {
            CHECK_EQ(wc[i].wr_id, next_id - 7 + static_cast<uint64_t>(order[i]));
            CHECK_EQ(wc[i].byte_len, 16u);
            CHECK_EQ(wc[i].opcode, RDD_WC_OP_RECV);
        }
    }
}

}  // namespace

int main()
{
    test_fan_out();
    test_srq_reuse();
    return h_finish("test_raw_ud_srq_cpp");
}
