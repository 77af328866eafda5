// C++17 smoke test of the submission service: RAII ownership of the
// service and submitter handles (the destructor order is the teardown
// order the API requires), two std::thread workers submitting RDMA WRITEs
// and reaping their own completions, one poll-mode std::thread, the
// software device on its thread, and the data checked at the target.
#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <thread>
#include <type_traits>
#include <vector>

#include "harness.h"

static_assert(std::is_trivially_copyable<rdd_submit_desc>::value, "plain C struct");
static_assert(std::is_standard_layout<rdd_submit_completion>::value, "plain C struct");
static_assert(sizeof(rdd_submit_desc) == 48, "rdd_submit_desc");
static_assert(sizeof(rdd_submit_counters) == 104, "rdd_submit_counters");
static_assert(std::is_same<decltype(&rdd_submit_destroy), rdd_status (*)(rdd_submit_service *)>::value,
              "destroy takes the handle only");
static_assert(RDD_SUBMIT_RING_SIZE == 4096 && RDD_SUBMIT_MAX_SUBMITTERS == 64 &&
                  RDD_SUBMIT_COMPLETION_RING_SIZE == 1024,
              "the documented sizes");

namespace {

void must(rdd_status s, const char *what)
{
    if (s != RDD_STATUS_OK) {
        std::fprintf(stderr, "%s failed with %u\n", what, static_cast<unsigned>(s));
        std::abort();
    }
}

template <typename T, rdd_status (*Destroy)(T *)>
struct Deleter {
    void operator()(T *p) const { must(Destroy(p), "destroy"); }
};

using Device = std::unique_ptr<rdd_device, Deleter<rdd_device, rdd_device_close>>;
using Pd = std::unique_ptr<rdd_pd, Deleter<rdd_pd, rdd_pd_free>>;
using Mr = std::unique_ptr<rdd_mr, Deleter<rdd_mr, rdd_mr_free>>;
using Cq = std::unique_ptr<rdd_cq, Deleter<rdd_cq, rdd_cq_destroy>>;
using Qp = std::unique_ptr<rdd_qp, Deleter<rdd_qp, rdd_qp_destroy>>;
using Service = std::unique_ptr<rdd_submit_service, Deleter<rdd_submit_service, rdd_submit_destroy>>;
using Submitter = std::unique_ptr<rdd_submitter, Deleter<rdd_submitter, rdd_submit_unregister>>;

constexpr unsigned kWorkers = 2;
constexpr unsigned kPer = 2000;
constexpr unsigned kChunk = 32;

}  // namespace

