/*
 * The cross-process fabric cases (rdd_device_open_fabric), shared by
 * test_fabric.c (C11) and test_fabric.cpp (C++17): a forked child process
 * opens its own fabric device, the two exchange rdd_qp_info and region
 * keys through pipes and connect; the parent then RDMA-WRITEs many
 * packets into the child's memory, READs them back, runs FETCH_AND_ADDs
 * on the child's word and SENDs into a receive the child checks. A second
 * child is killed while connected: the parent's next READ fails with a
 * retry-exceeded completion instead of hanging. Then the refusals of
 * rdd_device_open_fabric.
 */
#ifndef RDD_FFI_TESTS_FABRIC_CASES_H
#define RDD_FFI_TESTS_FABRIC_CASES_H

#include <signal.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"

#define REGION (1u << 20)
#define WRITE_LEN 300001u
#define SEND_LEN 20000u

struct hello {
    rdd_qp_info info;
    uint64_t addr;
    uint32_t rkey;
};

struct side {
    rdd_device *dev;
    rdd_pd *pd;
    rdd_cq *cq;
    rdd_qp *qp;
    rdd_mr *mr;
    uint8_t *buf;
    uint32_t lkey;
};

static uint8_t pattern(size_t i) { return (uint8_t)((i * 7 + 3) % 251); }

static void full_read(int fd, void *p, size_t n)
{
    uint8_t *b = (uint8_t *)p;
    while (n > 0) {
        ssize_t r = read(fd, b, n);
        if (r <= 0) {
            fprintf(stderr, "pipe closed\n");
            abort();
        }
        b += r;
        n -= (size_t)r;
    }
}

static void full_write(int fd, const void *p, size_t n)
{
    if (write(fd, p, n) != (ssize_t)n) {
        abort();
    }
}

static void open_side(struct side *s)
{
    uint32_t path = 0;
    MUST(rdd_device_open_fabric(NULL, &s->dev));
    MUST(rdd_device_data_path(s->dev, &path));
    CHECK_EQ(path, RDD_DATA_PATH_SOFTWARE);
    MUST(rdd_device_start(s->dev));
    MUST(rdd_pd_alloc(s->dev, &s->pd));
    MUST(rdd_cq_create(s->dev, 256, &s->cq));
    MUST(rdd_qp_create(s->pd, s->cq, s->cq, NULL, &s->qp));
    MUST(rdd_mr_reg(s->pd, REGION,
                    RDD_ACCESS_LOCAL_WRITE | RDD_ACCESS_REMOTE_WRITE | RDD_ACCESS_REMOTE_READ |
                        RDD_ACCESS_REMOTE_ATOMIC,
                    &s->mr));
    void *a = NULL;
    MUST(rdd_mr_addr(s->mr, &a));
    s->buf = (uint8_t *)a;
    MUST(rdd_mr_lkey(s->mr, &s->lkey));
}

static void close_side(struct side *s)
{
    MUST(rdd_qp_destroy(s->qp));
    MUST(rdd_cq_destroy(s->cq));
    MUST(rdd_mr_free(s->mr));
    MUST(rdd_pd_free(s->pd));
    MUST(rdd_device_close(s->dev));
}

static struct hello hello_of(struct side *s)
{
    struct hello h;
    memset(&h, 0, sizeof h);
    MUST(rdd_qp_query_info(s->qp, &h.info));
    void *a = NULL;
    MUST(rdd_mr_addr(s->mr, &a));
    h.addr = (uint64_t)(uintptr_t)a;
    MUST(rdd_mr_rkey(s->mr, &h.rkey));
    return h;
}

static rdd_connect_attr all_access(void)
{
    rdd_connect_attr a;
    memset(&a, 0, sizeof a);
    a.access = RDD_ACCESS_REMOTE_WRITE | RDD_ACCESS_REMOTE_READ | RDD_ACCESS_REMOTE_ATOMIC;
    a.rnr_retry = 7;
    a.retry_cnt = 7;
    return a;
}

