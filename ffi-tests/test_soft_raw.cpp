// C++17 test of the raw-queue level on software-device queues
// (rdd_qp_mlx5_desc, rdd_cq_mlx5_desc) from C++: RAII-owned objects, the
// device on its own thread, a loopback QP whose descriptors drive a batch
// of WRITEs and a SEND/RECV through rdd_mlx5_* only, the signatures
// checked at compile time, and every bad-input status of both calls.
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <thread>
#include <type_traits>
#include <vector>

#include "harness.h"

static_assert(std::is_same<decltype(&rdd_qp_mlx5_desc),
                           rdd_status (*)(rdd_qp *, rdd_mlx5dv_qp *, rdd_qp_caps *, uint32_t *)>::value,
              "rdd_qp_mlx5_desc: QP, three outputs");
static_assert(std::is_same<decltype(&rdd_cq_mlx5_desc),
                           rdd_status (*)(rdd_cq *, rdd_mlx5dv_cq *)>::value,
              "rdd_cq_mlx5_desc: CQ, one output");

namespace {

template <typename T, rdd_status (*Destroy)(T *)>
struct Deleter {
    void operator()(T *p) const
    {
        rdd_status s = Destroy(p);
        if (s != RDD_STATUS_OK) {
            std::fprintf(stderr, "destroy failed with %u\n", static_cast<unsigned>(s));
            std::abort();
        }
    }
};

using Device = std::unique_ptr<rdd_device, Deleter<rdd_device, rdd_device_close>>;
using Pd = std::unique_ptr<rdd_pd, Deleter<rdd_pd, rdd_pd_free>>;
using Mr = std::unique_ptr<rdd_mr, Deleter<rdd_mr, rdd_mr_free>>;
using Cq = std::unique_ptr<rdd_cq, Deleter<rdd_cq, rdd_cq_destroy>>;
using Qp = std::unique_ptr<rdd_qp, Deleter<rdd_qp, rdd_qp_destroy>>;

constexpr uint32_t kAll = RDD_ACCESS_LOCAL_WRITE | RDD_ACCESS_REMOTE_WRITE |
                          RDD_ACCESS_REMOTE_READ | RDD_ACCESS_REMOTE_ATOMIC;

// Raw handles over one QP's and its CQ's descriptors; finalised first
// (declared after the objects they describe, destroyed before them).
struct Raw {
    rdd_mlx5dv_qp dv_qp{};
    rdd_mlx5dv_cq dv_cq{};
    rdd_qp_caps caps{};
    uint32_t qpn = 0;
    std::unique_ptr<rdd_mlx5_sq_storage> sq{new rdd_mlx5_sq_storage()};
    std::unique_ptr<rdd_mlx5_rq_storage> rq{new rdd_mlx5_rq_storage()};
    std::unique_ptr<rdd_mlx5_cq_storage> cq{new rdd_mlx5_cq_storage()};
    std::vector<rdd_mlx5_sq_slot> sq_wrid;
    std::vector<uint64_t> rq_wrid;

    Raw(rdd_qp *qp, rdd_cq *c)
    {
        MUST(rdd_qp_mlx5_desc(qp, &dv_qp, &caps, &qpn));
        MUST(rdd_cq_mlx5_desc(c, &dv_cq));
        sq_wrid.resize(dv_qp.sq_wqe_cnt);
        rq_wrid.resize(dv_qp.rq_wqe_cnt);
        MUST(rdd_mlx5_sq_init(sq.get(), &dv_qp, qpn, &caps, 0, sq_wrid.data(), sq_wrid.size()));
        MUST(rdd_mlx5_rq_init(rq.get(), &dv_qp, &caps, rq_wrid.data(), rq_wrid.size()));
        MUST(rdd_mlx5_cq_init(cq.get(), &dv_cq));
        MUST(rdd_mlx5_cq_bind(cq.get(), sq.get(), rq.get()));
    }
    ~Raw()
    {
        (void)rdd_mlx5_cq_fini(cq.get());
        (void)rdd_mlx5_sq_fini(sq.get());
        (void)rdd_mlx5_rq_fini(rq.get());
    }

