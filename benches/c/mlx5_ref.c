/*
 * mlx5_ref.c - the C reference for benches/post_poll.rs.
 *
 * A minimal, hand-written mlx5 direct data path for one shape: RC
 * RDMA_WRITE with one SGE, posted with the public inline helpers of
 * <infiniband/mlx5dv.h> (mlx5dv_set_ctrl_seg, mlx5dv_set_data_seg) plus a
 * hand-filled remote-address segment, and a requester-only CQ poll loop.
 * It is what an application that gives up generality would write, and it
 * is the floor the Rust crate is compared against. Written for this
 * project from the segment layouts in docs/spec/mlx5.md and the
 * public infiniband/mlx5dv.h; no rdma-core or UCX code is copied.
 *
 * Memory stands in for a device exactly as FakeMlx5 does on the Rust side:
 * a 256-BB send ring, a 256-entry CQ of 64-byte CQEs, a doorbell record
 * and a pair of 256-byte BlueFlame buffers, all plain heap memory.
 *
 * The measured functions are the non-static, noinline ref_* functions;
 * scripts/bench.sh counts their instructions with
 * `valgrind --tool=callgrind --toggle-collect=<name>`. Everything that
 * keeps the queues going happens in main(), outside them.
 *
 * Build: gcc -O2 -std=c11 -o mlx5_ref mlx5_ref.c   (header-only, no -l)
 * Usage: mlx5_ref [BENCH...] [--iters N]; BENCH is post_1, post_16,
 * post_bf, poll_1, poll_16 or poll_empty (default: all).
 */
#define _DEFAULT_SOURCE
#include <endian.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <infiniband/mlx5dv.h>

#define BATCH 16
#define SQ_BBS 256u
#define CQES 256u
#define BF_SIZE 256u
#define QPN 0x1c5u
#define DEFAULT_ITERS 10000ul

/* ---- barriers (docs/spec/mlx5.md §7), same choices as src/mmio.rs ---------- */

#define compiler_barrier() __asm__ __volatile__("" ::: "memory")

#if defined(__x86_64__)
/* WQE stores before the doorbell record: program order suffices on x86. */
#define to_device_barrier() compiler_barrier()
/* Owner-bit load before the other CQE loads: x86 keeps load order. (rdma-core
 * uses lfence here; the Rust crate and this reference do not.) */
#define from_device_barrier() compiler_barrier()
/* Doorbell record before the write-combining register store. */
#define wc_barrier() __asm__ __volatile__("sfence" ::: "memory")
#elif defined(__aarch64__)
#define to_device_barrier() __asm__ __volatile__("dmb oshst" ::: "memory")
#define from_device_barrier() __asm__ __volatile__("dmb oshld" ::: "memory")
#define wc_barrier() __asm__ __volatile__("dsb st" ::: "memory")
#else
#error "x86_64 or aarch64 only"
#endif

/* ---- queues ---------------------------------------------------------- */

/* What the application knows about one RDMA_WRITE; same layout as
 * WriteDesc in benches/post_poll.rs. */
struct write_desc {
	uint64_t wr_id;
	uint64_t laddr;
	uint64_t raddr;
	uint32_t len;
	uint32_t lkey;
	uint32_t rkey;
	uint32_t flags; /* IBV_SEND_* */
};

struct ref_sq {
	uint8_t *buf;		/* SQ_BBS * 64 bytes */
	uint32_t mask;		/* wqe_cnt - 1 */
	uint32_t wqe_cnt;
	uint32_t pi;		/* free-running BB producer counter */
	uint16_t tail;		/* low 16 bits of the first BB not completed */
	uint32_t qpn;
	volatile __be32 *dbrec; /* SQ word of the doorbell record */
	uint8_t *bf_reg;	/* doorbell / BlueFlame register pair */
	uint32_t bf_size;
	uint32_t bf_offset;	/* 0 or bf_size, toggled per doorbell */
	uint64_t *wrid;		/* per-BB wr_id */
};

struct ref_cq {
	uint8_t *buf;		/* CQES * 64 bytes */
	uint32_t mask;
	uint32_t log_cnt;
	uint32_t ci;		/* free-running consumer index */
	volatile __be32 *dbrec; /* consumer-index word */
};

/* The fields the post loop needs, held in locals: the segment stores are
 * partly byte stores, which may alias anything, so reading them through
 * `sq` would reload them after every WQE. */