/* Polls one completion, for at most `secs` seconds. */
static int poll_one(struct side *s, rdd_wc *wc, int secs)
{
    time_t end = time(NULL) + secs;
    while (time(NULL) <= end) {
        size_t n = 0;
        MUST(rdd_cq_poll(s->cq, &s->qp, 1, wc, 1, &n));
        if (n == 1) {
            return 1;
        }
    }
    return 0;
}

/* The child: a target region filled with `pattern`, one receive posted,
 * then it waits for the parent's go and checks the receive. */
static int child(int rd, int wr, int kill_me)
{
    struct side s;
    open_side(&s);
    for (size_t i = 0; i < REGION; i++) {
        s.buf[i] = pattern(i);
    }
    struct hello mine = hello_of(&s), theirs;
    full_write(wr, &mine, sizeof mine);
    full_read(rd, &theirs, sizeof theirs);
    rdd_connect_attr attr = all_access();
    MUST(rdd_qp_connect(s.qp, &theirs.info, &attr));
    /* The receive lands at the region's second half. */
    MUST(rdd_qp_recv(s.qp, 99, (uint64_t)(uintptr_t)(s.buf + REGION / 2), REGION / 2, s.lkey, 0));
    uint8_t ready = 1;
    full_write(wr, &ready, 1);
    if (kill_me) {
        for (;;) {
            pause();
        }
    }
    uint8_t go;
    full_read(rd, &go, 1);
    rdd_wc wc;
    int bad = 0;
    if (!poll_one(&s, &wc, 20) || wc.status != 0 || wc.wr_id != 99 || wc.byte_len != SEND_LEN) {
        bad = 1;
    } else {
        for (size_t i = 0; i < SEND_LEN; i++) {
            if (s.buf[REGION / 2 + i] != (uint8_t)(i ^ 0x5a)) {
                bad = 1;
                break;
            }
        }
    }
    uint8_t verdict = (uint8_t)bad;
    full_write(wr, &verdict, 1);
    full_read(rd, &go, 1);
    close_side(&s);
    return bad;
}

static pid_t spawn(int kill_me, int *rd, int *wr)
{
    int p2c[2], c2p[2];
    if (pipe(p2c) != 0 || pipe(c2p) != 0) {
        abort();
    }
    pid_t pid = fork();
    if (pid == 0) {
        close(p2c[1]);
        close(c2p[0]);
        _exit(child(p2c[0], c2p[1], kill_me));
    }
    close(p2c[0]);
    close(c2p[1]);
    *rd = c2p[0];
    *wr = p2c[1];
    return pid;
}

static void connect_to(struct side *s, int rd, int wr, struct hello *theirs)
{
    full_read(rd, theirs, sizeof *theirs);
    rdd_connect_attr attr = all_access();
    MUST(rdd_qp_connect(s->qp, &theirs->info, &attr));
    struct hello mine = hello_of(s);
    full_write(wr, &mine, sizeof mine);
    uint8_t ready;
    full_read(rd, &ready, 1);
}

