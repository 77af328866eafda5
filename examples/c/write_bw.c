/*
 * write_bw: RDMA WRITE bandwidth and message rate with the rdma-direct C
 * API, in the style of perftest's ib_write_bw.
 *
 * One RC QP writes into a peer QP's memory region on the same device: the
 * in-process software HCA (its device thread started), or with
 * `--device NAME` a kernel RDMA device (rxe0, mlx5_0, ...) opened with
 * rdd_device_open_verbs, which needs a library built with the verbs
 * backend. The two QPs are connected with rdd_qp_query_info +
 * rdd_qp_connect, the peer granting RDD_ACCESS_REMOTE_WRITE. iWARP
 * devices (siw) connect only through rdma_cm, which the C API does not
 * offer: the example says so and exits 2.
 *
 * For each message size the writer keeps the send queue busy with
 * batches of `--batch` WRITEs, each WRITE one per-opcode rdd_qp_write
 * call (no rdd_wr to build), all but the last with
 * RDD_SEND_DEFER_DOORBELL, so the last rings one doorbell for the batch
 * (on rdma-direct's rxe and siw rings too, one POST_SEND system call per
 * batch; the verbs fallback posts every WR at once, and the doorbells
 * column says so); only that last WR is signaled: one completion retires
 * the whole batch. Every WR's wr_id is the number of messages posted up to and
 * including it, so any completion says how many are done. The writer
 * polls after each round of posting (rdd_cq_poll_n); after a stretch of empty polls it
 * yields the CPU, so a device thread sharing its core can run. Each size
 * is timed from the first post to the last completion, after a warm-up;
 * then the target buffer is compared byte for byte with the source (whose
 * pattern changes per size) and the row says OK or MISMATCH (exit 1).
 *
 * Build (from the repository root, after `cargo build --release`):
 *
 *     cc -std=c11 -O2 examples/c/write_bw.c -Iinclude \
 *         target/release/librdma_direct.a -lpthread -ldl -lm -o write_bw
 *
 * or, after scripts/install.sh (FEATURES=verbs for --device):
 *
 *     cc -std=c11 -O2 write_bw.c $(pkg-config --cflags --libs --static rdma-direct) -o write_bw
 *
 * (common.h, next to this file, must be on the include path.)
 *
 * Run: ./write_bw [--size BYTES] [--iters N] [--warmup N] [--batch 1..64]
 *                 [--device NAME]
 * Defaults: sizes 8 B to 64 KiB, 100000 messages per size after 10000
 * warm-up, batches of 16. RDMA_DIRECT_DATA_PATH=fallback runs a kernel
 * device's QPs on libibverbs' provider instead of rdma-direct's rings.
 */
#define _POSIX_C_SOURCE 200809L

#include "common.h"

#include <sched.h>

/* Message sizes measured without --size. */
static const unsigned long SIZES[] = {8, 32, 128, 512, 2048, 4096, 8192, 32768, 65536};
#define NSIZES (sizeof(SIZES) / sizeof(SIZES[0]))
/* Largest --batch. */
#define MAX_BATCH 64u
/* Send-queue depth asked for, in WRs; never more WRs are outstanding
 * (a 1-SGE WRITE is one 64-byte basic block on mlx5, one WQE on rxe). */
#define SQ_DEPTH 256u
/* Largest --size (the two regions are allocated once, at the largest). */
#define MAX_SIZE (64ul << 20)
/* Give up when nothing completes for this long. */
#define STALL_US 10e6

/* The writer's side: its QP and CQ, the source region, the target. */
struct writer {
    rdd_qp *qp;
    rdd_cq *cq;
    uint8_t *src;
    uint32_t lkey;
    uint64_t remote_addr;
    uint32_t rkey;
    unsigned batch;
};

/* What one timed run did. */
struct run {
    double us;
    uint64_t cqes;
    uint64_t doorbells;
};

