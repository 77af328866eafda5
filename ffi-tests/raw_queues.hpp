// C++ helpers shared by the raw-queue tests (test_raw_ops.cpp,
// test_raw_burst.cpp): a fake QP and CQ with live raw handles.
#ifndef RDD_FFI_TESTS_RAW_QUEUES_HPP
#define RDD_FFI_TESTS_RAW_QUEUES_HPP

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "harness.h"

namespace raw_queues {

constexpr uint32_t kRawQpn = 0x1c5;
const rdd_qp_caps kRawCaps{4, 60, 4};

// One fake QP and CQ with live handles; storages on the heap so they keep
// their addresses, finalised (if still live) before the memory is freed.
struct Queues {
    fake_mlx5 f{};
    std::unique_ptr<rdd_mlx5_sq_storage> sq{new rdd_mlx5_sq_storage()};
    std::unique_ptr<rdd_mlx5_rq_storage> rq{new rdd_mlx5_rq_storage()};
    std::unique_ptr<rdd_mlx5_cq_storage> cq{new rdd_mlx5_cq_storage()};

    explicit Queues(uint32_t sq_wqe_cnt = 64, const rdd_qp_caps &caps = kRawCaps)
    {
        fake_geo geo = FAKE_DEFAULT_GEO;
        geo.sq_wqe_cnt = sq_wqe_cnt;
        fake_init(&f, geo);
        MUST(rdd_mlx5_sq_init(sq.get(), &f.qp, kRawQpn, &caps, 0, f.sq_wrid, geo.sq_wqe_cnt));
        MUST(rdd_mlx5_rq_init(rq.get(), &f.qp, &caps, f.rq_wrid, geo.rq_wqe_cnt));
        MUST(rdd_mlx5_cq_init(cq.get(), &f.cq));
    }
    ~Queues()
    {
        (void)rdd_mlx5_cq_fini(cq.get());
        (void)rdd_mlx5_sq_fini(sq.get());
        (void)rdd_mlx5_rq_fini(rq.get());
        fake_free(&f);
    }
    Queues(const Queues &) = delete;
    Queues &operator=(const Queues &) = delete;

    // Everything a post or a doorbell may write.
    std::vector<uint8_t> state() const
    {
        std::vector<uint8_t> v;
        auto add = [&v](const void *p, size_t n) {
            const auto *b = static_cast<const uint8_t *>(p);
            v.insert(v.end(), b, b + n);
        };
        add(f.sq, size_t{f.geo.sq_wqe_cnt} * 64);
        add(f.qp_buf, size_t{f.geo.rq_wqe_cnt} * f.geo.rq_stride);
        add(f.sq_wrid, f.geo.sq_wqe_cnt * sizeof(rdd_mlx5_sq_slot));
        add(f.rq_wrid, f.geo.rq_wqe_cnt * sizeof(uint64_t));
        add(f.dbrec, 128);
        add(f.bf, 2 * size_t{f.geo.bf_size});
        return v;
    }
    // The SQ doorbell record (the posted counter).
    uint32_t db() const { return fake_dbrec_sq(&f); }
};

} // namespace raw_queues

#endif
