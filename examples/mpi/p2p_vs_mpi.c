/*
 * p2p_vs_mpi: point-to-point latency and bandwidth between rank 0 and
 * rank 1, through rdma-direct on the cross-process software fabric (or a
 * kernel RDMA device: --device, mesh.h) and through MPI_Send / MPI_Recv,
 * in the same run, side by side.
 *
 * Every rank joins the mesh (rdd_mesh_create with MPI_Allgather); only
 * ranks 0 and 1 measure, the others wait at the barriers between tests.
 *
 * - Latency: a ping-pong of `--lat-size`-byte messages. rdma-direct:
 *   SEND / receive on the mesh QP (receives posted ahead, as in
 *   ib_send_lat); MPI: MPI_Send / MPI_Recv. Half the round trip.
 * - Bandwidth: a stream of `--bw-size`-byte messages from rank 0 to rank
 *   1, `--window` outstanding. rdma-direct: RDMA WRITEs into rank 1's
 *   published region, timed to the last WRITE's completion (an RC
 *   completion means the data is in rank 1's memory); MPI: MPI_Isend /
 *   MPI_Irecv windows and a final zero-byte acknowledgement, as
 *   osu_bw does.
 * Every ping is checked (its iteration and payload); after each stream
 * rank 1 checks its buffer byte for byte. A failed check, status or
 * completion, or a completion that does not come within `--timeout`
 * seconds, ends the job non-zero.
 *
 * Build (after scripts/install.sh into a prefix on PKG_CONFIG_PATH):
 *     mpicc -std=c11 -O2 p2p_vs_mpi.c $(pkg-config --cflags --libs --static rdma-direct) \
 *         -o p2p_vs_mpi
 * Run:
 *     mpirun -np 2 ./p2p_vs_mpi [--wait MODE] [--lat-size B] [--lat-iters N] [--bw-size B] [--bw-iters N]
 *                               [--window W] [--timeout S]
 * Defaults: 8-byte pings, 1000 round trips; 1 MiB messages, 200 of them,
 * 8 outstanding; 30 s per wait. Each test runs a tenth of its count (at
 * least 1) as warm-up first.
 */
#define _POSIX_C_SOURCE 200809L

#include "mesh.h"

#define RECV_DEPTH 8u
#define MAX_WINDOW 64u
#define TAG_PING 1
#define TAG_BW 2
#define TAG_ACK 3

struct p2p {
    struct mx_mesh *m;
    int peer;
    size_t lat_size;
    size_t lat_stride;
    size_t bw_size;
    /* The stream's source at the local region's start, this long. */
    size_t src_stride;
    unsigned long window;
    double timeout_us;
};

static uint8_t pattern(uint32_t iter, size_t i) { return (uint8_t)(i * 11u + iter * 3u + 1u); }

static void fill_ping(uint8_t *buf, size_t size, uint32_t iter)
{
    size_t i;
    memcpy(buf, &iter, 4);
    for (i = 4; i < size; i++) {
        buf[i] = pattern(iter, i);
    }
}

static void check_ping(const uint8_t *buf, size_t size, uint32_t iter, const char *via)
{
    uint32_t got;
    size_t i;
    char msg[160];
    memcpy(&got, buf, 4);
    if (got != iter) {
        snprintf(msg, sizeof(msg), "%s ping-pong: iteration %u received a ping of %u", via, iter,
                 got);
        mx_die(msg);
    }
    for (i = 4; i < size; i++) {
        if (buf[i] != pattern(iter, i)) {
            snprintf(msg, sizeof(msg), "%s ping-pong: ping %u differs at byte %zu", via, iter, i);
            mx_die(msg);
        }
    }
}

/* The stream's bytes (rank 0's source, rank 1's expectation). */
static uint8_t stream_byte(size_t i) { return (uint8_t)((i * 2654435761u) >> 13); }

/* The ping's send slot, then its receive slots, after the source. */
static uint8_t *send_slot(const struct p2p *p) { return p->m->local_buf + p->src_stride; }

static uint8_t *ping_slot(const struct p2p *p, uint64_t i)
{
    return send_slot(p) + (1 + i) * p->lat_stride;
}

static void post_recv(struct p2p *p, uint64_t i)
{
    MX_TRY(rdd_qp_recv(p->m->qp[p->peer], i, (uint64_t)(uintptr_t)ping_slot(p, i),
                       (uint32_t)p->lat_size, p->m->local_lkey, 0));
}

