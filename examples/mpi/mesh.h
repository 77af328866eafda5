/*
 * Shared by the MPI examples (alltoall_bw.c, ring_lat.c,
 * atomic_counter.c, p2p_vs_mpi.c): every rank opens a device, registers
 * its regions, and builds a full mesh of connected RC QPs with
 * rdd_mesh_create, MPI_Allgather being the allgather. The device is a
 * software device on the cross-process fabric (rdd_device_open_fabric,
 * its device thread started) unless the options below name a kernel
 * RDMA device (rdd_device_open_verbs; a library built with the verbs
 * backend). Then
 * the figures every example prints (the mesh's setup time, QPs and memory
 * per rank), bounded completion waits, timing and argument helpers, and
 * the teardown.
 *
 * Failures are loud: a failed call or check prints "PROG[rank]: what"
 * and calls MPI_Abort, so mpirun exits non-zero and no rank is left
 * waiting for a dead one. Every wait for a completion has a deadline.
 *
 * Every example takes `--wait event|adaptive|busy|yield`: how a rank
 * waits for its completions. The default, event, sleeps in the kernel
 * (rdd_cq_wait with RDD_WAIT_EVENT) until its device thread writes one;
 * on a machine with fewer cores than ranks this leaves the CPU to the
 * device threads, which is what moves the data (busy polling and
 * yielding compete with them: see docs/benchmarks.md).
 *
 * And the device options (the fabric when none is given):
 *   --device NAME           every rank opens the kernel RDMA device NAME
 *                           (rxe0, mlx5_0, ...; RoCE or InfiniBand: the C
 *                           API connects iWARP QPs only through rdma_cm,
 *                           which it does not offer)
 *   --device-by-rank A,B,.. rank r opens entry r * n / size of the n
 *                           names, so the ranks split in blocks: at 4
 *                           ranks, `A,B` puts ranks 0,1 on A and 2,3 on B
 *   --gid-idx N             check that the GID each QP connects with is
 *   --gid-idx-by-rank N,M,. entry N of port 1's GID table (one index, or
 *                           one per --device-by-rank name). The C API has
 *                           no GID index to choose: rdd_device_open_verbs
 *                           takes the IPv4 RoCEv2 entry itself, and this
 *                           makes a job fail loudly when that is not the
 *                           entry the caller expects (e.g. the one
 *                           perftest's -x uses).
 *
 * Everything is `static inline`, so an example that does not use a
 * function gets no unused-function warning. Define _POSIX_C_SOURCE
 * before including it (clock_gettime, sched_yield, getline).
 */
#ifndef RDD_MPI_MESH_H
#define RDD_MPI_MESH_H

#include <mpi.h>
#include <rdma_direct.h>

#include <limits.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* The program name and this rank, for every message (set by mx_init). */
static const char *mx_prog = "mpi-example";
static int mx_rank = -1;
static int mx_size = 0;

/* Each remote QP's link segment with the default fabric configuration:
 * a 4096-byte header and two rings, each a 256-byte ring header and 256
 * KiB of data (docs/spec/fabric.md §2); mapped, it rounds up to pages. */
#define MX_LINK_SEGMENT_BYTES (4096ull + 2ull * (256ull + (256ull << 10)))

/* Monotonic time in microseconds (one clock for every process of the
 * host, so stamps compare across ranks). */
static inline double mx_now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

/* Prints "PROG[rank]: what: <message> (status N)" and aborts the job. */
static inline void mx_fail(const char *what, rdd_status s)
{
    char msg[160];
    size_t n = 0;
    if (rdd_status_str((uint32_t)s, msg, sizeof(msg), &n) != RDD_STATUS_OK) {
        strcpy(msg, "?");
    }
    fprintf(stderr, "%s[%d]: %s: %s (%s, status %u)\n", mx_prog, mx_rank, what, msg,
            rdd_status_name((uint32_t)s), (unsigned)s);
    fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 1);
    exit(1);
}

/* Prints "PROG[rank]: FAILED: what" and aborts the job. */
static inline void mx_die(const char *what)
{
    fprintf(stderr, "%s[%d]: FAILED: %s\n", mx_prog, mx_rank, what);
    fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 1);
    exit(1);
}

