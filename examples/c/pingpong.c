/*
 * pingpong: RC SEND/RECV ping-pong latency with the rdma-direct C API.
 *
 * Two queue pairs on one device exchange a message back and forth; every
 * round trip is timed and every payload byte checked. The device is the
 * in-process software HCA, or with `--device NAME` a kernel RDMA device
 * (rxe0, mlx5_0, ...) opened with rdd_device_open_verbs, which needs a
 * library built with the verbs backend. Both QPs are on that one device,
 * connected to each other with rdd_qp_query_info + rdd_qp_connect (what
 * two hosts would exchange out of band). iWARP devices (siw) connect only
 * through rdma_cm, which the C API does not offer: the example says so.
 *
 * Build (from the repository root, after `cargo build --release`):
 *
 *     cc -std=c11 -O2 examples/c/pingpong.c -Iinclude \
 *         target/release/librdma_direct.a -lpthread -ldl -lm -o pingpong
 *
 * or, after scripts/install.sh (FEATURES=verbs for --device):
 *
 *     cc -std=c11 -O2 pingpong.c $(pkg-config --cflags --libs --static rdma-direct) -o pingpong
 *
 * (common.h, next to this file, must be on the include path.)
 *
 * Run: ./pingpong [iterations] [message bytes] [--step] [--device NAME]
 *   --step    drive the software device from this thread (rdd_device_step)
 *             instead of its own thread: deterministic, and shows the
 *             device's share of the latency.
 *   --device  run on the kernel RDMA device NAME; it runs by itself (no
 *             --step). The device picks the GID (the IPv4 RoCEv2 entry on
 *             RoCE); RDMA_DIRECT_DATA_PATH=fallback selects libibverbs'
 *             provider instead of rdma-direct's own rings.
 */
#define _POSIX_C_SOURCE 200809L

#include "common.h"

#include <sched.h>

#define MAX_MSG 4096u
/* Give up when nothing arrives for this long (a lost message, a dead
 * device): a wait must never hang. */
#define STALL_US 10e6

/* One side of the connection: its queue pair, CQ and message buffer. */
struct endpoint {
    rdd_cq *cq;
    rdd_qp *qp;
    rdd_mr *mr;
    uint8_t *buf; /* [0, MAX_MSG): send buffer; [MAX_MSG, 2*MAX_MSG): receive buffer */
    uint32_t lkey;
};

static rdd_device *dev;
static int step_mode;

static void endpoint_open(struct endpoint *ep, rdd_pd *pd)
{
    void *addr;
    rdd_qp_init init;
    memset(&init, 0, sizeof(init));
    init.max_send_wr = 64;
    init.max_recv_wr = 16;
    init.max_send_sge = 1;
    init.max_recv_sge = 1;
    /* Deep enough for the CQ guard's worst case: every WR the queues can
     * hold, flushed at once (a kernel device may grant more than asked). */
    TRY(rdd_cq_create(dev, 512, &ep->cq));
    TRY(rdd_qp_create(pd, ep->cq, ep->cq, &init, &ep->qp));
    TRY(rdd_mr_reg(pd, 2 * MAX_MSG, RDD_ACCESS_LOCAL_WRITE, &ep->mr));
    TRY(rdd_mr_addr(ep->mr, &addr));
    TRY(rdd_mr_lkey(ep->mr, &ep->lkey));
    ep->buf = (uint8_t *)addr;
}

static void endpoint_close(struct endpoint *ep)
{
    TRY(rdd_qp_destroy(ep->qp));
    TRY(rdd_cq_destroy(ep->cq));
    TRY(rdd_mr_free(ep->mr));
}

/* One receive of up to MAX_MSG bytes into the receive buffer: the
 * per-opcode call (one SGE, no rdd_recv_wr to build; docs/c-api.md,
 * "which call to use when"). */
static void post_recv(struct endpoint *ep, uint64_t id)
{
    TRY(rdd_qp_recv(ep->qp, id, (uint64_t)(uintptr_t)(ep->buf + MAX_MSG), MAX_MSG, ep->lkey, 0));
}

/* Sends `len` bytes stamped with `seq` with the per-opcode rdd_qp_send
 * (one WR, one doorbell); only every 16th send is signaled (the library
 * keeps the send queue from filling with unsignaled work). */