/* Writes `count` messages of `size` bytes; returns once all completed. */
static struct run write_run(struct writer *w, uint32_t size, uint64_t count)
{
    rdd_wc wc[32];
    uint64_t posted = 0, done = 0, cqes = 0, db0, db1;
    uint64_t src = (uint64_t)(uintptr_t)w->src;
    unsigned long idle = 0;
    double start, idle_since = 0.0;
    struct run r;
    size_t i, k;

    TRY(rdd_qp_doorbells(w->qp, &db0));
    start = ex_now_us();
    while (done < count) {
        int full = 0;
        /* Post whole batches while the send queue has room for one. */
        while (!full && posted < count && posted - done + w->batch <= SQ_DEPTH) {
            uint64_t left = count - posted;
            unsigned n = left < w->batch ? (unsigned)left : w->batch;
            for (i = 0; i < n; i++) {
                /* All but the last defer the doorbell; the last rings it
                 * for the batch and asks for the completion. */
                uint32_t flags = (i == n - 1) ? RDD_SEND_SIGNALED : RDD_SEND_DEFER_DOORBELL;
                rdd_status s = rdd_qp_write(w->qp, posted + 1, src, size, w->lkey,
                                            w->remote_addr, w->rkey, flags);
                if (s == RDD_STATUS_SQ_FULL) {
                    /* A refused call rings nothing: ring what this batch
                     * deferred, poll, then post the rest. */
                    TRY(rdd_qp_ring(w->qp));
                    full = 1;
                    break;
                }
                if (s != RDD_STATUS_OK) {
                    ex_fail("rdd_qp_write", s);
                }
                posted++;
            }
        }
        k = ex_poll(w->cq, wc, sizeof(wc) / sizeof(wc[0]));
        for (i = 0; i < k; i++) {
            if (wc[i].status != RDD_WC_SUCCESS || wc[i].opcode != RDD_WC_OP_RDMA_WRITE) {
                fprintf(stderr,
                        "write_bw: completion of message %llu failed: opcode %u, wc status "
                        "%u, vendor syndrome 0x%x\n",
                        (unsigned long long)wc[i].wr_id, wc[i].opcode, wc[i].status,
                        wc[i].vendor_err);
                exit(1);
            }
            if (wc[i].wr_id <= done || wc[i].wr_id > posted) {
                fprintf(stderr,
                        "write_bw: completion for %llu messages out of order (done %llu, "
                        "posted %llu)\n",
                        (unsigned long long)wc[i].wr_id, (unsigned long long)done,
                        (unsigned long long)posted);
                exit(1);
            }
            done = wc[i].wr_id;
            cqes++;
        }
        if (k != 0) {
            idle = 0;
            continue;
        }
        idle++;
        if (idle < 64) {
            continue;
        }
        if (idle == 64) {
            idle_since = ex_now_us();
        } else if (idle % 1024 == 0 && ex_now_us() - idle_since > STALL_US) {
            fprintf(stderr, "write_bw: no completion for %.0f s (%llu of %llu done)\n",
                    STALL_US / 1e6, (unsigned long long)done, (unsigned long long)count);
            exit(1);
        }
        sched_yield();
    }
    r.us = ex_now_us() - start;
    TRY(rdd_qp_doorbells(w->qp, &db1));
    r.cqes = cqes;
    r.doorbells = db1 - db0;
    return r;
}

/* A pattern that differs per size, so a stale target cannot pass. */
static void fill_source(uint8_t *src, unsigned long size, unsigned seed)
{
    unsigned long j;
    for (j = 0; j < size; j++) {
        src[j] = (uint8_t)((uint8_t)(j * 13u + seed + 1u) ^ (uint8_t)(j >> 8));
    }
}

static void usage(void)
{
    fprintf(stderr,
            "usage: write_bw [--size BYTES] [--iters N] [--warmup N] [--batch 1..%u]\n"
            "                [--device NAME]\n",
            MAX_BATCH);
    exit(2);
}