static void rdd_ping(struct p2p *p, uint32_t iter)
{
    rdd_wc wc[1];
    uint8_t *buf = send_slot(p);
    fill_ping(buf, p->lat_size, iter);
    MX_TRY(rdd_qp_send(p->m->qp[p->peer], iter, (uint64_t)(uintptr_t)buf, (uint32_t)p->lat_size,
                       p->m->local_lkey, RDD_SEND_SIGNALED));
    mx_wait(&p->m->scq, wc, 1, p->timeout_us, "a ping's SEND");
}

static void rdd_pong(struct p2p *p, uint32_t iter)
{
    rdd_wc wc[1];
    mx_wait(&p->m->rcq, wc, 1, p->timeout_us, "a ping");
    if (wc[0].wr_id >= RECV_DEPTH || wc[0].byte_len != p->lat_size) {
        mx_die("rdma-direct ping-pong: a receive of the wrong length or wr_id");
    }
    check_ping(ping_slot(p, wc[0].wr_id), p->lat_size, iter, "rdma-direct");
    post_recv(p, wc[0].wr_id);
}

/* Half the round trip in microseconds, rdma-direct. */
static double rdd_latency(struct p2p *p, unsigned long iters, unsigned long warmup)
{
    double t0 = 0.0;
    uint32_t k;
    for (k = 0; k < warmup + iters; k++) {
        if (k == warmup) {
            t0 = mx_now_us();
        }
        if (mx_rank == 0) {
            rdd_ping(p, k);
            rdd_pong(p, k);
        } else {
            rdd_pong(p, k);
            rdd_ping(p, k);
        }
    }
    return (mx_now_us() - t0) / (double)iters / 2.0;
}

/* Half the round trip in microseconds, MPI_Send / MPI_Recv. */
static double mpi_latency(struct p2p *p, unsigned long iters, unsigned long warmup)
{
    uint8_t *out = malloc(p->lat_size), *in = malloc(p->lat_size);
    double t0 = 0.0;
    uint32_t k;
    if (out == NULL || in == NULL) {
        mx_die("out of memory");
    }
    for (k = 0; k < warmup + iters; k++) {
        if (k == warmup) {
            t0 = mx_now_us();
        }
        fill_ping(out, p->lat_size, k);
        if (mx_rank == 0) {
            MX_MPI(MPI_Send(out, (int)p->lat_size, MPI_BYTE, p->peer, TAG_PING, MPI_COMM_WORLD));
            MX_MPI(MPI_Recv(in, (int)p->lat_size, MPI_BYTE, p->peer, TAG_PING, MPI_COMM_WORLD,
                            MPI_STATUS_IGNORE));
        } else {
            MX_MPI(MPI_Recv(in, (int)p->lat_size, MPI_BYTE, p->peer, TAG_PING, MPI_COMM_WORLD,
                            MPI_STATUS_IGNORE));
            MX_MPI(MPI_Send(out, (int)p->lat_size, MPI_BYTE, p->peer, TAG_PING, MPI_COMM_WORLD));
        }
        check_ping(in, p->lat_size, k, "MPI");
    }
    t0 = (mx_now_us() - t0) / (double)iters / 2.0;
    free(out);
    free(in);
    return t0;
}

/* Rank 0 streams `count` WRITEs into rank 1's region; returns the
 * microseconds to the last completion (rank 1: 0). */
static double rdd_stream(struct p2p *p, unsigned long count)
{
    rdd_wc wc[MAX_WINDOW];
    unsigned long posted = 0, done = 0;
    double t0;
    if (mx_rank != 0) {
        return 0.0;
    }
    t0 = mx_now_us();
    while (done < count) {
        while (posted < count && posted - done < p->window) {
            MX_TRY(rdd_qp_write(p->m->qp[1], posted, (uint64_t)(uintptr_t)p->m->local_buf,
                                (uint32_t)p->bw_size, p->m->local_lkey, p->m->peer_region[1].addr,
                                p->m->peer_region[1].rkey, RDD_SEND_SIGNALED));
            posted++;
        }
        mx_wait(&p->m->scq, wc, 1, p->timeout_us, "a stream WRITE");
        done++;
    }
    return mx_now_us() - t0;
}

/* The same stream through MPI_Isend / MPI_Irecv, into `rbuf` on rank 1
 * (`window` buffers of the message size: no two pending receives
 * share one); returns rank 0's microseconds to the receiver's acknowledgement. */
