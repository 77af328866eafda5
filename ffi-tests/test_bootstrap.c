/*
 * C11 tests of the bootstrap (rdd_mesh_create and its accessors,
 * rdd_tcp_allgather): 4 ranks as pthreads on one software device with an
 * in-process allgather callback (a barrier and a shared buffer), every
 * rank RDMA-WRITEs into every peer's published region and the bytes are
 * checked; then the refusals: NULL arguments, a callback that fails, a
 * callback that corrupts a rank's record (every rank refuses it, no QP is
 * left: the CQs and PDs are freed cleanly), and the same mesh through the
 * built-in TCP rendezvous on localhost.
 */
#define _POSIX_C_SOURCE 200809L
#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <sched.h>
#include <time.h>
#include <sys/socket.h>
#include <unistd.h>

#include "harness.h"

#define RANKS 4
#define MR_LEN 4096
#define MAX_GATHER (64 * 1024)

enum mode { MODE_OK, MODE_FAIL_ROUND_1, MODE_CORRUPT_HELLO, MODE_TCP };

struct shared {
    pthread_barrier_t barrier;
    uint8_t buf[MAX_GATHER];
    enum mode mode;
    rdd_device *dev;
    uint16_t port;
    rdd_status status[RANKS];
    unsigned ok_writes[RANKS];
};

struct rank_ctx {
    struct shared *sh;
    uint32_t rank;
    unsigned round;
};

static pthread_mutex_t check_lock = PTHREAD_MUTEX_INITIALIZER;
#define TCHECK_EQ(a, b)                                                                  \
    do {                                                                                 \
        pthread_mutex_lock(&check_lock);                                                 \
        CHECK_EQ(a, b);                                                                  \
        pthread_mutex_unlock(&check_lock);                                               \
    } while (0)

/* The in-process allgather: every rank writes its slot, then reads the table. */
static int local_allgather(void *ctx, const void *mine, size_t len, void *all)
{
    struct rank_ctx *c = ctx;
    struct shared *sh = c->sh;
    unsigned round = c->round++;
    if (len * RANKS > MAX_GATHER) {
        return 1;
    }
    if (sh->mode == MODE_FAIL_ROUND_1 && round == 1) {
        /* Every rank's transport fails in the record round, after the QPs
         * were made: the status is passed on. */
        return (int)RDD_STATUS_TIMEOUT;
    }
    pthread_barrier_wait(&sh->barrier);
    memcpy(sh->buf + c->rank * len, mine, len);
    pthread_barrier_wait(&sh->barrier);
    memcpy(all, sh->buf, len * RANKS);
    pthread_barrier_wait(&sh->barrier);
    if (sh->mode == MODE_CORRUPT_HELLO && round == 0) {
        ((uint8_t *)all)[1 * len + 0] ^= 0xff; /* rank 1's magic */
    }
    return 0;
}

/* Holds a mesh's CQ (and its QPs) for a second: an rdd_cq_wait that
 * nothing completes, as a poller on another thread would. It retries
 * while the main thread's probes hold the CQ. */
struct busy_wait {
    rdd_cq *cq;
    rdd_qp **qps;
    size_t n;
};

static void *busy_waiter(void *arg)
{
    struct busy_wait *b = arg;
    rdd_wc wc[1];
    size_t got = 7;
    rdd_status s;
    do {
        s = rdd_cq_wait(b->cq, b->qps, b->n, wc, 1, RDD_WAIT_BUSY_POLL, 1000000000ull, &got);
    } while (s == RDD_STATUS_RESOURCE_BUSY);
    TCHECK_EQ(s, RDD_STATUS_TIMEOUT);
    return NULL;
}

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* rdd_mesh_destroy while another call holds the mesh's CQ: RESOURCE_BUSY
 * and every QP still there (all or nothing); then it destroys. */
