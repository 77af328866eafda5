/*
 * peer_loss: one rank of a full mesh is killed (SIGKILL) while the others
 * have RDMA WRITEs outstanding towards it. What a user of the mesh must
 * see, checked on every survivor:
 * - its outstanding WRs to the dead rank complete: the oldest with
 *   RETRY_EXC_ERR (retry exceeded, as on hardware), the rest with
 *   WR_FLUSH_ERR, none lost, none successful after the error;
 * - the first error comes within `--bound-ms` of the kill (on the
 *   cross-process fabric, the default, the liveness check notices a dead
 *   peer within about 10 ms plus one device pass: docs/spec/fabric.md §5;
 *   on a kernel device (`--device`, mesh.h) only the transport's retry
 *   timer does: 4.096 us * 2^14 (the default timeout exponent) per
 *   unanswered try, 8 tries with the mesh's retry_cnt 7 (7 on rxe, which
 *   would retry forever at 7, so the library gives it 6), about half a
 *   second, longer under emulation; give it `--bound-ms` accordingly);
 * - no poller hangs: every wait has a deadline (`--timeout`);
 * - traffic between survivors is untouched: WRITEs to the next survivor
 *   all succeed, before and after the loss, and land with the right
 *   bytes;
 * - the mesh and the device close with the dead peer's QP in ERROR.
 *
 * The victim (`--victim R`, default the last rank) WRITEs the time it
 * chose to die into every survivor's region first and waits for those
 * WRITEs to complete, so a survivor measures from a moment at or before
 * the kill (the figure can only overstate the delay). The survivors
 * finish on a communicator without the victim, split before the kill;
 * MPI itself is told not to end the job when a process dies
 * (`mpirun --enable-recovery`), and a survivor ends with _exit after
 * its report instead of MPI_Finalize, whose wait for every rank of
 * MPI_COMM_WORLD would include the dead one. The lowest surviving rank
 * prints "verdict: PASS" or "verdict: FAIL" (exit status 0 or 1 on every
 * survivor; the victim's is the signal).
 *
 * Build (after scripts/install.sh into a prefix on PKG_CONFIG_PATH):
 *     mpicc -std=c11 -O2 peer_loss.c $(pkg-config --cflags --libs --static rdma-direct) \
 *         -o peer_loss
 * Run:
 *     mpirun --enable-recovery -np 4 ./peer_loss [--wait MODE] [--device NAME] [--victim R] [--size B]
 *         [--window W] [--delay-ms D] [--bound-ms B] [--timeout S]
 * Defaults: the last rank dies, 4096-byte WRITEs, 8 outstanding towards
 * it, after 50 ms of traffic; a 250 ms bound (under the 537 ms
 * acknowledgement timeout of the default QP attributes, so the liveness
 * check is what must notice the loss); 30 s per wait.
 */
#define _POSIX_C_SOURCE 200809L

#include "mesh.h"

#include <signal.h>

#define MAX_WINDOW 64u
/* The kill record at the start of every survivor's region. */
#define KILL_MAGIC 0x6b696c6c2d726464ull
/* WRITEs to the next survivor after the loss was noticed. */
#define AFTER_LOSS 64u

/* The victim's kill record in a survivor's region (offset 0). */
struct kill_record {
    double t_kill_us;
    uint64_t magic;
};

/* What one survivor saw. */
struct seen {
    double first_error_us;
    unsigned long ok_to_victim, retry_exc, flushed, ok_ring;
};

static uint8_t ring_byte(uint32_t from, unsigned long k, size_t i)
{
    return (uint8_t)(from * 31u + k * 7u + i);
}

/* The victim: tells every survivor when it dies, then dies. */
static void die_now(struct mx_mesh *m, rdd_wc *wc, unsigned long delay_ms, double timeout_us)
{
    struct kill_record rec;
    struct timespec ts = {(time_t)(delay_ms / 1000), (long)(delay_ms % 1000) * 1000000L};
    uint32_t p, n = 0;
    nanosleep(&ts, NULL); /* the survivors' WRITEs are flowing now */
    rec.t_kill_us = mx_now_us();
    rec.magic = KILL_MAGIC;
    memcpy(m->local_buf, &rec, sizeof(rec));
    for (p = 0; p < (uint32_t)mx_size; p++) {
        if (p == (uint32_t)mx_rank) {
            continue;
        }
        MX_TRY(rdd_qp_write(m->qp[p], p, (uint64_t)(uintptr_t)m->local_buf, sizeof(rec),
                            m->local_lkey, m->peer_region[p].addr, m->peer_region[p].rkey,
                            RDD_SEND_SIGNALED));
        n++;
    }
    mx_wait(&m->scq, wc, n, timeout_us, "the kill records");
    fflush(stdout);
    fflush(stderr);
    raise(SIGKILL);
}