#define MX_TRY(call)                                                                     \
    do {                                                                                 \
        rdd_status mx_s_ = (call);                                                       \
        if (mx_s_ != RDD_STATUS_OK) {                                                    \
            mx_fail(#call, mx_s_);                                                       \
        }                                                                                \
    } while (0)

#define MX_MPI(call)                                                                     \
    do {                                                                                 \
        if ((call) != MPI_SUCCESS) {                                                     \
            mx_die(#call);                                                               \
        }                                                                                \
    } while (0)

/* MPI_Init, the rank and the size; every example needs at least `min`
 * ranks. */
static inline void mx_init(int *argc, char ***argv, const char *prog, int min)
{
    mx_prog = prog;
    MX_MPI(MPI_Init(argc, argv));
    MX_MPI(MPI_Comm_rank(MPI_COMM_WORLD, &mx_rank));
    MX_MPI(MPI_Comm_size(MPI_COMM_WORLD, &mx_size));
    if (mx_size < min) {
        if (mx_rank == 0) {
            fprintf(stderr, "%s: needs at least %d ranks (mpirun -np %d), has %d\n", prog, min,
                    min, mx_size);
        }
        MPI_Finalize();
        exit(2);
    }
}

/* Parses a whole decimal number in [min, max] for `flag`, or exits 2. */
static inline unsigned long mx_number(const char *flag, const char *text, unsigned long min,
                                      unsigned long max)
{
    char *end = NULL;
    unsigned long v;
    if (text == NULL) {
        if (mx_rank == 0) {
            fprintf(stderr, "%s: %s needs a value\n", mx_prog, flag);
        }
        MPI_Finalize();
        exit(2);
    }
    v = strtoul(text, &end, 10);
    if (end == text || *end != '\0' || text[0] == '-' || v < min || v > max) {
        if (mx_rank == 0) {
            fprintf(stderr, "%s: %s: not a number in %lu..%lu: %s\n", mx_prog, flag, min, max,
                    text);
        }
        MPI_Finalize();
        exit(2);
    }
    return v;
}

/* An unknown argument: the usage line, exit 2. */
static inline void mx_usage(const char *usage)
{
    if (mx_rank == 0) {
        fprintf(stderr, "usage: %s %s\n", mx_prog, usage);
    }
    MPI_Finalize();
    exit(2);
}

/* The device options: --device, --device-by-rank, --gid-idx. */
#include "device.h"

/* The allgather rdd_mesh_create runs its three rounds through: `ctx` is
 * an MPI_Comm *. Returns 0, or RDD_STATUS_CONNECT_FAILED when MPI fails
 * or the length does not fit MPI's int count. */
static inline int mx_mpi_allgather(void *ctx, const void *mine, size_t len, void *all)
{
    MPI_Comm comm = *(MPI_Comm *)ctx;
    if (len > (size_t)INT_MAX) {
        return (int)RDD_STATUS_CONNECT_FAILED;
    }
    if (MPI_Allgather(mine, (int)len, MPI_BYTE, all, (int)len, MPI_BYTE, comm) != MPI_SUCCESS) {
        return (int)RDD_STATUS_CONNECT_FAILED;
    }
    return 0;
}

/* A CQ and exactly the QPs that complete on it (rdd_cq_wait's list). */
struct mx_cq {
    rdd_cq *cq;
    rdd_qp **qps;
    size_t n;
};

/* What an example asks of its mesh. */
struct mx_config {
    /* Length of the region published to every peer, and its access. */
    size_t region_len;
    uint32_t region_access;
    /* Length of the local-only region (sources, receive buffers, atomic
     * results); 0 for none. */
    size_t local_len;
    /* Remote operations every QP executes for its peer. */
    uint32_t connect_access;
    /* Capacities of every QP. */
    rdd_qp_init qp;
};

/* One rank's device, regions and mesh. */
struct mx_mesh {
    rdd_device *dev;
    rdd_pd *pd;
    /* Every mesh QP sends on `scq` and receives on `rcq`. */
    struct mx_cq scq;
    struct mx_cq rcq;
    rdd_mr *region;
    rdd_mr *local;
    uint8_t *region_buf;
    uint8_t *local_buf;
    uint32_t region_lkey;
    uint32_t local_lkey;
    rdd_mesh *mesh;
    /* Indexed by rank (NULL and zeros at this rank). */
    rdd_qp **qp;
    rdd_remote_mr *peer_region;
    size_t n_qps;
    size_t region_len;
    size_t local_len;
    /* The kernel device this rank opened (NULL: a fabric device). */
    const char *dev_name;
    /* The GID and path MTU this rank's mesh QPs connect with. */
    uint8_t gid[16];
    uint32_t mtu;
    /* A fabric device's tag (GID bytes 8..16, 16 hex digits). */
    char tag[17];
    /* rdd_mesh_create's wall time: this rank's, and the max over ranks. */
    double setup_us;
    double setup_max_us;
    /* Bytes of buffers this rank posted as receives (the example counts
     * them with mx_count_recv). */
    uint64_t recv_posted_bytes;
    uint32_t recv_posted_wrs;
};

/* Opens this rank's device, PD, CQs and regions and builds the full
 * mesh; every rank calls it with the same configuration. */
static inline void mx_open(struct mx_mesh *m, const struct mx_config *cfg)
{
    uint32_t depth = 0;
    size_t npeers = (size_t)mx_size - 1, i;
    rdd_qp_init *inits;
    rdd_mr *published[1];
    rdd_connect_attr attr;
    rdd_mesh_init init;
    MPI_Comm comm = MPI_COMM_WORLD;
    rdd_qp_info info;
    void *a = NULL;
    double t0, t1;
    rdd_status s;
    size_t n = 0;
    uint32_t size = 0;

    memset(m, 0, sizeof(*m));
    m->region_len = cfg->region_len;
    m->local_len = cfg->local_len;
    m->qp = calloc((size_t)mx_size, sizeof(*m->qp));
    m->peer_region = calloc((size_t)mx_size, sizeof(*m->peer_region));
    inits = calloc(npeers, sizeof(*inits));
    if (m->qp == NULL || m->peer_region == NULL || inits == NULL) {
        mx_die("out of memory");
    }
    mx_open_device(&m->dev, &m->dev_name);
    MX_TRY(rdd_pd_alloc(m->dev, &m->pd));
    for (i = 0; i < npeers; i++) {
        inits[i] = cfg->qp;
    }
    MX_TRY(rdd_device_cq_depth_for(m->dev, inits, npeers, &depth));
    MX_TRY(rdd_cq_create(m->dev, depth, &m->scq.cq));
    MX_TRY(rdd_cq_create(m->dev, depth, &m->rcq.cq));
    free(inits);
    MX_TRY(rdd_mr_reg(m->pd, cfg->region_len, cfg->region_access, &m->region));
    MX_TRY(rdd_mr_addr(m->region, &a));
    m->region_buf = a;
    MX_TRY(rdd_mr_lkey(m->region, &m->region_lkey));
    if (cfg->local_len > 0) {
        MX_TRY(rdd_mr_reg(m->pd, cfg->local_len, RDD_ACCESS_LOCAL_WRITE, &m->local));
        MX_TRY(rdd_mr_addr(m->local, &a));
        m->local_buf = a;
        MX_TRY(rdd_mr_lkey(m->local, &m->local_lkey));
    }

    memset(&attr, 0, sizeof(attr));
    attr.access = cfg->connect_access;
    attr.rnr_retry = 7; /* a receive not posted yet waits, as on hardware */
    attr.retry_cnt = 7;
    published[0] = m->region;
    memset(&init, 0, sizeof(init));
    init.rank = (uint32_t)mx_rank;
    init.size = (uint32_t)mx_size;
    init.qp = &cfg->qp;
    init.attr = &attr;
    init.peers = NULL; /* every other rank */
    init.n_peers = 0;
    init.mrs = published;
    init.n_mrs = 1;

    MX_MPI(MPI_Barrier(MPI_COMM_WORLD));
    t0 = mx_now_us();
    s = rdd_mesh_create(m->pd, m->scq.cq, m->rcq.cq, &init, mx_mpi_allgather, &comm, &m->mesh);
    t1 = mx_now_us();
    if (s != RDD_STATUS_OK) {
        mx_fail("rdd_mesh_create", s);
    }
    m->setup_us = t1 - t0;
    MX_MPI(MPI_Allreduce(&m->setup_us, &m->setup_max_us, 1, MPI_DOUBLE, MPI_MAX,
                         MPI_COMM_WORLD));

    MX_TRY(rdd_mesh_peers(m->mesh, &n, &size));
    if (n != npeers || size != (uint32_t)mx_size) {
        mx_die("rdd_mesh_peers: not a full mesh of this job's size");
    }
    m->n_qps = n;
    m->scq.qps = calloc(n, sizeof(*m->scq.qps));
    if (m->scq.qps == NULL) {
        mx_die("out of memory");
    }
    for (i = 0; i < n; i++) {
        uint32_t peer = 0;
        size_t count = 0;
        MX_TRY(rdd_mesh_peer_rank(m->mesh, i, &peer));
        if (peer >= (uint32_t)mx_size || peer == (uint32_t)mx_rank || m->qp[peer] != NULL) {
            mx_die("rdd_mesh_peer_rank: a rank out of range, this rank, or listed twice");
        }
        MX_TRY(rdd_mesh_peer_qp(m->mesh, peer, &m->qp[peer]));
        m->scq.qps[i] = m->qp[peer];
        MX_TRY(rdd_mesh_peer_mr(m->mesh, peer, 0, &m->peer_region[peer], &count));
        if (count != 1 || m->peer_region[peer].len != cfg->region_len) {
            mx_die("rdd_mesh_peer_mr: the peer did not publish one region of the agreed length");
        }
    }
    m->scq.n = n;
    m->rcq.qps = m->scq.qps;
    m->rcq.n = n;
    MX_TRY(rdd_qp_query_info(m->qp[mx_rank == 0 ? 1 : 0], &info));
    memcpy(m->gid, info.gid, sizeof(m->gid));
    m->mtu = info.mtu;
    if (m->dev_name != NULL) {
        if (mx_ngids > 0) {
            mx_check_gid(m->dev_name, mx_gids[mx_ngids == 1 ? 0 : mx_device_index()], m->gid);
        }
        return;
    }
    /* The tag of this device's fabric GID names the segments it creates. */
    for (i = 0; i < 8; i++) {
        snprintf(m->tag + 2 * i, 3, "%02x", info.gid[8 + i]);
    }
}

/* Counts a posted receive of `len` bytes in the memory figures. */
static inline void mx_count_recv(struct mx_mesh *m, uint32_t len)
{
    m->recv_posted_bytes += len;
    m->recv_posted_wrs++;
}

/* Fabric link memory this process maps now (/proc/self/maps entries of
 * /dev/shm/rdd-fab-* segments): `*created` of segments this device
 * created, `*attached` of its peers' segments; returns the segment
 * count. */
static inline size_t mx_link_maps(const struct mx_mesh *m, uint64_t *created, uint64_t *attached)
{
    char *line = NULL;
    size_t cap = 0, segs = 0;
    FILE *f = fopen("/proc/self/maps", "r");
    *created = 0;
    *attached = 0;
    if (f == NULL) {
        return 0;
    }
    while (getline(&line, &cap, f) > 0) {
        unsigned long lo = 0, hi = 0;
        const char *name = strstr(line, "/rdd-fab-");
        if (name == NULL || sscanf(line, "%lx-%lx", &lo, &hi) != 2 || hi < lo) {
            continue;
        }
        segs++;
        /* rdd-fab-<src tag>-...: the creator's tag comes first. */
        if (strncmp(name + strlen("/rdd-fab-"), m->tag, 16) == 0) {
            *created += hi - lo;
        } else {
            *attached += hi - lo;
        }
    }
    free(line);
    fclose(f);
    return segs;
}

/* `n` rounded up to whole pages. */
static inline uint64_t mx_page_round(uint64_t n)
{
    long page = sysconf(_SC_PAGESIZE);
    uint64_t p = page > 0 ? (uint64_t)page : 4096u;
    return (n + p - 1) / p * p;
}

/* Rank 0 prints the scale figures: the mesh's setup time (max over
 * ranks), QPs, registered, posted-receive and, on the fabric, link
 * memory per rank (max over ranks). Collective. */
static inline void mx_report_setup(struct mx_mesh *m)
{
    uint64_t created = 0, attached = 0, mine[5], most[5];
    /* The attacher maps a peer's segment on its device's next passes
     * after the connect: every rank has traffic or a barrier behind it
     * here, but give the device threads a moment on a busy machine. */
    double until = mx_now_us() + 2e6;
    size_t segs = m->dev_name != NULL ? 0 : mx_link_maps(m, &created, &attached);
    while (m->dev_name == NULL && segs < 2 * m->n_qps && mx_now_us() < until) {
        sched_yield();
        segs = mx_link_maps(m, &created, &attached);
    }
    if (m->dev_name != NULL) {
        mx_report_devices(m->gid, m->mtu);
    }
    mine[0] = m->region_len + m->local_len;
    mine[1] = m->recv_posted_bytes;
    mine[2] = m->recv_posted_wrs;
    mine[3] = created;
    mine[4] = attached;
    MX_MPI(MPI_Reduce(mine, most, 5, MPI_UINT64_T, MPI_MAX, 0, MPI_COMM_WORLD));
    if (mx_rank != 0) {
        return;
    }
    printf(" ranks                    : %d (%s)\n", mx_size,
           m->dev_name != NULL ? "one kernel device handle per rank, rdd_device_open_verbs"
                               : "one fabric device per rank, device thread started");
    printf(" mesh setup               : %.1f ms (rdd_mesh_create wall time, max over ranks; "
           "3 MPI_Allgather rounds)\n",
           m->setup_max_us / 1e3);
    printf(" RC QPs per rank          : %zu\n", m->n_qps);
    printf(" registered per rank      : %llu bytes\n", (unsigned long long)most[0]);
    printf(" posted receives per rank : %llu bytes in %llu receive WRs\n",
           (unsigned long long)most[1], (unsigned long long)most[2]);
    if (m->dev_name != NULL) {
        fflush(stdout);
        return;
    }
    printf(" link shm per rank        : %llu bytes created + %llu bytes of peers' mapped "
           "(%zu x %llu expected created, page-rounded)\n",
           (unsigned long long)most[3], (unsigned long long)most[4], m->n_qps,
           (unsigned long long)mx_page_round(MX_LINK_SEGMENT_BYTES));
    fflush(stdout);
}

/* How mx_wait waits (--wait): RDD_WAIT_EVENT (the default: sleeps in
 * the kernel until the device writes a completion, so the waiting rank
 * leaves the CPU to the device threads), RDD_WAIT_ADAPTIVE, or
 * RDD_WAIT_BUSY_POLL; MX_WAIT_YIELD polls with rdd_cq_poll_n and yields
 * the CPU between empty polls. */
#define MX_WAIT_YIELD 100u
static uint32_t mx_wait_mode = RDD_WAIT_EVENT;

static inline const char *mx_wait_name(void)
{
    switch (mx_wait_mode) {
    case RDD_WAIT_EVENT:
        return "event (rdd_cq_wait, RDD_WAIT_EVENT)";
    case RDD_WAIT_ADAPTIVE:
        return "adaptive (rdd_cq_wait, RDD_WAIT_ADAPTIVE)";
    case RDD_WAIT_BUSY_POLL:
        return "busy (rdd_cq_wait, RDD_WAIT_BUSY_POLL)";
    default:
        return "yield (rdd_cq_poll_n, sched_yield between empty polls)";
    }
}

/* The options every example takes: `--wait MODE` and the device
 * options. Returns 1 (and moves `*a` past the value) when argv[*a] is
 * one. */
static inline int mx_common_arg(int argc, char **argv, int *a)
{
    const char *v;
    if (mx_device_arg(argc, argv, a)) {
        return 1;
    }
    if (strcmp(argv[*a], "--wait") != 0) {
        return 0;
    }
    v = *a + 1 < argc ? argv[++*a] : "";
    if (strcmp(v, "event") == 0) {
        mx_wait_mode = RDD_WAIT_EVENT;
    } else if (strcmp(v, "adaptive") == 0) {
        mx_wait_mode = RDD_WAIT_ADAPTIVE;
    } else if (strcmp(v, "busy") == 0) {
        mx_wait_mode = RDD_WAIT_BUSY_POLL;
    } else if (strcmp(v, "yield") == 0) {
        mx_wait_mode = MX_WAIT_YIELD;
    } else {
        if (mx_rank == 0) {
            fprintf(stderr, "%s: --wait: event, adaptive, busy or yield, not '%s'\n", mx_prog,
                    v);
        }
        MPI_Finalize();
        exit(2);
    }
    return 1;
}

/* Fails the job if any of `wc[0..n]` is not successful. */
static inline void mx_check_wc(const rdd_wc *wc, size_t n, const char *what)
{
    size_t i;
    for (i = 0; i < n; i++) {
        if (wc[i].status != RDD_WC_SUCCESS) {
            char msg[200];
            snprintf(msg, sizeof(msg), "%s: completion wr_id %llu qp 0x%x: %s", what,
                     (unsigned long long)wc[i].wr_id, (unsigned)wc[i].qp_num,
                     rdd_wc_status_name(wc[i].status));
            mx_die(msg);
        }
    }
}

/* Collects exactly `want` completions of `c` into `wc` (room for
 * `want`), each of which must be successful; fails loudly if they do
 * not all come within `timeout_us`. */
static inline void mx_wait(const struct mx_cq *c, rdd_wc *wc, uint32_t want, double timeout_us,
                           const char *what)
{
    uint32_t got = 0;
    double deadline = mx_now_us() + timeout_us;
    while (got < want) {
        size_t n = 0;
        double left = deadline - mx_now_us();
        if (mx_wait_mode == MX_WAIT_YIELD) {
            int32_t r = rdd_cq_poll_n(c->cq, wc + got, want - got);
            if (r < 0) {
                mx_fail("rdd_cq_poll_n", (rdd_status)(uint32_t)-r);
            }
            n = (size_t)r;
        } else if (left > 0) {
            rdd_status s = rdd_cq_wait(c->cq, c->qps, c->n, wc + got, want - got, mx_wait_mode,
                                       (uint64_t)(left * 1e3) + 1, &n);
            if (s == RDD_STATUS_TIMEOUT) {
                n = 0;
            } else if (s != RDD_STATUS_OK) {
                mx_fail("rdd_cq_wait", s);
            }
        }
        mx_check_wc(wc + got, n, what);
        got += (uint32_t)n;
        if (n == 0) {
            if (mx_now_us() > deadline) {
                char msg[200];
                snprintf(msg, sizeof(msg),
                         "%s: %u of %u completions after %.1f s (a lost completion?)", what, got,
                         want, timeout_us / 1e6);
                mx_die(msg);
            }
            if (mx_wait_mode == MX_WAIT_YIELD) {
                sched_yield();
            }
        }
    }
}

/* Destroys the mesh (after a barrier: no peer has work towards us left)
 * and everything mx_open made. */
static inline void mx_close(struct mx_mesh *m)
{
    MX_MPI(MPI_Barrier(MPI_COMM_WORLD));
    MX_TRY(rdd_mesh_destroy(m->mesh));
    if (m->local != NULL) {
        MX_TRY(rdd_mr_free(m->local));
    }
    MX_TRY(rdd_mr_free(m->region));
    MX_TRY(rdd_cq_destroy(m->rcq.cq));
    MX_TRY(rdd_cq_destroy(m->scq.cq));
    MX_TRY(rdd_pd_free(m->pd));
    MX_TRY(rdd_device_close(m->dev));
    free(m->qp);
    free(m->peer_region);
    free(m->scq.qps);
    m->scq.qps = NULL;
    m->rcq.qps = NULL;
    m->qp = NULL;
    m->peer_region = NULL;
}

/* Sorts `n` doubles ascending. */
static inline int mx_cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The `q`-quantile (0..1) of `n` sorted samples (nearest rank). */
static inline double mx_quantile(const double *sorted, size_t n, double q)
{
    size_t i;
    if (n == 0) {
        return 0.0;
    }
    i = (size_t)(q * (double)n + 0.999999);
    if (i > 0) {
        i--;
    }
    return sorted[i < n ? i : n - 1];
}

/* Where the figures come from, so nobody reads them as a network's. */
static inline void mx_report_machine(void)
{
    if (mx_rank == 0 && mx_ndevs == 0) {
        long cores = sysconf(_SC_NPROCESSORS_ONLN);
        printf(" medium                   : the software fabric: %d processes on one host "
               "(%ld cores online), shared-memory rings between device threads, no NIC\n",
               mx_size, cores);
    } else if (mx_rank == 0) {
        mx_report_device_medium();
    }
    if (mx_rank == 0) {
        printf(" completion wait          : %s\n", mx_wait_name());
    }
}

#endif /* RDD_MPI_MESH_H */
