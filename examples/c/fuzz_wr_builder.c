/*
 * fuzz_wr_builder: fuzzing your own work-request construction against the
 * library's rules with rdd_wr_check and libFuzzer.
 *
 * A program that builds rdd_wr structures from its own requests (here a
 * toy "message" API: send a buffer, or write it to a remote address,
 * inline when small) can check every WR it builds with rdd_wr_check: the
 * call returns exactly the status a post on a queue with the given
 * capabilities would return, without a device, a queue or any memory
 * being written. Under libFuzzer that turns into a property test of the
 * builder: whatever the request, the builder either refuses it itself or
 * produces WRs the queue accepts.
 *
 * Build (from the repository root, after `cargo build --release`; clang's
 * libFuzzer provides main):
 *
 *     clang -std=c11 -g -O1 -fsanitize=fuzzer,address,undefined \
 *         examples/c/fuzz_wr_builder.c -Iinclude \
 *         target/release/librdma_direct.a -lpthread -ldl -lm -o fuzz_wr_builder
 *
 * Run: ./fuzz_wr_builder -runs=20000         (ffi-tests/run.sh does this)
 *      ./fuzz_wr_builder -max_total_time=60  (longer)
 *
 * Build with -DTOY_BUG to plant a bug in the builder (it inlines messages
 * up to 64 bytes whatever the queue's inline limit): the fuzzer finds a
 * request whose WR the queue would refuse with RDD_STATUS_INLINE_TOO_LARGE
 * within a few thousand runs.
 */
#include <rdma_direct.h>

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The toy API: one message, possibly split into pieces. */
enum toy_kind { TOY_SEND = 0, TOY_WRITE = 1, TOY_WRITE_IMM = 2, TOY_READ = 3 };

struct toy_msg {
    enum toy_kind kind;
    const uint8_t *data; /* message bytes (for inline copies) */
    uint32_t lens[4];    /* piece lengths; 0 = unused */
    uint64_t remote;     /* remote address (WRITE, READ) */
    uint32_t rkey;
    uint32_t imm;
    int signaled;
};

/* The queue the builder targets. */
static const rdd_qp_caps CAPS = {3, 32, 1};
#define MR_BASE 0x100000u /* a registered region, as the program sees it */
#define MR_LKEY 0x77u

#ifdef TOY_BUG
#define INLINE_LIMIT 64u
#else
#define INLINE_LIMIT CAPS.max_inline_data
#endif

/*
 * Builds the WR for `m` into `wr` and `sges`; returns 0, or -1 when the
 * builder itself refuses the request (empty or too many pieces, an
 * immediate on a kind without one, ...).
 */
static int toy_build(const struct toy_msg *m, rdd_wr *wr, rdd_sge sges[4])
{
    uint32_t n = 0, total = 0, i;

    for (i = 0; i < 4 && m->lens[i] != 0; i++) {
        n++;
        total += m->lens[i];
    }
    if (n == 0 || n > CAPS.max_send_sge || total > 64) {
        return -1;
    }
    memset(wr, 0, sizeof(*wr));
    wr->wr_id = 1;
    wr->flags = m->signaled ? RDD_SEND_SIGNALED : 0;
    switch (m->kind) {
    case TOY_SEND:
        wr->opcode = RDD_WR_SEND;
        break;
    case TOY_WRITE:
        wr->opcode = RDD_WR_RDMA_WRITE;
        break;
    case TOY_WRITE_IMM:
        wr->opcode = RDD_WR_RDMA_WRITE_WITH_IMM;
        wr->imm_data = m->imm;
        break;
    case TOY_READ:
        wr->opcode = RDD_WR_RDMA_READ;
        break;
    default:
        return -1;
    }
    if (m->kind != TOY_SEND) {
        wr->remote_addr = m->remote;
        wr->rkey = m->rkey;
    }
    /* Small messages go inline (never a READ: it has no outgoing data). */
    int inline_ok = m->kind != TOY_READ && total <= INLINE_LIMIT;
    uint32_t off = 0;
    for (i = 0; i < n; i++) {
        if (inline_ok) {
            sges[i].addr = (uint64_t)(uintptr_t)(m->data + off);
        } else {
            sges[i].addr = MR_BASE + off;
        }
        sges[i].length = m->lens[i];
        sges[i].lkey = MR_LKEY;
        off += m->lens[i];
    }
    if (inline_ok) {
        wr->flags |= RDD_SEND_INLINE;
    }
    wr->sg_list = sges;
    wr->num_sge = n;
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *in, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *in, size_t size)
{
    static uint8_t payload[64];
    struct toy_msg m;
    rdd_wr wr;
    rdd_sge sges[4];
    size_t bad = (size_t)-1;
    uint8_t b[16] = {0};
    unsigned i;

    memcpy(b, in, size < sizeof(b) ? size : sizeof(b));
    memset(&m, 0, sizeof(m));
    m.kind = (enum toy_kind)(b[0] % 5); /* 4 is not a kind: refused */
    m.data = payload;
    for (i = 0; i < 4; i++) {
        m.lens[i] = b[1 + i] % 40;
    }
    m.remote = (uint64_t)b[5] << 8 | b[6];
    m.rkey = b[7];
    m.imm = b[8];
    m.signaled = b[9] & 1;

    if (toy_build(&m, &wr, sges) != 0) {
        return 0; /* refused by the builder itself: nothing to check */
    }
    rdd_status s = rdd_wr_check(&CAPS, &wr, 1, &bad);
    if (s != RDD_STATUS_OK) {
        fprintf(stderr, "toy_build made a WR the queue refuses: %s (%u), request %u/%u/%u/%u/%u\n",
                rdd_status_name((uint32_t)s), (unsigned)s, (unsigned)m.kind, m.lens[0], m.lens[1],
                m.lens[2], m.lens[3]);
        abort();
    }
    return 0;
}