struct sq_hot {
	uint8_t *buf;
	uint64_t *wrid;
	uint32_t mask, wqe_cnt, pi, tail, qpn;
};

static inline __attribute__((always_inline)) struct sq_hot hot_load(const struct ref_sq *sq)
{
	return (struct sq_hot){ sq->buf, sq->wrid, sq->mask, sq->wqe_cnt,
				sq->pi, sq->tail, sq->qpn };
}

/* Formats one 1-BB RDMA_WRITE WQE (ctrl + raddr + one data segment, DS 3)
 * at the producer position. Returns the WQE or NULL if the ring is full. */
static inline __attribute__((always_inline)) uint8_t *
write_wqe(struct sq_hot *h, const struct write_desc *d)
{
	uint32_t pi = h->pi;
	if ((uint16_t)(pi - h->tail) >= h->wqe_cnt)
		return NULL;
	uint32_t idx = pi & h->mask;
	uint8_t *wqe = h->buf + ((size_t)idx << 6);
	uint32_t fl = d->flags;
	uint8_t fm_ce_se = ((fl & IBV_SEND_SIGNALED) ? MLX5_WQE_CTRL_CQ_UPDATE : 0) |
			   ((fl & IBV_SEND_SOLICITED) ? MLX5_WQE_CTRL_SOLICITED : 0) |
			   ((fl & IBV_SEND_FENCE) ? MLX5_WQE_CTRL_FENCE : 0);

	mlx5dv_set_ctrl_seg((struct mlx5_wqe_ctrl_seg *)wqe, (uint16_t)pi,
			    MLX5_OPCODE_RDMA_WRITE, 0, h->qpn, fm_ce_se, 3, 0, 0);
	/* No helper exists for the remote-address segment. */
	struct mlx5_wqe_raddr_seg *r = (struct mlx5_wqe_raddr_seg *)(wqe + 16);
	r->raddr = htobe64(d->raddr);
	r->rkey = htobe32(d->rkey);
	r->reserved = 0;
	mlx5dv_set_data_seg((struct mlx5_wqe_data_seg *)(wqe + 32), d->len,
			    d->lkey, (uintptr_t)d->laddr);

	h->wrid[idx] = d->wr_id;
	h->pi = pi + 1;
	return wqe;
}

/* Doorbell record, WC barrier, then the 8-byte doorbell: the first 8 bytes
 * of the last WQE's control segment, as they sit in memory. */
static inline __attribute__((always_inline)) void
ring_db(struct ref_sq *sq, uint32_t pi, const uint8_t *last_wqe)
{
	sq->pi = pi;
	to_device_barrier();
	*sq->dbrec = htobe32(pi & 0xffff);
	wc_barrier();
	uint64_t ctrl8;
	memcpy(&ctrl8, last_wqe, 8);
	*(volatile uint64_t *)(sq->bf_reg + sq->bf_offset) = ctrl8;
	sq->bf_offset ^= sq->bf_size;
}

/* As ring_db, but the whole (one-BB) WQE goes to the BlueFlame buffer as
 * eight 64-bit stores in ascending order. */
static inline __attribute__((always_inline)) void
ring_bf(struct ref_sq *sq, uint32_t pi, const uint8_t *wqe)
{
	sq->pi = pi;
	to_device_barrier();
	*sq->dbrec = htobe32(pi & 0xffff);
	wc_barrier();
	volatile uint64_t *dst = (volatile uint64_t *)(sq->bf_reg + sq->bf_offset);
	const uint64_t *src = (const uint64_t *)wqe;
	for (int i = 0; i < 8; i++)
		dst[i] = src[i];
	sq->bf_offset ^= sq->bf_size;
}

/* ---- measured: post --------------------------------------------------- */

__attribute__((noinline)) int ref_post_1(struct ref_sq *sq, const struct write_desc *d)
{
	struct sq_hot h = hot_load(sq);
	uint8_t *wqe = write_wqe(&h, d);
	if (!wqe)
		return -1;
	ring_db(sq, h.pi, wqe);
	return 0;
}

__attribute__((noinline)) int ref_post_bf(struct ref_sq *sq, const struct write_desc *d)
{
	struct sq_hot h = hot_load(sq);
	uint8_t *wqe = write_wqe(&h, d);
	if (!wqe)
		return -1;
	ring_bf(sq, h.pi, wqe);
	return 0;
}

