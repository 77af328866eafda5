// C++17 test of the header (cpp_compat: extern "C", the uint32_t-based
// rdd_status enum) and a post/ring/poll round trip with RAII handles.
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <type_traits>

#include "harness.h"

static_assert(std::is_same<std::underlying_type<rdd_status>::type, uint32_t>::value,
              "rdd_status is a uint32_t enum in C++");
static_assert(sizeof(rdd_mlx5_sq_storage) == RDD_MLX5_SQ_STORAGE_SIZE, "SQ storage size");
static_assert(alignof(rdd_mlx5_sq_storage) == RDD_MLX5_SQ_STORAGE_ALIGN, "SQ storage align");
static_assert(sizeof(rdd_mlx5_rq_storage) == RDD_MLX5_RQ_STORAGE_SIZE, "RQ storage size");
static_assert(alignof(rdd_mlx5_rq_storage) == RDD_MLX5_RQ_STORAGE_ALIGN, "RQ storage align");
static_assert(sizeof(rdd_mlx5_cq_storage) == RDD_MLX5_CQ_STORAGE_SIZE, "CQ storage size");
static_assert(alignof(rdd_mlx5_cq_storage) == RDD_MLX5_CQ_STORAGE_ALIGN, "CQ storage align");
static_assert(sizeof(rdd_wc) == 48, "rdd_wc is 48 bytes");
static_assert(std::is_trivially_copyable<rdd_wr>::value, "plain C struct");
static_assert(std::is_standard_layout<rdd_wc>::value, "plain C struct");

namespace {

// Owns a queue handle's storage and finalises it on scope exit.
template <typename Storage, rdd_status (*Fini)(Storage *)>
class Handle {
  public:
    Handle() { std::memset(&storage_, 0, sizeof(storage_)); }
    ~Handle() { (void)Fini(&storage_); }
    Handle(const Handle &) = delete; // a handle is bound to its address
    Handle &operator=(const Handle &) = delete;
    Storage *get() { return &storage_; }

  private:
    Storage storage_;
};

using Sq = Handle<rdd_mlx5_sq_storage, rdd_mlx5_sq_fini>;
using Rq = Handle<rdd_mlx5_rq_storage, rdd_mlx5_rq_fini>;
using Cq = Handle<rdd_mlx5_cq_storage, rdd_mlx5_cq_fini>;

struct FakeDeleter {
    void operator()(fake_mlx5 *f) const
    {
        fake_free(f);
        delete f;
    }
};

std::string status_text(uint32_t code)
{
    std::array<char, 128> buf{};
    size_t n = 0;
    if (rdd_status_str(code, buf.data(), buf.size(), &n) != RDD_STATUS_OK) {
        return "?";
    }
    return std::string(buf.data(), n - 1);
}

void round_trip()
{
    std::unique_ptr<fake_mlx5, FakeDeleter> f(new fake_mlx5);
    fake_init(f.get(), FAKE_DEFAULT_GEO);
    const rdd_qp_caps caps{4, 60, 4};
    // Heap-allocated so each storage keeps its address for its whole life.
    auto sq = std::make_unique<Sq>();
    auto rq = std::make_unique<Rq>();
    auto cq = std::make_unique<Cq>();
    CHECK_EQ(rdd_mlx5_sq_init(sq->get(), &f->qp, f->geo.qpn, &caps, RDD_MLX5_SQ_BF_NEVER,
                              f->sq_wrid, f->geo.sq_wqe_cnt),
             RDD_STATUS_OK);
    CHECK_EQ(rdd_mlx5_rq_init(rq->get(), &f->qp, &caps, f->rq_wrid, f->geo.rq_wqe_cnt),
             RDD_STATUS_OK);
    CHECK_EQ(rdd_mlx5_cq_init(cq->get(), &f->cq), RDD_STATUS_OK);

    std::array<rdd_sge, 5> sges{{{0x10000, 100, 7}, {0x20000, 200, 7}, {0x30000, 1, 7}, {0x40000, 1, 7}, {0x50000, 1, 7}}};
    std::array<rdd_wr, 2> wrs{};
    wrs[0].wr_id = 11;
    wrs[0].opcode = RDD_WR_SEND;
    wrs[0].sg_list = sges.data();
    wrs[0].num_sge = 2;
    wrs[1].wr_id = 12;
    wrs[1].opcode = RDD_WR_RDMA_WRITE_WITH_IMM;
    wrs[1].flags = RDD_SEND_SIGNALED | RDD_SEND_SOLICITED;
    wrs[1].sg_list = sges.data();
    wrs[1].num_sge = 1;
    wrs[1].remote_addr = 0x9000;
    wrs[1].rkey = 0x42;
    wrs[1].imm_data = 0x01020304;
    size_t bad = 999;
    CHECK_EQ(rdd_mlx5_sq_post(sq->get(), wrs.data(), wrs.size(), &bad), RDD_STATUS_OK);
    CHECK_EQ(rdd_mlx5_sq_ring(sq->get()), RDD_STATUS_OK);
    CHECK_EQ(fake_dbrec_sq(f.get()), 2);
    // SEND with two SGEs: DS 3 at BB 0; WRITE_WITH_IMM: DS 3 at BB 1 with
    // the immediate big-endian in the control segment and SOLICITED|CQ_UPDATE.
    CHECK_EQ(get_be32(f->sq + 0), 0x0000000au);
    CHECK_EQ(get_be32(f->sq + 4), f->geo.qpn << 8 | 3);
    CHECK_EQ(get_be32(f->sq + 64), 0x00000109u);
    CHECK_EQ(f->sq[64 + 11], 0x0a);
    CHECK_EQ(get_be32(f->sq + 64 + 12), 0x01020304u);
    // BF_NEVER: always the 8-byte doorbell.
    CHECK_BYTES(f->bf, f->sq + 64, 8);

    uint8_t cqe[64];
    cqe_req(cqe, f->geo.qpn, 0x09, 1, 0);
    fake_write_cqe(f.get(), 0, cqe, 0);
    std::array<rdd_wc, 4> wc{};
    size_t count = 0;
    CHECK_EQ(rdd_mlx5_cq_poll(cq->get(), sq->get(), rq->get(), wc.data(), wc.size(), &count),
             RDD_STATUS_OK);
    CHECK_EQ(count, 1);
    CHECK_EQ(wc[0].wr_id, 12);
    CHECK_EQ(wc[0].opcode, RDD_WC_OP_RDMA_WRITE);
    CHECK_EQ(wc[0].wc_flags, RDD_WC_FLAG_WITH_IMM);

    // A rejected request from C++ too.
    wrs[0].opcode = 3;  // SEND_WITH_IMM ...
    wrs[0].imm_data = 0;
    wrs[0].num_sge = 5; // ... with more SGEs than max_send_sge
    CHECK_EQ(rdd_mlx5_sq_post(sq->get(), wrs.data(), 1, &bad), RDD_STATUS_TOO_MANY_SGES);
    CHECK_EQ(bad, 0);
    CHECK(status_text(RDD_STATUS_TOO_MANY_SGES).find("scatter/gather") != std::string::npos);
    CHECK(status_text(RDD_STATUS_INVALID_HANDLE).find("handle") != std::string::npos);
    // Handles are finalised by the destructors, before `f` is freed.
    cq.reset();
    rq.reset();
    sq.reset();
}

} // namespace

int main()
{
    CHECK(std::string(rdd_version()).rfind(std::to_string(RDD_VERSION_MAJOR) + ".", 0) == 0);
    round_trip();
    return h_finish("test_raw_queue_cpp");
}
