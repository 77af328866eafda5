/*
 * C11 tests of exposures (rdd_mr_expose, rdd_mr_expose_to, rdd_exposure_*)
 * on the software device, which has no memory windows: rdd_mr_expose_to
 * falls back to a registration of its own and posts nothing. Checked: the
 * peer's READ and WRITE through an exposure's key work exactly as granted
 * (a read-only exposure refuses WRITE with a remote access error and the
 * memory is unchanged), revocation by invalidate, revoke and free makes
 * the key fail, an exposure holds its region, and bad arguments are typed
 * errors. (Windows on rxe: ffi-tests/test_verbs.c in the VM.)
 */
#include <stddef.h>

#include "harness.h"

_Static_assert(sizeof(rdd_exposure_info) == 24, "rdd_exposure_info");
_Static_assert(offsetof(rdd_exposure_info, rkey) == 16, "rdd_exposure_info");

/* One RDMA READ (into `local`) or WRITE (from it) of 64 bytes against
 * `addr`/`rkey` on a fresh connected QP pair (a failed access moves a QP to
 * ERROR); returns the completion status. The QPs allow everything: only
 * the key decides. */
static uint32_t attempt(rdd_device *dev, rdd_pd *pd, rdd_mr *local, uint64_t addr, uint32_t rkey,
                        int write)
{
    rdd_cq *cq[2];
    rdd_qp *qp[2];
    rdd_qp_info info[2];
    rdd_connect_attr attr;
    rdd_sge s;
    rdd_wr w;
    rdd_wc wc;
    void *base;
    uint32_t lkey;
    size_t bad = 0, n = 0, work = 0;
    unsigned rounds = 0;
    int i;

    memset(&attr, 0, sizeof attr);
    attr.access = RDD_ACCESS_LOCAL_WRITE | RDD_ACCESS_REMOTE_READ | RDD_ACCESS_REMOTE_WRITE;
    for (i = 0; i < 2; i++) {
        MUST(rdd_cq_create(dev, 1024, &cq[i]));
        MUST(rdd_qp_create(pd, cq[i], cq[i], NULL, &qp[i]));
        MUST(rdd_qp_query_info(qp[i], &info[i]));
    }
    MUST(rdd_qp_connect(qp[0], &info[1], &attr));
    MUST(rdd_qp_connect(qp[1], &info[0], &attr));
    MUST(rdd_mr_addr(local, &base));
    MUST(rdd_mr_lkey(local, &lkey));
    s.addr = (uint64_t)(uintptr_t)base;
    s.length = 64;
    s.lkey = lkey;
    memset(&w, 0, sizeof w);
    w.wr_id = 1;
    w.opcode = write ? RDD_WR_RDMA_WRITE : RDD_WR_RDMA_READ;
    w.flags = RDD_SEND_SIGNALED;
    w.sg_list = &s;
    w.num_sge = 1;
    w.remote_addr = addr;
    w.rkey = rkey;
    MUST(rdd_qp_post_send(qp[0], &w, 1, &bad));
    while (n == 0 && rounds++ < 200) {
        MUST(rdd_device_step(dev, &work));
        MUST(rdd_cq_poll(cq[0], &qp[0], 1, &wc, 1, &n));
    }
    CHECK_EQ(n, 1);
    for (i = 0; i < 2; i++) {
        MUST(rdd_qp_destroy(qp[i]));
        MUST(rdd_cq_destroy(cq[i]));
    }
    return n == 1 ? wc.status : 0xffffffffu;
}

static void fill(rdd_mr *m, size_t len, uint8_t seed)
{
    void *p;
    size_t i;
    MUST(rdd_mr_addr(m, &p));
    for (i = 0; i < len; i++) {
        ((uint8_t *)p)[i] = (uint8_t)(seed + i * 7u);
    }
}