static void mesh_destroy_busy(rdd_mesh *mesh, rdd_cq *cq, rdd_qp **qps, size_t n)
{
    struct busy_wait b = {cq, qps, n};
    pthread_t t;
    rdd_status probe = RDD_STATUS_OK;
    size_t i;
    int joined;
    double t0 = now_s();
    TCHECK_EQ(pthread_create(&t, NULL, busy_waiter, &b), 0);
    /* Until the waiter holds the CQ: a poll of it is then RESOURCE_BUSY. */
    while (probe != RDD_STATUS_RESOURCE_BUSY && now_s() - t0 < 5.0) {
        rdd_wc wc[1];
        size_t got = 0;
        probe = rdd_cq_poll(cq, qps, n, wc, 1, &got);
        if (probe == RDD_STATUS_OK) {
            TCHECK_EQ(got, 0);
            sched_yield();
        }
    }
    TCHECK_EQ(probe, RDD_STATUS_RESOURCE_BUSY);
    TCHECK_EQ(rdd_mesh_destroy(mesh), RDD_STATUS_RESOURCE_BUSY);
    /* Joined outside TCHECK_EQ: it holds the check lock, which the waiter
     * takes for its own check. */
    joined = pthread_join(t, NULL);
    TCHECK_EQ(joined, 0);
    for (i = 0; i < n; i++) {
        rdd_qp_info qi;
        TCHECK_EQ(rdd_qp_query_info(qps[i], &qi), RDD_STATUS_OK);
    }
}

