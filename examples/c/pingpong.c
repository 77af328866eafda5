/*
 * pingpong: RC SEND/RECV ping-pong latency with the rdma-direct C API.
 *
 * Two queue pairs on the in-process software device exchange a message
 * back and forth; every round trip is timed and the payload checked. The
 * same calls drive a ConnectX NIC once a verbs device is opened instead of
 * the software one.
 *
 * Build (from the repository root, after `cargo build --release`):
 *
 *     cc -std=c11 -O2 examples/c/pingpong.c -Iinclude \
 *         target/release/librdma_direct.a -lpthread -ldl -lm -o pingpong
 *
 * or, after scripts/install.sh:
 *
 *     cc -std=c11 -O2 pingpong.c $(pkg-config --cflags --libs rdma-direct) -o pingpong
 *
 * Run: ./pingpong [iterations] [message bytes] [--step]
 *   --step  drive the device from this thread (rdd_device_step) instead of
 *           its own thread: deterministic, and shows the device's share of
 *           the latency.
 */
#define _POSIX_C_SOURCE 200809L

#include <rdma_direct.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define MAX_MSG 4096u

/* Reports a failed call with the library's message and exits. */
static void fail(const char *call, rdd_status s)
{
    char msg[160];
    size_t n = 0;
    if (rdd_status_str((uint32_t)s, msg, sizeof(msg), &n) != RDD_STATUS_OK) {
        strcpy(msg, "?");
    }
    fprintf(stderr, "pingpong: %s: %s (status %u)\n", call, msg, (unsigned)s);
    exit(1);
}