static void test_fallback_grants_and_revokes(rdd_device *dev, rdd_pd *pd)
{
    rdd_mr *owned, *peer;
    rdd_cq *cq;
    rdd_qp *qp;
    rdd_exposure *e, *r;
    rdd_exposure_info info;
    rdd_wc wc;
    void *ob, *pb;
    uint8_t before[4096];
    size_t n = 7;
    int posted = -1;

    /* The owner's region grants no remote access of its own. */
    MUST(rdd_mr_reg(pd, 4096, RDD_ACCESS_LOCAL_WRITE | RDD_ACCESS_MW_BIND, &owned));
    MUST(rdd_mr_reg(pd, 4096, RDD_ACCESS_LOCAL_WRITE, &peer));
    fill(owned, 4096, 5);
    MUST(rdd_mr_addr(owned, &ob));
    MUST(rdd_mr_addr(peer, &pb));
    memcpy(before, ob, sizeof before);
    MUST(rdd_cq_create(dev, 1024, &cq));
    MUST(rdd_qp_create(pd, cq, cq, NULL, &qp));

    /* No windows here: a registration, and nothing posted. */
    MUST(rdd_mr_expose_to(owned, qp, 7, RDD_SEND_SIGNALED, 1024, 2048, RDD_REMOTE_READ, &e));
    MUST(rdd_exposure_get_info(e, &info));
    CHECK_EQ(info.is_window, 0);
    CHECK_EQ(info.revoked, 0);
    CHECK_EQ(info.rights, RDD_REMOTE_READ);
    CHECK_EQ(info.addr, (uint64_t)(uintptr_t)ob + 1024);
    CHECK_EQ(info.len, 2048);
    CHECK_EQ(rdd_cq_poll(cq, &qp, 1, &wc, 1, &n), RDD_STATUS_OK);
    CHECK_EQ(n, 0);

    /* Granted: READ. Not granted: WRITE, and outside the range. */
    CHECK_EQ(attempt(dev, pd, peer, info.addr, info.rkey, 0), RDD_WC_SUCCESS);
    CHECK_BYTES(pb, (uint8_t *)ob + 1024, 64);
    CHECK_EQ(attempt(dev, pd, peer, info.addr, info.rkey, 1), RDD_WC_REM_ACCESS_ERR);
    CHECK_EQ(attempt(dev, pd, peer, (uint64_t)(uintptr_t)ob, info.rkey, 0),
             RDD_WC_REM_ACCESS_ERR);
    CHECK_BYTES(ob, before, sizeof before);

    /* The exposure holds its region. */
    CHECK_EQ(rdd_mr_free(owned), RDD_STATUS_RESOURCE_BUSY);

    /* Invalidate: a registration is revoked at once, nothing posted. */
    CHECK_EQ(rdd_exposure_invalidate(e, qp, 8, RDD_SEND_SIGNALED, &posted), RDD_STATUS_OK);
    CHECK_EQ(posted, 0);
    MUST(rdd_exposure_get_info(e, &info));
    CHECK_EQ(info.revoked, 1);
    CHECK_EQ(rdd_exposure_rebind(e, qp, 9, RDD_SEND_SIGNALED), RDD_STATUS_UNSUPPORTED);
    CHECK_EQ(attempt(dev, pd, peer, info.addr, info.rkey, 0), RDD_WC_REM_ACCESS_ERR);

    /* rdd_mr_expose, READ_WRITE, revoked by rdd_exposure_revoke. */
    MUST(rdd_mr_expose(owned, 0, 4096, RDD_REMOTE_READ_WRITE, &r));
    MUST(rdd_exposure_get_info(r, &info));
    CHECK_EQ(info.is_window, 0);
    memset(pb, 0x5c, 64);
    CHECK_EQ(attempt(dev, pd, peer, info.addr + 128, info.rkey, 1), RDD_WC_SUCCESS);
    CHECK_BYTES((uint8_t *)ob + 128, pb, 64);
    memcpy(before, ob, sizeof before);
    CHECK_EQ(rdd_exposure_revoke(r), RDD_STATUS_OK);
    CHECK_EQ(rdd_exposure_revoke(r), RDD_STATUS_OK); /* idempotent */
    MUST(rdd_exposure_get_info(r, &info));
    CHECK_EQ(info.revoked, 1);
    memset(pb, 0x77, 64);
    CHECK_EQ(attempt(dev, pd, peer, info.addr, info.rkey, 1), RDD_WC_REM_ACCESS_ERR);
    CHECK_BYTES(ob, before, sizeof before);

    CHECK_EQ(rdd_exposure_free(e), RDD_STATUS_OK);
    CHECK_EQ(rdd_mr_free(owned), RDD_STATUS_RESOURCE_BUSY);
    CHECK_EQ(rdd_exposure_free(r), RDD_STATUS_OK);
    CHECK_EQ(rdd_exposure_free(r), RDD_STATUS_INVALID_HANDLE);
    CHECK_EQ(rdd_qp_destroy(qp), RDD_STATUS_OK);
    CHECK_EQ(rdd_cq_destroy(cq), RDD_STATUS_OK);
    CHECK_EQ(rdd_mr_free(owned), RDD_STATUS_OK);
    CHECK_EQ(rdd_mr_free(peer), RDD_STATUS_OK);
}

