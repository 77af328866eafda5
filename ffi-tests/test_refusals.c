/*
 * C11: a refused control call changes nothing, for every parameter of
 * every object-level control call; rdd_qp_query, rdd_device_cq_depth_for
 * and the name functions (the tables are in refusals.h).
 */
#include "refusals.h"

int main(void)
{
    return run_refusal_tests("test_refusals");
}