static void send_msg(struct endpoint *ep, uint64_t seq, uint32_t len)
{
    memset(ep->buf, (int)(seq & 0xff), len);
    memcpy(ep->buf, &seq, sizeof(seq));
    TRY(rdd_qp_send(ep->qp, seq, (uint64_t)(uintptr_t)ep->buf, len, ep->lkey,
                    (seq % 16 == 0) ? RDD_SEND_SIGNALED : 0));
}

/* Whether the message in the receive buffer is message `seq` of `len`
 * bytes, as send_msg wrote it: every byte. */
static int payload_ok(const struct endpoint *ep, uint64_t seq, uint32_t len)
{
    const uint8_t *p = ep->buf + MAX_MSG;
    uint64_t got;
    uint32_t i;
    memcpy(&got, p, sizeof(got));
    if (got != seq) {
        return 0;
    }
    for (i = sizeof(seq); i < len; i++) {
        if (p[i] != (uint8_t)(seq & 0xff)) {
            return 0;
        }
    }
    return 1;
}

/* Waits for the receive of message `seq` on `ep`, handling any send
 * completions on the way, and checks the payload. Busy-polls; after a
 * stretch of empty polls it yields the CPU, so a device thread sharing
 * this core can run. */
static void wait_recv(struct endpoint *ep, uint64_t seq, uint32_t len)
{
    unsigned long idle = 0;
    double idle_since = 0.0;
    for (;;) {
        rdd_wc wc[4];
        size_t n, i, work;
        if (step_mode) {
            TRY(rdd_device_step(dev, &work));
        }
        n = ex_poll(ep->cq, wc, 4);
        if (n == 0) {
            idle++;
            if (idle % 1024 == 0) {
                double now = ex_now_us();
                if (idle == 1024) {
                    idle_since = now;
                } else if (now - idle_since > STALL_US) {
                    fprintf(stderr, "pingpong: message %llu did not arrive within %.0f s\n",
                            (unsigned long long)seq, STALL_US / 1e6);
                    exit(1);
                }
                sched_yield();
            }
            continue;
        }
        idle = 0;
        for (i = 0; i < n; i++) {
            if (wc[i].status != RDD_WC_SUCCESS) {
                fprintf(stderr, "pingpong: work request %llu failed: wc status %u\n",
                        (unsigned long long)wc[i].wr_id, wc[i].status);
                exit(1);
            }
            if (wc[i].opcode != RDD_WC_OP_RECV) {
                continue; /* a signaled send */
            }
            if (wc[i].byte_len != len || !payload_ok(ep, seq, len)) {
                uint64_t got;
                memcpy(&got, ep->buf + MAX_MSG, sizeof(got));
                fprintf(stderr,
                        "pingpong: expected message %llu (%u bytes), got %llu (%u bytes)%s\n",
                        (unsigned long long)seq, len, (unsigned long long)got, wc[i].byte_len,
                        got == seq ? ", payload bytes differ" : "");
                exit(1);
            }
            post_recv(ep, seq + 1);
            return;
        }
    }
}

static int cmp_double(const void *x, const void *y)
{
    double a = *(const double *)x, b = *(const double *)y;
    return (a > b) - (a < b);
}

static void usage(const char *argv0)
{
    fprintf(stderr,
            "usage: %s [iterations > 0] [message bytes 8..%u] [--step | --device NAME]\n",
            argv0, MAX_MSG);
    exit(2);
}

