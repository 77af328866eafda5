// C++17: the SRQ tests of test_srq.c (srq_cases.h) built as C++, plus the
// layouts and signatures as C++ sees them.
#include <cstddef>
#include <type_traits>

#include "srq_cases.h"

static_assert(std::is_trivially_copyable<rdd_srq_init>::value, "plain C struct");
static_assert(sizeof(rdd_srq_init) == 12, "rdd_srq_init");
static_assert(sizeof(rdd_srq_attr) == 16, "rdd_srq_attr");
static_assert(offsetof(rdd_srq_attr, srqn) == 12, "rdd_srq_attr.srqn");
static_assert(std::is_same<decltype(&rdd_qp_create_on_srq),
                           rdd_status (*)(rdd_pd *, rdd_cq *, rdd_cq *, rdd_srq *,
                                          const rdd_qp_init *, rdd_qp **)>::value,
              "rdd_qp_create_on_srq");

int main()
{
    return run_srq_tests("test_srq_cpp");
}