static void *rank_main(void *arg)
{
    struct rank_ctx *c = arg;
    struct shared *sh = c->sh;
    rdd_pd *pd = NULL;
    rdd_cq *cq = NULL;
    rdd_mr *target = NULL, *src = NULL;
    rdd_mesh *mesh = NULL;
    rdd_tcp_rendezvous *tcp = NULL;
    uint32_t depth = 0;
    rdd_qp_init inits[RANKS - 1];
    size_t i;
    for (i = 0; i < RANKS - 1; i++) {
        inits[i] = (rdd_qp_init){64, 64, 4, 4, 64, 0};
    }
    TCHECK_EQ(rdd_pd_alloc(sh->dev, &pd), RDD_STATUS_OK);
    TCHECK_EQ(rdd_device_cq_depth_for(sh->dev, inits, RANKS - 1, &depth), RDD_STATUS_OK);
    TCHECK_EQ(rdd_cq_create(sh->dev, depth, &cq), RDD_STATUS_OK);
    TCHECK_EQ(rdd_mr_reg(pd, MR_LEN, RDD_ACCESS_LOCAL_WRITE | RDD_ACCESS_REMOTE_WRITE, &target),
              RDD_STATUS_OK);
    TCHECK_EQ(rdd_mr_reg(pd, MR_LEN, RDD_ACCESS_LOCAL_WRITE, &src), RDD_STATUS_OK);

    rdd_connect_attr attr = {RDD_ACCESS_REMOTE_WRITE, 7, 7, 0, 0};
    rdd_mesh_init init = {c->rank, RANKS, NULL, &attr, NULL, 0, &target, 1};
    rdd_status s;
    if (sh->mode == MODE_TCP) {
        s = rdd_tcp_allgather_create(c->rank, RANKS, "127.0.0.1", sh->port, 10000, &tcp);
        TCHECK_EQ(s, RDD_STATUS_OK);
        s = rdd_mesh_create(pd, cq, cq, &init, rdd_tcp_allgather, tcp, &mesh);
    } else {
        s = rdd_mesh_create(pd, cq, cq, &init, local_allgather, c, &mesh);
    }
    sh->status[c->rank] = s;
    if (s == RDD_STATUS_OK) {
        size_t n = 0;
        uint32_t size = 0;
        rdd_qp *qps[RANKS - 1];
        void *sbuf = NULL, *tbuf = NULL;
        uint32_t lkey = 0;
        TCHECK_EQ(rdd_mesh_peers(mesh, &n, &size), RDD_STATUS_OK);
        TCHECK_EQ(n, RANKS - 1);
        TCHECK_EQ(size, RANKS);
        TCHECK_EQ(rdd_mr_addr(src, &sbuf), RDD_STATUS_OK);
        TCHECK_EQ(rdd_mr_lkey(src, &lkey), RDD_STATUS_OK);
        memset(sbuf, (int)(0xa0 + c->rank), 16);
        for (i = 0; i < n; i++) {
            uint32_t peer = 0;
            size_t count = 0;
            rdd_remote_mr rm;
            TCHECK_EQ(rdd_mesh_peer_rank(mesh, i, &peer), RDD_STATUS_OK);
            TCHECK_EQ(rdd_mesh_peer_qp(mesh, peer, &qps[i]), RDD_STATUS_OK);
            TCHECK_EQ(rdd_mesh_peer_mr(mesh, peer, 0, &rm, &count), RDD_STATUS_OK);
            TCHECK_EQ(count, 1);
            TCHECK_EQ(rm.len, MR_LEN);
            TCHECK_EQ(rdd_qp_write(qps[i], peer, (uint64_t)(uintptr_t)sbuf, 16, lkey,
                                   rm.addr + 16 * c->rank, rm.rkey, RDD_SEND_SIGNALED),
                      RDD_STATUS_OK);
        }
        /* Accessor refusals. */
        {
            rdd_qp *q = NULL;
            rdd_remote_mr rm;
            TCHECK_EQ(rdd_mesh_peer_qp(mesh, c->rank, &q), RDD_STATUS_NO_SUCH_OBJECT);
            TCHECK_EQ(rdd_mesh_peer_qp(mesh, 0, NULL), RDD_STATUS_NULL_PARAMETER);
            TCHECK_EQ(rdd_mesh_peer_rank(mesh, n, &size), RDD_STATUS_INVALID_ARGUMENT);
            TCHECK_EQ(rdd_mesh_peer_mr(mesh, (c->rank + 1) % RANKS, 1, &rm, NULL),
                      RDD_STATUS_INVALID_ARGUMENT);
        }
        unsigned done = 0, spins = 0;
        while (done < n && spins++ < 10000000) {
            rdd_wc wc[4];
            size_t got = 0;
            rdd_status ps = rdd_cq_poll(cq, qps, n, wc, 4, &got);
            if (ps != RDD_STATUS_OK) {
                TCHECK_EQ(ps, RDD_STATUS_OK);
                break;
            }
            for (i = 0; i < got; i++) {
                TCHECK_EQ(wc[i].status, 0);
            }
            done += (unsigned)got;
        }
        TCHECK_EQ(done, n);
        pthread_barrier_wait(&sh->barrier);
        TCHECK_EQ(rdd_mr_addr(target, &tbuf), RDD_STATUS_OK);
        for (i = 0; i < RANKS; i++) {
            if (i != c->rank) {
                const uint8_t *t = (const uint8_t *)tbuf + 16 * i;
                unsigned j, good = 1;
                for (j = 0; j < 16; j++) {
                    good &= t[j] == 0xa0 + i;
                }
                sh->ok_writes[c->rank] += good;
            }
        }
        pthread_barrier_wait(&sh->barrier);
        if (sh->mode == MODE_OK && c->rank == 0) {
            mesh_destroy_busy(mesh, cq, qps, n);
        }
        TCHECK_EQ(rdd_mesh_destroy(mesh), RDD_STATUS_OK);
        TCHECK_EQ(rdd_mesh_destroy(mesh), RDD_STATUS_INVALID_HANDLE);
        for (i = 0; i < n; i++) {
            rdd_qp_info qi;
            TCHECK_EQ(rdd_qp_query_info(qps[i], &qi), RDD_STATUS_INVALID_HANDLE);
        }
    }
    if (tcp) {
        TCHECK_EQ(rdd_tcp_allgather_destroy(tcp), RDD_STATUS_OK);
    }
    /* Nothing is left on the CQ or the PD, whatever happened. */
    TCHECK_EQ(rdd_mr_free(src), RDD_STATUS_OK);
    TCHECK_EQ(rdd_mr_free(target), RDD_STATUS_OK);
    TCHECK_EQ(rdd_cq_destroy(cq), RDD_STATUS_OK);
    TCHECK_EQ(rdd_pd_free(pd), RDD_STATUS_OK);
    return NULL;
}

