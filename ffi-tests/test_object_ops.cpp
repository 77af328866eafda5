// C++17 tests of the per-opcode posts and the one-handle poll: the calls
// from C++ with RAII-owned handles, a two-thread ping-pong on the software
// device's thread (each side posts with rdd_qp_send_inline/rdd_qp_recv
// and polls with rdd_cq_poll_n), and concurrent misuse: one thread posting
// to a QP while another polls its CQ with rdd_cq_poll_n, and two threads
// polling one CQ. Misuse must be reported as RESOURCE_BUSY, never crash,
// and never lose or duplicate a completion.
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "harness.h"

static_assert(std::is_same<decltype(&rdd_cq_poll_n), int32_t (*)(rdd_cq *, rdd_wc *, uint32_t)>::value,
              "rdd_cq_poll_n returns a count or a negative status");
static_assert(std::is_same<decltype(&rdd_qp_ring), rdd_status (*)(rdd_qp *)>::value,
              "rdd_qp_ring takes the QP only");
static_assert(RDD_SEND_DEFER_DOORBELL == 0x40000000u, "the deferral bit");

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

void must(rdd_status s, const char *what)
{
    if (s != RDD_STATUS_OK) {
        std::fprintf(stderr, "%s failed with %u\n", what, static_cast<unsigned>(s));
        std::abort();
    }
}

constexpr uint32_t kRemote = RDD_ACCESS_REMOTE_WRITE | RDD_ACCESS_REMOTE_READ;

// One side: a CQ, a QP completing on it and a 4 KiB MR (declared in that
// order, so they are destroyed QP first).
struct Side {
    Cq cq;
    Qp qp;
    Mr mr;
    uint8_t *buf = nullptr;
    uint64_t addr = 0;
    uint32_t lkey = 0;
    uint32_t rkey = 0;

    Side(rdd_device *dev, rdd_pd *pd)
    {
        rdd_cq *c = nullptr;
        must(rdd_cq_create(dev, 1024, &c), "rdd_cq_create");
        cq.reset(c);
        rdd_qp *q = nullptr;
        must(rdd_qp_create(pd, c, c, nullptr, &q), "rdd_qp_create");
        qp.reset(q);
        rdd_mr *m = nullptr;
        must(rdd_mr_reg(pd, 4096, RDD_ACCESS_LOCAL_WRITE | kRemote, &m), "rdd_mr_reg");
        mr.reset(m);
        void *a = nullptr;
        must(rdd_mr_addr(m, &a), "rdd_mr_addr");
        buf = static_cast<uint8_t *>(a);
        addr = reinterpret_cast<uintptr_t>(a);
        must(rdd_mr_lkey(m, &lkey), "rdd_mr_lkey");
        must(rdd_mr_rkey(m, &rkey), "rdd_mr_rkey");
    }
};

struct Pair {
    Device dev;
    Pd pd;
    std::unique_ptr<Side> a, b;

    Pair()
    {
        rdd_device *d = nullptr;
        must(rdd_device_open_soft(nullptr, &d), "rdd_device_open_soft");
        dev.reset(d);
        rdd_pd *p = nullptr;
        must(rdd_pd_alloc(d, &p), "rdd_pd_alloc");
        pd.reset(p);
        a.reset(new Side(d, p));
        b.reset(new Side(d, p));
        rdd_connect_attr attr{kRemote, 7, 7, 0, 0};
        rdd_qp_info ia{}, ib{};
        must(rdd_qp_query_info(a->qp.get(), &ia), "rdd_qp_query_info");
        must(rdd_qp_query_info(b->qp.get(), &ib), "rdd_qp_query_info");
        must(rdd_qp_connect(a->qp.get(), &ib, &attr), "rdd_qp_connect");
        must(rdd_qp_connect(b->qp.get(), &ia, &attr), "rdd_qp_connect");
    }

    ~Pair()
    {
        // Sides before the PD and the device.
        a.reset();
        b.reset();
    }
};

