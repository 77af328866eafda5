// C++17: the UD tests of test_ud.c (ud_cases.h) built as C++, plus the
// layouts and signatures as C++ sees them.
#include <cstddef>
#include <type_traits>

#include "ud_cases.h"

static_assert(std::is_trivially_copyable<rdd_ah_attr>::value, "plain C struct");
static_assert(std::is_trivially_copyable<rdd_ud_send>::value, "plain C struct");
static_assert(sizeof(rdd_ah_attr) == 32, "rdd_ah_attr");
static_assert(offsetof(rdd_ah_attr, flow_label) == 16, "rdd_ah_attr.flow_label");
static_assert(offsetof(rdd_ah_attr, reserved) == 28, "rdd_ah_attr.reserved");
static_assert(sizeof(rdd_ud_send) == 80, "rdd_ud_send");
static_assert(offsetof(rdd_ud_send, ah) == 64, "rdd_ud_send.ah");
static_assert(offsetof(rdd_ud_send, qkey) == 76, "rdd_ud_send.qkey");
static_assert(offsetof(rdd_wc, src_qp) == 32, "rdd_wc.src_qp");
static_assert(offsetof(rdd_wc, slid) == 42, "rdd_wc.slid");
static_assert(offsetof(rdd_wc, sl) == 44, "rdd_wc.sl");
static_assert(std::is_same<decltype(&rdd_qp_send_ud),
                           rdd_status (*)(rdd_qp *, rdd_ah *, uint32_t, uint32_t, uint64_t,
                                          uint64_t, uint32_t, uint32_t, uint32_t)>::value,
              "rdd_qp_send_ud");
static_assert(std::is_same<decltype(&rdd_qp_create_ud),
                           rdd_status (*)(rdd_pd *, rdd_cq *, rdd_cq *, const rdd_qp_init *,
                                          rdd_qp **)>::value,
              "rdd_qp_create_ud");
static_assert(std::is_same<decltype(&rdd_ah_create),
                           rdd_status (*)(rdd_pd *, const rdd_ah_attr *, rdd_ah **)>::value,
              "rdd_ah_create");

int main()
{
    return run_ud_tests("test_ud_cpp");
}