/* A survivor: WRITEs to the victim and to the next survivor until the
 * victim's WRs have all failed and AFTER_LOSS more reached the next
 * survivor. */
static void survive(struct mx_mesh *m, rdd_wc *wc, uint32_t victim, uint32_t next, size_t size,
                    uint32_t window, double timeout_us, struct seen *s)
{
    uint32_t v_out = 0, r_out = 0;
    unsigned long ring_sent = 0, ring_stop = (unsigned long)-1;
    int errored = 0;
    double deadline = mx_now_us() + timeout_us;
    uint8_t *src = m->local_buf + 4096;
    memset(s, 0, sizeof(*s));
    memset(src, 0x5a, size);
    for (;;) {
        int32_t got, i;
        if (errored && v_out == 0 && ring_sent >= ring_stop && r_out == 0) {
            return;
        }
        while (!errored && v_out < window) {
            MX_TRY(rdd_qp_write(m->qp[victim], victim, (uint64_t)(uintptr_t)src, (uint32_t)size,
                                m->local_lkey, m->peer_region[victim].addr + 4096,
                                m->peer_region[victim].rkey, RDD_SEND_SIGNALED));
            v_out++;
        }
        /* One ring WRITE in flight at a time: its bytes are checked by the
         * next survivor's own traffic below, so each must land whole. */
        if (next != victim && r_out == 0 && ring_sent < ring_stop) {
            uint8_t *ring = m->local_buf + 4096 + size;
            size_t b;
            for (b = 0; b < size; b++) {
                ring[b] = ring_byte((uint32_t)mx_rank, ring_sent, b);
            }
            MX_TRY(rdd_qp_write(m->qp[next], next, (uint64_t)(uintptr_t)ring, (uint32_t)size,
                                m->local_lkey, m->peer_region[next].addr + 4096 + size,
                                m->peer_region[next].rkey, RDD_SEND_SIGNALED));
            r_out++;
            ring_sent++;
        }
        got = rdd_cq_poll_n(m->scq.cq, wc, 32);
        if (got < 0) {
            mx_fail("rdd_cq_poll_n", (rdd_status)(uint32_t)-got);
        }
        for (i = 0; i < got; i++) {
            const rdd_wc *c = &wc[i];
            if (c->wr_id == victim) {
                v_out--;
                if (c->status == RDD_WC_SUCCESS && !errored) {
                    s->ok_to_victim++;
                } else if (c->status == RDD_WC_RETRY_EXC_ERR && !errored) {
                    errored = 1;
                    s->first_error_us = mx_now_us();
                    s->retry_exc++;
                    ring_stop = ring_sent + AFTER_LOSS;
                } else if (c->status == RDD_WC_WR_FLUSH_ERR && errored) {
                    s->flushed++;
                } else {
                    char msg[200];
                    snprintf(msg, sizeof(msg), "a WRITE to the dead rank completed %s%s",
                             rdd_wc_status_name(c->status),
                             errored ? " after its QP failed" : " before any error");
                    mx_die(msg);
                }
            } else if (c->wr_id == next) {
                r_out--;
                mx_check_wc(c, 1, "a WRITE to the next survivor");
                s->ok_ring++;
            } else {
                mx_die("a completion of a WR this rank did not post");
            }
        }
        /* The deadline is checked on every round: completions of the
         * WRITEs between survivors keep coming, so an empty poll may
         * never happen while the WRITEs to the dead rank hang. */
        if (mx_now_us() > deadline) {
            char msg[200];
            snprintf(msg, sizeof(msg),
                     "%u WRITEs to rank %u and %u to rank %u still outstanding after %.0f s "
                     "(%s)",
                     v_out, victim, r_out, next, timeout_us / 1e6,
                     errored ? "after the loss was noticed" : "the loss was never noticed");
            mx_die(msg);
        }
        if (got == 0) {
            sched_yield();
        }
    }
}