// Every per-opcode call from C++, in step mode, with the results checked.
void test_calls_from_cpp()
{
    Pair p;
    Side &a = *p.a, &b = *p.b;
    size_t work = 0;
    rdd_wc wc[8];
    std::memcpy(a.buf, "from c++", 8);
    CHECK_EQ(rdd_qp_recv(b.qp.get(), 1, b.addr + 1024, 64, b.lkey, RDD_SEND_DEFER_DOORBELL),
             RDD_STATUS_OK);
    CHECK_EQ(rdd_qp_ring(b.qp.get()), RDD_STATUS_OK);
    CHECK_EQ(rdd_qp_write(a.qp.get(), 10, a.addr, 8, a.lkey, b.addr, b.rkey,
                          RDD_SEND_SIGNALED | RDD_SEND_DEFER_DOORBELL),
             RDD_STATUS_OK);
    CHECK_EQ(rdd_qp_send_imm(a.qp.get(), 11, a.addr, 8, a.lkey, 42u,
                             RDD_SEND_SIGNALED | RDD_SEND_DEFER_DOORBELL),
             RDD_STATUS_OK);
    must(rdd_device_step(p.dev.get(), &work), "rdd_device_step");
    CHECK_EQ(work, 0);
    CHECK_EQ(rdd_qp_ring(a.qp.get()), RDD_STATUS_OK);
    for (int i = 0; i < 4; i++) {
        must(rdd_device_step(p.dev.get(), &work), "rdd_device_step");
    }
    CHECK_EQ(rdd_cq_poll_n(a.cq.get(), wc, 8), 2);
    CHECK_EQ(wc[0].wr_id, 10);
    CHECK_EQ(wc[1].wr_id, 11);
    CHECK_EQ(rdd_cq_poll_n(b.cq.get(), wc, 8), 1);
    CHECK_EQ(wc[0].imm_data, 42u);
    CHECK_BYTES(b.buf, "from c++", 8);
    CHECK_BYTES(b.buf + 1024, "from c++", 8);
    CHECK_EQ(rdd_qp_read(a.qp.get(), 12, a.addr + 64, 8, a.lkey, b.addr, b.rkey, RDD_SEND_SIGNALED),
             RDD_STATUS_OK);
    CHECK_EQ(rdd_qp_write_inline(a.qp.get(), 13, "xy", 2, b.addr + 8, b.rkey, RDD_SEND_SIGNALED),
             RDD_STATUS_OK);
    for (int i = 0; i < 4; i++) {
        must(rdd_device_step(p.dev.get(), &work), "rdd_device_step");
    }
    CHECK_EQ(rdd_cq_poll_n(a.cq.get(), wc, 8), 2);
    CHECK_BYTES(a.buf + 64, "from c++", 8);
    CHECK_BYTES(b.buf + 8, "xy", 2);
    CHECK_EQ(rdd_qp_write(nullptr, 0, 0, 0, 0, 0, 0, 0), RDD_STATUS_NULL_PARAMETER);
    CHECK_EQ(rdd_cq_poll_n(a.cq.get(), nullptr, 1), -static_cast<int32_t>(RDD_STATUS_NULL_PARAMETER));
}

