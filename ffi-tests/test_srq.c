/*
 * C11: the object-level shared receive queue (srq_cases.h): several QPs
 * on one SRQ, every receive completed once with its wr_id and qp_num
 * through rdd_cq_poll, rdd_cq_poll_n and rdd_cq_wait; the limit event
 * once per arm; every refusal typed and writing nothing.
 */
#include "srq_cases.h"

_Static_assert(sizeof(rdd_srq_init) == 12, "rdd_srq_init");
_Static_assert(sizeof(rdd_srq_attr) == 16, "rdd_srq_attr");

int main(void)
{
    return run_srq_tests("test_srq");
}