int main(int argc, char **argv)
{
    unsigned long iters = 10000;
    unsigned long len = 64;
    const char *device = NULL;
    struct endpoint a, b;
    rdd_pd *pd;
    rdd_qp_info info;
    double start, total, *rtt;
    unsigned long i;
    int argi, pos = 0;

    ex_prog = "pingpong";
    for (argi = 1; argi < argc; argi++) {
        if (strcmp(argv[argi], "--step") == 0) {
            step_mode = 1;
        } else if (strcmp(argv[argi], "--device") == 0 || strcmp(argv[argi], "-d") == 0) {
            if (++argi == argc) {
                usage(argv[0]);
            }
            device = argv[argi];
        } else if (argv[argi][0] == '-') {
            usage(argv[0]);
        } else if (pos == 0) {
            iters = ex_number("iterations", argv[argi], 1, 100000000ul);
            pos++;
        } else if (pos == 1) {
            len = ex_number("message bytes", argv[argi], sizeof(uint64_t), MAX_MSG);
            pos++;
        } else {
            usage(argv[0]);
        }
    }
    if (step_mode && device != NULL) {
        fprintf(stderr, "pingpong: --step drives the software device; a kernel device (--device)\n"
                        "pingpong:   runs by itself\n");
        return 2;
    }

    rtt = (double *)malloc(iters * sizeof(*rtt));
    if (rtt == NULL) {
        fprintf(stderr, "pingpong: out of memory\n");
        return 1;
    }

    dev = ex_open_device(device);
    TRY(rdd_pd_alloc(dev, &pd));
    endpoint_open(&a, pd);
    endpoint_open(&b, pd);

    /* Exchange connection data (out of band between hosts; here a copy)
     * and connect; SEND/RECV needs no remote access. */
    ex_connect_pair(device, a.qp, b.qp, NULL, NULL, &info);
    if (device == NULL && !step_mode) {
        TRY(rdd_device_start(dev));
    }
    post_recv(&a, 0);
    post_recv(&b, 0);

    /* Warm-up round, then the timed ones. */
    send_msg(&a, 0, (uint32_t)len);
    wait_recv(&b, 0, (uint32_t)len);
    send_msg(&b, 0, (uint32_t)len);
    wait_recv(&a, 0, (uint32_t)len);
    start = ex_now_us();
    for (i = 1; i <= iters; i++) {
        double t0 = ex_now_us();
        send_msg(&a, i, (uint32_t)len);
        wait_recv(&b, i, (uint32_t)len);
        send_msg(&b, i, (uint32_t)len);
        wait_recv(&a, i, (uint32_t)len);
        rtt[i - 1] = ex_now_us() - t0;
    }
    total = ex_now_us() - start;

    /* One-way latency is half the round trip, as ib_send_lat reports it. */
    qsort(rtt, iters, sizeof(*rtt), cmp_double);
    printf("pingpong: %lu round trips of %lu bytes (%s)\n", iters, len,
           device != NULL ? "kernel device"
           : step_mode    ? "step mode"
                          : "thread mode");
    printf("pingpong: measured: one-way latency, half the round trip of a SEND answered by a\n"
           "pingpong:   SEND; this one thread drives both QPs; every payload byte checked\n");
    if (device == NULL) {
        printf("pingpong: device: the in-process software HCA (memory copies, no network and no\n"
               "pingpong:   NIC), %s\n",
               step_mode ? "stepped by this thread" : "on its own busy-polling device thread");
    } else {
        printf("pingpong: device: %s, %s\n", device, ex_medium(device));
        char gid[40];
        ex_gid_str(info.gid, gid);
        printf("pingpong: data path: %s\n", ex_data_path(dev, device));
        printf("pingpong: GID %s, path MTU %u bytes (rdd_qp_query_info)\n", gid, info.mtu);
    }
    {
        long cores = ex_cores();
        /* This thread, plus the software device's own thread when it runs;
         * a kernel device adds no busy-polling thread to this process. */
        int pollers = (device == NULL && !step_mode) ? 2 : 1;
        printf("pingpong: %ld cores available (%s), %d busy-polling thread%s\n", cores,
               ex_in_vm() ? "virtual machine" : "no hypervisor flag", pollers,
               pollers == 1 ? "" : "s");
        if (pollers > cores) {
            printf("pingpong: WARNING: more busy-polling threads than cores: the figures include\n"
                   "pingpong:   scheduler hand-offs and vary widely between runs\n");
        }
    }
    printf("pingpong: one-way latency us: min %.2f  median %.2f  p99 %.2f  avg %.2f\n",
           rtt[0] / 2.0, rtt[iters / 2] / 2.0, rtt[iters - 1 - iters / 100] / 2.0,
           total / (double)iters / 2.0);
    free(rtt);

    if (device == NULL && !step_mode) {
        TRY(rdd_device_stop(dev));
    }
    endpoint_close(&a);
    endpoint_close(&b);
    TRY(rdd_pd_free(pd));
    TRY(rdd_device_close(dev));
    return 0;
}