// Two threads, each owning one side, exchange `rounds` messages each way.
void test_pingpong_threads()
{
    Pair p;
    must(rdd_device_start(p.dev.get()), "rdd_device_start");
    constexpr int rounds = 300;
    std::atomic<int> failures{0};
    auto run = [&](Side &me, bool first) {
        auto wait_one = [&](rdd_wc *wc) {
            for (long spins = 0; spins < 50000000L; spins++) {
                int32_t n = rdd_cq_poll_n(me.cq.get(), wc, 1);
                if (n == 1) {
                    return true;
                }
                if (n != 0) {
                    return false;
                }
                std::this_thread::yield();
            }
            return false;
        };
        for (int i = 0; i < rounds; i++) {
            std::string msg = (first ? "ping " : "pong ") + std::to_string(i);
            rdd_wc wc{};
            if (rdd_qp_recv(me.qp.get(), 1000 + static_cast<uint64_t>(i), me.addr + 2048, 64,
                            me.lkey, 0) != RDD_STATUS_OK) {
                failures++;
                return;
            }
            if (first && rdd_qp_send_inline(me.qp.get(), static_cast<uint64_t>(i), msg.data(),
                                            static_cast<uint32_t>(msg.size()),
                                            RDD_SEND_SIGNALED) != RDD_STATUS_OK) {
                failures++;
                return;
            }
            // Two completions per round: our send and the peer's message.
            for (int k = 0; k < 2; k++) {
                if (!wait_one(&wc) || wc.status != RDD_WC_SUCCESS) {
                    failures++;
                    return;
                }
                if (wc.opcode == RDD_WC_OP_RECV && !first) {
                    if (rdd_qp_send_inline(me.qp.get(), static_cast<uint64_t>(i), msg.data(),
                                           static_cast<uint32_t>(msg.size()),
                                           RDD_SEND_SIGNALED) != RDD_STATUS_OK) {
                        failures++;
                        return;
                    }
                }
            }
        }
    };
    std::thread ta(run, std::ref(*p.a), true);
    std::thread tb(run, std::ref(*p.b), false);
    ta.join();
    tb.join();
    CHECK_EQ(failures.load(), 0);
    must(rdd_device_stop(p.dev.get()), "rdd_device_stop");
}

// One thread posts signaled WRITEs to A's QP (some deferred, rung with
// rdd_qp_ring) while another polls A's CQ with rdd_cq_poll_n. The poller
// takes the QP only when a completion for it arrives, so the two collide:
// each side must see RESOURCE_BUSY (never a crash or a corrupt queue),
// and every posted WR must complete exactly once.
void test_post_while_polling()
{
    Pair p;
    Side &a = *p.a, &b = *p.b;
    must(rdd_device_start(p.dev.get()), "rdd_device_start");
    constexpr uint64_t total = 20000;
    std::atomic<bool> posted_all{false};
    std::atomic<unsigned> post_busy{0}, bad_status{0};
    std::vector<unsigned> seen(total, 0);
    unsigned poll_busy = 0, poll_bad = 0;
    uint64_t got = 0;

    std::thread poster([&] {
        uint64_t next = 0;
        bool pending = false;
        while (next < total) {
            uint32_t flags = RDD_SEND_SIGNALED | (next % 3 ? RDD_SEND_DEFER_DOORBELL : 0u);
            rdd_status s =
                rdd_qp_write(a.qp.get(), next, a.addr, 8, a.lkey, b.addr, b.rkey, flags);
            if (s == RDD_STATUS_OK) {
                pending = (flags & RDD_SEND_DEFER_DOORBELL) != 0;
                next++;
                continue;
            }
            if (s == RDD_STATUS_RESOURCE_BUSY) {
                post_busy++;
            } else if (s != RDD_STATUS_SQ_FULL) {
                bad_status++;
                break;
            }
            // Full or busy: make sure what is written gets rung.
            if (pending && rdd_qp_ring(a.qp.get()) == RDD_STATUS_OK) {
                pending = false;
            }
            std::this_thread::yield();
        }
        while (pending) {
            rdd_status s = rdd_qp_ring(a.qp.get());
            if (s == RDD_STATUS_OK) {
                pending = false;
            } else if (s != RDD_STATUS_RESOURCE_BUSY) {
                bad_status++;
                break;
            }
        }
        posted_all = true;
    });

    rdd_wc wc[16];
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (got < total && std::chrono::steady_clock::now() < deadline) {
        int32_t n = rdd_cq_poll_n(a.cq.get(), wc, 16);
        if (n == -static_cast<int32_t>(RDD_STATUS_RESOURCE_BUSY)) {
            poll_busy++;
            continue;
        }
        if (n < 0) {
            poll_bad++;
            break;
        }
        for (int32_t i = 0; i < n; i++) {
            if (wc[i].status != RDD_WC_SUCCESS || wc[i].wr_id >= total) {
                poll_bad++;
                continue;
            }
            seen[wc[i].wr_id]++;
        }
        got += static_cast<uint64_t>(n);
    }
    poster.join();
    must(rdd_device_stop(p.dev.get()), "rdd_device_stop");
    CHECK(posted_all.load());
    CHECK_EQ(bad_status.load(), 0);
    CHECK_EQ(poll_bad, 0);
    CHECK_EQ(got, total);
    unsigned once = 0;
    for (unsigned v : seen) {
        once += v == 1;
    }
    CHECK_EQ(once, total);
    std::printf("test_post_while_polling: %llu completions; RESOURCE_BUSY seen by the poster "
                "%u times, by the poller %u times\n",
                static_cast<unsigned long long>(got), post_busy.load(), poll_busy);
}