/* A localhost port nobody listens on now (bound to port 0, then
 * released), for the TCP rendezvous. */
static uint16_t free_port(void)
{
    struct sockaddr_in a;
    socklen_t n = sizeof a;
    uint16_t port = 0;
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof a) == 0 &&
        getsockname(fd, (struct sockaddr *)&a, &n) == 0) {
        port = ntohs(a.sin_port);
    }
    if (fd >= 0) {
        close(fd);
    }
    return port;
}

static void run(rdd_device *dev, enum mode mode, struct shared *sh)
{
    pthread_t t[RANKS];
    struct rank_ctx c[RANKS];
    uint32_t r;
    memset(sh, 0, sizeof *sh);
    sh->mode = mode;
    sh->dev = dev;
    sh->port = free_port();
    CHECK(sh->port != 0);
    pthread_barrier_init(&sh->barrier, NULL, RANKS);
    for (r = 0; r < RANKS; r++) {
        c[r] = (struct rank_ctx){sh, r, 0};
        pthread_create(&t[r], NULL, rank_main, &c[r]);
    }
    for (r = 0; r < RANKS; r++) {
        pthread_join(t[r], NULL);
    }
    pthread_barrier_destroy(&sh->barrier);
}

static int fail_7(void *ctx, const void *mine, size_t len, void *all)
{
    (void)ctx, (void)mine, (void)len, (void)all;
    return 7;
}