int main(int argc, char **argv)
{
    unsigned long size = 4096, window = 8, delay_ms = 50, bound_ms = 250, timeout_s = 30;
    long victim_arg = -1;
    uint32_t victim, next;
    int a, srank = 0, ssize = 0, pass = 1;
    MPI_Comm surv;
    struct mx_mesh m;
    struct mx_config cfg;
    struct seen s;
    struct kill_record rec;
    rdd_wc *wc;
    double timeout_us, delay_us, worst_us = 0.0;
    unsigned long mine[5], sum[5];

    mx_init(&argc, &argv, "peer_loss", 3);
    for (a = 1; a < argc; a++) {
        if (mx_common_arg(argc, argv, &a)) {
            continue;
        } else if (strcmp(argv[a], "--victim") == 0) {
            victim_arg = (long)mx_number("--victim", argv[++a], 0, (unsigned long)mx_size - 1);
        } else if (strcmp(argv[a], "--size") == 0) {
            size = mx_number("--size", argv[++a], 1, 16384);
        } else if (strcmp(argv[a], "--window") == 0) {
            window = mx_number("--window", argv[++a], 1, MAX_WINDOW);
        } else if (strcmp(argv[a], "--delay-ms") == 0) {
            delay_ms = mx_number("--delay-ms", argv[++a], 0, 10000);
        } else if (strcmp(argv[a], "--bound-ms") == 0) {
            bound_ms = mx_number("--bound-ms", argv[++a], 1, 600000);
        } else if (strcmp(argv[a], "--timeout") == 0) {
            timeout_s = mx_number("--timeout", argv[++a], 1, 3600);
        } else {
            mx_usage(MX_COMMON_USAGE " [--victim R] [--size B] [--window W] [--delay-ms D]"
                                     " [--bound-ms B] [--timeout S]");
        }
    }
    victim = victim_arg < 0 ? (uint32_t)mx_size - 1 : (uint32_t)victim_arg;
    timeout_us = (double)timeout_s * 1e6;

    memset(&cfg, 0, sizeof(cfg));
    cfg.region_len = 4096 + 2 * 16384;
    cfg.region_access = RDD_ACCESS_LOCAL_WRITE | RDD_ACCESS_REMOTE_WRITE;
    cfg.local_len = 4096 + 2 * 16384;
    cfg.connect_access = RDD_ACCESS_REMOTE_WRITE;
    cfg.qp.max_send_wr = MAX_WINDOW + 2;
    cfg.qp.max_recv_wr = 1;
    cfg.qp.max_send_sge = 1;
    cfg.qp.max_recv_sge = 1;
    mx_open(&m, &cfg);
    wc = calloc(64, sizeof(*wc));
    if (wc == NULL) {
        mx_die("out of memory");
    }
    /* The survivors' communicator, made while every rank is alive. */
    MX_MPI(MPI_Comm_split(MPI_COMM_WORLD, (uint32_t)mx_rank == victim ? MPI_UNDEFINED : 0,
                          mx_rank, &surv));
    /* Each survivor's ring neighbour: the next rank that is not the victim. */
    next = ((uint32_t)mx_rank + 1) % (uint32_t)mx_size;
    if (next == victim) {
        next = (next + 1) % (uint32_t)mx_size;
    }
    mx_report_machine();
    if (mx_rank == 0) {
        printf(" victim                   : rank %u, SIGKILL after %lu ms of traffic\n", victim,
               delay_ms);
        printf(" towards it               : %lu WRITEs of %lu bytes outstanding per survivor\n",
               window, size);
        fflush(stdout);
    }
    MX_MPI(MPI_Barrier(MPI_COMM_WORLD));
    if ((uint32_t)mx_rank == victim) {
        die_now(&m, wc, delay_ms, timeout_us);
        return 1; /* not reached */
    }

    survive(&m, wc, victim, next, size, (uint32_t)window, timeout_us, &s);
    memcpy(&rec, m.region_buf, sizeof(rec));
    if (rec.magic != KILL_MAGIC) {
        mx_die("no kill record from the victim in this rank's region");
    }
    delay_us = s.first_error_us - rec.t_kill_us;
    if (s.ok_to_victim == 0 || s.retry_exc != 1) {
        fprintf(stderr, "peer_loss[%d]: %lu WRITEs reached the victim before it died, %lu "
                        "RETRY_EXC (want at least 1 and exactly 1)\n",
                mx_rank, s.ok_to_victim, s.retry_exc);
        pass = 0;
    }
    if (delay_us > (double)bound_ms * 1e3) {
        fprintf(stderr, "peer_loss[%d]: the loss was noticed %.1f ms after the kill (bound %lu "
                        "ms)\n",
                mx_rank, delay_us / 1e3, bound_ms);
        pass = 0;
    }
    /* The last ring WRITE into this rank came from the previous survivor;
     * its bytes must be whole (WRITEs into the same slot complete in
     * order, and the previous survivor has finished its last one once it
     * is past the barrier below). */
    MX_MPI(MPI_Barrier(surv));
    {
        uint32_t prev = ((uint32_t)mx_rank + (uint32_t)mx_size - 1) % (uint32_t)mx_size;
        unsigned long prev_sent = 0, k;
        size_t b;
        if (prev == victim) {
            prev = (prev + (uint32_t)mx_size - 1) % (uint32_t)mx_size;
        }
        /* Every survivor learns how many ring WRITEs its predecessor sent
         * (point to point between survivors: the dead rank takes no part). */
        MX_MPI(MPI_Comm_rank(surv, &srank));
        MX_MPI(MPI_Comm_size(surv, &ssize));
        MX_MPI(MPI_Sendrecv(&s.ok_ring, 1, MPI_UNSIGNED_LONG, (int)next, 0, &prev_sent, 1,
                            MPI_UNSIGNED_LONG, (int)prev, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE));
        k = prev_sent - 1;
        for (b = 0; prev != (uint32_t)mx_rank && b < size; b++) {
            if (m.region_buf[4096 + size + b] != ring_byte(prev, k, b)) {
                fprintf(stderr,
                        "peer_loss[%d]: the last WRITE from rank %u differs at byte %zu\n",
                        mx_rank, prev, b);
                pass = 0;
                break;
            }
        }
    }
    mine[0] = s.ok_to_victim;
    mine[1] = s.retry_exc;
    mine[2] = s.flushed;
    mine[3] = s.ok_ring;
    mine[4] = (unsigned long)!pass;
    MX_MPI(MPI_Reduce(mine, sum, 5, MPI_UNSIGNED_LONG, MPI_SUM, 0, surv));
    MX_MPI(MPI_Reduce(&delay_us, &worst_us, 1, MPI_DOUBLE, MPI_MAX, 0, surv));
    MX_MPI(MPI_Allreduce(MPI_IN_PLACE, &pass, 1, MPI_INT, MPI_MIN, surv));
    /* Closing with the dead peer's QP in ERROR must not wait for it. */
    MX_TRY(rdd_mesh_destroy(m.mesh));
    MX_TRY(rdd_mr_free(m.local));
    MX_TRY(rdd_mr_free(m.region));
    MX_TRY(rdd_cq_destroy(m.rcq.cq));
    MX_TRY(rdd_cq_destroy(m.scq.cq));
    MX_TRY(rdd_pd_free(m.pd));
    MX_TRY(rdd_device_close(m.dev));
    MX_MPI(MPI_Barrier(surv));
    if (srank == 0) {
        printf(" survivors                : %d\n", ssize);
        printf(" loss noticed after       : %.1f ms (max over survivors; bound %lu ms)\n",
               worst_us / 1e3, bound_ms);
        printf(" WRITEs to the victim     : %lu completed before the kill, %lu RETRY_EXC + %lu "
               "flushed after it\n",
               sum[0], sum[1], sum[2]);
        printf(" WRITEs between survivors : %lu, all successful (%u after the loss each)\n",
               sum[3], AFTER_LOSS);
        printf(" verdict: %s\n", pass ? "PASS" : "FAIL");
    }
    fflush(stdout);
    fflush(stderr);
    free(wc);
    free(m.qp);
    free(m.peer_region);
    free(m.scq.qps);
    _exit(pass ? 0 : 1);
}