static double mpi_stream(struct p2p *p, unsigned long count, const uint8_t *sbuf, uint8_t *rbuf)
{
    MPI_Request req[MAX_WINDOW];
    unsigned long sent = 0;
    double t0 = mx_now_us();
    while (sent < count) {
        unsigned long n = count - sent < p->window ? count - sent : p->window, i;
        for (i = 0; i < n; i++) {
            if (mx_rank == 0) {
                MX_MPI(MPI_Isend(sbuf, (int)p->bw_size, MPI_BYTE, 1, TAG_BW, MPI_COMM_WORLD,
                                 &req[i]));
            } else {
                MX_MPI(MPI_Irecv(rbuf + i * p->bw_size, (int)p->bw_size, MPI_BYTE, 0, TAG_BW,
                                 MPI_COMM_WORLD, &req[i]));
            }
        }
        MX_MPI(MPI_Waitall((int)n, req, MPI_STATUSES_IGNORE));
        sent += n;
    }
    if (mx_rank == 0) {
        MX_MPI(MPI_Recv(NULL, 0, MPI_BYTE, 1, TAG_ACK, MPI_COMM_WORLD, MPI_STATUS_IGNORE));
    } else {
        MX_MPI(MPI_Send(NULL, 0, MPI_BYTE, 0, TAG_ACK, MPI_COMM_WORLD));
    }
    return mx_now_us() - t0;
}

/* Rank 1: the first byte of `buf` that is not the stream's, or size. */
static size_t check_stream(const uint8_t *buf, size_t size)
{
    size_t i;
    for (i = 0; i < size; i++) {
        if (buf[i] != stream_byte(i)) {
            return i;
        }
    }
    return size;
}