// Two threads poll one CQ at once while a third posts to its QP: a
// poller is refused with RESOURCE_BUSY whenever it overlaps the other (or
// the poster); together they get every completion exactly once.
void test_two_pollers()
{
    Pair p;
    Side &a = *p.a, &b = *p.b;
    must(rdd_device_start(p.dev.get()), "rdd_device_start");
    constexpr uint64_t total = 5000;
    std::atomic<bool> go{false};
    std::atomic<uint64_t> got{0};
    std::atomic<unsigned> busy{0}, bad{0};
    std::vector<std::vector<uint64_t>> ids(2);
    std::thread poster([&] {
        while (!go.load()) {
            std::this_thread::yield();
        }
        uint64_t next = 0;
        while (next < total) {
            rdd_status s =
                rdd_qp_write(a.qp.get(), next, a.addr, 8, a.lkey, b.addr, b.rkey, RDD_SEND_SIGNALED);
            if (s == RDD_STATUS_OK) {
                next++;
            } else if (s == RDD_STATUS_SQ_FULL || s == RDD_STATUS_RESOURCE_BUSY) {
                std::this_thread::yield();
            } else {
                bad++;
                return;
            }
        }
    });
    auto poll = [&](int me) {
        rdd_wc wc[2];
        while (!go.load()) {
            std::this_thread::yield();
        }
        auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
        while (got.load() < total && std::chrono::steady_clock::now() < deadline) {
            int32_t n = rdd_cq_poll_n(a.cq.get(), wc, 2);
            if (n == -static_cast<int32_t>(RDD_STATUS_RESOURCE_BUSY)) {
                busy++;
                continue;
            }
            if (n < 0) {
                bad++;
                return;
            }
            for (int32_t i = 0; i < n; i++) {
                ids[static_cast<size_t>(me)].push_back(wc[i].wr_id);
            }
            got += static_cast<uint64_t>(n);
        }
    };
    std::thread t0(poll, 0);
    std::thread t1(poll, 1);
    go = true;
    t0.join();
    t1.join();
    poster.join();
    must(rdd_device_stop(p.dev.get()), "rdd_device_stop");
    std::vector<unsigned> seen(total, 0);
    for (auto &v : ids) {
        for (uint64_t id : v) {
            if (id < total) {
                seen[id]++;
            }
        }
    }
    unsigned once = 0;
    for (unsigned v : seen) {
        once += v == 1;
    }
    CHECK_EQ(bad.load(), 0);
    CHECK_EQ(got.load(), total);
    CHECK_EQ(once, total);
    std::printf("test_two_pollers: %llu completions (%zu and %zu), %u RESOURCE_BUSY refusals\n",
                static_cast<unsigned long long>(got.load()), ids[0].size(), ids[1].size(),
                busy.load());
}

} // namespace

int main()
{
    test_calls_from_cpp();
    test_pingpong_threads();
    test_post_while_polling();
    test_two_pollers();
    return h_finish("test_object_ops_cpp");
}