static void refusals(rdd_device *dev)
{
    rdd_pd *pd = NULL;
    rdd_cq *cq = NULL;
    rdd_mesh *m = NULL;
    rdd_tcp_rendezvous *t = NULL;
    rdd_mesh_init init = {0, 1, NULL, NULL, NULL, 0, NULL, 0};
    uint32_t peer = 1;
    MUST(rdd_pd_alloc(dev, &pd));
    MUST(rdd_cq_create(dev, 64, &cq));
    CHECK_EQ(rdd_mesh_create(pd, cq, cq, NULL, fail_7, NULL, &m), RDD_STATUS_NULL_PARAMETER);
    CHECK_EQ(rdd_mesh_create(pd, cq, cq, &init, NULL, NULL, &m), RDD_STATUS_NULL_PARAMETER);
    CHECK_EQ(rdd_mesh_create(pd, cq, cq, &init, fail_7, NULL, NULL), RDD_STATUS_NULL_PARAMETER);
    init.n_peers = 1;
    CHECK_EQ(rdd_mesh_create(pd, cq, cq, &init, fail_7, NULL, &m), RDD_STATUS_NULL_PARAMETER);
    init.n_peers = 0;
    init.rank = 1;
    CHECK_EQ(rdd_mesh_create(pd, cq, cq, &init, fail_7, NULL, &m), RDD_STATUS_INVALID_ARGUMENT);
    init.rank = 0;
    /* A callback that fails with a value that is no status. */
    CHECK_EQ(rdd_mesh_create(pd, cq, cq, &init, fail_7, NULL, &m), RDD_STATUS_CONNECT_FAILED);
    CHECK(m == NULL);
    /* A bad peer list is this rank's refusal (announced, then returned). */
    init.peers = &peer;
    init.n_peers = 1;
    /* (A one-rank rendezvous: rank 0 listens on a system-chosen port and
     * waits for nobody.) */
    CHECK_EQ(rdd_tcp_allgather_create(0, 1, "127.0.0.1", 0, 1000, &t), RDD_STATUS_OK);
    CHECK_EQ(rdd_mesh_create(pd, cq, cq, &init, rdd_tcp_allgather, t, &m),
             RDD_STATUS_INVALID_ATTRIBUTE);
    /* A published region whose handle is not one: this rank's refusal. */
    {
        rdd_mr *bad = (rdd_mr *)(uintptr_t)0x5a5a00;
        init.peers = NULL;
        init.n_peers = 0;
        init.mrs = &bad;
        init.n_mrs = 1;
        CHECK_EQ(rdd_mesh_create(pd, cq, cq, &init, rdd_tcp_allgather, t, &m),
                 RDD_STATUS_INVALID_HANDLE);
        init.mrs = NULL;
        init.n_mrs = 0;
    }
    /* One rank, no peers: a mesh of none. */
    init.peers = NULL;
    init.n_peers = 0;
    CHECK_EQ(rdd_mesh_create(pd, cq, cq, &init, rdd_tcp_allgather, t, &m), RDD_STATUS_OK);
    {
        size_t n = 9;
        CHECK_EQ(rdd_mesh_peers(m, &n, NULL), RDD_STATUS_OK);
        CHECK_EQ(n, 0);
    }
    CHECK_EQ(rdd_mesh_destroy(m), RDD_STATUS_OK);
    CHECK_EQ(rdd_tcp_allgather_destroy(t), RDD_STATUS_OK);
    CHECK_EQ(rdd_tcp_allgather_destroy(t), RDD_STATUS_INVALID_HANDLE);
    CHECK_EQ(rdd_tcp_allgather(t, &peer, 4, &peer), (int)RDD_STATUS_INVALID_HANDLE);
    CHECK_EQ(rdd_tcp_allgather_create(0, 1, NULL, 0, 1000, &t), RDD_STATUS_NULL_PARAMETER);
    CHECK_EQ(rdd_tcp_allgather_create(1, 1, "127.0.0.1", 0, 1000, &t), RDD_STATUS_INVALID_ATTRIBUTE);
    CHECK_EQ(rdd_tcp_allgather_create(0, 1, "127.0.0.1", 0, 0, &t), RDD_STATUS_INVALID_ARGUMENT);
    CHECK_EQ(rdd_mesh_destroy(NULL), RDD_STATUS_NULL_PARAMETER);
    CHECK_EQ(rdd_tcp_allgather_destroy(NULL), RDD_STATUS_NULL_PARAMETER);
    CHECK_EQ(rdd_cq_destroy(cq), RDD_STATUS_OK);
    CHECK_EQ(rdd_pd_free(pd), RDD_STATUS_OK);
}

int main(void)
{
    rdd_device *dev = NULL;
    struct shared *sh = calloc(1, sizeof *sh);
    uint32_t r;
    MUST(rdd_device_open_soft(NULL, &dev));
    MUST(rdd_device_start(dev));

    run(dev, MODE_OK, sh);
    for (r = 0; r < RANKS; r++) {
        CHECK_EQ(sh->status[r], RDD_STATUS_OK);
        CHECK_EQ(sh->ok_writes[r], RANKS - 1);
    }
    run(dev, MODE_FAIL_ROUND_1, sh);
    for (r = 0; r < RANKS; r++) {
        CHECK_EQ(sh->status[r], RDD_STATUS_TIMEOUT);
    }
    run(dev, MODE_CORRUPT_HELLO, sh);
    for (r = 0; r < RANKS; r++) {
        CHECK_EQ(sh->status[r], RDD_STATUS_PROTOCOL_ERROR);
    }
    run(dev, MODE_TCP, sh);
    for (r = 0; r < RANKS; r++) {
        CHECK_EQ(sh->status[r], RDD_STATUS_OK);
        CHECK_EQ(sh->ok_writes[r], RANKS - 1);
    }
    refusals(dev);
    free(sh);
    MUST(rdd_device_close(dev));
    return h_finish("test_bootstrap");
}