/* Stops at the first WR that does not fit; what was written is rung. */
__attribute__((noinline)) int ref_post_16(struct ref_sq *sq, const struct write_desc *d)
{
	struct sq_hot h = hot_load(sq);
	uint8_t *last = NULL;
	int ret = 0;
	for (int i = 0; i < BATCH; i++) {
		uint8_t *wqe = write_wqe(&h, &d[i]);
		if (!wqe) {
			ret = -1;
			break;
		}
		last = wqe;
	}
	if (last)
		ring_db(sq, h.pi, last);
	return ret;
}

/* ---- measured: poll --------------------------------------------------- */

/* Retires up to and including the 1-BB WQE at 16-bit index `ctr`; SQ
 * accounting is kept in 16 bits, as the CQE reports it. */
static inline __attribute__((always_inline)) uint16_t retire_to(uint16_t ctr)
{
	return (uint16_t)(ctr + 1);
}

/* Anything but a successful requester CQE: not part of the measured shape.
 * Reports a generic error for the WQE, retires it and ends the call (so the
 * hot loop holds no call and needs no callee-saved registers). */
static __attribute__((noinline, cold)) int
poll_slow(struct ref_cq *cq, struct ref_sq *sq, const struct mlx5_cqe64 *cqe,
	  struct ibv_wc *wc, int i)
{
	uint16_t ctr = be16toh(cqe->wqe_counter);
	wc[i].wr_id = sq->wrid[ctr & sq->mask];
	wc[i].status = IBV_WC_GENERAL_ERR;
	wc[i].opcode = IBV_WC_SEND;
	wc[i].qp_num = be32toh(cqe->sop_drop_qpn) & 0xffffff;
	wc[i].wc_flags = 0;
	wc[i].byte_len = 0;
	sq->tail = retire_to(ctr);
	cq->ci++;
	to_device_barrier();
	*cq->dbrec = htobe32(cq->ci & 0xffffff);
	return i + 1;
}

static inline __attribute__((always_inline)) int
poll_cq(struct ref_cq *cq, struct ref_sq *sq, struct ibv_wc *wc, int n)
{
	/* The two counters live in locals; the read-only fields are read
	 * through the pointers (memory operands, no extra registers). */
	uint32_t ci = cq->ci;
	uint16_t tail = sq->tail;
	int i;
	for (i = 0; i < n; i++) {
		const struct mlx5_cqe64 *cqe =
			(const struct mlx5_cqe64 *)(cq->buf + ((size_t)(ci & cq->mask) << 6));
		uint8_t op_own = *(volatile const uint8_t *)&cqe->op_own;
		if ((op_own >> 4) == MLX5_CQE_INVALID || (op_own & 1) != ((ci >> cq->log_cnt) & 1))
			break;
		from_device_barrier();
		if (__builtin_expect((op_own >> 4) != MLX5_CQE_REQ, 0)) {
			sq->tail = tail;
			cq->ci = ci;
			return poll_slow(cq, sq, cqe, wc, i);
		}
		{
			uint16_t ctr = be16toh(cqe->wqe_counter);
			uint32_t sdq = be32toh(cqe->sop_drop_qpn);
			struct ibv_wc *w = &wc[i];
			w->wr_id = sq->wrid[ctr & sq->mask];
			w->status = IBV_WC_SUCCESS;
			switch (sdq >> 24) {
			case MLX5_OPCODE_RDMA_WRITE:
			case MLX5_OPCODE_RDMA_WRITE_IMM:
				w->opcode = IBV_WC_RDMA_WRITE;
				break;
			case MLX5_OPCODE_RDMA_READ:
				w->opcode = IBV_WC_RDMA_READ;
				break;
			default:
				w->opcode = IBV_WC_SEND;
				break;
			}
			w->qp_num = sdq & 0xffffff;
			w->wc_flags = 0;
			w->byte_len = 0;
			tail = retire_to(ctr);
		}
		ci++;
	}
	sq->tail = tail;
	cq->ci = ci;
	to_device_barrier();
	*cq->dbrec = htobe32(ci & 0xffffff);
	return i;
}

__attribute__((noinline)) int ref_poll_1(struct ref_cq *cq, struct ref_sq *sq, struct ibv_wc *wc)
{
	return poll_cq(cq, sq, wc, 1);
}

__attribute__((noinline)) int ref_poll_16(struct ref_cq *cq, struct ref_sq *sq, struct ibv_wc *wc)
{
	return poll_cq(cq, sq, wc, BATCH);
}