#define TRY(call)                                                                        \
    do {                                                                                 \
        rdd_status try_s_ = (call);                                                      \
        if (try_s_ != RDD_STATUS_OK) {                                                   \
            fail(#call, try_s_);                                                         \
        }                                                                                \
    } while (0)

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
    /* Deep enough for the CQ guard's worst case: every WR the default
     * queues can hold (64 sends of up to two basic blocks, 64 receives),
     * flushed at once. */
    TRY(rdd_cq_create(dev, 256, &ep->cq));
    TRY(rdd_qp_create(pd, ep->cq, ep->cq, NULL, &ep->qp));
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

static void post_recv(struct endpoint *ep, uint64_t id)
{
    rdd_sge sge;
    rdd_recv_wr wr;
    size_t bad;
    sge.addr = (uint64_t)(uintptr_t)(ep->buf + MAX_MSG);
    sge.length = MAX_MSG;
    sge.lkey = ep->lkey;
    memset(&wr, 0, sizeof(wr));
    wr.wr_id = id;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    TRY(rdd_qp_post_recv(ep->qp, &wr, 1, &bad));
}

/* Sends `len` bytes stamped with `seq`; only every 16th send is signaled
 * (the library keeps the send queue from filling with unsignaled work). */
static void send_msg(struct endpoint *ep, uint64_t seq, uint32_t len)
{
    rdd_sge sge;
    rdd_wr wr;
    size_t bad;
    memset(ep->buf, (int)(seq & 0xff), len);
    memcpy(ep->buf, &seq, sizeof(seq));
    sge.addr = (uint64_t)(uintptr_t)ep->buf;
    sge.length = len;
    sge.lkey = ep->lkey;
    memset(&wr, 0, sizeof(wr));
    wr.wr_id = seq;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.opcode = RDD_WR_SEND;
    wr.flags = (seq % 16 == 0) ? RDD_SEND_SIGNALED : 0;
    TRY(rdd_qp_post_send(ep->qp, &wr, 1, &bad));
}

/* Waits for the receive of message `seq` on `ep`, handling any send
 * completions on the way, and checks the payload. */
static void wait_recv(struct endpoint *ep, uint64_t seq, uint32_t len)
{
    for (;;) {
        rdd_wc wc[4];
        size_t n = 0, i, work;
        if (step_mode) {
            TRY(rdd_device_step(dev, &work));
        }
        TRY(rdd_cq_poll(ep->cq, &ep->qp, 1, wc, 4, &n));
        for (i = 0; i < n; i++) {
            uint64_t got;
            if (wc[i].status != RDD_WC_SUCCESS) {
                fprintf(stderr, "pingpong: work request %llu failed: wc status %u\n",
                        (unsigned long long)wc[i].wr_id, wc[i].status);
                exit(1);
            }
            if (wc[i].opcode != RDD_WC_OP_RECV) {
                continue; /* a signaled send */
            }
            memcpy(&got, ep->buf + MAX_MSG, sizeof(got));
            if (wc[i].byte_len != len || got != seq) {
                fprintf(stderr, "pingpong: expected message %llu (%u bytes), got %llu (%u)\n",
                        (unsigned long long)seq, len, (unsigned long long)got, wc[i].byte_len);
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

static double now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

int main(int argc, char **argv)
{
    unsigned long iters = 10000;
    unsigned long len = 64;
    struct endpoint a, b;
    rdd_pd *pd;
    rdd_qp_info ia, ib;
    double start, total, *rtt;
    unsigned long i;
    int argi, pos = 0;

    for (argi = 1; argi < argc; argi++) {
        if (strcmp(argv[argi], "--step") == 0) {
            step_mode = 1;
        } else if (pos == 0) {
            iters = strtoul(argv[argi], NULL, 10);
            pos++;
        } else {
            len = strtoul(argv[argi], NULL, 10);
        }
    }
    if (iters == 0 || len < sizeof(uint64_t) || len > MAX_MSG) {
        fprintf(stderr, "usage: %s [iterations > 0] [message bytes 8..%u] [--step]\n", argv[0],
                MAX_MSG);
        return 2;
    }

    rtt = (double *)malloc(iters * sizeof(*rtt));
    if (rtt == NULL) {
        fprintf(stderr, "pingpong: out of memory\n");
        return 1;
    }

    TRY(rdd_device_open_soft(NULL, &dev));
    TRY(rdd_pd_alloc(dev, &pd));
    endpoint_open(&a, pd);
    endpoint_open(&b, pd);

    /* Exchange connection data (out of band between hosts; here a copy). */
    TRY(rdd_qp_query_info(a.qp, &ia));
    TRY(rdd_qp_query_info(b.qp, &ib));
    TRY(rdd_qp_connect(a.qp, &ib, NULL));
    TRY(rdd_qp_connect(b.qp, &ia, NULL));
    if (!step_mode) {
        TRY(rdd_device_start(dev));
    }
    post_recv(&a, 0);
    post_recv(&b, 0);

    /* Warm-up round, then the timed ones. */
    send_msg(&a, 0, (uint32_t)len);
    wait_recv(&b, 0, (uint32_t)len);
    send_msg(&b, 0, (uint32_t)len);
    wait_recv(&a, 0, (uint32_t)len);
    start = now_us();
    for (i = 1; i <= iters; i++) {
        double t0 = now_us();
        send_msg(&a, i, (uint32_t)len);
        wait_recv(&b, i, (uint32_t)len);
        send_msg(&b, i, (uint32_t)len);
        wait_recv(&a, i, (uint32_t)len);
        rtt[i - 1] = now_us() - t0;
    }
    total = now_us() - start;

    /* One-way latency is half the round trip, as ib_send_lat reports it. */
    qsort(rtt, iters, sizeof(*rtt), cmp_double);
    printf("pingpong: %lu round trips of %lu bytes (%s mode)\n", iters, len,
           step_mode ? "step" : "thread");
    printf("pingpong: measured: one-way latency, half the round trip of a SEND answered by a\n"
           "pingpong:   SEND; this one thread drives both QPs\n");
    printf("pingpong: device: the in-process software HCA (memory copies, no network and no\n"
           "pingpong:   NIC), %s\n",
           step_mode ? "stepped by this thread" : "on its own busy-polling device thread");
    {
        long cores = sysconf(_SC_NPROCESSORS_ONLN);
        int pollers = step_mode ? 1 : 2;
        printf("pingpong: %ld cores available, %d busy-polling thread%s\n", cores, pollers,
               pollers == 1 ? "" : "s");
        if (cores > 0 && pollers > cores) {
            printf("pingpong: WARNING: more busy-polling threads than cores: the figures include\n"
                   "pingpong:   scheduler hand-offs and vary widely between runs\n");
        }
    }
    printf("pingpong: one-way latency us: min %.2f  median %.2f  p99 %.2f  avg %.2f\n",
           rtt[0] / 2.0, rtt[iters / 2] / 2.0, rtt[iters - 1 - iters / 100] / 2.0,
           total / (double)iters / 2.0);
    free(rtt);

    if (!step_mode) {
        TRY(rdd_device_stop(dev));
    }
    endpoint_close(&a);
    endpoint_close(&b);
    TRY(rdd_pd_free(pd));
    TRY(rdd_device_close(dev));
    return 0;
}