int main(int argc, char **argv)
{
    unsigned long lat_size = 8, lat_iters = 1000, bw_size = 1ul << 20, bw_iters = 200;
    unsigned long window = 8, timeout_s = 30, k;
    double lat_rdd = 0.0, lat_mpi = 0.0, bw_rdd = 0.0, bw_mpi = 0.0;
    struct mx_mesh m;
    struct mx_config cfg;
    struct p2p p;
    uint8_t *mpi_rbuf;
    int a;

    mx_init(&argc, &argv, "p2p_vs_mpi", 2);
    for (a = 1; a < argc; a++) {
        if (mx_common_arg(argc, argv, &a)) {
            continue;
        } else if (strcmp(argv[a], "--lat-size") == 0) {
            lat_size = mx_number("--lat-size", argv[++a], 4, 65536);
        } else if (strcmp(argv[a], "--lat-iters") == 0) {
            lat_iters = mx_number("--lat-iters", argv[++a], 1, 10000000);
        } else if (strcmp(argv[a], "--bw-size") == 0) {
            bw_size = mx_number("--bw-size", argv[++a], 1, 64ul << 20);
        } else if (strcmp(argv[a], "--bw-iters") == 0) {
            bw_iters = mx_number("--bw-iters", argv[++a], 1, 10000000);
        } else if (strcmp(argv[a], "--window") == 0) {
            window = mx_number("--window", argv[++a], 1, MAX_WINDOW);
        } else if (strcmp(argv[a], "--timeout") == 0) {
            timeout_s = mx_number("--timeout", argv[++a], 1, 3600);
        } else {
            mx_usage(MX_COMMON_USAGE " [--lat-size B] [--lat-iters N]"
                     " [--bw-size B] [--bw-iters N] [--window W] [--timeout S]");
        }
    }
    memset(&p, 0, sizeof(p));
    p.lat_size = lat_size;
    p.lat_stride = (lat_size + 63) & ~(size_t)63;
    p.bw_size = bw_size;
    p.src_stride = (bw_size + 63) & ~(size_t)63;
    p.window = window;
    p.timeout_us = (double)timeout_s * 1e6;
    p.peer = mx_rank == 0 ? 1 : 0;
    memset(&cfg, 0, sizeof(cfg));
    cfg.region_len = p.src_stride;
    cfg.region_access = RDD_ACCESS_LOCAL_WRITE | RDD_ACCESS_REMOTE_WRITE;
    /* The stream's source, then the ping's send slot and its receives. */
    cfg.local_len = p.src_stride + (1 + RECV_DEPTH) * p.lat_stride;
    cfg.connect_access = RDD_ACCESS_REMOTE_WRITE;
    cfg.qp = (rdd_qp_init){(uint32_t)window + 4, RECV_DEPTH, 1, 1, 0, 0};
    mx_open(&m, &cfg);
    p.m = &m;
    mpi_rbuf = malloc(window * bw_size);
    if (mpi_rbuf == NULL) {
        mx_die("out of memory");
    }
    for (k = 0; k < bw_size; k++) {
        m.local_buf[k] = stream_byte(k);
    }
    if (mx_rank < 2) {
        for (k = 0; k < RECV_DEPTH; k++) {
            post_recv(&p, k);
            mx_count_recv(&m, (uint32_t)lat_size);
        }
    }
    if (mx_rank == 0) {
        char version[MPI_MAX_LIBRARY_VERSION_STRING];
        int len = 0;
        char *nl;
        MX_MPI(MPI_Get_library_version(version, &len));
        nl = strchr(version, '\n');
        if (nl != NULL) {
            *nl = '\0';
        }
        printf("---------------------------------------------------------------------------\n");
        printf("                    Rank 0 <-> rank 1: rdma-direct vs MPI\n");
        printf("---------------------------------------------------------------------------\n");
        mx_report_machine();
        printf(" MPI                      : %s\n", version);
    }
    MX_MPI(MPI_Barrier(MPI_COMM_WORLD));
    if (mx_rank < 2) {
        unsigned long w = lat_iters / 10 ? lat_iters / 10 : 1;
        lat_rdd = rdd_latency(&p, lat_iters, w);
    }
    MX_MPI(MPI_Barrier(MPI_COMM_WORLD));
    if (mx_rank < 2) {
        unsigned long w = lat_iters / 10 ? lat_iters / 10 : 1;
        lat_mpi = mpi_latency(&p, lat_iters, w);
    }
    MX_MPI(MPI_Barrier(MPI_COMM_WORLD));
    if (mx_rank == 1) {
        memset(m.region_buf, 0, bw_size);
    }
    MX_MPI(MPI_Barrier(MPI_COMM_WORLD));
    rdd_stream(&p, bw_iters / 10 ? bw_iters / 10 : 1);
    bw_rdd = rdd_stream(&p, bw_iters);
    /* Rank 0's completions are in: rank 1's region holds the stream. */
    MX_MPI(MPI_Barrier(MPI_COMM_WORLD));
    if (mx_rank == 1 && check_stream(m.region_buf, bw_size) != bw_size) {
        mx_die("rdma-direct stream: rank 1's region does not hold the stream's bytes");
    }
    if (mx_rank < 2) {
        mpi_stream(&p, bw_iters / 10 ? bw_iters / 10 : 1, m.local_buf, mpi_rbuf);
        memset(mpi_rbuf, 0, window * bw_size);
        bw_mpi = mpi_stream(&p, bw_iters, m.local_buf, mpi_rbuf);
        for (k = 0; mx_rank == 1 && k < (bw_iters < window ? bw_iters : window); k++) {
            if (check_stream(mpi_rbuf + k * bw_size, bw_size) != bw_size) {
                mx_die("MPI stream: rank 1's buffer does not hold the stream's bytes");
            }
        }
    }
    MX_MPI(MPI_Barrier(MPI_COMM_WORLD));
    mx_report_setup(&m);
    if (mx_rank == 0) {
        double mib = (double)bw_size * (double)bw_iters / (1024.0 * 1024.0);
        double r_bw = mib / (bw_rdd / 1e6), m_bw = mib / (bw_mpi / 1e6);
        printf(" latency                  : %lu-byte ping-pong, %lu round trips (SEND/recv vs "
               "MPI_Send/MPI_Recv)\n",
               lat_size, lat_iters);
        printf(" bandwidth                : %lu x %lu bytes, %lu outstanding (RDMA WRITE vs "
               "MPI_Isend/MPI_Irecv)\n",
               bw_iters, bw_size, window);
        printf("---------------------------------------------------------------------------\n");
        printf(" %-20s %-10s %-18s %-18s %s\n", "test", "#bytes", "rdma-direct", "MPI",
               "rdma-direct / MPI");
        printf(" %-20s %-10lu %10.2f usec    %10.2f usec    %.2fx (lower is better)\n",
               "latency (half RTT)", lat_size, lat_rdd, lat_mpi, lat_rdd / lat_mpi);
        printf(" %-20s %-10lu %10.2f MiB/s   %10.2f MiB/s   %.2fx (higher is better)\n",
               "bandwidth", bw_size, r_bw, m_bw, r_bw / m_bw);
        printf("---------------------------------------------------------------------------\n");
        printf(" every ping and both streams' bytes checked: OK\n");
        fflush(stdout);
    }
    free(mpi_rbuf);
    mx_close(&m);
    MPI_Finalize();
    return 0;
}