/* ---- driver (not measured) ------------------------------------------- */

struct fake {
	uint8_t *sq_buf, *cq_buf, *bf;
	__be32 *dbrec; /* [0] RQ, [1] SQ, [16] CQ ci */
	uint64_t *wrid;
	struct ref_sq sq;
	struct ref_cq cq;
};

static void *zalloc(size_t n)
{
	void *p = aligned_alloc(4096, (n + 4095) & ~(size_t)4095);
	if (!p) {
		perror("aligned_alloc");
		exit(1);
	}
	memset(p, 0, (n + 4095) & ~(size_t)4095);
	return p;
}

static void fake_init(struct fake *f)
{
	f->sq_buf = zalloc(SQ_BBS * 64);
	f->cq_buf = zalloc(CQES * 64);
	f->bf = zalloc(2 * BF_SIZE);
	f->dbrec = zalloc(128);
	f->wrid = zalloc(SQ_BBS * sizeof(uint64_t));
	for (uint32_t i = 0; i < CQES; i++)
		f->cq_buf[i * 64 + 63] = 0xf0; /* INVALID, owner 0 */
	f->sq = (struct ref_sq){
		.buf = f->sq_buf, .mask = SQ_BBS - 1, .wqe_cnt = SQ_BBS,
		.qpn = QPN, .dbrec = &f->dbrec[1], .bf_reg = f->bf,
		.bf_size = BF_SIZE, .wrid = f->wrid,
	};
	f->cq = (struct ref_cq){
		.buf = f->cq_buf, .mask = CQES - 1,
		.log_cnt = (uint32_t)__builtin_ctz(CQES), .dbrec = &f->dbrec[16],
	};
}

static void fake_free(struct fake *f)
{
	free(f->sq_buf);
	free(f->cq_buf);
	free(f->bf);
	free(f->dbrec);
	free(f->wrid);
}

/* A successful requester CQE for the 1-BB RDMA_WRITE WQE at `start`,
 * written at consumer index `ci` with the owner bit of that pass. */
static void write_cqe(struct fake *f, uint32_t ci, uint32_t start)
{
	struct mlx5_cqe64 *c = (struct mlx5_cqe64 *)(f->cq_buf + (size_t)(ci & (CQES - 1)) * 64);
	memset(c, 0, 63);
	c->sop_drop_qpn = htobe32((MLX5_OPCODE_RDMA_WRITE << 24) | QPN);
	c->wqe_counter = htobe16((uint16_t)start);
	uint8_t owner = (ci & CQES) ? 1 : 0;
	__atomic_store_n(&c->op_own, (uint8_t)((MLX5_CQE_REQ << 4) | owner), __ATOMIC_RELEASE);
}

static struct write_desc desc(uint64_t wr_id)
{
	return (struct write_desc){
		.wr_id = wr_id, .laddr = 0x7f5a3c003000ull, .raddr = 0x7e0011220000ull,
		.len = 8, .lkey = 0xa1b2c3, .rkey = 0x0badcafe, .flags = IBV_SEND_SIGNALED,
	};
}

static double now_ns(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec * 1e9 + (double)t.tv_nsec;
}

/* Cost of one now_ns() pair, subtracted from every timed call. */
static double clock_cost;

static void calibrate_clock(void)
{
	const int n = 10000;
	double t0 = now_ns();
	for (int i = 0; i < n; i++)
		(void)now_ns();
	clock_cost = (now_ns() - t0) / n;
}

static void report(const char *bench, const char *fn, unsigned long calls,
		   unsigned long per, double ns)
{
	printf("bench=%s fn=%s calls=%lu ops_per_call=%lu\n", bench, fn, calls, per);
	printf("  wall-clock, noisy and secondary (not callgrind): %.1f ns/op\n",
	       ns / (double)(calls * per));
}

static void check(int cond, const char *what)
{
	if (!cond) {
		fprintf(stderr, "mlx5_ref: check failed: %s\n", what);
		exit(1);
	}
}

enum post_kind { POST_1, POST_BF, POST_16 };