static void test_operations(void)
{
    int rd, wr;
    pid_t pid = spawn(0, &rd, &wr);
    struct side s;
    open_side(&s);
    struct hello t;
    connect_to(&s, rd, wr, &t);
    uint64_t base = (uint64_t)(uintptr_t)s.buf;
    rdd_wc wc;

    for (size_t i = 0; i < WRITE_LEN; i++) {
        s.buf[i] = (uint8_t)(i * 13 + 1);
    }
    CHECK_EQ(rdd_qp_write(s.qp, 1, base, WRITE_LEN, s.lkey, t.addr + 3, t.rkey, RDD_SEND_SIGNALED),
             RDD_STATUS_OK);
    CHECK(poll_one(&s, &wc, 20));
    CHECK_EQ(wc.status, 0u);
    CHECK_EQ(wc.wr_id, 1u);
    uint8_t *back = s.buf + 2 * WRITE_LEN;
    CHECK_EQ(rdd_qp_read(s.qp, 2, (uint64_t)(uintptr_t)back, WRITE_LEN, s.lkey, t.addr + 3, t.rkey,
                         RDD_SEND_SIGNALED),
             RDD_STATUS_OK);
    CHECK(poll_one(&s, &wc, 20));
    CHECK_EQ(wc.status, 0u);
    CHECK_EQ(wc.byte_len, WRITE_LEN);
    CHECK_BYTES(back, s.buf, WRITE_LEN);

    /* FETCH_AND_ADD on a word the child left as its pattern. */
    uint64_t word = t.addr + REGION / 2 - 8, start = 0;
    for (unsigned k = 0; k < 8; k++) {
        ((uint8_t *)&start)[k] = pattern(REGION / 2 - 8 + k);
    }
    uint64_t *old = (uint64_t *)(void *)(s.buf + REGION - 64);
    for (uint64_t k = 0; k < 3; k++) {
        CHECK_EQ(rdd_qp_fetch_add(s.qp, 10 + k, (uint64_t)(uintptr_t)old, s.lkey, word, t.rkey, 100,
                                  RDD_SEND_SIGNALED),
                 RDD_STATUS_OK);
        CHECK(poll_one(&s, &wc, 20));
        CHECK_EQ(wc.status, 0u);
        CHECK_EQ(*old, start + 100 * k);
    }

    for (size_t i = 0; i < SEND_LEN; i++) {
        s.buf[i] = (uint8_t)(i ^ 0x5a);
    }
    CHECK_EQ(rdd_qp_send(s.qp, 20, base, SEND_LEN, s.lkey, RDD_SEND_SIGNALED), RDD_STATUS_OK);
    CHECK(poll_one(&s, &wc, 20));
    CHECK_EQ(wc.status, 0u);
    uint8_t go = 1, verdict = 9;
    full_write(wr, &go, 1);
    full_read(rd, &verdict, 1);
    CHECK_EQ(verdict, 0);
    full_write(wr, &go, 1);
    int st = 0;
    CHECK_EQ(waitpid(pid, &st, 0), pid);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    close(rd);
    close(wr);
    close_side(&s);
}

static void test_killed_peer(void)
{
    int rd, wr;
    pid_t pid = spawn(1, &rd, &wr);
    struct side s;
    open_side(&s);
    struct hello t;
    connect_to(&s, rd, wr, &t);
    CHECK_EQ(kill(pid, SIGKILL), 0);
    int st = 0;
    CHECK_EQ(waitpid(pid, &st, 0), pid);
    rdd_wc wc;
    CHECK_EQ(rdd_qp_read(s.qp, 7, (uint64_t)(uintptr_t)s.buf, 64, s.lkey, t.addr, t.rkey,
                         RDD_SEND_SIGNALED),
             RDD_STATUS_OK);
    CHECK(poll_one(&s, &wc, 5));
    CHECK_EQ(wc.wr_id, 7u);
    CHECK_EQ(wc.status, 12u); /* IBV_WC_RETRY_EXC_ERR */
    close(rd);
    close(wr);
    close_side(&s);
}

static void test_refusals(void)
{
    rdd_device *d = NULL;
    CHECK_EQ(rdd_device_open_fabric(NULL, NULL), RDD_STATUS_NULL_PARAMETER);
    rdd_soft_config bad;
    memset(&bad, 0, sizeof bad);
    bad.cqe_size = 96;
    CHECK_EQ(rdd_device_open_fabric(&bad, &d), RDD_STATUS_INVALID_ARGUMENT);
    CHECK(d == NULL);
}

static inline int run_fabric_tests(const char *name)
{
    test_operations();
    test_killed_peer();
    test_refusals();
    return h_finish(name);
}

#endif
