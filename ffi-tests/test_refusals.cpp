// C++17: the same refusal tables as test_refusals.c (refusals.h), built
// as C++, plus the layout of the new query struct as C++ sees it.
#include <cstddef>
#include <type_traits>

#include "refusals.h"

static_assert(std::is_trivially_copyable<rdd_qp_attr>::value, "plain C struct");
static_assert(sizeof(rdd_qp_attr) == 72, "rdd_qp_attr");
static_assert(offsetof(rdd_qp_attr, dest_gid) == 48, "rdd_qp_attr.dest_gid");
static_assert(std::is_same<decltype(&rdd_status_name), const char *(*)(uint32_t)>::value,
              "name functions return static strings");

int main()
{
    return run_refusal_tests("test_refusals_cpp");
}