int main()
{
    rdd_device *d = nullptr;
    must(rdd_device_open_soft(nullptr, &d), "open");
    Device dev(d);
    rdd_pd *p = nullptr;
    must(rdd_pd_alloc(dev.get(), &p), "pd");
    Pd pd(p);
    std::array<Cq, 2> cq;
    std::array<Qp, 2> qp;
    for (int i = 0; i < 2; i++) {
        rdd_cq *c = nullptr;
        must(rdd_cq_create(dev.get(), 1024, &c), "cq");
        cq[i].reset(c);
        rdd_qp *q = nullptr;
        must(rdd_qp_create(pd.get(), c, c, nullptr, &q), "qp");
        qp[i].reset(q);
    }
    const size_t len = size_t{kWorkers} * kPer * kChunk;
    rdd_mr *m = nullptr;
    must(rdd_mr_reg(pd.get(), len, RDD_ACCESS_LOCAL_WRITE, &m), "src");
    Mr src(m);
    must(rdd_mr_reg(pd.get(), len, RDD_ACCESS_LOCAL_WRITE | RDD_ACCESS_REMOTE_WRITE, &m), "dst");
    Mr dst(m);
    void *a = nullptr;
    must(rdd_mr_addr(src.get(), &a), "addr");
    auto *s = static_cast<uint8_t *>(a);
    must(rdd_mr_addr(dst.get(), &a), "addr");
    auto *t = static_cast<uint8_t *>(a);
    uint32_t lkey = 0, rkey = 0;
    must(rdd_mr_lkey(src.get(), &lkey), "lkey");
    must(rdd_mr_rkey(dst.get(), &rkey), "rkey");
    for (size_t i = 0; i < len; i++) {
        s[i] = static_cast<uint8_t>(i * 7 + 3);
    }
    rdd_qp_info info[2];
    must(rdd_qp_query_info(qp[0].get(), &info[0]), "info");
    must(rdd_qp_query_info(qp[1].get(), &info[1]), "info");
    rdd_connect_attr attr{};
    attr.access = RDD_ACCESS_REMOTE_WRITE;
    attr.rnr_retry = 7;
    attr.retry_cnt = 7;
    must(rdd_qp_connect(qp[0].get(), &info[1], nullptr), "connect");
    must(rdd_qp_connect(qp[1].get(), &info[0], &attr), "connect");

    rdd_submit_service *sv = nullptr;
    must(rdd_submit_create(qp[0].get(), cq[0].get(), nullptr, &sv), "create");
    Service svc(sv);
    must(rdd_device_start(dev.get()), "start");

    std::atomic<unsigned> failures{0};
    std::vector<std::thread> workers;
    for (unsigned w = 0; w < kWorkers; w++) {
        workers.emplace_back([&, w] {
            rdd_submitter *raw = nullptr;
            must(rdd_submit_register(svc.get(), &raw), "register");
            Submitter sub(raw);  // unregistered when the lambda returns
            unsigned next = 0, done = 0;
            auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
            while (done < kPer && std::chrono::steady_clock::now() < deadline) {
                if (next < kPer) {
                    size_t off = (size_t{w} * kPer + next) * kChunk;
                    rdd_submit_desc desc{};
                    desc.wr_id = next;
                    desc.local_addr = reinterpret_cast<uintptr_t>(s + off);
                    desc.remote_addr = reinterpret_cast<uintptr_t>(t + off);
                    desc.length = kChunk;
                    desc.lkey = lkey;
                    desc.rkey = rkey;
                    desc.opcode = RDD_WR_RDMA_WRITE;
                    size_t bad = 0;
                    rdd_status st = rdd_submit_post(sub.get(), &desc, 1, &bad);
                    if (st == RDD_STATUS_OK) {
                        next++;
                    } else if (st != RDD_STATUS_SQ_FULL) {
                        failures++;
                        return;
                    }
                }
                std::array<rdd_submit_completion, 16> c{};
                size_t n = 0;
                must(rdd_submit_reap(sub.get(), c.data(), c.size(), &n), "reap");
                for (size_t i = 0; i < n; i++) {
                    if (c[i].wr_id != done || c[i].status != RDD_WC_SUCCESS) {
                        failures++;
                    }
                    done++;
                }
            }
            if (done != kPer) {
                failures++;
            }
        });
    }
    std::thread poller([&] {
        size_t total = 0;
        auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
        while (total < size_t{kWorkers} * kPer && std::chrono::steady_clock::now() < deadline) {
            size_t posted = 0, n = 0;
            must(rdd_submit_drain(svc.get(), &posted), "drain");
            must(rdd_submit_complete(svc.get(), &n), "complete");
            total += n;
        }
        if (total != size_t{kWorkers} * kPer) {
            failures++;
        }
    });
    for (auto &w : workers) {
        w.join();
    }
    poller.join();
    must(rdd_device_stop(dev.get()), "stop");
    CHECK_EQ(failures.load(), 0u);
    CHECK_BYTES(t, s, len);
    rdd_submit_counters k{};
    must(rdd_submit_stats(svc.get(), &k), "stats");
    CHECK_EQ(k.completed, uint64_t{kWorkers} * kPer);
    CHECK_EQ(k.reaped, uint64_t{kWorkers} * kPer);
    CHECK(k.doorbells >= 1 && k.doorbells <= k.posted);
    // Members go in reverse order: the service, then the QPs, CQs, MRs...
    // (the QPs are declared before `svc`, so it goes first, as it must).
    svc.reset();
    return h_finish("test_submit_cpp");
}