    // Polls (the device runs on its thread) until `n` completions came.
    std::vector<rdd_wc> wait(size_t n)
    {
        std::vector<rdd_wc> got;
        auto t0 = std::chrono::steady_clock::now();
        while (got.size() < n && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(10)) {
            rdd_wc wc[16];
            int32_t k = rdd_mlx5_cq_poll_bound(cq.get(), wc, 16);
            CHECK(k >= 0);
            for (int32_t i = 0; i < k; i++) {
                got.push_back(wc[i]);
            }
            if (k == 0) {
                std::this_thread::yield();
            }
        }
        return got;
    }
};

// Runs a create call and returns what it wrote (in order: the call
// first, then the read of its output).
template <typename T, typename F>
T *make(F create)
{
    T *p = nullptr;
    MUST(create(&p));
    return p;
}

void test_loopback_on_the_device_thread()
{
    rdd_device *d = nullptr;
    MUST(rdd_device_open_soft(nullptr, &d));
    Device dev(d);
    MUST(rdd_device_start(dev.get()));
    Pd pd(make<rdd_pd>([&](rdd_pd **o) { return rdd_pd_alloc(dev.get(), o); }));
    Cq cq(make<rdd_cq>([&](rdd_cq **o) { return rdd_cq_create(dev.get(), 256, o); }));
    Qp qp(make<rdd_qp>(
        [&](rdd_qp **o) { return rdd_qp_create(pd.get(), cq.get(), cq.get(), nullptr, o); }));
    Mr mr(make<rdd_mr>([&](rdd_mr **o) { return rdd_mr_reg(pd.get(), 8192, kAll, o); }));
    void *addr = nullptr;
    uint32_t lkey = 0, rkey = 0;
    MUST(rdd_mr_addr(mr.get(), &addr));
    MUST(rdd_mr_lkey(mr.get(), &lkey));
    MUST(rdd_mr_rkey(mr.get(), &rkey));
    auto *buf = static_cast<uint8_t *>(addr);
    const uint64_t base = reinterpret_cast<uintptr_t>(addr);
    // The QP talks to itself.
    rdd_qp_info info{};
    MUST(rdd_qp_query_info(qp.get(), &info));
    rdd_connect_attr attr{kAll & ~RDD_ACCESS_LOCAL_WRITE, 7, 7, 0, 0};
    MUST(rdd_qp_connect(qp.get(), &info, &attr));
    Raw raw(qp.get(), cq.get());
    CHECK_EQ(raw.qpn, info.qpn);

    for (size_t i = 0; i < 256; i++) {
        buf[i] = static_cast<uint8_t>(i * 3 + 1);
    }
    // A batch of eight WRITEs, one doorbell, the last one signaled.
    for (uint64_t i = 0; i < 8; i++) {
        uint32_t flags = i == 7 ? RDD_SEND_SIGNALED : RDD_SEND_DEFER_DOORBELL;
        CHECK_EQ(rdd_mlx5_sq_write(raw.sq.get(), i, base + i * 32, 32, lkey, base + 4096 + i * 32,
                                   rkey, flags),
                 RDD_STATUS_OK);
    }
    auto w = raw.wait(1);
    CHECK_EQ(w.size(), 1);
    if (!w.empty()) {
        CHECK_EQ(w[0].wr_id, 7);
        CHECK_EQ(w[0].status, RDD_WC_SUCCESS);
    }
    CHECK_BYTES(buf + 4096, buf, 256);

    // SEND to itself: the receive and the send complete on the same CQ.
    CHECK_EQ(rdd_mlx5_rq_recv(raw.rq.get(), 100, base + 6144, 64, lkey, 0), RDD_STATUS_OK);
    CHECK_EQ(rdd_mlx5_sq_send(raw.sq.get(), 200, base, 48, lkey, RDD_SEND_SIGNALED), RDD_STATUS_OK);
    w = raw.wait(2);
    CHECK_EQ(w.size(), 2);
    bool send = false, recv = false;
    for (const rdd_wc &x : w) {
        send = send || (x.wr_id == 200 && x.status == RDD_WC_SUCCESS);
        recv = recv || (x.wr_id == 100 && x.status == RDD_WC_SUCCESS && x.byte_len == 48);
    }
    CHECK(send && recv);
    CHECK_BYTES(buf + 6144, buf, 48);
    MUST(rdd_device_stop(dev.get()));
}

void test_bad_inputs()
{
    rdd_device *d = nullptr;
    MUST(rdd_device_open_soft(nullptr, &d));
    Device dev(d);
    Pd pd(make<rdd_pd>([&](rdd_pd **o) { return rdd_pd_alloc(dev.get(), o); }));
    Cq cq(make<rdd_cq>([&](rdd_cq **o) { return rdd_cq_create(dev.get(), 4096, o); }));
    Qp qp(make<rdd_qp>(
        [&](rdd_qp **o) { return rdd_qp_create(pd.get(), cq.get(), cq.get(), nullptr, o); }));
    rdd_qp_info info{};
    MUST(rdd_qp_query_info(qp.get(), &info));
    MUST(rdd_qp_connect(qp.get(), &info, nullptr));

    rdd_mlx5dv_qp dq;
    rdd_mlx5dv_cq dc;
    rdd_qp_caps caps;
    uint32_t qpn = 0x12345678u;
    std::memset(&dq, 0x3c, sizeof dq);
    std::memset(&dc, 0x3c, sizeof dc);
    std::memset(&caps, 0x3c, sizeof caps);
    const rdd_mlx5dv_qp dq0 = dq;
    const rdd_mlx5dv_cq dc0 = dc;
    const rdd_qp_caps caps0 = caps;

    CHECK_EQ(rdd_qp_mlx5_desc(nullptr, &dq, &caps, &qpn), RDD_STATUS_NULL_PARAMETER);
    CHECK_EQ(rdd_qp_mlx5_desc(qp.get(), nullptr, &caps, &qpn), RDD_STATUS_NULL_PARAMETER);
    CHECK_EQ(rdd_qp_mlx5_desc(qp.get(), &dq, nullptr, &qpn), RDD_STATUS_NULL_PARAMETER);
    CHECK_EQ(rdd_qp_mlx5_desc(qp.get(), &dq, &caps, nullptr), RDD_STATUS_NULL_PARAMETER);
    CHECK_EQ(rdd_cq_mlx5_desc(nullptr, &dc), RDD_STATUS_NULL_PARAMETER);
    CHECK_EQ(rdd_cq_mlx5_desc(cq.get(), nullptr), RDD_STATUS_NULL_PARAMETER);
    CHECK_EQ(rdd_qp_mlx5_desc(reinterpret_cast<rdd_qp *>(uintptr_t{0x77000}), &dq, &caps, &qpn),
             RDD_STATUS_INVALID_HANDLE);
    CHECK_EQ(rdd_cq_mlx5_desc(reinterpret_cast<rdd_cq *>(uintptr_t{0x77000}), &dc),
             RDD_STATUS_INVALID_HANDLE);
    // The object level posted a receive: the raw RQ would start at 0.
    Mr mr(make<rdd_mr>(
        [&](rdd_mr **o) { return rdd_mr_reg(pd.get(), 4096, RDD_ACCESS_LOCAL_WRITE, o); }));
    void *addr = nullptr;
    uint32_t lkey = 0;
    MUST(rdd_mr_addr(mr.get(), &addr));
    MUST(rdd_mr_lkey(mr.get(), &lkey));
    CHECK_EQ(rdd_qp_recv(qp.get(), 1, reinterpret_cast<uintptr_t>(addr), 64, lkey, 0),
             RDD_STATUS_OK);
    CHECK_EQ(rdd_qp_mlx5_desc(qp.get(), &dq, &caps, &qpn), RDD_STATUS_INVALID_QP_STATE);
    CHECK_BYTES(&dq, &dq0, sizeof dq);
    CHECK_BYTES(&dc, &dc0, sizeof dc);
    CHECK_BYTES(&caps, &caps0, sizeof caps);
    CHECK_EQ(qpn, 0x12345678u);
    // The CQ was not polled: it still hands over.
    CHECK_EQ(rdd_cq_mlx5_desc(cq.get(), &dc), RDD_STATUS_OK);
    CHECK(dc.buf != nullptr);
}

} // namespace

int main()
{
    test_loopback_on_the_device_thread();
    test_bad_inputs();
    return h_finish("test_soft_raw_cpp");
}