static void bench_post(unsigned long iters, enum post_kind kind)
{
	struct fake f;
	fake_init(&f);
	double ns = 0;
	struct write_desc ds[BATCH];
	for (unsigned long i = 0; i < iters; i++) {
		double t;
		int r;
		switch (kind) {
		case POST_1:
		case POST_BF:
			ds[0] = desc(i);
			compiler_barrier();
			t = now_ns();
			r = kind == POST_1 ? ref_post_1(&f.sq, ds) : ref_post_bf(&f.sq, ds);
			ns += now_ns() - t - clock_cost;
			break;
		default:
			for (int k = 0; k < BATCH; k++)
				ds[k] = desc(i * BATCH + k);
			compiler_barrier();
			t = now_ns();
			r = ref_post_16(&f.sq, ds);
			ns += now_ns() - t - clock_cost;
			break;
		}
		check(r == 0, "post");
		f.sq.tail = (uint16_t)f.sq.pi; /* the "device" completes everything */
	}
	if (kind == POST_1)
		report("post_1", "ref_post_1", iters, 1, ns);
	else if (kind == POST_BF)
		report("post_bf", "ref_post_bf", iters, 1, ns);
	else
		report("post_16", "ref_post_16", iters, BATCH, ns);
	fake_free(&f);
}

enum poll_kind { POLL_1, POLL_16, POLL_EMPTY };

static void bench_poll(unsigned long iters, enum poll_kind kind)
{
	struct fake f;
	fake_init(&f);
	struct ibv_wc wc[BATCH];
	struct write_desc ds[BATCH];
	unsigned long calls = 0, next_id = 0;
	double ns = 0, t;
	while (calls < iters) {
		if (kind != POLL_EMPTY) {
			/* Not measured: post BATCH WRs and complete them all. */
			uint32_t first = f.sq.pi;
			for (int k = 0; k < BATCH; k++)
				ds[k] = desc(next_id + k);
			next_id += BATCH;
			check(ref_post_16(&f.sq, ds) == 0, "setup post");
			for (uint32_t k = 0; k < BATCH; k++)
				write_cqe(&f, f.cq.ci + k, first + k);
		}
		if (kind == POLL_1) {
			for (int k = 0; k < BATCH; k++) {
				if (calls == iters) {
					int n = ref_poll_16(&f.cq, &f.sq, wc);
					check(n == BATCH - k, "drain");
					break;
				}
				t = now_ns();
				int n = ref_poll_1(&f.cq, &f.sq, wc);
				ns += now_ns() - t - clock_cost;
				check(n == 1 && wc[0].opcode == IBV_WC_RDMA_WRITE, "poll_1");
				calls++;
			}
		} else {
			t = now_ns();
			int n = ref_poll_16(&f.cq, &f.sq, wc);
			ns += now_ns() - t - clock_cost;
			check(n == (kind == POLL_16 ? BATCH : 0), "poll_16");
			calls++;
		}
	}
	check(f.sq.tail == (uint16_t)f.sq.pi, "everything retired");
	if (kind == POLL_1)
		report("poll_1", "ref_poll_1", calls, 1, ns);
	else if (kind == POLL_16)
		report("poll_16", "ref_poll_16", calls, BATCH, ns);
	else
		report("poll_empty", "ref_poll_16", calls, 1, ns);
	fake_free(&f);
}

int main(int argc, char **argv)
{
	static const char *const all[] = {"post_1", "post_16", "post_bf",
					  "poll_1", "poll_16", "poll_empty"};
	const int n_all = (int)(sizeof(all) / sizeof(all[0]));
	unsigned long iters = DEFAULT_ITERS;
	const char *which[16];
	int n = 0;
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--iters") && i + 1 < argc) {
			iters = strtoul(argv[++i], NULL, 10);
			continue;
		}
		int known = 0;
		for (int k = 0; k < n_all; k++)
			known |= !strcmp(argv[i], all[k]);
		if (!known || n == 16) {
			fprintf(stderr, "mlx5_ref: unknown bench %s\n", argv[i]);
			return 2;
		}
		which[n++] = argv[i];
	}
	calibrate_clock();
	if (n == 0)
		for (n = 0; n < n_all; n++)
			which[n] = all[n];
	for (int i = 0; i < n; i++) {
		const char *w = which[i];
		if (!strcmp(w, "post_1"))
			bench_post(iters, POST_1);
		else if (!strcmp(w, "post_bf"))
			bench_post(iters, POST_BF);
		else if (!strcmp(w, "post_16"))
			bench_post(iters, POST_16);
		else if (!strcmp(w, "poll_1"))
			bench_poll(iters, POLL_1);
		else if (!strcmp(w, "poll_16"))
			bench_poll(iters, POLL_16);
		else
			bench_poll(iters, POLL_EMPTY);
	}
	return 0;
}
