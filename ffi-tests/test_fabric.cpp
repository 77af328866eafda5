// C++17: the cross-process fabric cases of fabric_cases.h built as C++,
// and the open call's signature as C++ sees it.
#include <type_traits>

#include "fabric_cases.h"

static_assert(std::is_same<decltype(&rdd_device_open_fabric),
                           rdd_status (*)(const rdd_soft_config *, rdd_device **)>::value,
              "rdd_device_open_fabric");

int main()
{
    return run_fabric_tests("test_fabric_cpp");
}