static void test_bad_arguments(rdd_device *dev, rdd_pd *pd)
{
    rdd_mr *m;
    rdd_pd *pd2;
    rdd_cq *cq;
    rdd_qp *other;
    rdd_exposure *e = NULL;
    rdd_exposure_info info;
    int posted;

    MUST(rdd_mr_reg(pd, 4096, RDD_ACCESS_LOCAL_WRITE | RDD_ACCESS_MW_BIND, &m));
    CHECK_EQ(rdd_mr_expose(m, 0, 0, RDD_REMOTE_READ, &e), RDD_STATUS_INVALID_ARGUMENT);
    CHECK_EQ(rdd_mr_expose(m, 4000, 97, RDD_REMOTE_READ, &e), RDD_STATUS_INVALID_ARGUMENT);
    CHECK_EQ(rdd_mr_expose(m, SIZE_MAX, 2, RDD_REMOTE_READ, &e), RDD_STATUS_INVALID_ARGUMENT);
    CHECK_EQ(rdd_mr_expose(m, 0, 64, 0, &e), RDD_STATUS_INVALID_ARGUMENT);
    CHECK_EQ(rdd_mr_expose(m, 0, 64, 5, &e), RDD_STATUS_INVALID_ARGUMENT);
    CHECK_EQ(rdd_mr_expose(m, 0, 64, RDD_REMOTE_READ, NULL), RDD_STATUS_NULL_PARAMETER);
    CHECK_EQ(rdd_mr_expose(NULL, 0, 64, RDD_REMOTE_READ, &e), RDD_STATUS_NULL_PARAMETER);
    CHECK(e == NULL);

    /* A QP of another protection domain, and flags a bind cannot take. */
    MUST(rdd_pd_alloc(dev, &pd2));
    MUST(rdd_cq_create(dev, 1024, &cq));
    MUST(rdd_qp_create(pd2, cq, cq, NULL, &other));
    CHECK_EQ(rdd_mr_expose_to(m, other, 1, 0, 0, 64, RDD_REMOTE_READ, &e), RDD_STATUS_OK);
    /* (falls back here: no windows, so the QP is never used) */
    CHECK_EQ(rdd_exposure_free(e), RDD_STATUS_OK);
    CHECK_EQ(rdd_mr_expose_to(m, other, 1, RDD_SEND_INLINE, 0, 64, RDD_REMOTE_READ, &e),
             RDD_STATUS_INVALID_FLAGS);
    CHECK_EQ(rdd_mr_expose_to(m, other, 1, 0x100, 0, 64, RDD_REMOTE_READ, &e),
             RDD_STATUS_INVALID_FLAGS);

    /* Wrong handle kinds and NULL outputs. */
    CHECK_EQ(rdd_exposure_get_info((rdd_exposure *)m, &info), RDD_STATUS_INVALID_HANDLE);
    MUST(rdd_mr_expose(m, 0, 64, RDD_REMOTE_WRITE, &e));
    CHECK_EQ(rdd_exposure_get_info(e, NULL), RDD_STATUS_NULL_PARAMETER);
    CHECK_EQ(rdd_exposure_invalidate(e, other, 1, 0, NULL), RDD_STATUS_NULL_PARAMETER);
    CHECK_EQ(rdd_exposure_invalidate(e, other, 1, RDD_SEND_INLINE, &posted),
             RDD_STATUS_INVALID_FLAGS);
    CHECK_EQ(rdd_exposure_free(e), RDD_STATUS_OK);

    CHECK_EQ(rdd_qp_destroy(other), RDD_STATUS_OK);
    CHECK_EQ(rdd_cq_destroy(cq), RDD_STATUS_OK);
    CHECK_EQ(rdd_pd_free(pd2), RDD_STATUS_OK);
    CHECK_EQ(rdd_mr_free(m), RDD_STATUS_OK);
}

int main(void)
{
    rdd_device *dev;
    rdd_pd *pd;

    MUST(rdd_device_open_soft(NULL, &dev));
    MUST(rdd_pd_alloc(dev, &pd));
    test_fallback_grants_and_revokes(dev, pd);
    test_bad_arguments(dev, pd);
    CHECK_EQ(rdd_pd_free(pd), RDD_STATUS_OK);
    CHECK_EQ(rdd_device_close(dev), RDD_STATUS_OK);
    return h_finish("test_expose");
}