int main(int argc, char **argv)
{
    unsigned long iters = 100000, warmup = 10000, batch = 16, one_size = 0, max;
    const unsigned long *sizes = SIZES;
    size_t nsizes = NSIZES, k;
    const char *device = NULL;
    rdd_device *dev;
    rdd_pd *pd;
    rdd_cq *cq, *peer_cq;
    rdd_qp *qp, *peer;
    rdd_mr *src_mr, *dst_mr;
    rdd_qp_init init;
    rdd_connect_attr target_attr;
    rdd_qp_info info;
    char gid[40];
    struct writer w;
    void *addr;
    uint8_t *dst;
    long cores;
    int pollers, argi, bad = 0;
    const char *line = "-----------------------------------------------------------------------"
                       "----------------";

    ex_prog = "write_bw";
    /* Every flag takes a value: they come in pairs. */
    for (argi = 1; argi < argc; argi += 2) {
        const char *f = argv[argi];
        const char *v = argi + 1 < argc ? argv[argi + 1] : NULL;
        if (strcmp(f, "--size") == 0 || strcmp(f, "-s") == 0) {
            one_size = ex_number(f, v, 1, MAX_SIZE);
        } else if (strcmp(f, "--iters") == 0 || strcmp(f, "-n") == 0) {
            iters = ex_number(f, v, 1, 1000000000ul);
        } else if (strcmp(f, "--warmup") == 0) {
            warmup = ex_number(f, v, 0, 1000000000ul);
        } else if (strcmp(f, "--batch") == 0 || strcmp(f, "-b") == 0) {
            batch = ex_number(f, v, 1, MAX_BATCH);
        } else if (strcmp(f, "--device") == 0 || strcmp(f, "-d") == 0) {
            if (v == NULL) {
                usage();
            }
            device = v;
        } else {
            usage();
        }
    }
    if (one_size != 0) {
        sizes = &one_size;
        nsizes = 1;
    }
    max = 0;
    for (k = 0; k < nsizes; k++) {
        max = sizes[k] > max ? sizes[k] : max;
    }

    dev = ex_open_device(device);
    TRY(rdd_pd_alloc(dev, &pd));
    memset(&init, 0, sizeof(init));
    init.max_send_wr = SQ_DEPTH;
    init.max_recv_wr = 1;
    init.max_send_sge = 1;
    init.max_recv_sge = 1;
    /* Deep enough for the CQ guard's worst case: every WR the queues can
     * hold, flushed at once (a kernel device may grant more than asked). */
    TRY(rdd_cq_create(dev, 4 * SQ_DEPTH, &cq));
    TRY(rdd_cq_create(dev, 4 * SQ_DEPTH, &peer_cq));
    TRY(rdd_qp_create(pd, cq, cq, &init, &qp));
    TRY(rdd_qp_create(pd, peer_cq, peer_cq, &init, &peer));
    /* The source is only read by the device; the target takes writes. */
    TRY(rdd_mr_reg(pd, max, 0, &src_mr));
    TRY(rdd_mr_reg(pd, max, RDD_ACCESS_LOCAL_WRITE | RDD_ACCESS_REMOTE_WRITE, &dst_mr));
    memset(&target_attr, 0, sizeof(target_attr));
    target_attr.access = RDD_ACCESS_REMOTE_WRITE;
    target_attr.rnr_retry = 7;
    target_attr.retry_cnt = 7;
    ex_connect_pair(device, qp, peer, NULL, &target_attr, &info);

    memset(&w, 0, sizeof(w));
    w.qp = qp;
    w.cq = cq;
    w.batch = (unsigned)batch;
    TRY(rdd_mr_addr(src_mr, &addr));
    w.src = (uint8_t *)addr;
    TRY(rdd_mr_lkey(src_mr, &w.lkey));
    TRY(rdd_mr_addr(dst_mr, &addr));
    dst = (uint8_t *)addr;
    w.remote_addr = (uint64_t)(uintptr_t)addr;
    TRY(rdd_mr_rkey(dst_mr, &w.rkey));
    if (device == NULL) {
        TRY(rdd_device_start(dev));
    }

    printf("%s\n", line);
    printf("                    RDMA_Write BW Test (C API, %s, loopback)\n",
           device == NULL ? "software HCA" : "kernel device");
    printf(" Measured         : RDMA WRITE message rate and bandwidth from one QP to another,\n"
           "                    timed from the first post to the last completion\n");
    if (device == NULL) {
        printf(" Device           : soft (in-process software HCA, device thread)\n");
    } else {
        printf(" Device           : %s (kernel verbs, port 1)\n", device);
    }
    printf(" What it is       : %s\n", ex_medium(device));
    printf(" Data path        : %s\n", ex_data_path(dev, device));
    if (device != NULL) {
        ex_gid_str(info.gid, gid);
        printf(" GID, path MTU    : %s, %u bytes (rdd_qp_query_info)\n", gid, info.mtu);
    }
    cores = ex_cores();
    printf(" Machine          : %ld cores available (%s)\n", cores,
           ex_in_vm() ? "virtual machine" : "no hypervisor flag");
    /* The poster, plus the software device's thread; a kernel device adds
     * no busy-polling thread to this process. */
    pollers = device == NULL ? 2 : 1;
    if (pollers > cores) {
        printf(" WARNING          : %d busy-polling threads (poster%s) on %ld cores: they take\n"
               "                    turns, so the figures include scheduler hand-offs and vary\n"
               "                    widely between runs\n",
               pollers, device == NULL ? ", device thread" : "", cores);
    }
    printf(" Transport        : RC, 1 QP, 1 SGE per WR, no inline\n");
    printf(" TX depth         : %u WRs\n", SQ_DEPTH);
    printf(" Doorbell batch   : %lu WR%s per doorbell (rdd_qp_write, RDD_SEND_DEFER_DOORBELL),"
           " only the last signaled\n",
           batch, batch == 1 ? "" : "s");
    printf(" Iterations       : %lu per size after %lu warm-up\n", iters, warmup);
    printf("%s\n", line);
    printf(" %-10s %-13s %19s %15s %11s %9s %8s\n", "#bytes", "#iterations",
           "BW average[MB/sec]", "MsgRate[Mpps]", "doorbells", "CQEs", "check");
    for (k = 0; k < nsizes; k++) {
        unsigned long size = sizes[k];
        struct run r;
        double secs;
        int ok;
        fill_source(w.src, size, (unsigned)k);
        memset(dst, 0, size);
        if (warmup > 0) {
            (void)write_run(&w, (uint32_t)size, warmup);
        }
        r = write_run(&w, (uint32_t)size, iters);
        /* Every WRITE of this size has completed: the device has written
         * the target, so reading it now is ordered after those writes. */
        ok = memcmp(dst, w.src, size) == 0;
        bad |= !ok;
        secs = r.us / 1e6;
        printf(" %-10lu %-13lu %19.2f %15.6f %11llu %9llu %8s\n", size, iters,
               (double)iters * (double)size / secs / 1e6, (double)iters / secs / 1e6,
               (unsigned long long)r.doorbells, (unsigned long long)r.cqes,
               ok ? "OK" : "MISMATCH");
    }
    printf("%s\n", line);
    printf(" MB = 10^6 bytes. Wall-clock figures: noisy on a shared machine.\n");
    if (device == NULL) {
        printf(" On the software device a WRITE is a memcpy between two buffers of this process:\n"
               " the bandwidth is memory-copy speed, not a network's.\n");
    } else if (strncmp(device, "rxe", 3) == 0 || strncmp(device, "siw", 3) == 0) {
        printf(" On %s the kernel's software driver moves the data with this machine's CPU:\n"
               " the figures are that driver's, not an RDMA NIC's.\n",
               device);
    }

    if (device == NULL) {
        TRY(rdd_device_stop(dev));
    }
    TRY(rdd_qp_destroy(qp));
    TRY(rdd_qp_destroy(peer));
    TRY(rdd_cq_destroy(cq));
    TRY(rdd_cq_destroy(peer_cq));
    TRY(rdd_mr_free(src_mr));
    TRY(rdd_mr_free(dst_mr));
    TRY(rdd_pd_free(pd));
    TRY(rdd_device_close(dev));
    if (bad) {
        fprintf(stderr, "write_bw: FAILED: the target differs from the source\n");
        return 1;
    }
    return 0;
}
